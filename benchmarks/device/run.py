"""The device script's steps (`benchmarks/device/run.sh` runs this): the CUDA path run and measured in one call.

Each step runs in processes of its own under its own time limit (the process group is killed when it runs
over), all of them within one budget; a step that fails or runs over is recorded and the next one runs. Into
``--out`` go ``run.log`` (every command and its output), ``figures.json`` (rewritten after each step: each
step's status, seconds and figures), ``profile.txt`` and ``profile_t5.txt``; checkpoints, data and caches go to
``--work``.

Steps: ``environment`` (torch, the device, the modules the project needs); ``cuda_tests`` (the tests that
skip without CUDA: tests/trainer/test_zero_offload.py and tests/trainer/test_on_device.py); ``gpu_step_*``
(benchmarks/gpu_step.py for GPT-345M and mT5-base, eager at the model's micro-batch and the largest that fits,
``--compile`` at the same micro-batches); ``workflow`` (the README's preprocess-data, train, generate and evaluate on
the device); ``profile`` and ``profile_t5`` (benchmarks/device/profile_step.py's tables of the GPT-345M and
mT5-base steps, eager). With ``--device cpu --tiny`` every step runs on the CPU at tiny sizes, the same commands
with the same device flag: a dry run of the script.

    python -m benchmarks.device.run --out out/ --work /tmp/device-work                 # on a GPU machine
    python -m benchmarks.device.run --out out/ --work /tmp/w --device cpu --tiny        # dry run on a CPU
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOG_NAME, FIGURES_NAME = "run.log", "figures.json"
# The profile tables of GPT-345M and of mT5-base (the step whose ratio to the plain loop was short on an H200).
PROFILE_NAMES = {"gpt": "profile.txt", "t5": "profile_t5.txt"}
# The device call's command gets at most 10 minutes; the issue asks for the whole script under 8. The steps'
# limits below add up to more than this budget: a step gets what is left when its own limit would overrun it.
BUDGET_S = 450
# A step that would get less than this is not started (recorded as skipped).
MIN_STEP_S = 10
OK, FAILED, TIMEOUT, SKIPPED = "ok", "failed", "timeout", "skipped"
# Each command's output kept in figures.json for a failed step: its last characters.
ERROR_TAIL_CHARS = 2000

# gpu_step: the largest micro-batch tried (the model's own doubled up to this): GPT-345M from 4, mT5-base from 16.
MAX_MICRO_BATCH = {"gpt": 64, "t5": 128}
# Tiny shapes fit anywhere: one doubling of gpu_step's tiny micro-batch (2) checks the search.
TINY_MAX_MICRO_BATCH = 4
GPU_STEP_STEPS, GPU_STEP_WARMUP = 10, 3
TINY_GPU_STEP_STEPS, TINY_GPU_STEP_WARMUP = 2, 1
PROFILE_STEPS, PROFILE_WARMUP = 3, 3
CUDA_TEST_FILES = ("tests/trainer/test_zero_offload.py", "tests/trainer/test_on_device.py")
# The dry run's share of them: every test of test_on_device.py passes with TOKENMILL_TEST_DEVICE=cpu, but together
# they train some 20 tiny models and compile one (about 70 s on two CPU cores): the dry run checks the step (the
# device variable, pytest's report read back) with the offload tests and test_on_device.py's cheapest.
TINY_TEST_SELECTION = "offload or bf16_trains_close and dense"

TOKENIZER = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "data_test/gpt2/gpt2-vocab.json",
             "--merge-file", "data_test/gpt2/gpt2-merges.txt"]
# The workflow's GPT: GPT-2 small's shape on the device; on a dry run the quickstart's, at half its positions.
WORKFLOW_MODEL = ["--num-layers", "12", "--hidden-size", "768", "--num-attention-heads", "12", "--seq-length", "1024",
                  "--micro-batch-size", "8", "--global-batch-size", "32"]
TINY_WORKFLOW_MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
                       "--micro-batch-size", "2", "--global-batch-size", "2"]
WORKFLOW_STEPS = 50
# The dry run's: bf16 on a CPU is slow (no fast bf16 kernels: the GPT-2 vocabulary's head costs ~0.3 s a step of
# 4 x 64 positions on two cores), and evaluating the whole sample's 271k tokens takes longer than all the rest.
TINY_WORKFLOW_STEPS = 10
TINY_SAMPLE_DOCUMENTS = 20
SAMPLE = REPO / "data_test" / "sample_en.jsonl"
WORKFLOW_PROMPT = "The history of the"
# Within the dry run's 32 positions with the prompt's 4 tokens.
WORKFLOW_NEW_TOKENS = 16
# Modules the steps import; the device image lacks some (run.sh installs them from carried wheels). The
# optional ones are the project's dependencies that no step imports (--do-chinese-wwm, --hf-dataset): reported.
NEEDED_MODULES = ("torch", "numpy", "numba", "pyarrow", "tokenizers", "sentencepiece", "safetensors", "yaml",
                  "transformers", "gigatoken", "awkward", "pytest", "pytest_timeout")
OPTIONAL_MODULES = ("jieba", "datasets")


@dataclass(frozen=True, slots=True)
class Settings:
    """What every step is given."""

    device: str
    """cuda, or cpu for a dry run."""
    tiny: bool
    out: Path
    work: Path
    log: Path


class StepFailed(Exception):
    """A step's command ended with a non-zero status or ran over its limit."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class Commands:
    """Runs one step's commands (in the repository root, each in a process group of its own) before its deadline,
    appending each command line and its output to the log."""

    def __init__(self, settings: Settings, deadline: float) -> None:
        self.settings = settings
        self.deadline = deadline

    def __call__(self, argv: list[str], environment: dict[str, str] | None = None) -> str:
        """Run ``argv``; returns its output (stdout and stderr together).

        Raises:
            StepFailed: a non-zero exit, or the step's deadline passed (the whole process group is killed).
        """
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise StepFailed(f"no time left for {shlex.join(argv)}", timed_out=True)
        with open(self.settings.log, "a") as log:
            log.write(f"$ {shlex.join(argv)}\n")
        begin = time.monotonic()
        process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ, **(environment or {})}, start_new_session=True)
        try:
            output, _ = process.communicate(timeout=remaining)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # compile workers and launched ranks too
            output, _ = process.communicate()
            timed_out = True
        with open(self.settings.log, "a") as log:
            log.write(output)
            log.write(f"[exit status {process.returncode}{', killed at the deadline' if timed_out else ''}; "
                      f"{time.monotonic() - begin:.1f} s]\n\n")
        if timed_out:
            raise StepFailed(f"ran over the step's limit: {' '.join(argv)}\n{output[-ERROR_TAIL_CHARS:]}", True)
        if process.returncode != 0:
            raise StepFailed(f"exit status {process.returncode}: {' '.join(argv)}\n{output[-ERROR_TAIL_CHARS:]}")
        return output


