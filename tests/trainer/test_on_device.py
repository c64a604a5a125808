"""The accelerator path against the CPU: one-process `train` runs on the device follow the same runs on the CPU.

The device is ``TOKENMILL_TEST_DEVICE`` (``cuda`` by default; every test here skips when it is ``cuda`` and no
CUDA device is available). ``TOKENMILL_TEST_DEVICE=cpu`` runs the same tests with the CPU on both sides, which
is how `benchmarks/device/run.sh`'s dry run checks them without a GPU. Promised, on the device:

- `--use-cpu-initialization` gives the CPU run's initial weights bit for bit;
- GPT, T5, BERT and a MoE GPT (fp32), started from those weights, give the CPU run's per-step losses within the
  parity tests' tolerance, and a run resumed from a checkpoint saved halfway goes on as the straight run on the CPU;
- bf16 (GPT and MoE GPT, whose experts take the grouped GEMM on Hopper) trains within the CPU precision
  tests' bound of the fp32 CPU run, and fp16 with a loss scale that does not overflow likewise;
- fp16 dynamic loss scaling: an overflowing scale skips steps, halves, and then training goes on, the
  learning rate held over the skipped steps (as on the CPU);
- ``--compile`` trains like eager on the device, and the AdamW kernel is the fused one on CUDA;
- on CUDA, a training step waits for the device only to read its loss and gradient norm, once, after its
  optimizer step is queued.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os

import pytest
import torch
from test_bert_train import bert_config
from test_compile_and_kernels import COMPILE_RTOL, fresh_compiler, short_run  # noqa: F401 (fixture)
from test_parity import TOLERANCE
from trainer_testing import TINY_VOCAB, lr_after_steps, result_record, t5_config, tiny_config

import trainer.train as train_module
from trainer.config import MoEConfig, TrainConfig
from trainer.models import model_spec
from trainer.models.gpt.spec import PLAN as GPT_PLAN
from trainer.models.gpt.training import model_shape
from trainer.parallel.dims import resolve_parallel_dims
from trainer.parallel.runner import ParallelModel

DEVICE_VARIABLE = "TOKENMILL_TEST_DEVICE"
DEVICE = os.environ.get(DEVICE_VARIABLE, "cuda")
pytestmark = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                                reason=f"needs a CUDA device (or {DEVICE_VARIABLE}=cpu for a dry run)")

HALF = 5
# test_precision.py's bound of bf16 losses against fp32 ones on the same data, over its first steps.
LOW_PRECISION_ATOL = 0.05
LOW_PRECISION_STEPS = 3
# fp16 with a scale that overflows nothing: 2**10 times this model's gradients stays far below fp16's 65504.
SAFE_FP16_SCALE = 2.0**10
# A dynamic scale that overflows at first. On the CPU, fp16 computes in fp32 and only the fp32 sum of squares
# of the gradient norm overflows (test_precision.py's 2**66). On a GPU the fp16 backward itself overflows: a
# target's logit gradient is about scale / (tokens per step = 256), 2**18 at 2**26, past fp16's 65504; the head's
# weight gradient sums that over the tokens of one target (a few), so it fits from about 2**18 on: some eight of
# the steps are skipped.
OVERFLOWING_SCALE = {"cpu": 2.0**66, "cuda": 2.0**26}
FP16_STEPS = 16
MOE = MoEConfig(num_experts=4, moe_router_topk=2, moe_aux_loss_coeff=0.01)


def on_device(config: TrainConfig, **sections: dict) -> TrainConfig:
    """``config`` on the device under test, starting from the CPU run's weights (`--use-cpu-initialization`: a
    GPU's generator draws other numbers from the same seed), with ``sections``' fields replaced (section name ->
    changes)."""
    config = dataclasses.replace(config, training=dataclasses.replace(config.training, device=DEVICE),
                                 model=dataclasses.replace(config.model, use_cpu_initialization=True))
    for name, changes in sections.items():
        config = dataclasses.replace(config, **{name: dataclasses.replace(getattr(config, name), **changes)})
    return config


def with_experts(config: TrainConfig) -> TrainConfig:
    return dataclasses.replace(config, moe=MOE)


def cpu_and_device(config: TrainConfig) -> tuple[dict, dict]:
    """The results of ``config`` (a CPU run) on the CPU and on the device under test: one run when that is the CPU."""
    cpu = result_record(config)
    return cpu, cpu if torch.device(DEVICE).type == "cpu" else result_record(on_device(config))


def assert_losses_close(got: list[float], want: list[float], atol: float) -> None:
    assert len(got) == len(want)
    for step, (a, b) in enumerate(zip(got, want), start=1):
        assert a == pytest.approx(b, abs=atol), f"loss of step {step}: {a} on {DEVICE}, {b} on the CPU"


def test_cpu_initialization_gives_the_cpu_runs_weights_on_the_device(tiny_prefix, cache_dir):
    config = tiny_config(tiny_prefix, cache_dir)
    dims = resolve_parallel_dims(config, 1, model_spec(config.model.model).layout_rules)
    shape = model_shape(config, TINY_VOCAB, 1)

    def initial_weights(device: str, cpu_initialization: bool) -> dict[str, torch.Tensor]:
        model = ParallelModel(GPT_PLAN, shape, dims, None, config.parallelism, torch.device(device),
                              config.data.seed, checkpoint_activations=False, autocast_dtype=None,
                              cpu_initialization=cpu_initialization)
        return {name: param.detach().cpu() for name, param in model.named_parameters()}

    cpu = initial_weights("cpu", cpu_initialization=False)
    on_the_device = initial_weights(DEVICE, cpu_initialization=True)
    assert cpu.keys() == on_the_device.keys()
    for name, weight in cpu.items():
        assert torch.equal(on_the_device[name], weight), name


def test_gpt_follows_the_cpu_run_and_resumes(reference, tiny_prefix, cache_dir, tmp_path):
    straight = result_record(on_device(tiny_config(tiny_prefix, cache_dir, eval_iters=1)))
    assert_losses_close(straight["losses"], reference["losses"], TOLERANCE)
    assert straight["grad_norms"] == pytest.approx(reference["grad_norms"], abs=TOLERANCE)
    for split, loss in reference["eval_losses"].items():
        assert straight["eval_losses"][split] == pytest.approx(loss, abs=TOLERANCE), f"{split} loss"
    save = str(tmp_path / "checkpoint")
    result_record(on_device(tiny_config(tiny_prefix, cache_dir, train_iters=HALF, save=save)))
    resumed = result_record(on_device(tiny_config(tiny_prefix, cache_dir, load=save)))
    assert_losses_close(resumed["losses"], reference["losses"][HALF:], TOLERANCE)
    assert resumed["consumed_samples"] == reference["consumed_samples"]


def test_t5_follows_the_cpu_run_and_resumes(sentence_prefix, data_test, tmp_path):
    cache = str(tmp_path / "cache")
    cpu, device = cpu_and_device(t5_config(sentence_prefix, data_test, cache))
    assert_losses_close(device["losses"], cpu["losses"], TOLERANCE)
    save = str(tmp_path / "checkpoint")
    result_record(on_device(t5_config(sentence_prefix, data_test, cache, train_iters=HALF, save=save)))
    resumed = result_record(on_device(t5_config(sentence_prefix, data_test, cache, load=save)))
    assert_losses_close(resumed["losses"], cpu["losses"][HALF:], TOLERANCE)


def test_bert_follows_the_cpu_run_and_resumes(wordpiece_sentences, data_test, tmp_path):
    cache = str(tmp_path / "cache")
    cpu, device = cpu_and_device(bert_config(wordpiece_sentences, data_test, cache))
    assert_losses_close(device["losses"], cpu["losses"], TOLERANCE)
    half = len(cpu["losses"]) // 2
    save = str(tmp_path / "checkpoint")
    result_record(on_device(bert_config(wordpiece_sentences, data_test, cache, train_iters=half, save=save)))
    resumed = result_record(on_device(bert_config(wordpiece_sentences, data_test, cache, load=save)))
    assert_losses_close(resumed["losses"], cpu["losses"][half:], TOLERANCE)


def test_moe_gpt_follows_the_cpu_run_and_resumes(tiny_prefix, cache_dir, tmp_path):
    def config(**kwargs) -> TrainConfig:
        return with_experts(tiny_config(tiny_prefix, cache_dir, num_layers=2, **kwargs))

    cpu, device = cpu_and_device(config())
    assert_losses_close(device["losses"], cpu["losses"], TOLERANCE)
    save = str(tmp_path / "checkpoint")
    result_record(on_device(config(train_iters=HALF, save=save)))
    resumed = result_record(on_device(config(load=save)))
    assert_losses_close(resumed["losses"], cpu["losses"][HALF:], TOLERANCE)


@pytest.mark.skipif(torch.device(DEVICE).type != "cuda", reason="host-device synchronisation is a CUDA matter")
@pytest.mark.parametrize("family", ["gpt", "t5", "bert"])
def test_a_training_step_waits_for_the_device_only_to_read_its_figures(family, monkeypatch, tiny_prefix, cache_dir,
                                                                      sentence_prefix, wordpiece_sentences, data_test,
                                                                      tmp_path):
    # A bf16 step queues its forward, backward, gradient norm, clipping and optimizer step, and reads its loss and
    # gradient norm to the host once (`trainer.optim.grads.queue_host_read`; step 1's during step 2, between its
    # backward and its update). Any other host read (.item(), a blocking copy, a host decision on a device value)
    # stalls the queue, costing the most at small micro-batches. torch's sync debug mode raises at the first such
    # call, naming it.
    original_queue = train_module.queue_host_read

    def watched(method):
        def run(self, *args, **kwargs):
            mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("error")
            try:
                return method(self, *args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode(mode)

        return run

    def allowed_queue(values):
        read = original_queue(values)

        def allowed_read():
            mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("default")
            try:
                return read()
            finally:
                torch.cuda.set_sync_debug_mode(mode)

        return allowed_read

    cache = str(tmp_path / "cache")
    config = {"gpt": lambda: tiny_config(tiny_prefix, cache_dir, train_iters=2),
              "t5": lambda: t5_config(sentence_prefix, data_test, cache, train_iters=2),
              "bert": lambda: bert_config(wordpiece_sentences, data_test, cache, train_iters=2)}[family]()
    for name in ("_forward_backward", "_finish", "_update"):  # a step's parts, and the reading of its figures
        monkeypatch.setattr(train_module._Run, name, watched(getattr(train_module._Run, name)))
    monkeypatch.setattr(train_module, "queue_host_read", allowed_queue)
    result_record(on_device(config, precision={"bf16": True}))


@pytest.mark.parametrize("experts", [False, True], ids=["dense", "moe"])
def test_bf16_trains_close_to_fp32_on_the_cpu(experts, tiny_prefix, cache_dir):
    def config() -> TrainConfig:
        base = tiny_config(tiny_prefix, cache_dir, num_layers=2, train_iters=LOW_PRECISION_STEPS)
        return with_experts(base) if experts else base

    fp32 = result_record(config())
    bf16 = result_record(on_device(config(), precision={"bf16": True}))
    assert_losses_close(bf16["losses"], fp32["losses"], LOW_PRECISION_ATOL)


def test_fp16_trains_close_to_fp32_on_the_cpu(reference, tiny_prefix, cache_dir):
    config = tiny_config(tiny_prefix, cache_dir, train_iters=LOW_PRECISION_STEPS)
    fp16 = result_record(on_device(config, precision={"fp16": True, "initial_loss_scale": SAFE_FP16_SCALE}))
    assert all(math.isfinite(norm) for norm in fp16["grad_norms"]), "no step may overflow at this scale"
    assert_losses_close(fp16["losses"], reference["losses"][:LOW_PRECISION_STEPS], LOW_PRECISION_ATOL)


def test_fp16_skips_overflowing_steps_backs_off_and_holds_the_learning_rate(tiny_prefix, cache_dir, tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    config = on_device(tiny_config(tiny_prefix, cache_dir, train_iters=FP16_STEPS, metrics_file=str(metrics)),
                       precision={"fp16": True, "hysteresis": 1,
                                  "initial_loss_scale": OVERFLOWING_SCALE[torch.device(DEVICE).type]},
                       logging={"log_interval": 1})
    result = result_record(config)
    assert not math.isfinite(result["grad_norms"][0]), "the first step overflows"
    assert all(math.isfinite(loss) for loss in result["losses"])
    assert math.isfinite(result["grad_norms"][-1]), "the scale came down far enough to train"
    skipped = sum(not math.isfinite(norm) for norm in result["grad_norms"])
    steps = [record for record in map(json.loads, metrics.read_text().splitlines()) if "lr" in record]
    assert 0 < skipped < FP16_STEPS
    # Each overflow halves the scale (hysteresis 1); no window of 1000 clean steps passes to double it. A step
    # runs at the schedule's rate for the steps taken before it: a skipped step does not advance the schedule.
    scale, taken = config.precision.initial_loss_scale, 0
    for step, norm in zip(steps, result["grad_norms"], strict=True):
        assert step["lr"] == pytest.approx(lr_after_steps(config, taken)), f"iteration {step['iteration']}"
        overflowed = not math.isfinite(norm)
        scale, taken = (scale / 2, taken) if overflowed else (scale, taken + 1)
        assert step["loss_scale"] == scale, f"iteration {step['iteration']}"


def test_compiled_gpt_trains_like_eager_with_the_device_adamw_kernel(tiny_prefix, cache_dir, fresh_compiler,  # noqa: F811
                                                                     caplog):
    caplog.set_level(logging.INFO, logger="trainer.train")
    config = on_device(short_run(tiny_config(tiny_prefix, cache_dir)))
    eager = result_record(config)
    compiled = result_record(on_device(config, training={"compile": True}))
    assert compiled["losses"] == pytest.approx(eager["losses"], rel=COMPILE_RTOL)
    assert compiled["grad_norms"] == pytest.approx(eager["grad_norms"], rel=COMPILE_RTOL)
    assert "AdamW kernel: fused" in caplog.text


@pytest.mark.skipif(torch.device(DEVICE).type != "cuda",
                    reason="the CPU's fused attention takes no mask that requires a gradient, T5's always does")
def test_t5_attention_runs_in_fused_kernels_in_bf16():
    # T5's attention masks carry the learned position bias. On CUDA a mask strided in its last dimension sends
    # SDPA to its math path, which computes in float32 (the encoder's masks did until 67361ea). With the math
    # path excluded, a bf16 step of a padded batch must still run, and the bias tables get their gradients.
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from trainer.models.t5.model import T5, T5Shape

    model = T5(T5Shape(vocab_size=TINY_VOCAB, d_model=64, d_kv=16, d_ff=128, num_heads=4, num_encoder_layers=2,
                       num_decoder_layers=2)).to(DEVICE)
    generator = torch.Generator().manual_seed(0)
    encoder = torch.randint(2, TINY_VOCAB, (2, 32), generator=generator).to(DEVICE)
    decoder = torch.randint(2, TINY_VOCAB, (2, 16), generator=generator).to(DEVICE)
    mask = torch.ones_like(encoder)
    mask[0, 20:] = 0
    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    with sdpa_kernel(fused), torch.autocast("cuda", dtype=torch.bfloat16):
        model(encoder, decoder, mask).float().square().mean().backward()
    for table in (model.encoder_position_bias, model.decoder_position_bias):
        assert torch.isfinite(table.embedding.weight.grad).all() and table.embedding.weight.grad.abs().sum() > 0
