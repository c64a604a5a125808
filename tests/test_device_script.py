"""`benchmarks/device/run.sh`, the one command a GPU call runs, dry-run on the CPU (``DEVICE=cpu TINY=1``).

Promised: the same script, run as a device call would run it (from the repository root, the project on
PYTHONPATH, its outputs under ``$OUT``), goes through every step with the device flag ``cpu`` at tiny sizes and
reports each as ok; ``$OUT`` holds the log, one JSON of figures and the two profile tables, and nothing else; the
figures hold what the GPU run is for (test counts, throughput and MFU fields, the workflow's losses and
perplexity, the profile's shares). So a first GPU call meets only CUDA itself as new.

The default run dry-runs every step but the two compiled benchmarks; those (a minute of compiling on two CPU
cores) run under ``pytest -m campaign`` as the documented second call: ``ONLY="gpu_step_gpt_compile
gpu_step_t5_compile"`` over the first call's ``$WORK``, whose eager figures set the compiled micro-batches.
"""

import json
import math
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "device" / "run.sh"
STEPS = ("environment", "cuda_tests", "gpu_step_gpt_eager", "gpu_step_t5_eager", "workflow", "profile", "profile_t5")
COMPILE_STEPS = ("gpu_step_gpt_compile", "gpu_step_t5_compile")
OUTPUTS = {"run.log", "figures.json", "profile.txt", "profile_t5.txt"}
PROFILE_CATEGORIES = {"attention", "matmul", "optimizer", "other"}
# The steps' time limits are the GPU machine's (16 cores compile there); two CPU cores, shared, compile the tiny
# models some times slower. A quiet 2-core machine runs the whole dry run in about two minutes.
TIME_SCALE = 4
DRY_RUN_TIMEOUT_S = 900


def run_script(root: Path, out: str, steps: tuple[str, ...]) -> tuple[subprocess.CompletedProcess, Path]:
    """run.sh's dry run of ``steps`` into ``root/out``, over the work folder ``root/work``."""
    environment = {**os.environ, "OUT": str(root / out), "WORK": str(root / "work"), "DEVICE": "cpu", "TINY": "1",
                   "PYTHON": sys.executable, "WHEELS": str(root / "no_wheels"), "SITE": str(root / "site"),
                   "TIME_SCALE": str(TIME_SCALE), "ONLY": " ".join(steps)}
    run = subprocess.run(["bash", str(SCRIPT)], env=environment, capture_output=True, text=True,
                         timeout=DRY_RUN_TIMEOUT_S)
    return run, root / out


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    return run_script(tmp_path_factory.mktemp("device_script"), "out", STEPS)


@pytest.fixture(scope="module")
def figures(dry_run) -> dict:
    return json.loads((dry_run[1] / "figures.json").read_text())


def _assert_every_step_ok(run: subprocess.CompletedProcess, out: Path, figures: dict,
                          steps: tuple[str, ...]) -> None:
    statuses = {name: step["status"] for name, step in figures["steps"].items()}
    assert statuses == dict.fromkeys(steps, "ok"), {name: figures["steps"][name].get("error") for name in statuses}
    assert run.returncode == 0, run.stderr
    log = (out / "run.log").read_text()
    assert all(f"=== {name}: ok" in log for name in steps)
    assert "--device cpu" in log and "--device cuda" not in log
    assert figures["device"] == "cpu" and figures["tiny"] is True


def _assert_throughput_runs(runs: list[dict]) -> None:
    for run in runs:
        assert run["ratio"] > 0 and run["ratio"] == pytest.approx(run["ours"]["tokens_per_s"]
                                                                  / run["plain"]["tokens_per_s"])
        for side in (run["ours"], run["plain"]):
            assert side["tokens_per_s"] > 0 and math.isfinite(side["last_loss"])
            assert len(side["losses"]) == len(run["ours"]["losses"]) and side["losses"][-1] == side["last_loss"]
            assert side["mfu"] is None and side["peak_memory_gib"] is None  # no bf16 peak, no device memory on a CPU
        gap = run["largest_loss_gap"]  # where the two sides' losses part most (a step of warm-up or windows)
        assert gap["gap"] == max(abs(a - b) for a, b in zip(run["ours"]["losses"], run["plain"]["losses"]))
        assert gap["ours"] == run["ours"]["losses"][gap["step"]]


@pytest.mark.timeout(DRY_RUN_TIMEOUT_S + 60)
def test_every_step_runs_ok_and_the_outputs_are_the_log_the_figures_and_the_profile(dry_run, figures):
    _assert_every_step_ok(*dry_run, figures, STEPS)
    assert {path.name for path in dry_run[1].iterdir()} == OUTPUTS


def test_the_cuda_tests_ran_on_the_device_under_test_and_passed(figures):
    tests = figures["steps"]["cuda_tests"]["figures"]
    assert tests["failed"] == 0 and tests["failed_tests"] == []
    # the dry run's selection: test_zero_offload.py's CPU cases and one of test_on_device.py's
    assert tests["passed"] >= 4