def python(*arguments: str) -> list[str]:
    return [sys.executable, *arguments]


def cli(module: str, *arguments: str) -> list[str]:
    """A command-line entry point (``main(argv)``) run as ``python -c`` (not every CLI module has a __main__)."""
    return python("-c", f"import sys; from {module} import main; sys.exit(main(sys.argv[1:]))", *arguments)


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


# --- the steps: each returns its figures, or raises StepFailed ---


ENVIRONMENT_PROBE = """
import importlib, json, sys
import torch
missing = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as error:  # report every module, whatever stops it
        missing[name] = f"{type(error).__name__}: {error}"
cuda = torch.cuda.is_available()
print(json.dumps({"python": sys.version.split()[0], "torch": torch.__version__, "cuda_available": cuda,
                  "cuda": torch.version.cuda, "device_name": torch.cuda.get_device_name(0) if cuda else "CPU",
                  "device_count": torch.cuda.device_count(), "missing_modules": missing}))
"""


def environment(settings: Settings, run: Commands) -> dict:
    output = run(python("-c", ENVIRONMENT_PROBE, *NEEDED_MODULES, *OPTIONAL_MODULES))
    figures = json.loads(output.strip().splitlines()[-1])
    needed = {name: error for name, error in figures["missing_modules"].items() if name in NEEDED_MODULES}
    if needed:
        raise StepFailed(f"modules missing: {needed}")
    if settings.device == "cuda" and not figures["cuda_available"]:
        raise StepFailed("no CUDA device is available")
    return figures


def cuda_tests(settings: Settings, run: Commands) -> dict:
    report = settings.work / "cuda_tests.xml"
    selection = ["-k", TINY_TEST_SELECTION] if settings.tiny else []
    try:
        run(python("-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(settings.work / "pytest"),
                   "--junitxml", str(report), *selection, *CUDA_TEST_FILES), {"TOKENMILL_TEST_DEVICE": settings.device})
    finally:
        figures = _junit_counts(report) if report.exists() else {}
    return figures


