"""Context parallelism's pieces (`trainer.parallel.context`): Megatron's load-balanced layout (rank r of N keeps
chunks r and 2N-1-r of 2N), the causal mask of a block of local queries against the keys up to its end, the
gathered attention whose backward returns the key/value gradients to their owners (with grouped-query
attention), and the loss as the mean over all tokens of the sequence. Collectives run in spawned gloo processes."""

from __future__ import annotations

import pytest
import torch

from context_parallel_testing import attention_errors, dropout_attention_errors, loss_error
from process_testing import run_jobs
from trainer.parallel.context import ContextLayout, block_causal_mask

# float64 attention of a few dozen terms: a wrong position or a missing gradient is O(1), rounding ~1e-15.
TOLERANCE = 1e-10
# The loss is computed in float32 (`token_cross_entropy`): a few ulps of a mean near log(16).
LOSS_TOLERANCE = 1e-6


@pytest.mark.parametrize(("size", "rank", "expected"), [
    (1, 0, list(range(8))),
    (2, 0, [0, 1, 6, 7]),
    (2, 1, [2, 3, 4, 5]),
    (4, 0, [0, 7]),
    (4, 3, [3, 4]),
])
def test_rank_keeps_chunks_r_and_2n_minus_1_minus_r(size, rank, expected):
    assert ContextLayout(size, rank).local_indices(8).tolist() == expected


@pytest.mark.parametrize("size", [2, 4])
def test_the_ranks_together_hold_every_position_once(size):
    gathered = ContextLayout(size, 0).gathered_indices(16 // size)
    assert sorted(gathered.tolist()) == list(range(16))
    for rank in range(size):
        tokens = torch.arange(16).expand(3, 16)
        layout = ContextLayout(size, rank)
        assert torch.equal(layout.shard(tokens), layout.local_indices(16).expand(3, -1))


@pytest.mark.parametrize(("start", "block"), [(0, 4), (5, 4), (9, 2), (12, 4)])
def test_a_block_of_queries_sees_the_keys_up_to_its_own_position(start, block):
    # Queries at start..start+block-1 against keys 0..start+block-1: a view of one mask of 4 rows by 16 keys.
    rows, seq_len = 4, 16
    keys = start + block
    view = block_causal_mask(rows, seq_len, torch.float32, torch.device("cpu"))[rows - block:, seq_len - keys:]
    for row in range(block):
        assert torch.isinf(view[row]).tolist() == [key > start + row for key in range(keys)]


def test_a_sequence_that_does_not_divide_is_refused():
    with pytest.raises(ValueError, match="sequence length 10 is not divisible by 2 x context-parallel size \\(2\\)"):
        ContextLayout(2, 0).local_indices(10)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world_size", [2, 4])
def test_gathered_attention_and_its_gradients_match_one_process(world_size, tmp_path):
    seq_len = 8 * world_size
    # Multi-head (4 groups), grouped-query (2 groups) and multi-query (1 group) attention; with attention dropout
    # (multi-head and grouped-query); the loss.
    jobs = ([(attention_errors, (seq_len, groups), {}) for groups in (4, 2, 1)]
            + [(dropout_attention_errors, (seq_len, groups), {}) for groups in (4, 2)] + [(loss_error, (seq_len,), {})])
    *attention, loss = run_jobs(world_size, jobs, tmp_path)
    for errors in attention:
        assert max(errors.values()) < TOLERANCE, errors
    assert loss < LOSS_TOLERANCE
