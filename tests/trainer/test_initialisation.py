"""Every layout starts from the same weights, bit for bit.

The model is built, split and sharded on the meta device; each rank then allocates its own share and
fills it with that share of the full model's initial values, drawn parameter by parameter from the
seed. So no rank ever holds the whole model, and tensor, pipeline and sharded data parallel runs
begin exactly where the single-process run begins.
"""

import dataclasses
import hashlib

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from trainer_testing import TINY_VOCAB, tiny_config

from trainer.models import model_spec
from trainer.parallel.dims import resolve_parallel_dims
from trainer.models.gpt.spec import PLAN as GPT_PLAN
from trainer.parallel.runner import ParallelModel
from trainer.models.gpt.training import model_shape

LAYOUTS = {"tp2": {"tp": 2}, "pp2": {"pp": 2}, "pp2_interleaved": {"pp": 2, "schedule": "interleaved",
                                                                    "virtual_layers": 1},
           "dp2_fsdp": {"distributed_optimizer": True}}


def initial_digests(prefix: str, cache: str, layout: dict) -> dict[str, list[str]]:
    """sha256 of each parameter's full initial value, from every rank: name -> the digests seen."""
    config = tiny_config(prefix, cache, **layout)
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    dims = resolve_parallel_dims(config, world_size, model_spec(config.model.model).layout_rules)
    mesh = dims.build_mesh(device_type="cpu") if world_size > 1 else None
    model = ParallelModel(GPT_PLAN, model_shape(config, TINY_VOCAB, dims.tp), dims, mesh, config.parallelism,
                          torch.device("cpu"), config.data.seed, checkpoint_activations=False, autocast_dtype=None)
    digests: dict[str, list[str]] = {}
    for name, param in model.named_parameters():
        full = param.full_tensor() if isinstance(param, DTensor) else param
        digests.setdefault(name, []).append(hashlib.sha256(full.detach().numpy().tobytes()).hexdigest())
    if world_size == 1:
        return digests
    gathered: list[dict[str, list[str]]] = [{} for _ in range(world_size)]
    dist.all_gather_object(gathered, digests)
    return {name: sorted({d for rank in gathered for d in rank.get(name, [])}) for rank in gathered for name in rank}


@pytest.mark.timeout(400)
def test_every_layout_starts_from_the_single_process_weights(tiny_prefix, cache_dir, workdir):
    from process_testing import run_jobs

    reference = initial_digests(tiny_prefix, cache_dir, {})
    jobs = [(initial_digests, (tiny_prefix, cache_dir, layout), {}) for layout in LAYOUTS.values()]
    for name, digests in zip(LAYOUTS, run_jobs(2, jobs, workdir)):
        assert digests == reference, name


def test_the_full_model_is_built_on_the_meta_device(tiny_prefix, cache_dir, monkeypatch):
    config = tiny_config(tiny_prefix, cache_dir)
    devices_at_build = []

    def recording_build(shape):
        model = GPT_PLAN.build(shape)
        devices_at_build.append({p.device.type for p in model.parameters()})
        return model

    plan = dataclasses.replace(GPT_PLAN, build=recording_build)
    dims = resolve_parallel_dims(config, 1, model_spec(config.model.model).layout_rules)
    model = ParallelModel(plan, model_shape(config, TINY_VOCAB, 1), dims, None,
                          config.parallelism, torch.device("cpu"), config.data.seed, checkpoint_activations=False,
                          autocast_dtype=None)
    assert devices_at_build == [{"meta"}]
    assert {p.device.type for _, p in model.named_parameters()} == {"cpu"}