@pytest.mark.parametrize("model", ["gpt", "t5"])
def test_the_benchmark_measures_both_micro_batches_eager(figures, model):
    eager = figures["steps"][f"gpu_step_{model}_eager"]["figures"]["runs"]
    assert [run["mode"] for run in eager] == ["eager", "eager"]
    assert eager[0]["micro_batch_size"] < eager[1]["micro_batch_size"]
    _assert_throughput_runs(eager)


@pytest.mark.campaign
@pytest.mark.timeout(2 * DRY_RUN_TIMEOUT_S + 60)
def test_the_second_call_compiles_both_models_at_the_eager_micro_batches(dry_run, figures):
    run, out = run_script(dry_run[1].parent, "out_compile", COMPILE_STEPS)
    compile_figures = json.loads((out / "figures.json").read_text())
    _assert_every_step_ok(run, out, compile_figures, COMPILE_STEPS)
    for model in ("gpt", "t5"):
        eager = [run["micro_batch_size"] for run in figures["steps"][f"gpu_step_{model}_eager"]["figures"]["runs"]]
        compiled = compile_figures["steps"][f"gpu_step_{model}_compile"]["figures"]["runs"]
        assert [(run["mode"], run["micro_batch_size"]) for run in compiled] == [("compile", size) for size in eager]
        _assert_throughput_runs(compiled)


def test_the_workflow_trains_saves_generates_and_evaluates(figures):
    workflow = figures["steps"]["workflow"]["figures"]
    assert workflow["last_step"]["iteration"] == 10 and math.isfinite(workflow["last_step"]["loss"])  # 50 on a GPU
    assert "forward_backward_ms_per_iteration" in workflow["last_step"]  # --timing-log-level 1
    assert workflow["memory"]  # --print-memory
    assert workflow["evaluate"]["task"] == "perplexity" and workflow["evaluate"]["ppl"] > 1
    assert workflow["generate"]["prompt"] == "The history of the" and len(workflow["generate"]["ids"]) > 0


@pytest.mark.parametrize(("step", "table_name"), [("profile", "profile.txt"), ("profile_t5", "profile_t5.txt")])
def test_the_profile_splits_the_step_into_attention_matmul_optimizer_and_other(figures, dry_run, step, table_name):
    profile = figures["steps"][step]["figures"]
    assert profile["model"] == {"profile": "gpt", "profile_t5": "t5"}[step]
    assert set(profile["shares"]) == PROFILE_CATEGORIES
    assert sum(profile["shares"].values()) == pytest.approx(1.0)
    assert profile["shares"]["matmul"] > 0 and profile["shares"]["attention"] > 0
    # How busy the device was: the traced kernels' (here operators') time over an untraced step's wall time.
    assert profile["wall_ms_per_step"] > 0 and profile["busy"] == pytest.approx(
        profile["total_ms_per_step"] / profile["wall_ms_per_step"])
    assert profile["shares"]["optimizer"] > 0
    assert len(profile["top"]) == 10
    # The host's side of the step: on a CUDA device a table of its own; a CPU runs the operators itself.
    assert profile["host"] == {key: profile[key] for key in profile["host"]}
    table = (dry_run[1] / table_name).read_text()
    assert all(category in table for category in PROFILE_CATEGORIES)
    assert "the host's side of the step" in table


def _write_probe_wheel(folder: Path) -> str:
    """A minimal pure-Python wheel (one module), written by hand as PEP 427 lays it out; returns its module name."""
    module, version = "tokenmill_wheel_probe", "1.0"
    info = f"{module}-{version}.dist-info"
    files = {f"{module}.py": "VALUE = 1\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {module}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tokenmill-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    folder.mkdir()
    with zipfile.ZipFile(folder / f"{module}-{version}-py3-none-any.whl", "w") as wheel:
        for name, text in {**files, f"{info}/RECORD": record}.items():
            wheel.writestr(name, text)
    return module


def test_carried_wheels_are_installed_into_the_site_folder_before_the_steps(tmp_path):
    """The device machine has no network: run.sh installs what `.whl/` carries with pip's --no-index --target."""
    module = _write_probe_wheel(tmp_path / "wheels")
    environment = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), "DEVICE": "cpu",
                   "TINY": "1", "PYTHON": sys.executable, "WHEELS": str(tmp_path / "wheels"),
                   "SITE": str(tmp_path / "site"), "ONLY": "environment"}
    run = subprocess.run(["bash", str(SCRIPT)], env=environment, capture_output=True, text=True,
                         timeout=DRY_RUN_TIMEOUT_S)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "site" / f"{module}.py").read_text() == "VALUE = 1\n"
    figures = json.loads((tmp_path / "out" / "figures.json").read_text())
    assert figures["steps"]["environment"]["status"] == "ok"
