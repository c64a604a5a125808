"""`train(config)`: the training loop behind the ``train`` command.

One process or many (under torchrun, ``train --num-gpus-per-node N``, or a process group the caller
already set up): the loop is the same; the layout lives in `trainer.parallel.runner.ParallelModel`, and what is
particular to a model family (its shape, data, model, checkpoint names, HF weights) is asked of its
`trainer.models.spec.ModelSpec`: the loop never tests which family it runs.

    from trainer.config import TrainConfig, ModelConfig, DataConfig, TrainingConfig
    result = train(TrainConfig(model=ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4,
                                                 seq_length=64, vocab_size=1024),
                               data=DataConfig(dataset=["data/my_text_document"]),
                               training=TrainingConfig(micro_batch_size=4, train_iters=20, device="cpu")))
    result.losses  # one mean loss per step
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from samplers.run_length import RunLength
from trainer.optim.auxiliary_losses import MAX, MEAN
from trainer.checkpoint.store import (
    MODEL_CONFIG_FILE,
    MODEL_PREFIX,
    check_load_path,
    is_model_only_checkpoint,
    latest_iteration,
    load_checkpoint,
    save_checkpoint,
    vocab_row_names,
)
from trainer.config import TrainConfig
from trainer.data.batches import Prefetcher, explained_sample_counts, step_iterator
from trainer.parallel.distributed import DistContext, init_distributed, resolve_device_type
from trainer.optim.grads import clip_factor, global_grad_norm, reduce_loss, scale_grads
from trainer.checkpoint.lengths import record_sequence_lengths
from trainer.checkpoint.tokenizer import record_tokenizer, run_tokenizer
from trainer.checkpoint.hf_files import copy_tokenizer_files, read_json
from trainer.metrics.memory_report import gather_reports, measure_memory
from trainer.metrics.writers import MetricsWriter, StepTimer, TrainStats, device_peak_flops
from trainer.metrics.records import METRICS_FILE_NAME
from trainer.models import model_spec
from trainer.moe.settings import check_family_has_experts
from trainer.parallel.runner import ParallelModel
from trainer.checkpoint.save_directory import check_save_directory, claim_save_directory
from trainer.optim.optimizer import (
    SCHEDULER_PREFIX,
    LossScaler,
    apply_schedule,
    embedding_and_output_names,
    scheduler_state_from_tensors,
    scheduler_state_tensors,
)
from trainer.parallel.dims import ParallelDims, resolve_parallel_dims
from trainer.parallel.zero import build_zero_optimizer, init_state, load_optimizer_states, optimizer_states, refresh_masters

logger = logging.getLogger(__name__)

# Megatron seeds each pipeline stage differently so dropout masks differ between stages.
PIPELINE_SEED_STRIDE = 100
# Seconds between two progress lines of a long evaluation pass (a silent minute looks like a hang).
EVAL_PROGRESS_INTERVAL_S = 5.0


def recorded_hf_model_type(root: str | Path, known: tuple[str, ...]) -> str | None:
    """The HF ``model_type`` a checkpoint root's ``model_config.json`` records, if it is one of ``known``."""
    path = Path(root) / MODEL_CONFIG_FILE
    recorded = read_json(path).get("model_type") if path.is_file() else None
    return recorded if recorded in known else None


@dataclass(slots=True)
class TrainResult:
    """What a run did (the same on every rank)."""

    iteration: int
    """Last completed step."""
    consumed_samples: int
    losses: list[float] = field(default_factory=list)
    """Mean training loss of each step this call ran."""
    grad_norms: list[float] = field(default_factory=list)
    """Global gradient norm of each step this call ran."""
    eval_losses: dict[str, float] = field(default_factory=dict)
    """Latest loss per evaluated split ("valid", "test")."""
    auxiliary: list[dict[str, float]] = field(default_factory=list)
    """The model's auxiliary metrics of each step this call ran (`trainer.optim.auxiliary_losses`; empty dicts for a model
    without auxiliary losses)."""


