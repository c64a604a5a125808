"""Index build time: our numba kernels vs their numpy twins (and megatron-core's C++ helpers if given).

    python -m benchmarks.indices                          # ours vs the numpy reference
    python -m benchmarks.indices --megatron-helpers /path/to/helpers_cpp.cpython-311-x86_64-linux-gnu.so

    # the megatron-core baseline: its wheel ships the compiled helpers (nothing is installed)
    pip download --no-deps megatron-core==0.16.1 -d /tmp/mcore && cd /tmp/mcore && python -m zipfile -e *.whl .
    # -> /tmp/mcore/megatron/core/datasets/helpers_cpp.cpython-311-x86_64-linux-gnu.so

Data: 1,000,000 synthetic sequence lengths, log-normal (mean ~1000 tokens, ~1e9 tokens in all);
sequence lengths 2048 and 4096; one epoch, and three epochs whose last is shuffled apart. Blend:
10,000,000 samples over 3 datasets weighted 0.5/0.3/0.2. Figures are medians of `--repeats` runs
after one warm-up (numba's on-disk cache loaded); "cold" is a fresh interpreter importing the
library and building the first case with the numba cache already on disk.

The megatron-core baseline (optional, the pybind11 module shipped in the megatron-core wheel,
loaded directly without importing megatron) runs its C++ `build_sample_idx` and
`build_blending_indices` with Megatron's Python wrapper steps (bound checks, `numpy.mgrid`
document index); the document and shuffle shuffles are numpy `RandomState.shuffle` in every column.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

from samplers.gpt.indices import GPTIndexSpec, PhaseTimings, build_gpt_indices, plan_epochs
from samplers.indices import build_blending_indices, build_document_index, build_shuffle_index, sequence_id_dtype
from samplers.reference import blending_indices_reference, sample_index_reference

NUM_SEQUENCES = 1_000_000
MEAN_LENGTH = 1000
LOG_SIGMA = 1.0
SEED = 1234
BLEND_SAMPLES = 10_000_000
BLEND_WEIGHTS = [0.5, 0.3, 0.2]
REFERENCE_BLEND_FRACTION = 50
"""The pure-Python blending reference runs on 1/50 of the samples (a full run takes minutes)."""
PHASES = ("document_index", "sample_index", "shuffle_index")


def synthetic_lengths() -> np.ndarray:
    """int32 [1e6] log-normal lengths, mean ~MEAN_LENGTH (exp(mu + sigma^2/2) = mean)."""
    rng = np.random.default_rng(SEED)
    mu = np.log(MEAN_LENGTH) - LOG_SIGMA**2 / 2
    return np.clip(rng.lognormal(mu, LOG_SIGMA, NUM_SEQUENCES), 1, 2**31 - 1).astype(np.int32)


def cases(lengths: np.ndarray) -> list[tuple[str, GPTIndexSpec]]:
    """(name, spec) for each sequence length, one epoch and three epochs with a separate last one."""
    total = int(lengths.sum(dtype=np.int64))
    out = []
    for sequence_length in (2048, 4096):
        per_epoch = (total - 1) // sequence_length
        for name, num_samples in (("1 epoch", None), ("3 epochs", 2 * per_epoch + per_epoch // 10)):
            spec = GPTIndexSpec(begin=0, end=NUM_SEQUENCES, num_samples=num_samples, sequence_length=sequence_length, random_seed=SEED)
            out.append((f"L={sequence_length} {name}", spec))
    return out


def run_ours(lengths: np.ndarray, spec: GPTIndexSpec) -> tuple[dict, dict]:
    timings = PhaseTimings()
    arrays = build_gpt_indices(lengths, spec, timings)
    return timings.as_dict(), arrays


def run_numpy_reference(lengths: np.ndarray, spec: GPTIndexSpec) -> tuple[dict, dict]:
    """Same pipeline with the numpy twin for the sample index."""
    seconds = {}
    plan = plan_epochs(lengths, spec)
    rng = np.random.RandomState(spec.random_seed)
    start = time.perf_counter()
    ids = np.arange(spec.begin, spec.end, dtype=sequence_id_dtype(len(lengths)))
    document_index = build_document_index(ids, plan.num_epochs, plan.separate_final_epoch, rng)
    seconds["document_index"] = time.perf_counter() - start
    start = time.perf_counter()
    n = (plan.num_epochs * plan.num_tokens_per_epoch - spec.extra_tokens) // spec.sequence_length
    sample_index = sample_index_reference(lengths, document_index, spec.sequence_length, spec.extra_tokens, n)
    seconds["sample_index"] = time.perf_counter() - start
    start = time.perf_counter()
    build_shuffle_index(plan.num_samples_before_final_epoch if plan.separate_final_epoch else n, n, rng)
    seconds["shuffle_index"] = time.perf_counter() - start
    return seconds, {"sample_index": sample_index}


def load_megatron_helpers(path: str):
    """The pybind11 helpers module from a megatron-core wheel, loaded by file path."""
    loader = importlib.machinery.ExtensionFileLoader("helpers_cpp", path)
    spec = importlib.util.spec_from_file_location("helpers_cpp", path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def run_megatron(helpers, lengths: np.ndarray, spec: GPTIndexSpec) -> tuple[dict, dict]:
    """megatron-core's GPTDataset index steps (paraphrased Python, its C++ for the sample index)."""
    seconds = {}
    indices = np.arange(spec.begin, spec.end, dtype=np.int32)
    plan = plan_epochs(lengths, spec)
    rng = np.random.RandomState(spec.random_seed)

    def document_index(epochs: int) -> np.ndarray:
        grid = np.mgrid[0:epochs, 0 : len(indices)][1]
        grid[:] = indices
        flat = grid.reshape(-1).astype(np.int32)
        rng.shuffle(flat)
        return flat

    start = time.perf_counter()
    if plan.separate_final_epoch:
        docs = np.concatenate((document_index(plan.num_epochs - 1), document_index(1)))
    else:
        docs = document_index(plan.num_epochs)
    seconds["document_index"] = time.perf_counter() - start
    start = time.perf_counter()
    bound = max(docs.shape[0], lengths.max())
    sample_index = helpers.build_sample_idx_int32(
        lengths, docs, spec.sequence_length, plan.num_epochs, plan.num_tokens_per_epoch, True, spec.extra_tokens
    )
    assert sample_index.min() >= 0 and sample_index.max() <= bound
    seconds["sample_index"] = time.perf_counter() - start
    start = time.perf_counter()
    n = len(sample_index) - 1
    build_shuffle_index(plan.num_samples_before_final_epoch if plan.separate_final_epoch else n, n, rng)
    seconds["shuffle_index"] = time.perf_counter() - start
    return seconds, {"sample_index": sample_index}


