"""``--print-memory``: the bytes each rank reports after the first step equal what the ZeRO stage should keep,
computed from the parameter sizes the saved checkpoint lists (a separate path: DCP's metadata)."""

import dataclasses
import json

import pytest
from test_zero_stages import zero_config
from torch.distributed.checkpoint import FileSystemReader
from trainer_testing import run_in_processes

from trainer.checkpoint.store import checkpoint_dir
from trainer.metrics.records import read_run

FP32_BYTES = 4
# AdamW's ``step`` of each parameter: a float32 scalar.
STEP_BYTES = 4
MOMENTS = 2
DP = 2
# (ZeRO stage, cpu offload) of each measured run.
LAYOUTS = [(0, False), (1, False), (2, False), (3, False), (1, True)]


def parameter_sizes(root: str) -> list[int]:
    """Element count of every model tensor a checkpoint holds."""
    metadata = FileSystemReader(str(checkpoint_dir(root, 1))).read_metadata().state_dict_metadata
    return [_numel(meta.size) for name, meta in metadata.items() if name.startswith("model.")]


def _numel(size) -> int:
    count = 1
    for dim in size:
        count *= dim
    return count


def expected_bytes(stage: int, sizes: list[int]) -> dict[str, int]:
    """One rank's bytes at ``stage`` over DP ranks: shards are ceil(n / DP) elements (every tiny-model
    dimension is even, so neither ZeRO-1 slices nor FSDP2's dim-0 shards are padded)."""
    psi = sum(sizes)
    steps = STEP_BYTES * len(sizes)
    sharded = FP32_BYTES * psi // DP
    full = FP32_BYTES * psi
    params = sharded if stage >= 2 else full
    grads = sharded if stage >= 2 else full
    return {"parameters_device": params, "gradients_device": grads,
            "optimizer_device": MOMENTS * (sharded if stage >= 1 else full) + steps,
            "parameters_cpu": 0, "gradients_cpu": 0, "optimizer_cpu": 0}


@pytest.fixture(scope="module")
def memory_runs(tiny_prefix, cache_dir, workdir, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("zero_memory")
    runs = {}
    configs = []
    for stage, offload in LAYOUTS:
        name = f"stage{stage}{'_offload' if offload else ''}"
        save, metrics = str(root / name), str(root / f"{name}.jsonl")
        config = zero_config(tiny_prefix, cache_dir, stage, offload, train_iters=1, save=save, metrics_file=metrics)
        configs.append(dataclasses.replace(config, logging=dataclasses.replace(config.logging, print_memory=True)))
        runs[stage, offload] = (save, metrics)
    run_in_processes(DP, configs, workdir)
    return runs


@pytest.mark.timeout(600)
@pytest.mark.parametrize("stage, offload", LAYOUTS)
def test_each_rank_reports_the_bytes_its_zero_stage_keeps(memory_runs, stage, offload):
    """Stage 1 offloaded on a CPU run holds what stage 1 holds: its masters and gradients are views, not copies."""
    save, metrics = memory_runs[stage, offload]
    records = read_run(metrics).memory
    assert len(records) == 1 and records[0]["iteration"] == 1
    ranks = records[0]["memory"]
    assert [entry["rank"] for entry in ranks] == list(range(DP))
    want = expected_bytes(stage, parameter_sizes(save))
    for entry in ranks:
        assert {key: entry[key] for key in want} == want, f"rank {entry['rank']}"
        assert entry["peak_kind"] == "cpu_peak_rss" and entry["peak_bytes"] > entry["parameters_device"]


def test_the_memory_record_does_not_count_as_a_training_record(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [{"iteration": 1, "loss": 2.0}, {"iteration": 1, "memory": [{"rank": 0, "parameters_device": 8}]}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    run = read_run(path)
    assert [r["iteration"] for r in run.train] == [1] and run.memory[0]["memory"][0]["parameters_device"] == 8
