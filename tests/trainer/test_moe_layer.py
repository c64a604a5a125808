"""The MoE layer against a plain per-token reference written here: routing (top-1/top-2, softmax before or
after top-k), capacity dropping, the auxiliary losses on hand-checked tiny cases, the grouped-GEMM backends."""

import math

import pytest
import torch
import torch.nn.functional as F

from trainer.optim.auxiliary_losses import pop_metrics, reduce_metrics
from trainer.moe.dispatch import capacity_keep_mask, expert_capacity
from trainer.moe.experts import (
    BATCHED,
    GROUPED_MM,
    LOOP,
    SEGMENTED,
    cpu_grouped_mm_available,
    grouped_matmul,
    select_backend,
)
from trainer.moe.layer import AUX_LOSS, DROPPED_FRACTION, MAX_LOAD, MIN_LOAD, METRIC_KINDS, Z_LOSS, MoELayer
from trainer.moe.router import load_balancing_loss, route, z_loss
from trainer.moe.settings import MoESettings

HIDDEN, FFN, EXPERTS = 8, 12, 4


def make_layer(activation="gelu", **settings) -> MoELayer:
    torch.manual_seed(0)
    layer = MoELayer(HIDDEN, FFN, activation, MoESettings(num_experts=EXPERTS, **settings))
    with torch.no_grad():
        for param in layer.parameters():
            param.normal_(0.0, 0.5)
    return layer


def reference_forward(layer: MoELayer, x: torch.Tensor) -> tuple[torch.Tensor, set[tuple[int, int]]]:
    """Token by token: route, apply each chosen expert's MLP, add with its gate. Capacity: walk first
    choices of all tokens, then second choices, each expert keeping its first `capacity` arrivals.

    Returns the output [T, hidden] and the dropped (token, slot) pairs."""
    s = layer.settings
    tokens = x.reshape(-1, HIDDEN)
    capacity = math.inf if s.capacity_factor is None else math.ceil(s.capacity_factor * len(tokens) * s.top_k / EXPERTS)
    choices = []
    for token in tokens:
        logits = layer.router.weight @ token
        if s.pre_softmax:
            gates, experts = torch.softmax(logits, 0).topk(s.top_k)
        else:
            top, experts = logits.topk(s.top_k)
            gates = torch.softmax(top, 0)
        choices.append(list(zip(experts.tolist(), gates)))
    taken, dropped = [0] * EXPERTS, set()
    for slot in range(s.top_k):
        for t, token_choices in enumerate(choices):
            expert = token_choices[slot][0]
            if taken[expert] >= capacity:
                dropped.add((t, slot))
            taken[expert] += 1
    out = torch.zeros_like(tokens)
    w = layer.experts
    for t, token in enumerate(tokens):
        for slot, (e, gate) in enumerate(choices[t]):
            if (t, slot) in dropped:
                continue
            hidden = token @ w.w1.weight[e]
            if w.w3 is None:
                hidden = F.gelu(hidden, approximate="tanh") if w.activation == "gelu" else F.relu(hidden)
            else:
                hidden = F.gelu(hidden, approximate="tanh") * (token @ w.w3.weight[e])
            out[t] += gate * (hidden @ w.w2.weight[e])
    return out, dropped


