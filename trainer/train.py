"""`train(config)`: the training loop behind the ``train`` command.

One process or many (under torchrun, ``train --num-gpus-per-node N``, or a process group the caller
already set up): the loop is the same; the layout lives in `trainer.parallel.runner.ParallelModel`, and what is
particular to a model family (its shape, data, model, checkpoint names, HF weights) is asked of its
`trainer.family.spec.ModelSpec`: the loop never tests which family it runs.

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
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from samplers.run_length import RunLength
from trainer.errors import NonFiniteError
from trainer.optim.auxiliary_losses import MAX, MEAN
from trainer.checkpoint.load import load_checkpoint, saved_names, vocab_row_names
from trainer.checkpoint.save import save_checkpoint
from trainer.checkpoint.store import (
    MODEL_CONFIG_FILE,
    MODEL_PREFIX,
    OPTIMIZER_PREFIX,
    check_load_path,
    latest_iteration,
    remove_old_checkpoints,
)
from trainer.checkpoint.async_save import AsyncSaver
from trainer.checkpoint.early_exit import SECONDS_PER_MINUTE, EarlyExit
from trainer.checkpoint.restart import restarted_config
from trainer.config import TrainConfig
from trainer.data.batches import Prefetcher, explained_sample_counts, step_iterator
from trainer.parallel.collective_timeout import process_group_timeout, reported_timeouts
from trainer.parallel.distributed import DistContext, init_distributed, resolve_device_type, restart_count
from trainer.parallel.rank_progress import RankProgress
from trainer.optim.batch_size_schedule import check_batch_sizes, samples_after
from trainer.optim.grads import (
    clip_factor,
    global_grad_norm,
    mean_loss,
    queue_host_read,
    ranks_where,
    reduce_loss,
    scale_grads,
)
from trainer.checkpoint.lengths import record_sequence_lengths
from trainer.checkpoint.tokenizer import record_tokenizer, run_tokenizer
from trainer.checkpoint.hf_files import copy_tokenizer_files, read_json
from trainer.metrics.memory_report import gather_reports, measure_memory
from trainer.metrics.step_observer import StepObserver, trace_root
from trainer.metrics.writers import MetricsWriter, StepTimer, TrainStats, WandbRun, device_peak_flops
from trainer.metrics.records import METRICS_FILE_NAME
from trainer.family.checks import check_family_options
from trainer.models import model_spec
from trainer.moe.settings import check_family_has_experts
from trainer.parallel.attention_backend import attention_kernels, backend_names
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
from trainer.parallel.dims import ParallelDims, overlap_notes, resolve_parallel_dims
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
    exit_reason: str | None = None
    """Why the run stopped before train_iters (`trainer.checkpoint.early_exit`); None when it did not."""


def train(config: TrainConfig) -> TrainResult:
    """Train as ``config`` says; returns after ``train_iters`` steps (saving first if asked).

    Raises:
        TrainConfigError: a layout rule, the data or the vocabulary is wrong (raised on every rank
            before the first collective).
        CheckpointError: the checkpoint to resume from is broken or belongs to another model.
    """
    config = restarted_config(config, restart_count())
    device_type = resolve_device_type(config.training.device)
    if config.precision.disable_bf16_reduced_precision_matmul:
        # Megatron's switch sets the same process-wide backend flag.
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    timeout_minutes = config.launch.distributed_timeout_minutes
    ctx = init_distributed(device_type, process_group_timeout(timeout_minutes))
    run: _Run | None = None
    try:
        with RankProgress.open(ctx.store, ctx.rank, ctx.world_size) as progress, \
                reported_timeouts(timeout_minutes, ctx.rank, lambda: run.completed_iteration if run else None,
                                  progress), \
                contextlib.ExitStack() as held:
            run = _Run(config, ctx, held, progress)
            return run.train()
    finally:
        if ctx.owns_process_group:
            dist.destroy_process_group()


class _Run:
    """Everything one training run holds; built in `__init__`, driven by `train`. ``held`` keeps what the run
    holds until it ends (the lock of its save directory). ``progress``: this rank's records of the phase it is in
    (None for one process)."""

    def __init__(self, config: TrainConfig, ctx: DistContext, held: contextlib.ExitStack,
                 progress: RankProgress | None = None) -> None:
        started = time.monotonic()
        self.config, self.ctx, self.progress = config, ctx, progress
        checkpoint = config.checkpoint
        check_load_path(checkpoint.load, checkpoint.save)
        check_save_directory(checkpoint.save, checkpoint.load, checkpoint.overwrite_save)
        # Everything that can fail on bad input happens before the first collective (mesh creation).
        self.spec = model_spec(config.model.model)
        check_family_options(config, self.spec)  # (the ``train`` flags ran it already; a Python caller's config not)
        if config.data.tokenizer_type is None:
            # The family's default (Megatron's pretrain_<family>.py sets it per family): the config cannot
            # know it, as the core never imports the registry.
            config.data.tokenizer_type = self.spec.default_tokenizer_type
        self.dims: ParallelDims = resolve_parallel_dims(config, ctx.world_size, self.spec.layout_rules)
        if ctx.rank == 0:
            for note in overlap_notes(config.parallelism, self.dims.dp * self.dims.cp):
                logger.warning("warning: %s", note)
        # --rampup-batch-size, --step-batch-size-schedule: each step's global batch (None: dims.global_batch_size).
        self.batch_sizes = config.batch_size_schedule()
        train_samples = config.training.train_samples
        if self.batch_sizes is not None:
            check_batch_sizes(self.batch_sizes, self.dims.micro_batch_size * self.dims.dp)
            # The train split holds what the steps take (the last step may pass --train-samples).
            train_samples = samples_after(self.batch_sizes, config.training.train_iters)
        # Megatron's split sizes: the validation split holds every evaluation's own samples.
        self.run_length = RunLength(train_iters=config.training.train_iters,
                                    global_batch_size=self.dims.global_batch_size,
                                    eval_interval=config.logging.eval_interval, eval_iters=config.logging.eval_iters,
                                    train_samples=train_samples)
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
        autocast = _autocast_dtype(config, ctx.device, ctx.rank)
        observability = config.observability
        self.observer = held.enter_context(StepObserver(
            observability, trace_root(config.logging.tensorboard_dir, checkpoint.save), ctx.rank, ctx.device,
            config.logging.log_interval))
        held.enter_context(attention_kernels(config.kernels.attention_backend, ctx.device, autocast or torch.float32))
        if ctx.rank == 0:
            logger.info("attention kernels: %s (attention_backend %s, on %s)",
                        backend_names(config.kernels.attention_backend), config.kernels.attention_backend,
                        ctx.device.type)
        # After the checks of the config and data (a refused run creates nothing), before the first save.
        held.enter_context(claim_save_directory(checkpoint.save, ctx.rank == 0, checkpoint.overwrite_save))
        self.mesh = self.dims.build_mesh(device_type=ctx.device.type) if ctx.world_size > 1 else None
        coords = {name: (self.mesh.get_local_rank(name) if self.mesh is not None else 0) for name in ("pp", "dp")}
        self.dp_rank = coords["dp"]
        self.model = ParallelModel(self.spec.parallel_plan, self.shape, self.dims, self.mesh, config.parallelism,
                                   ctx.device, config.data.seed,
                                   config.recompute.policy(config.training.checkpoint_activations), autocast,
                                   compile_blocks=config.training.compile,
                                   per_token_loss=config.training.calculate_per_token_loss,
                                   cpu_initialization=config.model.use_cpu_initialization)
        # The HF model type the checkpoints record (of the family's several, say), for `convert-checkpoint --to-hf`.
        self.hf_model_type = self.spec.hf_model_types[0]
        if config.checkpoint.load_hf is not None:
            self.hf_model_type = self.spec.load_hf_weights(self.model.named_parameters(), config.checkpoint.load_hf,
                                                           self.shape)
        torch.manual_seed(config.data.seed + PIPELINE_SEED_STRIDE * coords["pp"])
        self.params = [p for _, p in self.model.named_parameters()]
        par = config.parallelism
        # ZeRO shards over every replica of the parameters: the data-parallel ranks, times the cp ranks.
        dims = self.dims
        dp_group = self.mesh.get_group(dims.replica_dim) if self.mesh is not None and dims.replicas > 1 else None
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
        self.saved_iteration: int | None = None
        self.completed_iteration: int | None = None
        """The last iteration whose step finished (None until `train` starts the step loop)."""
        self._window = _Window()
        self.loaded_from: tuple[Path, int] | None = None
        """(root, iteration) of the checkpoint the run resumed from: never removed by keep_last_checkpoints."""
        if config.checkpoint.load is not None:
            self._load()
        metrics_file = config.logging.metrics_file
        if metrics_file is None and config.checkpoint.save is not None:
            metrics_file = str(Path(config.checkpoint.save) / METRICS_FILE_NAME)
        wandb_run = None if observability.wandb_project is None else WandbRun(
            observability.wandb_project, observability.wandb_exp_name, observability.wandb_save_dir, asdict(config))
        self.writer = MetricsWriter(metrics_file, config.logging.tensorboard_dir, ctx.rank == 0, self.iteration,
                                    wandb_run)
        self.peak_flops = device_peak_flops(ctx.device, autocast is not None)
        # Background saves exchange over their own group: the step loop's collectives use the default one meanwhile.
        async_group = dist.new_group(backend="gloo") if checkpoint.async_save and ctx.world_size > 1 else None
        self.async_saver = AsyncSaver(async_group) if checkpoint.async_save else None
        training = config.training
        # Last: a signal from here on finishes the step in flight instead of ending the process.
        self.early_exit = held.enter_context(EarlyExit(
            training.exit_interval,
            None if training.exit_duration_in_mins is None else training.exit_duration_in_mins * SECONDS_PER_MINUTE,
            signal.Signals[training.exit_signal] if training.exit_signal_handler else None, started))
        level = config.logging.timing_log_level
        self.timer = StepTimer(level >= 1, ctx.device, detailed=level >= 2 and self.model.schedule is None)
        self.model.timer = self.timer

    # -- checkpoints ------------------------------------------------------------------------------------

    def _state(self, optimizer_state: dict | None = None, optimizer: bool = True,
               rng: bool = True) -> dict[str, torch.Tensor]:
        """Everything a checkpoint holds, as tensors under layout-independent names (the optimiser's state
        at full size: ``optimizer_state`` from `trainer.parallel.zero.optimizer_states`, or gathered here).
        Without ``optimizer`` it leaves out the optimiser state, the loss scaler and the schedule (Megatron's
        --no-save-optim/--no-load-optim), without ``rng`` the generators' states."""
        state: dict[str, torch.Tensor] = {}
        if optimizer_state is None:
            optimizer_state = optimizer_states(self.optimizer) if optimizer else {}
        for name, param in self.model.named_parameters():
            state[f"model.{name}"] = param.detach()
            for key, value in (optimizer_state.get(param) or {}).items():
                state[f"optim.{name}.{key}"] = value
        counters = {"iteration": self.iteration, "consumed_samples": self.consumed_samples,
                    "skipped_iterations": self.skipped}
        state |= {f"train.{k}": torch.tensor(v, dtype=torch.int64) for k, v in counters.items()}
        if optimizer:
            state |= {f"loss_scaler.{k}": v for k, v in self.scaler.state_dict().items()}
            state |= scheduler_state_tensors(self.scheduler)
        if not rng:
            return state
        state[f"rng.rank{self.ctx.rank}.cpu"] = torch.get_rng_state()
        if self.ctx.device.type == "cuda":
            state[f"rng.rank{self.ctx.rank}.cuda"] = torch.cuda.get_rng_state(self.ctx.device)
        return state

    def _enter(self, phase: str) -> None:
        """Record the phase of `iteration` this rank enters (`RankProgress`: names it if it never arrives)."""
        if self.progress is not None:
            self.progress.enter(self.iteration, phase)

    def _save(self) -> None:
        self._enter("save")
        init_state(self.optimizer)
        root = self.config.checkpoint.save
        # What the tensors cannot tell (head count, real vocabulary) and the tokenizer, so that
        # `convert-checkpoint --to-hf` and `generate` need no extra flags.
        if self.ctx.rank == 0:
            self.spec.save_model_config(root, self.shape, self.vocabulary, self.hf_model_type)
            record_sequence_lengths(root, {name: getattr(self.config.section(section), name)
                                           for section, name in self.spec.sequence_lengths})
        if self.ctx.rank == 0 and self.config.checkpoint.load_hf is not None:
            copy_tokenizer_files(self.config.checkpoint.load_hf, root)
        if self.ctx.rank == 0 and self.tokenizer is not None:
            record_tokenizer(root, self.tokenizer)
        checkpoint = self.config.checkpoint
        state = self._state(optimizer=not checkpoint.no_save_optim, rng=not checkpoint.no_save_rng)
        state = self.model.checkpoint_state(state)
        if self.async_saver is not None:
            self._finish_save()  # the previous one: a save waits for it
            self.async_saver.start(root, self.iteration, state)
        else:
            save_checkpoint(root, self.iteration, state)
            self._remove_old_checkpoints()
        self.saved_iteration = self.iteration

    def _finish_save(self) -> None:
        """Wait for the asynchronous save in flight, if any (collective)."""
        if self.async_saver is not None and self.async_saver.wait() is not None:
            self._remove_old_checkpoints()

    def _remove_old_checkpoints(self) -> None:
        """keep_last_checkpoints, after a checkpoint is complete (rank 0)."""
        root, keep = self.config.checkpoint.save, self.config.checkpoint.keep_last_checkpoints
        if keep is not None and self.ctx.rank == 0:
            loaded = self.loaded_from
            protected = frozenset({loaded[1]}) if loaded is not None and loaded[0] == Path(root).resolve() else frozenset()
            remove_old_checkpoints(root, keep, protected)

    def _load(self) -> None:
        root = self.config.checkpoint.load
        # Keep the HF variant the checkpoint records (an mT5 stays an mT5 when exported again).
        self.hf_model_type = recorded_hf_model_type(root, self.spec.hf_model_types) or self.hf_model_type
        iteration = latest_iteration(root)
        if iteration is None:
            if self.ctx.rank == 0:  # every rank finds the same directory empty: say it once
                logger.warning("no checkpoint in %s: training from scratch", root)
            return
        self.loaded_from = (Path(root).resolve(), iteration)
        with torch.device("meta"):
            # The names checkpoints hold, whatever layout this run computes in (`ParallelPlan.to_checkpoint`).
            full_model = self.spec.checkpoint_model(self.shape)
            model_names = frozenset(f"model.{name}" for name, _ in full_model.named_parameters())
        checkpoint = self.config.checkpoint
        verify = not checkpoint.no_verify
        saved = saved_names(root, iteration, verify)
        if checkpoint.finetune or all(name.startswith(MODEL_PREFIX) for name in saved):
            # `convert-checkpoint --from-hf` writes weights only, and --finetune takes only them (Megatron's):
            # the optimiser, schedule, counters and generators start fresh.
            model_state = {k: v for k, v in self._state(optimizer=False, rng=False).items()
                           if k.startswith(MODEL_PREFIX)}
            saved_state = self.model.checkpoint_state(model_state)
            load_checkpoint(root, iteration, saved_state, model_names=model_names, verify=verify,
                            vocab_rows=self._vocab_rows(saved_state))
            self.model.restore_checkpoint_state(saved_state, model_state)
            refresh_masters(self.optimizer)
            if self.ctx.rank == 0:
                logger.info("starting from the model weights of %s (iteration %d)", root, iteration)
            return
        # A checkpoint saved with --no-save-optim holds no optimiser state: it starts afresh, as Megatron's does.
        load_optimizer = not checkpoint.no_load_optim and any(name.startswith(OPTIMIZER_PREFIX) for name in saved)
        full_optimizer_state = None
        if load_optimizer:
            init_state(self.optimizer)
            full_optimizer_state = optimizer_states(self.optimizer)
        state = self._state(full_optimizer_state, optimizer=load_optimizer, rng=not checkpoint.no_load_rng)
        rng_names = frozenset(name for name in state if name.startswith("rng."))
        scheduler_names = frozenset(name for name in state if name.startswith(SCHEDULER_PREFIX))
        saved_state = self.model.checkpoint_state(state)
        loaded = load_checkpoint(root, iteration, saved_state, optional=rng_names | scheduler_names,
                                 model_names=model_names, verify=verify, vocab_rows=self._vocab_rows(saved_state))
        self.model.restore_checkpoint_state(saved_state, state)
        self.iteration = int(state["train.iteration"])
        self.consumed_samples = int(state["train.consumed_samples"])
        self.skipped = int(state["train.skipped_iterations"])
        if not load_optimizer:
            # Megatron's --no-load-optim: fresh optimiser state, loss scale and schedule (at its step 0).
            refresh_masters(self.optimizer)
            if self.ctx.rank == 0:
                logger.info("resuming the weights of iteration %d (%d samples consumed); the optimiser state and "
                            "learning-rate schedule start afresh", self.iteration, self.consumed_samples)
            self._restore_rng(state, rng_names & loaded)
            return
        load_optimizer_states(self.optimizer, full_optimizer_state)
        self.scaler.load_state_dict({k.split(".", 1)[1]: v for k, v in state.items() if k.startswith("loss_scaler.")})
        if scheduler_names <= loaded:
            self.scheduler.load_state_dict(scheduler_state_from_tensors(state))
        else:  # a checkpoint from before the schedule was saved: its schedule counted the steps taken
            self.scheduler.step((self.iteration - self.skipped) * self.dims.global_batch_size)
        self._restore_rng(state, rng_names & loaded)
        if self.ctx.rank == 0:
            logger.info("resuming from iteration %d (%d samples consumed)", self.iteration, self.consumed_samples)

    def _restore_rng(self, state: dict[str, torch.Tensor], names: Iterable[str]) -> None:
        """Set the generators from the loaded ``rng.*`` tensors ``names`` of ``state``."""
        for name in names:
            if name.endswith(".cpu"):
                torch.set_rng_state(state[name])
            else:
                torch.cuda.set_rng_state(state[name], self.ctx.device)

    def _vocab_rows(self, state: dict[str, torch.Tensor]) -> frozenset[str]:
        """The checkpoint names whose rows are the padded vocabulary (re-padded when the layout changed)."""
        return vocab_row_names(state, self.spec.vocab_rows)

    # -- steps ------------------------------------------------------------------------------------------

    def _reads_later(self, iteration: int) -> bool:
        """Whether ``iteration``'s figures are read during the next step (after its backward is queued, before its
        update) rather than at the end of its own. Where a non-finite value stops the run (no loss scaler, the
        NaN check on: bf16 and fp32 by default) nothing this step decides waits for them, and a GPU then never
        drains between steps: the host queues the next batch's forward and backward while the device finishes
        this step, as a loop that reads nothing would. A loss scaler, or a run without the NaN check, reads first
        (it skips a step whose gradients overflow); an evaluation, a save and the last step read at once (they
        come after the step's figures and before the next step's update), and so does a step timed phase by phase
        (``--timing-log-level`` 1 or 2 waits for the device at every phase's ends: nothing is left to overlap)."""
        cfg = self.config
        save_interval = cfg.checkpoint.save_interval if cfg.checkpoint.save else None
        return not (cfg.precision.skips_overflowing_steps or self.timer.enabled) \
            and iteration < cfg.training.train_iters and iteration % cfg.logging.eval_interval != 0 \
            and not (save_interval and iteration % save_interval == 0)

    def _forward_backward(self, microbatches: list) -> _Queued:
        """Queue the step's forward, backward, loss, gradient norm and the copy of both to the host."""
        self.optimizer.zero_grad(set_to_none=True)
        self.model.loss_scale = self.scaler.scale
        with self.timer.phase("forward_backward"):
            loss_sum, holds_loss = self.model.run(microbatches, train=True)
        auxiliary = self.model.auxiliary_metrics()
        with self.timer.phase("grad_clip"):
            loss = mean_loss(loss_sum, holds_loss, len(microbatches), self.dims.dp * self.dims.cp * self.dims.tp)
            norm = global_grad_norm(self.model.norm_parameters(), self.model.pp_group)
            norm_on_device = norm.total / self.scaler.scale
            read = queue_host_read(torch.stack([loss, norm_on_device]))
        return _Queued(read, norm_on_device, loss_sum if holds_loss else None, norm.local_finite, auxiliary)

    def _update(self, queued: _Queued, reads_later: bool) -> None:
        """Clip and take the optimizer's step of ``queued``; where the host decides on it (``reads_later`` false
        and a loss scaler or no NaN check), read the figures first and skip a step whose gradients overflowed."""
        host_decides = self.config.precision.skips_overflowing_steps
        with self.timer.phase("grad_clip"):
            if self.config.optimizer.clip_grad > 0 or self.scaler.scale != 1.0:  # else a multiply by 1
                scale_grads(self.params,
                            clip_factor(queued.norm, self.config.optimizer.clip_grad) / self.scaler.scale)
        if not host_decides:
            # Queued before the read: on a GPU the device runs the optimizer while the host waits for the
            # figures (the norm, not the optimizer).
            with self.timer.phase("optimizer"):
                self.optimizer.step()
            if not reads_later:
                queued.figures = queued.read()
            return
        queued.figures = queued.read()
        norm = queued.figures[1]
        if math.isfinite(norm):
            with self.timer.phase("optimizer"):
                self.optimizer.step()
        else:
            self.skipped += 1
            if self.ctx.rank == 0:
                logger.warning("iteration %d: gradients overflow at loss scale %g, step skipped (%d so far)",
                               self.iteration, self.scaler.scale, self.skipped)
        self.scaler.update(found_inf=not math.isfinite(norm))

    def _check_finite(self, taken: _Taken, loss: float, norm: float) -> None:
        """Megatron's --check-for-nan-in-loss-and-grad (on by default): stop at a NaN or infinite loss, or
        gradient norm where no loss scaler owns overflows (fp16, or a static --loss-scale, skips such steps as
        Megatron's grad scalers do). ``loss`` and ``norm`` are the same on every rank, so every rank raises.

        Raises:
            NonFiniteError: naming the iteration and the ranks whose own loss or gradients hold the value.
        """
        if math.isfinite(loss) and (math.isfinite(norm) or self.config.precision.loss_scaled):
            return
        what = "loss" if not math.isfinite(loss) else "gradient norm"
        queued = taken.queued
        # Which ranks hold the value is read only once it is known to be there (no host read per step).
        local = (queued.local_loss_sum is not None and not bool(torch.isfinite(queued.local_loss_sum))
                 if what == "loss" else not bool(queued.local_grads_finite))
        ranks = ranks_where(local, self.ctx.rank)
        raise NonFiniteError(f"iteration {taken.iteration}: the {what} is {loss if what == 'loss' else norm} (from "
                             f"rank {', '.join(map(str, ranks)) or 'unknown'}); stopped, as Megatron's "
                             "--check-for-nan-in-loss-and-grad does (--no-check-for-nan-in-loss-and-grad skips "
                             "such steps instead)")

    def _finish(self, taken: _Taken, result: TrainResult, ended: float | None = None) -> bool:
        """Read ``taken``'s figures (waiting for the device up to its norm), check them, record and log them, and
        evaluate and save where due; returns whether the run stops after it (an early exit).

        ``ended``: where the step's time ends (`time.perf_counter`), for a step read during the next one: when the
        next step asked for its batch. None: now, as its figures are read. A step's time runs from its own batch's
        request, so the steps' times tile the run: a read one step later moves no step's work into another's.
        """
        loss, norm = taken.queued.figures if taken.queued.figures is not None else taken.queued.read()
        if not self.config.precision.no_check_for_nan_in_loss_and_grad:
            self._check_finite(taken, loss, norm)
        cfg = self.config
        train_iters = cfg.training.train_iters
        result.losses.append(loss)
        result.grad_norms.append(norm)
        result.auxiliary.append(taken.queued.auxiliary)
        window = self._window
        window.add(loss, norm, (time.perf_counter() if ended is None else ended) - taken.began, taken.data_seconds,
                   taken.queued.auxiliary)
        window.samples += taken.batch_size
        iteration = taken.iteration
        result.exit_reason = self.early_exit.reason(iteration) if iteration < train_iters else None
        if iteration % cfg.logging.log_interval == 0 or iteration == train_iters or result.exit_reason is not None:
            self.writer.train(self._stats(window, taken))
            self._window = _Window()
        # (`_reads_later` leaves a step that evaluates or saves to its own end: the weights are its.)
        if iteration % cfg.logging.eval_interval == 0 and iteration < train_iters:
            self._enter("evaluation")
            self.evaluate(self.valid_ds, "valid", self.run_length.consumed_valid_samples(iteration - 1))
        if cfg.checkpoint.save and cfg.checkpoint.save_interval and iteration % cfg.checkpoint.save_interval == 0 \
                and iteration < train_iters:
            self._save()
        return result.exit_reason is not None

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
            total += reduce_loss(loss_sum, holds_loss, len(microbatches), self.dims.dp * self.dims.cp * self.dims.tp)
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
        self.completed_iteration = self.iteration  # 0, or the iteration this attempt resumed from
        train_iters = cfg.training.train_iters
        samples_per_microbatch = self.dims.micro_batch_size * self.dims.dp
        batches = Prefetcher(step_iterator(self.train_ds, self.consumed_samples, self.dims.micro_batch_size,
                                           self.dims.num_microbatches, self.dp_rank, self.dims.dp, self.vocabulary.size,
                                           self.collate, self.batch_sizes))
        pending: _Taken | None = None  # a step whose figures are read during the next one
        self.model.set_train(True)
        try:
            while self.iteration < train_iters:
                start = time.perf_counter()
                microbatches = [mb.to(self.ctx.device) for mb in next(batches)]
                data_time = time.perf_counter() - start
                self.iteration += 1
                self._enter("step")
                with self.observer.step(self.iteration):
                    queued = self._forward_backward(microbatches)
                    if pending is not None:
                        stop = self._finish(pending, result, ended=start)
                        pending = None
                        if stop:
                            self.iteration -= 1  # this step's forward and backward ran; its update is not taken
                            break
                    # The rates of the samples consumed before this step (Megatron's). The schedule advances only
                    # after a step that was taken: after a skipped fp16 step the next runs at the same rates.
                    apply_schedule(self.optimizer, self.scheduler)
                    lr, skipped = self.scheduler.lr(), self.skipped
                    reads_later = self._reads_later(self.iteration)
                    self._update(queued, reads_later)
                # This step's global batch (it changes under a batch-size ramp).
                gbs = len(microbatches) * samples_per_microbatch
                if self.skipped == skipped:
                    self.scheduler.step(gbs)
                if cfg.logging.print_memory and self.iteration == result.iteration + 1:
                    self._report_memory()
                self.consumed_samples += gbs
                self.completed_iteration = self.iteration
                taken = _Taken(self.iteration, gbs, lr, self.consumed_samples, start, data_time, queued)
                if reads_later:
                    pending = taken
                elif self._finish(taken, result):
                    break
        finally:
            batches.close()
        if cfg.checkpoint.save and self.iteration > result.iteration and self.saved_iteration != self.iteration:
            self._save()
        if result.exit_reason is not None:
            # Megatron's early exits skip the final evaluations too: a preempted job has seconds to leave.
            self._finish_save()
            if self.ctx.rank == 0:
                saved = f"saved in {cfg.checkpoint.save}" if cfg.checkpoint.save else "nothing saved (no save)"
                logger.info("exiting at iteration %d of %d: %s; %s", self.iteration, train_iters, result.exit_reason,
                            saved)
            self.writer.close()
            result.iteration, result.consumed_samples = self.iteration, self.consumed_samples
            return result
        final_evaluations = (("valid", self.valid_ds, self.run_length.consumed_valid_samples(self.iteration)),
                             ("test", self.test_ds, 0))
        self._enter("final evaluations")
        for split, dataset, first_sample in final_evaluations:
            loss = self.evaluate(dataset, split, first_sample)
            if loss is not None:
                result.eval_losses[split] = loss
        self._finish_save()
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

    def _stats(self, window: _Window, taken: _Taken) -> TrainStats:
        """The log record of the window that ``taken`` ends."""
        seconds = window.seconds / window.count
        tokens_per_second = window.samples / window.count * self.tokens_per_sample / seconds
        flops_per_device = tokens_per_second * self.flops_per_token / self.ctx.world_size
        return TrainStats(
            iteration=taken.iteration, train_iters=self.config.training.train_iters,
            consumed_samples=taken.consumed_samples, global_batch_size=taken.batch_size, lr=taken.lr,
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
class _Queued:
    """A step's forward and backward, queued on the device, and what its update and its figures need."""

    read: Callable[[], list[float]]
    """Waits for the copy of [mean loss, gradient norm] (`queue_host_read`) and returns it."""
    norm: torch.Tensor
    """The gradient norm on the device (unscaled; float64)."""
    local_loss_sum: torch.Tensor | None
    """This rank's own loss sum (None on a rank that computes no loss)."""
    local_grads_finite: torch.Tensor
    """Whether this rank's own gradients are finite (bool, on the device): read only once a value is not."""
    auxiliary: dict[str, float]
    figures: list[float] | None = None
    """[mean loss, gradient norm], once read."""


@dataclass(frozen=True, slots=True)
class _Taken:
    """A step whose update is queued (or skipped), with what its log line needs."""

    iteration: int
    batch_size: int
    """Global-batch samples (a batch-size ramp changes them)."""
    lr: float
    consumed_samples: int
    """After this step."""
    began: float
    """`time.perf_counter` when its batch was asked for."""
    data_seconds: float
    queued: _Queued


@dataclass(slots=True)
class _Window:
    """Sums over the steps since the last log line."""

    count: int = 0
    samples: int = 0
    """Global-batch samples of the steps (a batch-size ramp changes them)."""
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
