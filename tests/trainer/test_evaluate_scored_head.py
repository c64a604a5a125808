"""Scoring runs the final norm and output head on the counted positions only, a bounded number of rows at a
time, and still gives transformers' scores; the family's spec says how a model is scored."""

import numpy as np
import pytest
from evaluate_testing import PPL_RTOL, hf_row_scores, tiny_hf  # noqa: F401
from hf_testing import hf_model
from torch import nn

import trainer.models.gpt.sharded as sharded_module
from trainer.errors import TrainConfigError
from trainer.evaluation.scoring import EvalModelConfig, ScoreRow, open_eval_model, score_rows
from trainer.models.dispatch import resolve_scoring_source
from trainer.models import model_spec
from trainer.models.gpt.generate import GPTSource

VOCAB = 50257


class RowCounter(nn.Module):
    """A head that records how many positions (rows) each call received."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.head, self.calls = head, []

    def forward(self, h):
        self.calls.append(h.shape[:-1].numel())
        return self.head(h)


def sample_rows() -> list[ScoreRow]:
    """Rows of different lengths, each counting a different range of its targets (none, one, several)."""
    rng = np.random.default_rng(7)
    spans = [(40, 30, 39), (25, 0, 24), (33, 32, 32), (12, 5, 9), (48, 16, 48)]
    return [ScoreRow(rng.integers(0, VOCAB, length + 1), first=first, last=last) for length, first, last in spans]


def test_head_sees_the_counted_positions_only(tiny_hf):
    rows = sample_rows()
    with open_eval_model(EvalModelConfig(load=str(tiny_hf), batch_size=len(rows), progress=False),
                         resolve_scoring_source(str(tiny_hf), 1)) as model:
        counter = model.sharded.head = RowCounter(model.sharded.head)
        scores = score_rows(model, rows, "rows")
    assert sum(counter.calls) == sum(row.last - row.first for row in rows)  # not 5 rows x 48 positions
    want = hf_row_scores(hf_model(tiny_hf), rows)
    assert [s.count for s in scores] == [row.last - row.first for row in rows]
    assert [s.greedy for s in scores] == [hit for _, hit in want]
    assert np.allclose([s.log_prob for s in scores], [lp for lp, _ in want], rtol=PPL_RTOL, atol=0)


def test_head_runs_in_bounded_chunks_with_the_same_scores(tiny_hf, monkeypatch):
    rows = sample_rows()
    config = EvalModelConfig(load=str(tiny_hf), batch_size=len(rows), progress=False)
    with open_eval_model(config, resolve_scoring_source(str(tiny_hf), 1)) as model:
        whole = score_rows(model, rows, "rows")
        monkeypatch.setattr(sharded_module, "SCORE_CHUNK_ELEMENTS", 3 * VOCAB)  # 3 rows of logits at a time
        counter = model.sharded.head = RowCounter(model.sharded.head)
        chunked = score_rows(model, rows, "rows")
    assert max(counter.calls) == 3 and sum(counter.calls) == sum(s.count for s in whole)
    assert [s.greedy for s in chunked] == [s.greedy for s in whole]
    assert np.allclose([s.log_prob for s in chunked], [s.log_prob for s in whole], rtol=PPL_RTOL, atol=0)


def test_a_family_is_scored_through_its_specs_scoring_source(tiny_hf):
    assert model_spec("gpt").scoring_source is not None and model_spec("t5").scoring_source is None
    source = resolve_scoring_source(str(tiny_hf), 1)
    assert isinstance(source, GPTSource)
    assert (source.vocab_size, source.max_positions, source.eod_id) == (VOCAB, 128, 50256)
    with pytest.raises(TrainConfigError, match="num_attention_heads .* is not divisible"):
        source.layout(3, 1, 3)
