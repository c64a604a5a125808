"""BERT under tensor, pipeline and data parallelism follows the single-process loss curve (CPU, gloo).

One 2-process launch runs every layout in turn (process start-up dominates on CPU); each layout trains
the same tiny BERT with the trainer's `ParallelModel` (BERT's plan) from the same seed on the same
masked-LM + sentence-order batches for STEPS AdamW steps, and its per-step losses must match a
single-process run within LOSS_TOLERANCE. The model with the binary head and without it both run.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from process_testing import run_jobs

from trainer.config import OptimizerConfig, ParallelismConfig
from trainer.data.batches import IGNORE_INDEX
from trainer.errors import TrainConfigError
from trainer.optim.grads import reduce_loss
from trainer.models.bert.data import bert_loss, collate_bert
from trainer.models.bert.model import Bert, BertShape
from trainer.models.bert.pipeline import split_stage
from trainer.models.bert.spec import PLAN as BERT_PLAN
from trainer.optim.optimizer import build_optimizer
from trainer.parallel.dims import ParallelDims
from trainer.parallel.runner import ParallelModel

STEPS = 8
LOSS_TOLERANCE = 1e-4
VOCAB, SEQ = 64, 12  # the vocabulary divisible by the tensor-parallel size
MICRO_BATCH, NUM_MICROBATCHES = 2, 2
DISTINCT_BATCHES = 2
CLS, SEP, MASK = 2, 3, 4


def tiny_shape(binary_head: bool = True, num_layers: int = 2) -> BertShape:
    return BertShape(num_layers=num_layers, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64,
                     max_position_embeddings=16, padded_vocab_size=VOCAB, binary_head=binary_head)


def make_item(rng: np.random.RandomState) -> dict[str, np.ndarray | int]:
    """A BERT item as `samplers.bert.dataset.BertDataset` gives it: [CLS] A [SEP] B [SEP], padding, 2-3 masked."""
    length = rng.randint(7, SEQ + 1)
    split = rng.randint(2, length - 2)
    text = np.zeros(SEQ, np.int64)
    text[:length] = rng.randint(5, VOCAB, size=length)
    text[[0, split, length - 1]] = CLS, SEP, SEP
    masked = rng.choice(np.arange(1, split), size=min(2, split - 1), replace=False)
    labels = np.full(SEQ, -1, np.int64)
    labels[masked] = text[masked]
    text[masked] = MASK
    loss_mask = (labels >= 0).astype(np.int64)
    types = ((np.arange(SEQ) > split) & (np.arange(SEQ) < length)).astype(np.int64)
    return {"text": text, "types": types, "labels": labels, "is_random": int(rng.randint(2)),
            "padding_mask": (np.arange(SEQ) < length).astype(np.int64), "loss_mask": loss_mask}


def make_batches() -> list[list[dict]]:
    """STEPS global batches of NUM_MICROBATCHES x MICRO_BATCH items: two batches in turn, which the model
    learns within STEPS steps (random labels otherwise leave the loss curve flat)."""
    rng = np.random.RandomState(0)
    distinct = [[make_item(rng) for _ in range(MICRO_BATCH * NUM_MICROBATCHES)] for _ in range(DISTINCT_BATCHES)]
    return [distinct[step % DISTINCT_BATCHES] for step in range(STEPS)]


def split_micro(items):
    return [items[i : i + MICRO_BATCH] for i in range(0, len(items), MICRO_BATCH)]


def run_parallel_bert(batches, binary_head: bool = True, num_layers: int = 2, pp: int = 1, dp: int = 1, tp: int = 1,
                      checkpoint_activations: bool = False, **parallelism) -> list[float]:
    """The trainer's way: `ParallelModel` with BERT's plan on a (pp, dp, tp) mesh, `run` per step, the logged
    mean loss."""
    dims = ParallelDims(pp=pp, dp=dp, tp=tp, micro_batch_size=MICRO_BATCH,
                        num_microbatches=NUM_MICROBATCHES * MICRO_BATCH // (MICRO_BATCH * dp))
    mesh = dims.build_mesh("cpu") if dims.world_size > 1 else None
    config = ParallelismConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, **parallelism)
    model = ParallelModel(BERT_PLAN, tiny_shape(binary_head, num_layers), dims, mesh, config, torch.device("cpu"),
                          seed=0, checkpoint_activations=checkpoint_activations, autocast_dtype=None)
    optimizer = build_optimizer(model.named_parameters(), OptimizerConfig(lr=3e-3, weight_decay=0.0), foreach=False)
    dp_rank = mesh.get_local_rank("dp") if mesh is not None else 0
    model.set_train(True)
    losses = []
    for step_items in batches:
        # Megatron's order: each micro-step takes MICRO_BATCH x dp samples, rank r the r-th slice.
        mine = [items for k, items in enumerate(split_micro(step_items)) if k % dp == dp_rank]
        optimizer.zero_grad(set_to_none=True)
        micro = [collate_bert(items, VOCAB, binary_head) for items in mine]
        loss_sum, holds_loss = model.run(micro, train=True)
        optimizer.step()
        losses.append(reduce_loss(loss_sum, holds_loss, dims.num_microbatches, dp * tp))
    return losses


def test_targets_pack_mlm_labels_then_the_sentence_order_label():
    items = [make_item(np.random.RandomState(seed)) for seed in range(2)]
    batch = collate_bert(items, VOCAB)
    assert batch.targets.shape == (2, SEQ + 1)
    assert batch.targets[:, -1].tolist() == [item["is_random"] for item in items]
    for row, item in zip(batch.targets, items):
        expected = np.where(item["loss_mask"] == 1, item["labels"], IGNORE_INDEX)
        assert row[:-1].tolist() == expected.tolist()
    assert (collate_bert(items, VOCAB, binary_head=False).targets[:, -1] == IGNORE_INDEX).all()


def test_loss_is_mlm_plus_sentence_order_cross_entropy():
    torch.manual_seed(0)
    mlm, order = torch.randn(2, SEQ, VOCAB), torch.randn(2, 2)
    targets = torch.full((2, SEQ + 1), IGNORE_INDEX)
    targets[0, 3], targets[1, 5], targets[:, -1] = 7, 9, torch.tensor([1, 0])
    expected_mlm = torch.nn.functional.cross_entropy(torch.stack([mlm[0, 3], mlm[1, 5]]), torch.tensor([7, 9]))
    expected = expected_mlm + torch.nn.functional.cross_entropy(order, torch.tensor([1, 0]))
    torch.testing.assert_close(bert_loss((mlm, order), targets), expected)
    torch.testing.assert_close(bert_loss((mlm,), targets), expected_mlm)
    # A micro-batch whose samples mask no token adds 0, not NaN.
    assert bert_loss((mlm,), torch.full((2, SEQ + 1), IGNORE_INDEX)).item() == 0.0


def test_pipeline_stages_keep_full_model_names():
    model = Bert(tiny_shape(num_layers=4))
    first, last = split_stage(model, 0, 2), split_stage(model, 1, 2)
    names = set(dict(first.named_parameters())) | set(dict(last.named_parameters()))
    assert names | {"lm_head.decoder.weight"} == set(dict(model.named_parameters())) | {"lm_head.decoder.weight"}
    assert "layers.0.attention.wq.weight" in dict(first.named_parameters())
    assert "layers.3.ffn_norm.weight" in dict(last.named_parameters())
    assert last.word_embeddings is None and first.lm_head is None
    with pytest.raises(TrainConfigError, match=r"num_layers \(4\) is not divisible .* \(3\)"):
        split_stage(model, 0, 3)


def test_activation_checkpointing_gives_the_same_losses():
    batches = make_batches()[:3]
    assert run_parallel_bert(batches, checkpoint_activations=True) == run_parallel_bert(batches)


LAYOUTS = {
    "tp2": dict(tp=2),
    "tp2 no binary head": dict(tp=2, binary_head=False),
    "pp2": dict(pp=2),
    "pp2 interleaved, 4 layers": dict(pp=2, num_layers=4, pipeline_schedule="interleaved",
                                      num_layers_per_virtual_pipeline_stage=1),
    "dp2 ddp": dict(dp=2),
    "dp2 fsdp": dict(dp=2, zero_stage=3),
}


@pytest.mark.slow
def test_tp_pp_dp_follow_the_single_process_losses(tmp_path):
    batches = make_batches()
    references = {}
    for layout in LAYOUTS.values():
        key = (layout.get("binary_head", True), layout.get("num_layers", 2))
        if key not in references:
            references[key] = run_parallel_bert(batches, binary_head=key[0], num_layers=key[1])
    assert all(losses[-1] < losses[0] for losses in references.values()), "the references should learn"
    results = run_jobs(2, [(run_parallel_bert, (batches,), layout) for layout in LAYOUTS.values()], tmp_path)
    for (name, layout), losses in zip(LAYOUTS.items(), results):
        reference = references[(layout.get("binary_head", True), layout.get("num_layers", 2))]
        gap = np.max(np.abs(np.subtract(losses, reference)))
        print(f"{name}: max |loss - single process| over {STEPS} steps = {gap:.2e}")
        assert len(losses) == STEPS
        np.testing.assert_allclose(losses, reference, atol=LOSS_TOLERANCE, rtol=0, err_msg=name)
