"""Under the 1F1B pipeline schedule, the tensor bytes a stage holds are bounded by the number of stages, not
by the number of micro-batches (issue: a T5 stage's memory tripled from 2 to 8 micro-batches).

One 2-process launch runs the first training step of a tiny T5 and a tiny GPT split over two stages with
2 and with 8 micro-batches, and measures on each stage the peak of the bytes its CPU tensors hold during
that step (the profiler's allocation record: every allocation and free, in order, from the step's start;
the first step, so that buffers the schedule allocates per micro-batch are counted). The shapes make what
could be kept per micro-batch large next to the parameters: a long encoder (its attention bias alone is
[batch, heads, 256, 256]) and a wide vocabulary (logits [batch, seq, 4096]).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from process_testing import run_jobs
from torch.profiler import ProfilerActivity, profile

from trainer.config import ParallelismConfig
from trainer.models.gpt.data import GPTMicroBatch
from trainer.models.gpt.model import GPTShape
from trainer.models.gpt.spec import PLAN as GPT_PLAN
from trainer.models.t5.data import T5MicroBatch
from trainer.models.t5.model import T5Shape
from trainer.models.t5.spec import PLAN as T5_PLAN
from trainer.parallel.dims import ParallelDims
from trainer.parallel.runner import ParallelModel

FEW, MANY = 2, 8
MICRO_BATCH = 2
VOCAB = 4096
ENCODER_LENGTH, DECODER_LENGTH, GPT_LENGTH = 256, 64, 128
# The bound: a stage's peak with 8 micro-batches within 1.3x of its peak with 2.
BOUND = 1.3


def _t5_shape() -> T5Shape:
    return T5Shape(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_heads=4, num_encoder_layers=2,
                   num_decoder_layers=2, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                   feed_forward="gated-gelu", tie_word_embeddings=False, scale_decoder_outputs=False)


def _gpt_shape() -> GPTShape:
    return GPTShape(num_layers=8, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64,
                    max_position_embeddings=GPT_LENGTH, padded_vocab_size=VOCAB)


def _microbatches(family: str, count: int) -> list:
    generator = torch.Generator().manual_seed(0)

    def ids(length: int) -> torch.Tensor:
        return torch.randint(2, VOCAB, (MICRO_BATCH, length), generator=generator)

    if family == "t5":
        return [T5MicroBatch(encoder_input_ids=ids(ENCODER_LENGTH), decoder_input_ids=ids(DECODER_LENGTH),
                             encoder_attention_mask=torch.ones(MICRO_BATCH, ENCODER_LENGTH, dtype=torch.int64),
                             targets=ids(DECODER_LENGTH)) for _ in range(count)]
    positions = torch.arange(GPT_LENGTH).expand(MICRO_BATCH, GPT_LENGTH)
    return [GPTMicroBatch(tokens=ids(GPT_LENGTH), position_ids=positions, targets=ids(GPT_LENGTH))
            for _ in range(count)]


# The profiler's name of an allocation record's event (bytes allocated, or freed when negative).
MEMORY_EVENT = "[memory]"


def peak_tensor_bytes(step) -> int:
    """The largest number of bytes CPU tensors allocated during ``step()`` held at once (from its start).

    Every allocation and free in the order they happened (each `MEMORY_EVENT` at its own time, as the
    profiler's memory timeline reads them), not the ops' net memory: an op's net usage dated at its start
    hides the buffers it frees before it returns and misdates those it keeps."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    records = [event for event in prof.profiler.kineto_results.events() if event.name() == MEMORY_EVENT]
    live = peak = 0
    for event in sorted(records, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def first_step_peaks(family: str, num_microbatches: int) -> list[int]:
    """Every stage's `peak_tensor_bytes` of the first training step (collective over the 2 processes)."""
    shape, plan = (_t5_shape(), T5_PLAN) if family == "t5" else (_gpt_shape(), GPT_PLAN)
    dims = ParallelDims(pp=2, dp=1, tp=1, micro_batch_size=MICRO_BATCH, num_microbatches=num_microbatches)
    model = ParallelModel(plan, shape, dims, dims.build_mesh("cpu"),
                          ParallelismConfig(pipeline_model_parallel_size=2, pipeline_schedule="1f1b"),
                          torch.device("cpu"), seed=0, checkpoint_activations=False, autocast_dtype=None)
    model.set_train(True)
    batches = _microbatches(family, num_microbatches)
    peak = peak_tensor_bytes(lambda: model.run(batches, train=True))
    peaks: list[int] = [0] * dist.get_world_size()
    dist.all_gather_object(peaks, peak)
    return peaks


@pytest.mark.timeout(600)
def test_a_stage_holds_no_more_tensors_with_more_micro_batches(tmp_path):
    jobs = [(first_step_peaks, (family, count), {}) for family in ("t5", "gpt") for count in (FEW, MANY)]
    t5_few, t5_many, gpt_few, gpt_many = run_jobs(2, jobs, tmp_path)
    for family, few, many in (("t5", t5_few, t5_many), ("gpt", gpt_few, gpt_many)):
        for stage, (small, large) in enumerate(zip(few, many)):
            assert large <= BOUND * small, (f"{family} stage {stage}: {large / 2**20:.1f} MiB with {MANY} "
                                            f"micro-batches, {small / 2**20:.1f} MiB with {FEW}")
