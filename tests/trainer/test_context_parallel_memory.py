"""Context parallelism cuts a rank's activation memory with the sequence it holds: at CP 4 a rank's peak of
activation bytes in one training step is at most 0.3x one process's (issue 32; the ideal is 0.25x, the rest
is what attention over the whole sequence needs: the gathered keys/values' buffer, which the run keeps).

Measured as `test_pipeline_memory.py` measures pipeline stages (`peak_tensor_bytes`): the profiler's allocation
record (every CPU allocation and free, in order, from the step's start) of one forward and backward of a
micro-batch of one sequence, the first step (so that buffers allocated on first use are counted). One process
(a model of its own in the first of 4 spawned gloo processes), then the 4 processes at CP 4, each measuring its
own; the largest rank counts. A narrow model (GPT-2 shape, 2 blocks, width 64, vocabulary 512, fp32), so that
the sequence-long activations, not the weights, are what is measured: at sequence 4,096 by default and at the
issue's 16,384 under ``pytest -m campaign`` (both measured 0.280x on every rank, run after run: the collectives
work in place on one buffer the run keeps, so no buffer's release is left to gloo's worker threads, which the
record does not see).

What makes it so: attention runs over blocks of `QUERY_BLOCK` local queries against the keys up to each block's
end (no mask larger than a block by the sequence); its backward gathers the keys and values again and runs each
block again, accumulating the blocks' key/value gradients in one tensor of the sequence, so no rank keeps the
gathered keys and values between the forward and the backward; the blocks' result is one process's attention
(checked with gradients, with chunks that do not divide into whole blocks)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from context_parallel_testing import attention_errors
from process_testing import run_jobs
from test_pipeline_memory import peak_tensor_bytes

from trainer.config import ParallelismConfig
from trainer.models.gpt.data import GPTMicroBatch
from trainer.models.gpt.model import GPTShape
from trainer.models.gpt.spec import PLAN as GPT_PLAN
from trainer.parallel.context import QUERY_BLOCK
from trainer.parallel.dims import ParallelDims
from trainer.parallel.runner import ParallelModel

CP = 4
# The issue's bound: a CP 4 rank's peak within 0.3x one process's.
BOUND = 0.3
FAST_SEQ, ISSUE_SEQ = 4096, 16384
VOCAB = 512
# float64 attention: a wrong block boundary or mask is O(1), rounding ~1e-15.
TOLERANCE = 1e-10


def _shape(seq_len: int) -> GPTShape:
    return GPTShape(num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=256,
                    max_position_embeddings=seq_len, padded_vocab_size=VOCAB)


def step_peak(seq_len: int, cp: int) -> int:
    """`peak_tensor_bytes` of one training step of one sequence of ``seq_len`` tokens on this rank, at
    context-parallel size ``cp`` (1: a model of its own, no collective; otherwise over the world's ranks)."""
    dims = ParallelDims(pp=1, dp=1, tp=1, micro_batch_size=1, num_microbatches=1, cp=cp)
    model = ParallelModel(GPT_PLAN, _shape(seq_len), dims, dims.build_mesh("cpu") if cp > 1 else None,
                          ParallelismConfig(context_parallel_size=cp), torch.device("cpu"), seed=0,
                          checkpoint_activations=False, autocast_dtype=None)
    model.set_train(True)
    generator = torch.Generator().manual_seed(0)
    tokens, targets = (torch.randint(VOCAB, (1, seq_len), generator=generator) for _ in range(2))
    batch = GPTMicroBatch(tokens=tokens, position_ids=torch.arange(seq_len)[None], targets=targets)
    return peak_tensor_bytes(lambda: model.run([batch], train=True))


def one_process_and_cp_peaks(seq_len: int) -> tuple[int, list[int]]:
    """One process's `step_peak` (measured by rank 0 while the others wait: one launch serves both) and every
    CP 4 rank's (collective over the 4 processes)."""
    single = step_peak(seq_len, 1) if dist.get_rank() == 0 else 0
    dist.barrier()
    peaks: list[int] = [0] * dist.get_world_size()
    dist.all_gather_object(peaks, step_peak(seq_len, CP))
    return single, peaks


def measured_ratio(seq_len: int, tmp_path) -> tuple[int, list[int]]:
    """One process's peak and the CP 4 ranks' peaks (bytes) at ``seq_len``."""
    (single, ranks), = run_jobs(CP, [(one_process_and_cp_peaks, (seq_len,), {})], tmp_path)
    return single, ranks


def _assert_within_bound(single: int, ranks: list[int]) -> None:
    for rank, peak in enumerate(ranks):
        assert peak <= BOUND * single, (f"CP {CP} rank {rank}: {peak / 2**20:.1f} MiB, one process "
                                        f"{single / 2**20:.1f} MiB ({peak / single:.3f}x)")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("seq_len", [FAST_SEQ, pytest.param(ISSUE_SEQ, marks=pytest.mark.campaign)])
def test_a_cp4_rank_holds_under_0_3x_one_process_activations(seq_len, tmp_path):
    _assert_within_bound(*measured_ratio(seq_len, tmp_path))


@pytest.mark.timeout(300)
def test_blocked_attention_with_a_partial_last_block_matches_one_process(tmp_path):
    # CP 2: chunks of 2 whole blocks and a partial one; multi-head and grouped-query attention.
    seq_len = 2 * 2 * (2 * QUERY_BLOCK + QUERY_BLOCK // 3)
    for errors in run_jobs(2, [(attention_errors, (seq_len, groups), {}) for groups in (4, 2)], tmp_path):
        assert max(errors.values()) < TOLERANCE, errors
