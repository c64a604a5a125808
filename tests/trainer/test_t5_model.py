"""The T5 model on its own: position buckets, variants, checkpointing and the pipeline-stage protocol."""

from __future__ import annotations

import pytest
import torch

from trainer.models.t5.model import T5, T5Shape, position_bias, relative_position_bucket
from trainer.models.t5.pipeline import split_t5_stage


def shape(**overrides) -> T5Shape:
    options = dict(vocab_size=96, d_model=32, d_kv=8, d_ff=48, num_heads=4, num_encoder_layers=3,
                   num_decoder_layers=3, relative_attention_num_buckets=8, relative_attention_max_distance=20)
    return T5Shape(**(options | overrides))


def inputs(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    encoder = torch.randint(2, 96, (2, 10), generator=generator)
    mask = torch.ones_like(encoder)
    mask[0, 6:] = 0
    return encoder, torch.randint(2, 96, (2, 7), generator=generator), mask


@pytest.mark.parametrize("bidirectional", [True, False])
def test_position_buckets_match_hugging_face(bidirectional):
    from transformers.models.t5.modeling_t5 import T5Attention

    relative = torch.arange(-300, 300)[None, :] - torch.arange(0, 40)[:, None]
    for buckets, distance in ((32, 128), (8, 20)):
        expected = T5Attention._relative_position_bucket(relative, bidirectional, buckets, distance)
        assert torch.equal(relative_position_bucket(relative, bidirectional, buckets, distance), expected)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("query_length,key_length,query_offset",
                         [(10, 10, 0), (1, 40, 39), (3, 12, 9), (1, 1, 0), (7, 30, 0), (30, 7, 0)])
def test_position_bias_is_each_pairs_bucket_row(bidirectional, query_length, key_length, query_offset):
    # The definition: bias[0, h, q, k] = rows[bucket(k - (query_offset + q)), h]; its gradient sums the pairs of
    # each bucket. float64, where the windows' order of addition cannot show.
    rows = torch.randn(8, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    query = torch.arange(query_offset, query_offset + query_length)[:, None]
    buckets = relative_position_bucket(torch.arange(key_length)[None, :] - query, bidirectional, 8, 20)
    expected = rows[buckets].permute(2, 0, 1)[None]
    bias = position_bias(rows, bidirectional, 20, query_length, key_length, query_offset)
    assert torch.equal(bias, expected)
    assert bias.is_contiguous()  # as SDPA's fused kernels want their inputs
    upstream = torch.randn(bias.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(torch.autograd.grad(bias, rows, upstream)[0],
                               torch.autograd.grad(expected, rows, upstream)[0], rtol=1e-12, atol=1e-12)


def test_every_attention_mask_handed_to_sdpa_has_contiguous_keys(monkeypatch):
    # On CUDA, SDPA's fused kernels refuse a mask whose last dimension is strided (sdp_utils'
    # check_last_dim_stride_equals_1_dense; the CPU's kernels accept it) and fall back to the math path, in
    # float32: T5's encoder did, its masks built from a permuted lookup of the position bias.
    strides = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, **kwargs):
        strides.append(None if attn_mask is None else attn_mask.stride(-1))
        return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    encoder, decoder, mask = inputs()  # the first sequence padded: a padding bias joins the encoder's
    model = T5(shape())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(encoder, decoder, mask).float().square().mean().backward()
    attentions = model.shape.num_encoder_layers + 2 * model.shape.num_decoder_layers  # decoder: self and cross
    assert len(strides) == attentions and set(strides) == {1}


def test_variants_tie_and_gate_as_configured():
    v1_0 = T5(shape(feed_forward="relu", tie_word_embeddings=True))
    mt5 = T5(shape(feed_forward="gated-gelu", tie_word_embeddings=False, scale_decoder_outputs=False))
    assert v1_0.output.weight is v1_0.shared.weight and v1_0.decoder_layers["0"].feed_forward.w3 is None
    assert mt5.output.weight is not mt5.shared.weight and mt5.decoder_layers["0"].feed_forward.w3 is not None
    with pytest.raises(ValueError, match="feed_forward"):
        shape(feed_forward="swiglu")


def test_activation_checkpointing_changes_nothing():
    torch.manual_seed(0)
    model = T5(shape(feed_forward="gated-gelu"))
    encoder, decoder, mask = inputs()

    def loss_and_grads():
        model.zero_grad()
        loss = model(encoder, decoder, mask).square().mean()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    plain_loss, plain_grads = loss_and_grads()
    model.checkpoint_activations = True
    loss, grads = loss_and_grads()
    assert torch.equal(loss, plain_loss)
    for grad, plain in zip(grads, plain_grads):
        torch.testing.assert_close(grad, plain, rtol=0, atol=1e-6)


@pytest.mark.parametrize("num_stages", [2, 3, 6])
def test_pipeline_stages_in_sequence_compute_the_whole_model(num_stages):
    torch.manual_seed(0)
    model = T5(shape()).eval()
    encoder, decoder, mask = inputs()
    stages = [split_t5_stage(model, stage_id, num_stages) for stage_id in range(num_stages)]
    names = set()
    for stage in stages:
        names |= {name for name, _ in stage.named_parameters()}
    # Every parameter lives on some stage, under its full-model name (the tied head is a copy on the last).
    assert names == {name for name, _ in model.named_parameters()} | {"output.weight"}
    with torch.no_grad():
        outputs = (encoder, decoder, mask)
        for stage in stages:
            outputs = stage(*outputs)
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        torch.testing.assert_close(outputs[0], model(encoder, decoder, mask), rtol=0, atol=1e-5)
