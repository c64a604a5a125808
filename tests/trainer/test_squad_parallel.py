"""SQuAD fine-tuning under data and tensor parallelism follows the one-process run: the same global batches
(micro-batch x data-parallel size x accumulation), the same initial weights, the same losses.

One 2-process launch (gloo, CPU) runs DP 2 and TP 2; one process runs the reference with the same global
batch as accumulation. fp32, no dropout, a few AdamW steps on the synthetic rule set of `squad_testing`.
"""

from __future__ import annotations

import pytest
from process_testing import run_jobs
from squad_testing import ENGLISH, filler_words, write_synthetic_squad

from trainer.config import OptimizerConfig
from trainer.models.bert.squad.features import FeatureOptions
from trainer.models.bert.squad.finetune import ScratchShape, SquadConfig, finetune

MICRO_BATCH, GLOBAL_BATCH = 4, 8
# fp32 reductions in another order (TP's split matmuls, DP's gradient all-reduce) over a few AdamW steps.
LOSS_TOLERANCE = 1e-4


def squad_losses(train_file: str, vocab: str, tp: int, dp: int) -> list[float]:
    """The per-step losses of a short fine-tuning run in the current process group (or none)."""
    config = SquadConfig(train_file=train_file, vocab_file=vocab,
                         features=FeatureOptions(max_seq_length=40, doc_stride=8, max_query_length=8),
                         scratch=ScratchShape(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64),
                         optimizer=OptimizerConfig(lr=1e-3, min_lr=0.0, weight_decay=0.01),
                         epochs=0.5, micro_batch_size=MICRO_BATCH, num_microbatches=GLOBAL_BATCH // (MICRO_BATCH * dp),
                         tensor_model_parallel_size=tp, hidden_dropout=0.0, device="cpu")
    return finetune(config).losses


@pytest.mark.timeout(600)
def test_dp2_and_tp2_fine_tuning_follow_one_process(data_test, tmp_path):
    vocab = data_test / "tokenizers" / "wordpiece-vocab.txt"
    train = str(write_synthetic_squad(tmp_path / "train.json", filler_words(vocab, ENGLISH), ENGLISH, 64, seed=0))
    reference = squad_losses(train, str(vocab), tp=1, dp=1)
    dp2, tp2 = run_jobs(2, [(squad_losses, (train, str(vocab), 1, 2), {}),
                            (squad_losses, (train, str(vocab), 2, 1), {})], tmp_path)
    assert len(reference) >= 3
    assert dp2 == pytest.approx(reference, rel=LOSS_TOLERANCE)
    assert tp2 == pytest.approx(reference, rel=LOSS_TOLERANCE)
