"""Megatron's recomputation flags, with Megatron's meaning (`trainer.parallel.recompute`).

Promised:
- ``--recompute-granularity full --recompute-method uniform --recompute-num-layers N`` recomputes every layer,
  N consecutive layers per checkpoint; ``block`` recomputes the first N layers of the stage (pipeline stage),
  each on its own, and no other; ``selective`` (also ``--recompute-activations``) recomputes the core of every
  attention and no whole layer: megatron-core's ``checkpointed_forward`` and ``core_attn``, observed by
  counting forward calls and their order in the backward pass;
- losses and gradients are those of the run without recomputation, to the bit (dropout included);
- the combinations megatron-core's TransformerConfig refuses are refused in one line naming the flags.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trainer.cli import train as train_cli
from trainer.config import RecomputeConfig
from trainer.models.bert.model import Bert, BertShape
from trainer.models.gpt.model import GPT, GPTShape
from trainer.models.t5.model import T5, T5Shape
from trainer.parallel.keyed_dropout import sample_keys
from trainer.parallel.recompute import Recompute, apply_recompute
from trainer_testing import result_record, tiny_config

LAYERS = 4
DROPOUT = 0.1


def tiny_gpt() -> GPT:
    return GPT(GPTShape(num_layers=LAYERS, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64,
                        max_position_embeddings=16, padded_vocab_size=64, hidden_dropout=DROPOUT,
                        attention_dropout=DROPOUT))


@pytest.mark.parametrize(("recompute", "count", "expected"), [
    (Recompute("full", "uniform", 1), 4, [(0, 1, True), (1, 2, True), (2, 3, True), (3, 4, True)]),
    (Recompute("full", "uniform", 2), 5, [(0, 2, True), (2, 4, True), (4, 5, True)]),
    (Recompute("full", "block", 2), 5, [(0, 1, True), (1, 2, True), (2, 5, False)]),
    (Recompute("full", "block", 7), 2, [(0, 1, True), (1, 2, True)]),
    (Recompute("selective"), 3, [(0, 3, False)]),
])
def test_layer_groups_follow_megatron_checkpointed_forward(recompute, count, expected):
    assert recompute.groups(count) == expected


def run_and_watch(recompute: Recompute | None):
    """A fresh tiny GPT's loss, gradients, forward calls per block, the blocks' calls during backward, and
    core-attention calls."""
    torch.manual_seed(0)
    model = tiny_gpt()
    tokens = torch.randint(0, 64, (2, 16))
    positions = torch.arange(16).expand(2, 16)
    if recompute is not None:
        apply_recompute(model, recompute)
    calls, backward_calls, in_backward = [0] * LAYERS, [], [False]

    def counter(index):
        def hook(module, args, kwargs):
            calls[index] += 1
            if in_backward[0]:
                backward_calls.append(index)
        return hook

    handles = [layer.register_forward_pre_hook(counter(i), with_kwargs=True)
               for i, layer in enumerate(model.layers.values())]
    core_calls = [0]
    sdpa = F.scaled_dot_product_attention

    def counting_sdpa(*args, **kwargs):
        core_calls[0] += 1
        return sdpa(*args, **kwargs)

    F.scaled_dot_product_attention = counting_sdpa
    try:
        torch.manual_seed(1)
        loss = model(tokens, positions).square().mean()
        in_backward[0] = True
        loss.backward()
    finally:
        F.scaled_dot_product_attention = sdpa
        for handle in handles:
            handle.remove()
    return loss.detach(), [p.grad.clone() for p in model.parameters()], calls, backward_calls, core_calls[0]


@pytest.mark.parametrize(("recompute", "forwards", "backward_order", "core"), [
    # (a recomputed layer runs its attention core again too)
    # uniform 1: every layer its own checkpoint, recomputed last to first
    (Recompute("full", "uniform", 1), [2, 2, 2, 2], [3, 2, 1, 0], 2 * LAYERS),
    # uniform 2: two checkpoints of two layers each: a group is recomputed whole, first layer first
    (Recompute("full", "uniform", 2), [2, 2, 2, 2], [2, 3, 0, 1], 2 * LAYERS),
    # block 2: the first two layers only
    (Recompute("full", "block", 2), [2, 2, 1, 1], [1, 0], LAYERS + 2),
    # selective: no layer, every attention core twice
    (Recompute("selective"), [1, 1, 1, 1], [], 2 * LAYERS),
])
def test_recomputes_the_layers_megatron_recomputes_with_the_same_loss_and_grads(recompute, forwards,
                                                                                 backward_order, core):
    plain_loss, plain_grads, plain_calls, _, plain_core = run_and_watch(None)
    assert plain_calls == [1] * LAYERS and plain_core == LAYERS
    loss, grads, calls, order, core_calls = run_and_watch(recompute)
    assert torch.equal(loss, plain_loss)
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads))
    assert calls == forwards
    assert order == backward_order
    assert core_calls == core


@pytest.mark.parametrize("recompute", [Recompute("full", "block", 1), Recompute("full", "uniform", 2),
                                       Recompute("selective")])
def test_t5_and_bert_recompute_with_the_same_loss_and_grads(recompute):
    def t5_loss(model):
        torch.manual_seed(3)
        inputs = (torch.randint(0, 64, (2, 12)), torch.randint(0, 64, (2, 6)), torch.ones(2, 12, dtype=torch.long))
        return model(*inputs, dropout_keys=sample_keys(1234, torch.tensor([10, 11]))).square().mean()

    def bert_loss(model):
        torch.manual_seed(3)
        tokens = torch.randint(0, 64, (2, 12))
        return model.encode(tokens, torch.zeros_like(tokens), torch.ones_like(tokens)).square().mean()

    builders = [
        (lambda: T5(T5Shape(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_heads=4, num_encoder_layers=2,
                            num_decoder_layers=2, dropout_rate=DROPOUT)), t5_loss),
        (lambda: Bert(BertShape(num_layers=3, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64,
                                max_position_embeddings=16, padded_vocab_size=64, hidden_dropout=DROPOUT,
                                attention_dropout=DROPOUT)), bert_loss),
    ]
    for build, loss_of in builders:
        results = []
        for policy in (None, recompute):
            torch.manual_seed(0)
            model = build()
            if policy is not None:
                apply_recompute(model, policy)
            loss = loss_of(model)
            loss.backward()
            results.append((loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
        (plain, plain_grads), (recomputed, grads) = results
        assert torch.equal(plain, recomputed)
        assert len(grads) == len(plain_grads) and all(torch.equal(a, b) for a, b in zip(grads, plain_grads))


def test_recompute_activations_is_selective_and_a_train_run_keeps_its_losses(reference, tiny_prefix, cache_dir):
    assert RecomputeConfig(recompute_activations=True).recompute_granularity == "selective"
    steps = 3
    for flags in ({"recompute_activations": True},
                  {"recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 1}):
        config = tiny_config(tiny_prefix, cache_dir, train_iters=steps)
        config.recompute = RecomputeConfig(**flags)
        assert result_record(config)["losses"] == reference["losses"][:steps]


@pytest.mark.parametrize(("flags", "named"), [
    (["--recompute-granularity", "full"], "--recompute-granularity full needs --recompute-method"),
    (["--recompute-granularity", "full", "--recompute-method", "block"], "--recompute-num-layers"),
    (["--recompute-method", "uniform"], "--recompute-method apply to --recompute-granularity full only"),
    (["--recompute-activations", "--recompute-num-layers", "2"], "--recompute-num-layers apply"),
    (["--recompute-activations", "--recompute-granularity", "full"], "--recompute-activations means"),
    (["--checkpoint-activations", "--recompute-activations"], "--checkpoint-activations"),
    (["--recompute-granularity", "some"], "--recompute-granularity"),
])
def test_inconsistent_recompute_flags_are_one_line(flags, named, tmp_path, capsys):
    before = sorted(tmp_path.iterdir())
    try:
        code = train_cli.main(["--dataset", str(tmp_path / "missing"), "--device", "cpu", *flags])
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], err
    assert "Traceback" not in err
    assert sorted(tmp_path.iterdir()) == before
