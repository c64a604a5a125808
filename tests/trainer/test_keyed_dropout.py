"""Keyed dropout (``--keyed-dropout``): masks that are a function of where they apply, not of a random stream.

The hash agrees bit for bit with its numpy twin; masks keep 1 - p of the elements, differ between layers,
sites, samples (so steps) and seeds, and a rank's shard of a mask is the slice of the full mask; without
keys a site is exactly ``nn.Dropout``; activation checkpointing recomputes the same masks. End to end,
GPT and T5 runs with dropout 0.1 follow the single-process losses under tensor (and sequence), pipeline
and data parallelism, which plain dropout does not.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from trainer_testing import LOSS_RTOL, result_record, run_in_processes, t5_config, tiny_config

from trainer.cli.train_args import build_parser, config_from_args
from trainer.data.batches import SAMPLE_ID_KEY, stack_sample_ids
from trainer.parallel.keyed_dropout import (
    OUTSIDE_LAYERS,
    KeyedDropout,
    attention,
    drop_threshold,
    element_hashes,
    keep_mask,
    layer_keys,
    sample_keys,
    set_tensor_parallel,
)
from trainer.parallel.keyed_dropout_reference import combine_reference, hashes_reference, sample_keys_reference
from trainer.models.gpt.model import GPT, GPTShape
from trainer.models.t5.model import T5, T5Shape

P = 0.1
STEPS = 4
# Standard deviations of a binomial count the keep count may stray from its mean (a false alarm every 1.7e6 runs).
BINOMIAL_SIGMAS = 5
# Seeds and sample ids above 32 bits: both of their words are hashed.
WIDE_SEED, WIDE_ID = 2**33 + 1234, 2**40 + 7
# How far above the parity tolerance an effect must be to show that the tolerance could not hide it.
CLEARLY_ABOVE_TOLERANCE = 10


def keys_of(sample_ids: list[int], layer: int = 0, seed: int = 1234) -> torch.Tensor:
    return layer_keys(sample_keys(seed, torch.tensor(sample_ids)), layer)


# -- the hash -------------------------------------------------------------------------------------------------


def test_torch_hash_matches_the_numpy_twin_bit_for_bit():
    ids = np.array([0, 1, 9, 2**31 + 5, WIDE_ID], dtype=np.int64)
    for seed in (0, 1234, WIDE_SEED):
        keys = sample_keys(seed, torch.from_numpy(ids))
        reference = sample_keys_reference(seed, ids)
        assert keys.numpy().astype(np.uint32).tolist() == reference.tolist()
        for layer in (0, 7, OUTSIDE_LAYERS):
            layered = layer_keys(keys, layer)
            layered_reference = combine_reference(reference, np.full(ids.shape, layer, dtype=np.uint64))
            assert layered.numpy().tolist() == layered_reference.tolist()
            for shape, offsets in (((5, 3), (0,)), ((5, 4, 6), (8, 0)), ((5, 2, 3, 4), (2, 0, 12))):
                hashes = element_hashes(layered, 3, shape, offsets)
                assert hashes.dtype == torch.int64
                np.testing.assert_array_equal(hashes.numpy(), hashes_reference(layered_reference, 3, shape, offsets))


def test_keep_fraction_is_one_minus_p_within_a_binomial_bound():
    count = 64 * 128 * 128
    for p in (0.1, 0.5, 0.9):
        kept = int(keep_mask(keys_of([3]), 1, (1, 64, 128, 128), (0, 0, 0), p).sum())
        sigma = math.sqrt(count * p * (1 - p))
        assert abs(kept - count * (1 - p)) < BINOMIAL_SIGMAS * sigma, p
    assert drop_threshold(0.0) == 0 and drop_threshold(1.0) == 2**32


def agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a == b).float().mean())


def test_masks_differ_between_layers_sites_samples_steps_and_seeds():
    shape, offsets = (1, 16, 64), (0, 0)
    base = keep_mask(keys_of([0]), 2, shape, offsets, P)
    # Two independent masks agree on (1-p)^2 + p^2 = 0.82 of the elements; identical ones on all.
    independent = (1 - P) ** 2 + P**2
    others = {
        "layer": keep_mask(keys_of([0], layer=1), 2, shape, offsets, P),
        "site": keep_mask(keys_of([0]), 3, shape, offsets, P),
        "sample": keep_mask(keys_of([1]), 2, shape, offsets, P),
        # The next step reads the next global batch: its samples have other ids.
        "step": keep_mask(keys_of([8]), 2, shape, offsets, P),
        "seed": keep_mask(keys_of([0], seed=1235), 2, shape, offsets, P),
        "outside the layers": keep_mask(keys_of([0], layer=OUTSIDE_LAYERS), 2, shape, offsets, P),
    }
    for name, other in others.items():
        assert agreement(base, other) == pytest.approx(independent, abs=0.05), name
    assert torch.equal(base, keep_mask(keys_of([0]), 2, shape, offsets, P)), "a mask is a function of its keys"
    # Positions and features are coordinates too: the rows of one mask are not copies of each other.
    assert agreement(base[0, 0], base[0, 1]) == pytest.approx(independent, abs=0.1)


@pytest.mark.parametrize("site_dims, sequence_parallel, sharded_dim", [
    (dict(tensor_parallel_dim=1), False, 1),  # attention heads
    (dict(tensor_parallel_dim=-1), False, 2),  # MLP features
    (dict(sequence_dim=1), True, 1),  # the residual stream under sequence parallelism
    (dict(sequence_dim=1), False, None),  # ... which tensor parallelism alone replicates
])
def test_a_ranks_shard_of_a_mask_is_the_slice_of_the_full_mask(site_dims, sequence_parallel, sharded_dim):
    keys, full_shape, tp = keys_of([4, 5]), (2, 8, 6), 2
    full = KeyedDropout(P, **site_dims)(torch.ones(full_shape), keys, 1)
    shards = []
    for rank in range(tp):
        site = KeyedDropout(P, **site_dims)
        set_tensor_parallel(site, rank, sequence_parallel)
        local_shape = [n // tp if d == sharded_dim else n for d, n in enumerate(full_shape)]
        shards.append(site(torch.ones(local_shape), keys, 1))
    if sharded_dim is None:
        assert all(torch.equal(shard, full) for shard in shards)
    else:
        assert torch.equal(torch.cat(shards, dim=sharded_dim), full)


def test_kept_elements_are_scaled_by_one_over_one_minus_p():
    x = torch.randn(2, 32, 16)
    out = KeyedDropout(P)(x, keys_of([0, 1]), 0)
    kept = out != 0
    torch.testing.assert_close(out[kept], x[kept] / (1 - P))
    assert torch.equal(KeyedDropout(1.0)(x, keys_of([0, 1]), 0), torch.zeros_like(x))


def test_without_keys_or_in_eval_a_site_is_nn_dropout():
    x = torch.randn(4, 8, 16)
    torch.manual_seed(5)
    expected = torch.nn.Dropout(P)(x)
    torch.manual_seed(5)
    assert torch.equal(KeyedDropout(P)(x), expected)
    assert torch.equal(KeyedDropout(P).eval()(x, keys_of([0, 1, 2, 3]), 0), x)


def test_keyed_attention_is_sdpa_with_its_probabilities_masked():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    bias = torch.randn(1, 4, 8, 8)
    keys = keys_of([0, 1])
    # A p so small that nothing is dropped still takes the explicit path: it must equal the fused kernel.
    keep_all = KeyedDropout(1e-12)
    for mask, causal, scale in ((None, True, None), (bias, False, 1.0)):
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
        torch.testing.assert_close(attention(q, k, v, mask, causal, scale, keep_all, keys, 0), expected)
    dropout = KeyedDropout(P)
    probs = torch.softmax(q @ k.transpose(-2, -1) + bias, dim=-1)
    expected = (probs * keep_mask(keys, 0, tuple(probs.shape), (0, 0, 0), P) / (1 - P)) @ v
    torch.testing.assert_close(attention(q, k, v, bias, False, 1.0, dropout, keys, 0), expected)


# -- the models -----------------------------------------------------------------------------------------------


def tiny_gpt() -> GPT:
    return GPT(GPTShape(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64,
                        max_position_embeddings=16, padded_vocab_size=64, hidden_dropout=P, attention_dropout=P))


def tiny_t5() -> T5:
    return T5(T5Shape(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_heads=4, num_encoder_layers=2,
                      num_decoder_layers=2, dropout_rate=P))


def loss_and_grads(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], keys: torch.Tensor | None):
    model.zero_grad(set_to_none=True)
    loss = model(*inputs, dropout_keys=keys).square().mean()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("build", [tiny_gpt, tiny_t5])
def test_activation_checkpointing_recomputes_the_same_masks(build):
    torch.manual_seed(0)
    model = build()
    if isinstance(model, GPT):
        inputs = (torch.randint(0, 64, (2, 16)), torch.arange(16).expand(2, 16))
    else:
        inputs = (torch.randint(0, 64, (2, 12)), torch.randint(0, 64, (2, 6)), torch.ones(2, 12, dtype=torch.long))
    keys = sample_keys(1234, torch.tensor([10, 11]))
    loss, grads = loss_and_grads(model, inputs, keys)
    model.checkpoint_activations = True
    checkpointed_loss, checkpointed_grads = loss_and_grads(model, inputs, keys)
    assert torch.equal(loss, checkpointed_loss)
    assert all(torch.equal(a, b) for a, b in zip(grads, checkpointed_grads))
    # The keys do drop something: the loss without dropout differs.
    assert not torch.equal(loss, loss_and_grads(model.eval(), inputs, keys)[0])


def test_sample_ids_come_with_the_items_and_are_stacked():
    items = [{"tokens": torch.zeros(3), SAMPLE_ID_KEY: torch.tensor(i)} for i in (8, 9)]
    assert stack_sample_ids(items).tolist() == [8, 9]
    assert stack_sample_ids([{"tokens": torch.zeros(3)}]) is None


def test_the_flag_sets_the_parallelism_field():
    parser = build_parser()
    assert config_from_args(parser.parse_args(["--keyed-dropout"])).parallelism.keyed_dropout
    assert not config_from_args(parser.parse_args([])).parallelism.keyed_dropout


# -- layouts --------------------------------------------------------------------------------------------------


def with_dropout(config, keyed: bool = True):
    """``config`` with hidden and attention dropout P, and keyed dropout on or off."""
    return dataclasses.replace(config, model=dataclasses.replace(config.model, hidden_dropout=P, attention_dropout=P),
                               parallelism=dataclasses.replace(config.parallelism, keyed_dropout=keyed))


GPT_LAYOUTS = {"tp2": dict(tp=2), "tp2 sequence parallel": dict(tp=2, sequence_parallel=True), "pp2": dict(pp=2),
               "dp2": {}}
T5_LAYOUTS = {"tp2": dict(tensor_model_parallel_size=2), "pp2": dict(pipeline_model_parallel_size=2), "dp2": {}}


@pytest.fixture(scope="module")
def layout_runs(tiny_prefix, cache_dir, sentence_prefix, data_test, workdir) -> dict:
    """Single-process references and every 2-process layout, keyed (and one plain-dropout control)."""
    gpt = {name: with_dropout(tiny_config(tiny_prefix, cache_dir, train_iters=STEPS, **layout))
           for name, layout in GPT_LAYOUTS.items()}
    t5 = {name: with_dropout(t5_config(sentence_prefix, data_test, cache_dir, train_iters=STEPS, **layout))
          for name, layout in T5_LAYOUTS.items()}
    plain_gpt = with_dropout(tiny_config(tiny_prefix, cache_dir, train_iters=STEPS), keyed=False)
    configs = {**{("gpt", n): c for n, c in gpt.items()}, **{("t5", n): c for n, c in t5.items()},
               ("gpt", "dp2 plain dropout"): plain_gpt}
    results = dict(zip(configs, run_in_processes(2, list(configs.values()), workdir)))
    results[("gpt", "reference")] = result_record(with_dropout(tiny_config(tiny_prefix, cache_dir, train_iters=STEPS)))
    results[("gpt", "plain reference")] = result_record(plain_gpt)
    results[("gpt", "no dropout")] = result_record(tiny_config(tiny_prefix, cache_dir, train_iters=STEPS))
    results[("t5", "reference")] = result_record(with_dropout(t5_config(sentence_prefix, data_test, cache_dir,
                                                                        train_iters=STEPS)))
    return results


@pytest.mark.timeout(600)
@pytest.mark.parametrize("family, layout", [("gpt", name) for name in GPT_LAYOUTS]
                         + [("t5", name) for name in T5_LAYOUTS])
def test_keyed_dropout_runs_follow_the_single_process_losses(layout_runs, family, layout):
    losses, reference = layout_runs[(family, layout)]["losses"], layout_runs[(family, "reference")]["losses"]
    assert len(losses) == STEPS
    gap = np.max(np.abs(np.subtract(losses, reference)) / reference)
    print(f"{family} {layout}: max |loss - single process| / loss = {gap:.1e}")
    np.testing.assert_allclose(losses, reference, rtol=LOSS_RTOL, atol=0, err_msg=f"{family} {layout}")


@pytest.mark.timeout(600)
def test_dropout_is_active_and_plain_dropout_depends_on_the_layout(layout_runs):
    """The tolerance above could not hide the dropout: it changes the losses, and plain dropout's depend on
    the layout, by far more than LOSS_RTOL."""
    keyed, undropped = layout_runs[("gpt", "reference")]["losses"], layout_runs[("gpt", "no dropout")]["losses"]
    plain = layout_runs[("gpt", "plain reference")]["losses"]
    plain_dp2 = layout_runs[("gpt", "dp2 plain dropout")]["losses"]
    dropout_effect = np.max(np.abs(np.subtract(keyed, undropped)) / undropped)
    layout_effect = np.max(np.abs(np.subtract(plain, plain_dp2)) / plain)
    print(f"dropout changes the loss by {dropout_effect:.1e}, the layout plain dropout's by {layout_effect:.1e}")
    assert dropout_effect > CLEARLY_ABOVE_TOLERANCE * LOSS_RTOL
    assert layout_effect > CLEARLY_ABOVE_TOLERANCE * LOSS_RTOL