def _junit_counts(report: Path) -> dict:
    """Passed/failed/skipped counts and the failed tests' names of a pytest JUnit XML report."""
    cases = ElementTree.parse(report).getroot().iter("testcase")
    outcomes: dict[str, str] = {}
    for case in cases:
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        outcomes[name] = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
    counts = {kind: sum(outcome == kind for outcome in outcomes.values()) for kind in ("passed", "failed", "skipped")}
    return {**counts, "failed_tests": sorted(name for name, outcome in outcomes.items() if outcome == "failed")}


def gpu_step(model: str, compile_model: bool) -> Callable[[Settings, Commands], dict]:
    """The step of benchmarks/gpu_step.py for ``model``: eager at the model's micro-batch and the largest that
    fits, or compiled at the micro-batches the eager step measured (the model's own without its figures)."""

    def step(settings: Settings, run: Commands) -> dict:
        figures_path = settings.work / f"gpu_step_{model}_{'compile' if compile_model else 'eager'}.json"
        steps, warmup = (TINY_GPU_STEP_STEPS, TINY_GPU_STEP_WARMUP) if settings.tiny else (GPU_STEP_STEPS,
                                                                                           GPU_STEP_WARMUP)
        argv = ["--model", model, "--device", settings.device, "--steps", str(steps), "--warmup", str(warmup),
                "--json", str(figures_path)] + (["--tiny"] if settings.tiny else [])
        if compile_model:
            argv += ["--compile", *_eager_measured(settings.work / f"gpu_step_{model}_eager.json")]
        else:
            argv += ["--max-micro-batch", str(TINY_MAX_MICRO_BATCH if settings.tiny else MAX_MICRO_BATCH[model])]
        run(python("-m", "benchmarks.gpu_step", *argv))
        return read_json(figures_path)

    return step


def _eager_measured(eager_figures: Path) -> list[str]:
    """``--micro-batch-size N...``: the micro-batches the eager step measured (the model's own and the largest that
    fits); none (the model's own) without its figures."""
    if not eager_figures.exists():
        return []
    sizes = sorted({run["micro_batch_size"] for run in read_json(eager_figures)["runs"]})
    return ["--micro-batch-size", *map(str, sizes)]


def workflow(settings: Settings, run: Commands) -> dict:
    """The README's workflow on the device: tokenize the bundled sample, train 50 steps in bf16 with a save,
    generate and evaluate perplexity from that checkpoint (a dry run: the sample's first documents, 10 steps)."""
    prefix, checkpoint = settings.work / "sample", settings.work / "checkpoint"
    data = f"{prefix}_text_document"
    sample, steps = SAMPLE, WORKFLOW_STEPS
    if settings.tiny:
        sample, steps = settings.work / SAMPLE.name, TINY_WORKFLOW_STEPS
        with open(SAMPLE) as whole:
            sample.write_text("".join(line for _, line in zip(range(TINY_SAMPLE_DOCUMENTS), whole)))
    run(cli("preprocess.cli", "--input", str(sample), "--output-prefix", str(prefix), *TOKENIZER,
            "--append-eod", "--workers", "2"))
    run(cli("trainer.cli.train", "--dataset", data, *TOKENIZER, "--split", "90,5,5",
            "--data-cache-path", str(settings.work / "index-cache"),
            *(TINY_WORKFLOW_MODEL if settings.tiny else WORKFLOW_MODEL), "--train-iters", str(steps),
            "--lr", "3e-4", "--lr-warmup-iters", "5", "--log-interval", "5", "--eval-interval", str(steps),
            "--eval-iters", "2", "--device", settings.device, "--bf16", "--print-memory", "--timing-log-level", "1",
            "--save", str(checkpoint)))
    generated = run(cli("trainer.cli.generate", "--load", str(checkpoint), "--prompt", WORKFLOW_PROMPT,
                        "--max-new-tokens", str(WORKFLOW_NEW_TOKENS), "--greedy", "--device", settings.device, "--json"))
    evaluated = run(cli("trainer.cli.evaluate", "--task", "perplexity", "--data", data, "--load", str(checkpoint),
                        "--device", settings.device, "--json"))
    records = [json.loads(line) for line in (checkpoint / "metrics.jsonl").read_text().splitlines()]
    logged = [record for record in records if "lr" in record]
    memory = [record for record in records if "memory" in record]
    if not logged or not memory:
        raise StepFailed(f"{checkpoint / 'metrics.jsonl'}: no step or no memory record")
    return {"last_step": logged[-1], "memory": memory[0]["memory"],
            "evaluations": [record for record in records if "split" in record],
            "generate": json.loads(generated.strip().splitlines()[-1]),
            "evaluate": json.loads(evaluated.strip().splitlines()[-1])}