def median_phases(runs: dict, repeats: int) -> dict[str, tuple[dict, dict]]:
    """Per implementation: (median seconds per phase and of the total, arrays of the last run).

    The implementations run round-robin, one warm-up round first, so that load from other
    processes on the machine falls on all of them alike.
    """
    samples: dict[str, list] = {name: [] for name in runs}
    for round_number in range(repeats + 1):
        for name, run in runs.items():
            result = run()
            if round_number:
                samples[name].append(result)
    out = {}
    for name, results in samples.items():
        medians = {phase: statistics.median(r[0][phase] for r in results) for phase in PHASES}
        medians["total"] = statistics.median(sum(r[0][p] for p in PHASES) for r in results)
        out[name] = (medians, results[-1][1])
    return out


def time_medians(functions: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each function, run round-robin after one warm-up round."""
    times: dict[str, list[float]] = {name: [] for name in functions}
    for round_number in range(repeats + 1):
        for name, function in functions.items():
            start = time.perf_counter()
            function()
            if round_number:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


COLD_SCRIPT = """
import resource, sys, time
start = time.perf_counter()
import numpy as np
from samplers.gpt.indices import GPTIndexSpec, build_gpt_indices
imported = time.perf_counter()
lengths = np.load(sys.argv[1])
loaded = time.perf_counter()
build_gpt_indices(lengths, GPTIndexSpec(begin=0, end=len(lengths), num_samples=None, sequence_length=2048, random_seed=1234))
built = time.perf_counter()
print(imported - start, built - loaded, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def cold_start(lengths: np.ndarray, directory: str) -> tuple[float, float, int]:
    """(import seconds, first build seconds, peak RSS KiB) of a fresh interpreter."""
    path = os.path.join(directory, "benchmark_lengths.npy")
    np.save(path, lengths)
    try:
        output = subprocess.run([sys.executable, "-c", COLD_SCRIPT, path], check=True, capture_output=True, text=True)
    finally:
        os.remove(path)
    imported, built, rss = output.stdout.split()
    return float(imported), float(built), int(rss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per figure (median), default 5")
    parser.add_argument("--megatron-helpers", help="path of megatron-core's helpers_cpp extension module")
    parser.add_argument("--tmp", default="/tmp", help="directory for the cold-start run's input file")
    args = parser.parse_args()
    helpers = load_megatron_helpers(args.megatron_helpers) if args.megatron_helpers else None

    print(f"cpus: {os.cpu_count()}, load average before: {os.getloadavg()}")
    lengths = synthetic_lengths()
    print(f"data: {NUM_SEQUENCES:,} sequences, {int(lengths.sum(dtype=np.int64)):,} tokens, mean length {lengths.mean():.0f}")
    run_ours(lengths, cases(lengths)[0][1])  # compile or load the numba cache before the cold start
    imported, built, cold_rss = cold_start(lengths, args.tmp)
    print(f"cold (fresh interpreter, numba cache on disk): import {imported:.2f} s + first build (L=2048, 1 epoch) "
          f"{built:.2f} s = {imported + built:.2f} s; peak RSS {cold_rss / 1024:.0f} MiB")

    header = f"{'case':<18}{'phase':<16}{'ours s':>9}{'numpy s':>9}{'ours/numpy':>11}"
    print(header + (f"{'megatron s':>11}{'ours/megatron':>14}" if helpers else ""))
    for name, spec in cases(lengths):
        runs = {"ours": lambda: run_ours(lengths, spec), "numpy": lambda: run_numpy_reference(lengths, spec)}
        if helpers:
            runs["megatron"] = lambda: run_megatron(helpers, lengths, spec)
        results = median_phases(runs, args.repeats)
        (ours, our_arrays), (numpy_ref, numpy_arrays) = results["ours"], results["numpy"]
        assert np.array_equal(our_arrays["sample_index"], numpy_arrays["sample_index"])
        if helpers:
            assert np.array_equal(our_arrays["sample_index"], results["megatron"][1]["sample_index"])
        for phase in (*PHASES, "total"):
            line = f"{name:<18}{phase:<16}{ours[phase]:>9.4f}{numpy_ref[phase]:>9.4f}{ours[phase] / numpy_ref[phase]:>11.2f}"
            if helpers:
                megatron = results["megatron"][0]
                line += f"{megatron[phase]:>11.4f}{ours[phase] / megatron[phase]:>14.2f}"
            print(line)

    weights = np.array(BLEND_WEIGHTS)

    def megatron_blend() -> tuple[np.ndarray, np.ndarray]:
        dataset_index = np.zeros(BLEND_SAMPLES, dtype=np.int16)
        sample_index = np.zeros(BLEND_SAMPLES, dtype=np.int64)
        helpers.build_blending_indices(dataset_index, sample_index, weights, len(weights), BLEND_SAMPLES, False)
        return dataset_index, sample_index

    blends = {"ours": lambda: build_blending_indices(weights, BLEND_SAMPLES)}
    if helpers:
        blends["megatron"] = megatron_blend
        assert all(np.array_equal(a, b) for a, b in zip(blends["ours"](), megatron_blend()))
    seconds = time_medians(blends, args.repeats)
    counts = np.bincount(blends["ours"]()[0]).tolist()
    reference_size = BLEND_SAMPLES // REFERENCE_BLEND_FRACTION
    start = time.perf_counter()
    blending_indices_reference(weights, reference_size)
    reference_scaled = (time.perf_counter() - start) * REFERENCE_BLEND_FRACTION
    line = (f"blend {BLEND_SAMPLES:,} x {BLEND_WEIGHTS}: ours {seconds['ours']:.4f} s (counts {counts}); "
            f"python reference {reference_scaled:.1f} s (timed on {reference_size:,}, x{REFERENCE_BLEND_FRACTION}), "
            f"ours/reference {seconds['ours'] / reference_scaled:.4f}")
    if helpers:
        line += f"; megatron {seconds['megatron']:.4f} s, ours/megatron {seconds['ours'] / seconds['megatron']:.2f}"
    print(line)
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB; "
          f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
