"""bf16 autocast covers the forward only, as PyTorch's AMP recipe has it.

Promised: with ``autocast_dtype`` the runner's training forward and backward (`ParallelModel.run`) issue the same
tensor operators, with the same dtypes, as PyTorch's own loop over the same model (forward and loss under
``torch.autocast``, backward outside it); only the step's scalar loss bookkeeping differs. Under autocast the
backward's own products would be cast again: on a CPU, T5's attention gradients went through fp32 -> bf16 -> fp32
copies (hundreds of extra kernels a step at full size) and were computed in bf16 where the forward used fp32.
"""

from __future__ import annotations

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trainer.config import ParallelismConfig
from trainer.data.batches import MicroBatch
from trainer.models import model_spec
from trainer.models.gpt.data import GPTMicroBatch
from trainer.models.gpt.model import GPTShape
from trainer.models.t5.data import T5MicroBatch
from trainer.models.t5.model import T5Shape
from trainer.parallel.dims import ParallelDims
from trainer.parallel.runner import ParallelModel

VOCAB, BATCH, SEQ, DECODER_SEQ = 128, 2, 16, 8
SHAPES = {
    "gpt": GPTShape(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=128,
                    max_position_embeddings=SEQ, padded_vocab_size=VOCAB),
    "t5": T5Shape(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_heads=4, num_encoder_layers=2,
                  num_decoder_layers=2, feed_forward="gated-gelu"),
}


def micro_batch(family: str) -> MicroBatch:
    generator = torch.Generator().manual_seed(0)

    def ids(length: int) -> torch.Tensor:
        return torch.randint(0, VOCAB, (BATCH, length), generator=generator)

    if family == "gpt":
        return GPTMicroBatch(ids(SEQ), torch.arange(SEQ).expand(BATCH, SEQ), ids(SEQ))
    return T5MicroBatch(ids(SEQ), ids(DECODER_SEQ), torch.ones(BATCH, SEQ, dtype=torch.int64), ids(DECODER_SEQ))


class TensorOperators(TorchDispatchMode):
    """Counts each operator call on a tensor of more than one element: (name, its tensors' dtypes) -> calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if any(t.numel() > 1 for t in tensors):
            self.calls[func.__name__, tuple(str(t.dtype) for t in tensors)] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("family", ["gpt", "t5"])
def test_the_training_step_issues_the_operators_of_pytorchs_amp_loop(family):
    plan = model_spec(family).parallel_plan
    dims = ParallelDims(pp=1, dp=1, tp=1, micro_batch_size=BATCH, num_microbatches=1)
    ours = ParallelModel(plan, SHAPES[family], dims, None, ParallelismConfig(), torch.device("cpu"), 1, False,
                         torch.bfloat16)
    ours.set_train(True)
    plain = plan.build(SHAPES[family])
    plain.load_state_dict({name: p.detach() for name, p in ours.named_parameters()}, strict=False)  # tied: once
    batch = micro_batch(family)

    def plain_step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = plan.loss(plain(*plan.model_inputs(batch)), batch.targets)
        loss.backward()

    ours_operators, plain_operators = TensorOperators(), TensorOperators()
    with ours_operators:
        ours.run([batch], train=True)
    with plain_operators:
        plain_step()
    assert ours_operators.calls == plain_operators.calls


def test_the_backward_runs_outside_autocast():
    plan = model_spec("gpt").parallel_plan
    dims = ParallelDims(pp=1, dp=1, tp=1, micro_batch_size=BATCH, num_microbatches=1)
    model = ParallelModel(plan, SHAPES["gpt"], dims, None, ParallelismConfig(), torch.device("cpu"), 1, False,
                          torch.bfloat16)
    autocast_in_backward = []

    def record(grad: torch.Tensor) -> None:
        autocast_in_backward.append(torch.is_autocast_enabled("cpu"))

    for _, param in model.named_parameters():
        param.register_hook(record)
    model.run([micro_batch("gpt")], train=True)
    assert autocast_in_backward and not any(autocast_in_backward)