def profile(model: str) -> Callable[[Settings, Commands], dict]:
    """The step of benchmarks/device/profile_step.py for ``model``, eager at the model's seeds' micro-batch: its
    tables into ``PROFILE_NAMES[model]`` under ``--out``."""

    def step(settings: Settings, run: Commands) -> dict:
        figures_path, table = settings.work / f"profile_{model}.json", settings.out / PROFILE_NAMES[model]
        run(python("-m", "benchmarks.device.profile_step", "--model", model, "--device", settings.device,
                   "--steps", str(PROFILE_STEPS), "--warmup", str(PROFILE_WARMUP), "--table", str(table),
                   "--json", str(figures_path), *(["--tiny"] if settings.tiny else [])))
        return read_json(figures_path)

    return step


# (name, limit in seconds on the device, step). Compiling is last: it is what most likely runs over. On an H200,
# compiled GPT-345M at micro-batches 4 and 64 took 158 s with one 10-step window per side; gpu_step now times 3.
STEPS: list[tuple[str, int, Callable[[Settings, Commands], dict]]] = [
    ("environment", 30, environment),
    ("cuda_tests", 150, cuda_tests),
    ("gpu_step_gpt_eager", 75, gpu_step("gpt", compile_model=False)),
    ("gpu_step_t5_eager", 75, gpu_step("t5", compile_model=False)),
    ("workflow", 110, workflow),
    ("profile", 30, profile("gpt")),
    ("profile_t5", 40, profile("t5")),
    ("gpu_step_gpt_compile", 210, gpu_step("gpt", compile_model=True)),
    ("gpu_step_t5_compile", 210, gpu_step("t5", compile_model=True)),
]


def write_figures(path: Path, figures: dict) -> None:
    """``figures`` as JSON at ``path``, written under a temporary name first."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(figures, indent=1) + "\n")
    os.replace(partial, path)


def run_steps(settings: Settings, budget_s: float, time_scale: float, names: list[str]) -> dict:
    """The steps ``names`` in turn, each within its limit (times ``time_scale``) and what is left of the budget."""
    figures: dict = {"device": settings.device, "tiny": settings.tiny, "budget_s": budget_s * time_scale,
                     "steps": {}}
    end = time.monotonic() + budget_s * time_scale
    for name, limit_s, step in STEPS:
        if name not in names:
            continue
        allowed = min(limit_s * time_scale, end - time.monotonic())
        record: dict = {"limit_s": limit_s * time_scale}
        if allowed < MIN_STEP_S:
            record.update(status=SKIPPED, error=f"{allowed:.0f} s of the budget left")
        else:
            begin = time.monotonic()
            try:
                record.update(status=OK, figures=step(settings, Commands(settings, begin + allowed)))
            except StepFailed as error:
                record.update(status=TIMEOUT if error.timed_out else FAILED, error=str(error))
            except (OSError, ValueError, KeyError) as error:  # unreadable or malformed figures of a step
                record.update(status=FAILED, error=f"{type(error).__name__}: {error}")
            record["seconds"] = round(time.monotonic() - begin, 1)
        figures["steps"][name] = record
        with open(settings.log, "a") as log:
            log.write(f"=== {name}: {record['status']} ({record.get('seconds', 0)} s)\n\n")
        write_figures(settings.out / FIGURES_NAME, figures)
    return figures


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="run.log, figures.json and the profile tables go here")
    parser.add_argument("--work", type=Path, required=True, help="data, checkpoints and caches go here")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes everywhere (with --device cpu: a dry run)")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="seconds for all the steps together")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="multiply every limit and the budget (a slow or loaded machine)")
    parser.add_argument("--only", nargs="+", choices=[name for name, _, _ in STEPS], metavar="STEP",
                        help="run only these steps (a second call; the compile steps read the eager steps' "
                             "figures from --work when they are there)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs every step; exit status 0 when all are ok, 1 otherwise (figures.json says which)."""
    args = build_parser().parse_args(argv)
    for directory in (args.out, args.work):
        directory.mkdir(parents=True, exist_ok=True)
    settings = Settings(device=args.device, tiny=args.tiny, out=args.out, work=args.work, log=args.out / LOG_NAME)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(args.work / "inductor"))
    os.environ["PYTHONUNBUFFERED"] = "1"
    figures = run_steps(settings, args.budget_s, args.time_scale, args.only or [name for name, _, _ in STEPS])
    statuses = {name: record["status"] for name, record in figures["steps"].items()}
    print(json.dumps(statuses))
    return 0 if all(status == OK for status in statuses.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