def train(config: TrainConfig) -> TrainResult:
    """Train as ``config`` says; returns after ``train_iters`` steps (saving first if asked).

    Raises:
        TrainConfigError: a layout rule, the data or the vocabulary is wrong (raised on every rank
            before the first collective).
        CheckpointError: the checkpoint to resume from is broken or belongs to another model.
    """
    device_type = resolve_device_type(config.training.device)
    ctx = init_distributed(device_type)
    try:
        with contextlib.ExitStack() as held:
            return _Run(config, ctx, held).train()
    finally:
        if ctx.owns_process_group:
            dist.destroy_process_group()


class _Run:
    """Everything one training run holds; built in `__init__`, driven by `train`. ``held`` keeps what the run
    holds until it ends (the lock of its save directory)."""

    def __init__(self, config: TrainConfig, ctx: DistContext, held: contextlib.ExitStack) -> None:
        self.config, self.ctx = config, ctx
        checkpoint = config.checkpoint
        check_load_path(checkpoint.load, checkpoint.save)
        check_save_directory(checkpoint.save, checkpoint.load, checkpoint.overwrite_save)
        # Everything that can fail on bad input happens before the first collective (mesh creation).
        self.spec = model_spec(config.model.model)
        self.dims: ParallelDims = resolve_parallel_dims(config, ctx.world_size)
        # Megatron's split sizes: the validation split holds every evaluation's own samples.
        self.run_length = RunLength(train_iters=config.training.train_iters,
                                    global_batch_size=self.dims.global_batch_size,
                                    eval_interval=config.logging.eval_interval, eval_iters=config.logging.eval_iters,
                                    train_samples=config.training.train_samples)
        with explained_sample_counts(self.run_length, config.data.split):
            parts = self.spec.training_parts(config, self.dims.tp, self.run_length.sizes())
        self.vocabulary, self.shape, self.collate = parts.vocabulary, parts.shape, parts.collate
        data = config.data
        # The tokenizer each checkpoint records (`trainer.checkpoint.tokenizer`).
        files = {"vocab_file": data.vocab_file, "merge_file": data.merge_file, "tokenizer_model": data.tokenizer_model}
        self.tokenizer = run_tokenizer(data.tokenizer_type, files, self.vocabulary.size)
        check_family_has_experts(config.moe.num_experts, self.shape, config.model.model)
        self.train_ds, self.valid_ds, self.test_ds = parts.datasets
        self.tokens_per_sample, self.flops_per_token = parts.tokens_per_sample, parts.flops_per_token
        # After the checks of the config and data (a refused run creates nothing), before the first save.
        held.enter_context(claim_save_directory(checkpoint.save, ctx.rank == 0, checkpoint.overwrite_save))
        self.mesh = self.dims.build_mesh(device_type=ctx.device.type) if ctx.world_size > 1 else None
        coords = {name: (self.mesh.get_local_rank(name) if self.mesh is not None else 0) for name in ("pp", "dp")}
        self.dp_rank = coords["dp"]
        autocast = _autocast_dtype(config, ctx.device, ctx.rank)
        self.model = ParallelModel(self.spec.parallel_plan, self.shape, self.dims, self.mesh, config.parallelism,
                                   ctx.device, config.data.seed, config.training.checkpoint_activations, autocast,
                                   compile_blocks=config.training.compile)
        # The HF model type the checkpoints record (of the family's several, say), for `convert-checkpoint --to-hf`.
        self.hf_model_type = self.spec.hf_model_types[0]
        if config.checkpoint.load_hf is not None:
            self.hf_model_type = self.spec.load_hf_weights(self.model.named_parameters(), config.checkpoint.load_hf,
                                                           self.shape)
        torch.manual_seed(config.data.seed + PIPELINE_SEED_STRIDE * coords["pp"])
        self.params = [p for _, p in self.model.named_parameters()]
        par = config.parallelism
        dp_group = self.mesh.get_group("dp") if self.mesh is not None and self.dims.dp > 1 else None
        # Megatron's embedding and output layer (--decoupled-lr): the parameters whose rows are the vocabulary.
        decoupled = embedding_and_output_names(self.model.named_parameters(), self.spec.vocab_rows)
        self.optimizer, kernel = build_zero_optimizer(self.model.named_parameters(), config.optimizer, par.zero_stage,
                                                      par.cpu_offload, dp_group, ctx.device.type, decoupled)
        if ctx.rank == 0:
            logger.info("AdamW kernel: %s (ZeRO stage %d%s)", kernel, par.zero_stage,
                        ", optimiser on the CPU" if par.cpu_offload else "")
        self.scheduler = config.optimizer.scheduler(config.training, self.dims.global_batch_size)
        self.scaler = LossScaler(config.precision)
        self.iteration = self.consumed_samples = self.skipped = 0
        if config.checkpoint.load is not None:
            self._load()
        metrics_file = config.logging.metrics_file
        if metrics_file is None and config.checkpoint.save is not None:
            metrics_file = str(Path(config.checkpoint.save) / METRICS_FILE_NAME)
        self.writer = MetricsWriter(metrics_file, config.logging.tensorboard_dir, ctx.rank == 0, self.iteration)
        self.peak_flops = device_peak_flops(ctx.device, autocast is not None)
        self.timer = StepTimer(config.logging.timing_log_level >= 1, ctx.device)

    # -- checkpoints ------------------------------------------------------------------------------------

    def _state(self, optimizer_state: dict | None = None) -> dict[str, torch.Tensor]:
        """Everything a checkpoint holds, as tensors under layout-independent names (the optimiser's state
        at full size: ``optimizer_state`` from `trainer.parallel.zero.optimizer_states`, or gathered here)."""
        state: dict[str, torch.Tensor] = {}
        if optimizer_state is None:
            optimizer_state = optimizer_states(self.optimizer)
        for name, param in self.model.named_parameters():
            state[f"model.{name}"] = param.detach()
            for key, value in (optimizer_state.get(param) or {}).items():
                state[f"optim.{name}.{key}"] = value
        counters = {"iteration": self.iteration, "consumed_samples": self.consumed_samples,
                    "skipped_iterations": self.skipped}
        state |= {f"train.{k}": torch.tensor(v, dtype=torch.int64) for k, v in counters.items()}
        state |= {f"loss_scaler.{k}": v for k, v in self.scaler.state_dict().items()}
        state |= scheduler_state_tensors(self.scheduler)
        state[f"rng.rank{self.ctx.rank}.cpu"] = torch.get_rng_state()
        if self.ctx.device.type == "cuda":
            state[f"rng.rank{self.ctx.rank}.cuda"] = torch.cuda.get_rng_state(self.ctx.device)
        return state

    def _save(self) -> None:
        init_state(self.optimizer)
        root = self.config.checkpoint.save
        # What the tensors cannot tell (head count, real vocabulary) and the tokenizer, so that
        # `convert-checkpoint --to-hf` and `generate` need no extra flags.
        if self.ctx.rank == 0:
            self.spec.save_model_config(root, self.shape, self.vocabulary, self.hf_model_type)
            record_sequence_lengths(root, self.config, self.spec.unused_fields)
        if self.ctx.rank == 0 and self.config.checkpoint.load_hf is not None:
            copy_tokenizer_files(self.config.checkpoint.load_hf, root)
        if self.ctx.rank == 0 and self.tokenizer is not None:
            record_tokenizer(root, self.tokenizer)
        save_checkpoint(root, self.iteration, self.model.checkpoint_state(self._state()))

    def _load(self) -> None:
        root = self.config.checkpoint.load
        # Keep the HF variant the checkpoint records (an mT5 stays an mT5 when exported again).
        self.hf_model_type = recorded_hf_model_type(root, self.spec.hf_model_types) or self.hf_model_type
        iteration = latest_iteration(root)
        if iteration is None:
            if self.ctx.rank == 0:  # every rank finds the same directory empty: say it once
                logger.warning("no checkpoint in %s: training from scratch", root)
            return
        with torch.device("meta"):
            # The names checkpoints hold, whatever layout this run computes in (`ParallelPlan.to_checkpoint`).
            full_model = self.spec.checkpoint_model(self.shape)
            model_names = frozenset(f"model.{name}" for name, _ in full_model.named_parameters())
        verify = not self.config.checkpoint.no_verify
        if is_model_only_checkpoint(root, iteration, verify):
            # `convert-checkpoint --from-hf` writes weights only: the optimiser and counters start fresh.
            model_state = {k: v for k, v in self._state().items() if k.startswith(MODEL_PREFIX)}
            saved_state = self.model.checkpoint_state(model_state)
            load_checkpoint(root, iteration, saved_state, model_names=model_names, verify=verify,
                            vocab_rows=self._vocab_rows(saved_state))
            self.model.restore_checkpoint_state(saved_state, model_state)
            refresh_masters(self.optimizer)
            if self.ctx.rank == 0:
                logger.info("starting from the model weights of %s (iteration %d)", root, iteration)
            return
        init_state(self.optimizer)
        full_optimizer_state = optimizer_states(self.optimizer)
        state = self._state(full_optimizer_state)
        rng_names = frozenset(name for name in state if name.startswith("rng."))
        scheduler_names = frozenset(name for name in state if name.startswith(SCHEDULER_PREFIX))
        saved_state = self.model.checkpoint_state(state)
        loaded = load_checkpoint(root, iteration, saved_state, optional=rng_names | scheduler_names,
                                 model_names=model_names, verify=verify, vocab_rows=self._vocab_rows(saved_state))
        self.model.restore_checkpoint_state(saved_state, state)
        load_optimizer_states(self.optimizer, full_optimizer_state)
        self.iteration = int(state["train.iteration"])
        self.consumed_samples = int(state["train.consumed_samples"])
        self.skipped = int(state["train.skipped_iterations"])
        self.scaler.load_state_dict({k.split(".", 1)[1]: v for k, v in state.items() if k.startswith("loss_scaler.")})
        if scheduler_names <= loaded:
            self.scheduler.load_state_dict(scheduler_state_from_tensors(state))
        else:  # a checkpoint from before the schedule was saved: its schedule counted the steps taken
            self.scheduler.step((self.iteration - self.skipped) * self.dims.global_batch_size)
        for name in rng_names & loaded:
            if name.endswith(".cpu"):
                torch.set_rng_state(state[name])
            else:
                torch.cuda.set_rng_state(state[name], self.ctx.device)
        if self.ctx.rank == 0:
            logger.info("resuming from iteration %d (%d samples consumed)", self.iteration, self.consumed_samples)

    def _vocab_rows(self, state: dict[str, torch.Tensor]) -> frozenset[str]:
        """The checkpoint names whose rows are the padded vocabulary (re-padded when the layout changed)."""
        return vocab_row_names(state, self.spec.vocab_rows)

    # -- steps ------------------------------------------------------------------------------------------

    def _step(self, microbatches) -> tuple[float, float, dict[str, float]]:
        """One optimiser step; returns (mean loss, gradient norm, the model's auxiliary metrics)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.model.loss_scale = self.scaler.scale
        with self.timer.phase("forward_backward"):
            loss_sum, holds_loss = self.model.run(microbatches, train=True)
        auxiliary = self.model.auxiliary_metrics()
        with self.timer.phase("grad_clip"):
            norm = float(global_grad_norm(self.model.norm_parameters(), self.model.pp_group)) / self.scaler.scale
            if math.isfinite(norm):
                scale_grads(self.params, clip_factor(norm, self.config.optimizer.clip_grad) / self.scaler.scale)
        if math.isfinite(norm):
            with self.timer.phase("optimizer"):
                self.optimizer.step()
        else:
            self.skipped += 1
            if self.ctx.rank == 0:
                logger.warning("iteration %d: gradients overflow at loss scale %g, step skipped (%d so far)",
                               self.iteration, self.scaler.scale, self.skipped)
        self.scaler.update(found_inf=not math.isfinite(norm))
        loss = reduce_loss(loss_sum, holds_loss, len(microbatches), self.dims.dp * self.dims.tp)
        return loss, norm, auxiliary

    def evaluate(self, dataset, split: str, first_sample: int = 0) -> float | None:
        """Mean loss over ``eval_iters`` global batches of ``dataset``, from sample ``first_sample`` on.

        Validation follows Megatron's single valid iterator: each evaluation reads the samples after the
        previous ones', so the one at step k starts at ``run_length.consumed_valid_samples(k - 1)`` and the
        one after training at ``consumed_valid_samples(train_iters)`` (a function of the step, so a resumed
        run continues where Megatron's rebuilt iterator does). When train_iters is a multiple of
        eval_interval, Megatron evaluates twice after the last step; we run only the second of the two.
        The test split is read once, from its start.
        """
        if dataset is None or self.config.logging.eval_iters == 0:
            return None
        batches = step_iterator(dataset, first_sample, self.dims.micro_batch_size, self.dims.num_microbatches,
                                self.dp_rank, self.dims.dp, self.vocabulary.size, self.collate)
        self.model.set_train(False)
        self.model.loss_scale = 1.0
        total = 0.0
        started = last_line = time.monotonic()
        for done, microbatches in enumerate(batches, start=1):
            loss_sum, holds_loss = self.model.run([mb.to(self.ctx.device) for mb in microbatches], train=False)
            total += reduce_loss(loss_sum, holds_loss, len(microbatches), self.dims.dp * self.dims.tp)
            if done == self.config.logging.eval_iters:
                break
            now = time.monotonic()
            if self.ctx.rank == 0 and now - last_line >= EVAL_PROGRESS_INTERVAL_S:
                logger.info(" %s evaluation at iteration %d: %d/%d batches (%.0f s)", split, self.iteration, done,
                            self.config.logging.eval_iters, now - started)
                last_line = now
        self.model.set_train(True)
        loss = total / self.config.logging.eval_iters
        self.writer.evaluation(self.iteration, split, loss)
        return loss

    def train(self) -> TrainResult:
        cfg = self.config
        result = TrainResult(iteration=self.iteration, consumed_samples=self.consumed_samples)
        gbs, train_iters = self.dims.global_batch_size, cfg.training.train_iters
        batches = Prefetcher(step_iterator(self.train_ds, self.consumed_samples, self.dims.micro_batch_size,
                                           self.dims.num_microbatches, self.dp_rank, self.dims.dp, self.vocabulary.size,
                                           self.collate))
        window = _Window()
        self.model.set_train(True)
        try:
            while self.iteration < train_iters:
                start = time.perf_counter()
                microbatches = [mb.to(self.ctx.device) for mb in next(batches)]
                data_time = time.perf_counter() - start
                self.iteration += 1
                # The rates of the samples consumed before this step (Megatron's). The schedule advances only
                # after a step that was taken: after a skipped fp16 step the next runs at the same rates.
                apply_schedule(self.optimizer, self.scheduler)
                lr, skipped = self.scheduler.lr(), self.skipped
                loss, norm, auxiliary = self._step(microbatches)
                if self.skipped == skipped:
                    self.scheduler.step(gbs)
                if cfg.logging.print_memory and self.iteration == result.iteration + 1:
                    self._report_memory()
                self.consumed_samples += gbs
                result.losses.append(loss)
                result.grad_norms.append(norm)
                result.auxiliary.append(auxiliary)
                window.add(loss, norm, time.perf_counter() - start, data_time, auxiliary)
                if self.iteration % cfg.logging.log_interval == 0 or self.iteration == train_iters:
                    self.writer.train(self._stats(window, lr))
                    window = _Window()
                if self.iteration % cfg.logging.eval_interval == 0 and self.iteration < train_iters:
                    self.evaluate(self.valid_ds, "valid", self.run_length.consumed_valid_samples(self.iteration - 1))
                if cfg.checkpoint.save and cfg.checkpoint.save_interval and \
                        self.iteration % cfg.checkpoint.save_interval == 0 and self.iteration < train_iters:
                    self._save()
        finally:
            batches.close()
        if cfg.checkpoint.save and self.iteration > result.iteration:
            self._save()
        final_evaluations = (("valid", self.valid_ds, self.run_length.consumed_valid_samples(self.iteration)),
                             ("test", self.test_ds, 0))
        for split, dataset, first_sample in final_evaluations:
            loss = self.evaluate(dataset, split, first_sample)
            if loss is not None:
                result.eval_losses[split] = loss
        self.writer.close()
        result.iteration, result.consumed_samples = self.iteration, self.consumed_samples
        return result

    def _report_memory(self) -> None:
        """``--print-memory``: every rank's bytes after this call's first step, logged and recorded."""
        reports = gather_reports(measure_memory(self.params, self.optimizer, self.ctx.device))
        if self.ctx.rank == 0:
            for report in reports:
                logger.info(report.log_line())
        self.writer.memory(self.iteration, [asdict(report) for report in reports])

    def _stats(self, window: _Window, lr: float) -> TrainStats:
        seconds = window.seconds / window.count
        tokens_per_second = self.dims.global_batch_size * self.tokens_per_sample / seconds
        flops_per_device = tokens_per_second * self.flops_per_token / self.ctx.world_size
        return TrainStats(
            iteration=self.iteration, train_iters=self.config.training.train_iters,
            consumed_samples=self.consumed_samples, global_batch_size=self.dims.global_batch_size, lr=lr,
            loss=window.loss / window.count, grad_norm=window.grad_norm / window.count, loss_scale=self.scaler.scale,
            skipped_iterations=self.skipped, ms_per_iteration=1000 * seconds,
            data_ms_per_iteration=1000 * window.data_seconds / window.count, tokens_per_second=tokens_per_second,
            tflops_per_device=flops_per_device / 1e12,
            mfu=flops_per_device / self.peak_flops if self.peak_flops else None,
            auxiliary=window.auxiliary_values(self.model.auxiliary_kinds), timing=self.timer.take(window.count))


def _autocast_dtype(config: TrainConfig, device: torch.device, rank: int) -> torch.dtype | None:
    """The autocast dtype of ``--bf16``/``--fp16``; None computes in fp32.

    ``--fp16`` on a CPU computes in fp32 (CPU kernels have no fast float16 path, and fp16 overflows would
    skip most steps of a short run), with fp16's loss scaling still applied, so logs and checkpoints
    look like a GPU run's; a power-of-2 scale makes the losses exactly fp32's.
    """
    precision = config.precision
    if precision.fp16 and device.type == "cpu":
        if rank == 0:
            logger.warning("--fp16 on a CPU: computing in float32 (loss scaling still applies); use --bf16 for "
                           "reduced precision on a CPU")
        return None
    return torch.bfloat16 if precision.bf16 else torch.float16 if precision.fp16 else None


@dataclass(slots=True)
class _Window:
    """Sums over the steps since the last log line."""

    count: int = 0
    loss: float = 0.0
    grad_norm: float = 0.0
    seconds: float = 0.0
    data_seconds: float = 0.0
    auxiliary: list[dict[str, float]] = field(default_factory=list)

    def add(self, loss: float, grad_norm: float, seconds: float, data_seconds: float,
            auxiliary: dict[str, float]) -> None:
        self.count += 1
        self.loss += loss
        self.grad_norm += grad_norm
        self.seconds += seconds
        self.data_seconds += data_seconds
        self.auxiliary.append(auxiliary)

    def auxiliary_values(self, kinds: dict[str, str]) -> dict[str, float]:
        """Each auxiliary metric over the window's steps: the mean of "mean" metrics, the extreme of the others."""
        values: dict[str, float] = {}
        for name, kind in kinds.items():
            steps = [step[name] for step in self.auxiliary if name in step]
            if steps:
                values[name] = sum(steps) / len(steps) if kind == MEAN else max(steps) if kind == MAX else min(steps)
        return values