@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("pre_softmax", [False, True])
@pytest.mark.parametrize("activation", ["gelu", "gated-gelu"])
def test_dropless_layer_matches_the_per_token_reference_forward_and_backward(top_k, pre_softmax, activation):
    layer = make_layer(activation, top_k=top_k, pre_softmax=pre_softmax)
    x = torch.randn(3, 5, HIDDEN, requires_grad=True)
    out = layer(x)
    ref_x = x.detach().clone().requires_grad_(True)
    ref, dropped = reference_forward(layer, ref_x)
    assert not dropped
    torch.testing.assert_close(out.reshape(-1, HIDDEN), ref, atol=1e-5, rtol=1e-5)
    grad = torch.randn_like(ref)
    layer_grads = torch.autograd.grad(out.reshape(-1, HIDDEN), [x, *layer.parameters()], grad)
    ref_grads = torch.autograd.grad(ref, [ref_x, *layer.parameters()], grad, allow_unused=True)
    for got, want in zip(layer_grads, ref_grads):
        torch.testing.assert_close(got, torch.zeros_like(got) if want is None else want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("top_k", [1, 2])
def test_capacity_drops_the_same_assignments_as_the_reference_and_zeroes_fully_dropped_tokens(top_k):
    layer = make_layer(top_k=top_k, capacity_factor=0.5)
    x = torch.randn(2, 6, HIDDEN)
    out = layer(x).reshape(-1, HIDDEN)
    ref, dropped = reference_forward(layer, x)
    assert dropped, "capacity 0.5 must drop"
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    fully_dropped = [t for t in range(12) if all((t, slot) in dropped for slot in range(top_k))]
    for t in fully_dropped:
        assert torch.count_nonzero(out[t]) == 0  # the block's residual carries it through unchanged
    metrics = layer.pop_auxiliary_metrics()[DROPPED_FRACTION]
    assert (metrics.value, metrics.weight) == (len(dropped), 12 * top_k)
    # Deterministic: the same input drops the same assignments again.
    torch.testing.assert_close(layer(x).reshape(-1, HIDDEN), out, atol=0, rtol=0)


def test_capacity_keeps_first_choices_before_second_choices_in_token_order():
    experts = torch.tensor([[0, 1], [0, 1], [1, 0], [0, 2]])
    # capacity 2: expert 0 gets token 0 and 1 (first choices); token 3's first choice and token 2's second
    # choice are dropped; expert 1 gets token 2 (first), then tokens 0 and 1's second choices: token 1's dropped.
    keep = capacity_keep_mask(experts, num_experts=3, capacity=2)
    assert keep.tolist() == [[True, True], [True, False], [True, False], [False, True]]
    assert expert_capacity(num_tokens=4, top_k=2, num_experts=3, capacity_factor=0.75) == 2  # ceil(0.75*8/3)


def test_load_balancing_and_z_loss_on_a_hand_checked_case():
    logits = torch.tensor([[math.log(3.0), 0.0], [0.0, 0.0]])  # probs [0.75, 0.25] and [0.5, 0.5]
    routing = route(logits, top_k=1, pre_softmax=True)
    assert routing.experts.flatten().tolist() == [0, 0]  # the tie goes to expert 0
    counts = torch.tensor([2, 0])
    # E * sum_e f_e P_e = 2 * (1.0 * 0.625 + 0.0 * 0.375) = 1.25
    assert float(load_balancing_loss(routing.probs, counts, top_k=1)) == pytest.approx(1.25)
    # mean(logsumexp^2) = (log(4)^2 + log(2)^2) / 2
    assert float(z_loss(logits)) == pytest.approx((math.log(4.0) ** 2 + math.log(2.0) ** 2) / 2)
    # Perfect balance gives 1 for any E.
    uniform = torch.full((4, 4), 0.25)
    assert float(load_balancing_loss(uniform, torch.tensor([2, 2, 2, 2]), top_k=2)) == pytest.approx(1.0)


def test_post_softmax_top1_gates_with_one_and_pre_softmax_with_the_probability():
    logits = torch.tensor([[1.0, 2.0, 0.5]])
    assert route(logits, 1, pre_softmax=False).weights.item() == 1.0
    assert route(logits, 1, pre_softmax=True).weights.item() == pytest.approx(torch.softmax(logits, -1)[0, 1].item())
    top2 = route(logits, 2, pre_softmax=False)
    assert top2.experts.tolist() == [[1, 0]]
    torch.testing.assert_close(top2.weights, torch.softmax(torch.tensor([[2.0, 1.0]]), -1))


def test_auxiliary_losses_reach_the_router_gradient_with_their_coefficients():
    """The layer's backward equals the gradient of output + aux_coeff x balance + z_coeff x z-loss."""
    layer = make_layer(top_k=2, aux_loss_coeff=0.1, z_loss_coeff=0.01)
    x = torch.randn(10, HIDDEN)
    layer.auxiliary_loss_scale = 1.0
    layer(x).sum().backward()
    with_aux = layer.router.weight.grad.clone()
    layer.zero_grad()
    logits = x @ layer.router.weight.t()
    routing = route(logits, 2, False)
    counts = torch.bincount(routing.experts.flatten(), minlength=EXPERTS)
    extra = 0.1 * load_balancing_loss(routing.probs, counts, 2) + 0.01 * z_loss(logits)
    layer.eval()  # no attached loss in eval mode: the output alone
    (layer(x).sum() + extra).backward()
    torch.testing.assert_close(layer.router.weight.grad, with_aux)


def test_metrics_report_losses_dropped_fraction_and_expert_loads():
    layer = make_layer(top_k=1, aux_loss_coeff=0.01, z_loss_coeff=0.001, capacity_factor=1.0)
    x = torch.randn(16, HIDDEN)
    layer(x)
    layer(x)
    reported = reduce_metrics(pop_metrics([layer]), METRIC_KINDS)
    logits = (x @ layer.router.weight.t()).detach()
    counts = torch.bincount(logits.argmax(-1), minlength=EXPERTS)
    assert reported[AUX_LOSS] == pytest.approx(0.01 * float(load_balancing_loss(torch.softmax(logits, -1), counts, 1)))
    assert reported[Z_LOSS] == pytest.approx(0.001 * float(z_loss(logits)))
    assert reported[DROPPED_FRACTION] == pytest.approx(float((counts - 4).clamp(min=0).sum()) / 16)
    assert reported[MAX_LOAD] == pytest.approx(float(counts.max()) / 4)
    assert reported[MIN_LOAD] == pytest.approx(float(counts.min()) / 4)
    assert layer.pop_auxiliary_metrics() == {}
    # The runner asks for the step's last forwards (a pipeline's shape-inference pass came before them).
    for scale in (100.0, 1.0, 1.0):
        layer(scale * x)
    assert layer.pop_auxiliary_metrics(last_forwards=2)[MAX_LOAD].value == pytest.approx(reported[MAX_LOAD])
    layer(x)
    assert layer.pop_auxiliary_metrics(last_forwards=5)[DROPPED_FRACTION].weight == 16  # fewer than asked: all


def test_evaluation_and_generation_forwards_record_no_metrics():
    """Only a training step pops the records: forwards in eval mode (evaluation, generation) keep none, so a
    long generation does not pile them up."""
    layer = make_layer(top_k=1, aux_loss_coeff=0.01)
    layer.eval()
    with torch.no_grad():
        for _ in range(3):
            layer(torch.randn(16, HIDDEN))
    assert layer.pop_auxiliary_metrics() == {}


@pytest.mark.parametrize("backend", [BATCHED, GROUPED_MM, SEGMENTED])
def test_grouped_backends_compute_the_per_expert_loop_numbers(backend):
    torch.manual_seed(1)
    x, w = torch.randn(20, 8), torch.randn(4, 8, 16)
    counts = torch.tensor([5, 0, 12, 3])
    if backend == GROUPED_MM:
        try:
            torch._grouped_mm(x, w, offs=counts.cumsum(0).to(torch.int32))
        except RuntimeError:
            pytest.skip("torch._grouped_mm has no kernel for float32 on this device")
    want = grouped_matmul(x, w, counts, LOOP)
    torch.testing.assert_close(grouped_matmul(x, w, counts, backend), want, atol=1e-6, rtol=1e-6)
    # Every row is its own expert's product.
    torch.testing.assert_close(want[5:17], x[5:17] @ w[2])


def test_layer_freq_marks_every_kth_layer_from_layer_zero():
    settings = MoESettings(num_experts=4, layer_freq=2)
    assert [settings.is_moe_layer(i) for i in range(5)] == [True, False, True, False, True]


@pytest.mark.parametrize("activation", ["gelu", "relu", "gated-gelu"])
def test_expert_mlps_give_the_same_numbers_with_every_cpu_backend(activation):
    from trainer.moe.experts import GroupedExperts

    torch.manual_seed(2)
    experts = GroupedExperts(4, HIDDEN, FFN, activation)
    with torch.no_grad():
        for param in experts.parameters():
            param.normal_(0.0, 0.5)
    x, counts = torch.randn(9, HIDDEN), torch.tensor([0, 6, 0, 3])  # empty experts included
    outputs = {}
    for backend in (LOOP, BATCHED, SEGMENTED):
        experts.backend = backend
        outputs[backend] = experts(x, counts)
    torch.testing.assert_close(outputs[BATCHED], outputs[LOOP], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(outputs[SEGMENTED], outputs[LOOP], atol=0, rtol=0)  # the same mm per expert


def test_input_jitter_perturbs_only_the_routers_input_and_only_in_training():
    layer = make_layer(top_k=1, pre_softmax=True, input_jitter_eps=0.5)
    x = torch.randn(64, HIDDEN)
    layer.eval()
    plain = layer(x)
    torch.testing.assert_close(plain, reference_forward(layer, x)[0], atol=1e-5, rtol=1e-5)
    layer.train()
    torch.manual_seed(3)
    jittered = layer(x)
    assert not torch.allclose(jittered, plain)  # different gates (and some different experts)
    torch.manual_seed(3)
    torch.testing.assert_close(layer(x), jittered, atol=0, rtol=0)  # the noise comes from torch's generator
    # The experts see x unchanged: a token routed to the same expert differs only by its gate.
    torch.manual_seed(3)
    noise = torch.empty_like(x).uniform_(0.5, 1.5)
    routing = route((x * noise) @ layer.router.weight.t(), 1, True)
    layer.eval()
    same = routing.experts[:, 0] == route(x @ layer.router.weight.t(), 1, True).experts[:, 0]
    ratio = routing.weights[:, 0] / torch.softmax(x @ layer.router.weight.t(), -1).gather(1, routing.experts)[:, 0]
    torch.testing.assert_close(jittered[same], plain[same] * ratio[same, None], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", [SEGMENTED, GROUPED_MM])
def test_per_expert_backends_give_the_loops_gradients_to_the_bit(backend):
    """The CPU paths run the loop's very matmuls, forward and backward (empty experts get zero gradients)."""
    if backend == GROUPED_MM and not cpu_grouped_mm_available(torch.float32):
        pytest.skip("this torch has no CPU torch._grouped_mm")
    torch.manual_seed(3)
    x, w = torch.randn(20, 8, requires_grad=True), torch.randn(4, 8, 12, requires_grad=True)
    counts, grad = torch.tensor([5, 0, 12, 3]), torch.randn(20, 12)
    got = torch.autograd.grad(grouped_matmul(x, w, counts, backend), [x, w], grad)
    want = torch.autograd.grad(grouped_matmul(x, w, counts, LOOP), [x, w], grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert not got[1][1].any()


def test_cpu_picks_grouped_mm_for_aligned_rows_and_segmented_otherwise():
    x = torch.randn(6, 8)
    aligned = GROUPED_MM if cpu_grouped_mm_available(torch.float32) else SEGMENTED
    assert select_backend(x, torch.empty(4, 8, 12)) == aligned
    assert select_backend(x, torch.empty(4, 8, 13)) == SEGMENTED  # 13 float32 rows: 52 bytes, not 16-aligned
