"""``--cpu-offload`` at stage 1 (`trainer.parallel.zero.ShardedAdamW`): the offloaded step follows the step on the device;
when the parameters already live on the CPU it copies nothing (masters and gradients are views of the
parameters'); from a CUDA device the host masters and gradient buffers are pinned, and a checkpoint loaded into
the parameters reaches the host masters."""

import pytest
import torch
from torch import nn

from trainer.config import OptimizerConfig
from trainer.parallel.zero import ShardedAdamW, build_zero_optimizer, refresh_masters

STEPS = 5
# Offloaded (fused CPU AdamW) and device (foreach/fused) kernels round differently in the last bits only.
LOSS_ATOL = 1e-6
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def make_model(device: str) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).to(device)


def make_optimizer(model: nn.Module, offload: bool, device: str):
    config = OptimizerConfig(lr=1e-2, weight_decay=0.1)
    optimizer, _ = build_zero_optimizer(list(model.named_parameters()), config, 1 if offload else 0, offload,
                                        None, device)
    return optimizer


def train_losses(device: str, offload: bool) -> list[float]:
    model = make_model(device)
    optimizer = make_optimizer(model, offload, device)
    generator = torch.Generator().manual_seed(1)
    inputs, targets = torch.randn(32, 8, generator=generator), torch.randn(32, 4, generator=generator)
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(inputs.to(device)), targets.to(device))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_the_offloaded_step_follows_the_step_on_the_device(device):
    assert train_losses(device, offload=True) == pytest.approx(train_losses(device, offload=False), abs=LOSS_ATOL)


def test_offloading_from_the_cpu_copies_nothing():
    model = make_model("cpu")
    optimizer = make_optimizer(model, offload=True, device="cpu")
    assert isinstance(optimizer, ShardedAdamW) and not optimizer.copy_devices
    model(torch.ones(2, 8)).sum().backward()
    optimizer.step()
    for param, piece in optimizer.slices.items():
        assert not piece.offload and piece.host_grad is None
        assert piece.master.untyped_storage().data_ptr() == param.untyped_storage().data_ptr()
        assert piece.master.grad.untyped_storage().data_ptr() == param.grad.untyped_storage().data_ptr()


@CUDA
def test_offloading_from_cuda_keeps_masters_and_gradients_in_pinned_host_memory():
    model = make_model("cuda")
    optimizer = make_optimizer(model, offload=True, device="cuda")
    for piece in optimizer.slices.values():
        assert piece.offload and piece.master.device.type == "cpu"
        assert piece.master.is_pinned() and piece.host_grad.is_pinned()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_weights_loaded_into_the_parameters_reach_the_offloaded_masters(device):
    model = make_model(device)
    optimizer = make_optimizer(model, offload=True, device=device)
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(0.5)  # what loading a checkpoint in place does
    refresh_masters(optimizer)
    for piece in optimizer.slices.values():
        assert torch.equal(piece.master.detach().cpu(), torch.full_like(piece.master, 0.5).cpu())
