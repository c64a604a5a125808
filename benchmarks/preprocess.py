"""Whole-process speed and memory of `preprocess-data` against a bare gigatoken encode (the ceiling).

    # issue 19's three corpora in one run (see README, Benchmarks, for building them):
    python -m benchmarks.preprocess bench_data/corpus_en.jsonl bench_data/corpus_en_1g.jsonl \
        bench_data/corpus_random_words.jsonl --runs 3 --large-runs 1
    python -m benchmarks.preprocess bench_data/corpus_en_10m.jsonl --output-format mmap arrow mindrecord

(Run it with -m from the repository root: run by path, this file would shadow the `preprocess` package.)

For each corpus, alternately runs (each in a fresh process, `--runs` times):
  * ours:    python -m preprocess.cli --input CORPUS --tokenizer-type GPT2BPETokenizer ... --append-eod
             (default workers, i.e. what a user gets without tuning; `--output-format` is passed on, so
             the cost of writing several formats in the same pass shows against the same ceiling);
  * ceiling: a fresh Python that builds the same GPT-2 tokenizer and calls gigatoken's `encode_files` on
             the JSONL (its own unchecked JSON reader; no validation, no output file).
Prints medians of wall time, CPU time (user + system, encoder processes included: on a machine shared
with other jobs the steadier figure), MB/s, tokens/s, peak RSS of the whole process tree (encoder processes
included), how many times an encoder process was replaced (`--encoder-memory-limit-mb`), our speed as
a fraction of the ceiling's (ratio of medians, and per run: each run's ceiling over ours), and with
several corpora the peak RSS of each and its growth from the first to the last. Corpora larger than
LARGE_CORPUS_BYTES run `--large-runs` times. The machine's load average is printed with each corpus:
other jobs on a small machine move every number.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2 = os.path.join(REPO, "data_test", "gpt2")
MEGABYTE = 2**20
RSS_POLL_SECONDS = 0.02
LARGE_CORPUS_BYTES = 200 * 10**6
PEAK_RSS_TARGET_MB = 600
SPEED_TARGET, SPEED_FLOOR = 0.75, 0.6
REPLACED = "replacing it with a fresh one"

CEILING = """
import sys
import gigatoken
from tokenizers import AddedToken, Tokenizer, pre_tokenizers
from tokenizers.models import BPE
reference = Tokenizer(BPE.from_file(sys.argv[1], sys.argv[2]))
reference.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
reference.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
encoded = gigatoken.Tokenizer(reference).encode_files(gigatoken.JsonlFileSource([sys.argv[3]]))
print(len(encoded.layout.content))
"""


def _tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants (Linux /proc)."""
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            with open(f"/proc/{current}/status") as f:
                total += next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
            # Children are listed per thread: a process started from a thread is a child of that thread.
            for thread in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{thread}/children") as f:
                    stack.extend(int(child) for child in f.read().split())
        except (FileNotFoundError, ProcessLookupError, StopIteration):
            continue
    return total


def _children_cpu_seconds() -> float:
    """User + system CPU seconds of this process's waited-for descendants so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(command: list[str]) -> tuple[float, float, int, str]:
    """(wall seconds, CPU seconds, peak tree RSS bytes, stdout) of one fresh-process run."""
    cpu_before = _children_cpu_seconds()
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": REPO})
    peak = 0
    done = threading.Event()

    def poll() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_rss_bytes(process.pid))
            time.sleep(RSS_POLL_SECONDS)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    out, err = process.communicate()
    seconds = time.perf_counter() - started
    done.set()
    poller.join()
    if process.returncode != 0:
        raise SystemExit(f"failed ({process.returncode}): {' '.join(command)}\n{err}")
    return seconds, _children_cpu_seconds() - cpu_before, peak, out + err


def bench_corpus(corpus: str, runs: int, workers: int | None, output_formats: list[str], scratch: str) -> dict:
    vocab, merges = os.path.join(GPT2, "gpt2-vocab.json"), os.path.join(GPT2, "gpt2-merges.txt")
    ours = [sys.executable, "-m", "preprocess.cli", "--input", corpus, "--output-prefix",
            os.path.join(scratch, "run", "bench"), "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab,
            "--merge-file", merges, "--append-eod", "--log-interval", str(10**9), "--output-format", *output_formats]
    if workers is not None:
        ours += ["--workers", str(workers)]
    ceiling = [sys.executable, "-c", CEILING, vocab, merges, corpus]
    results: dict[str, list[tuple[float, float, int]]] = {"ours": [], "ceiling": []}
    tokens = {}
    replacements = 0
    for _ in range(runs):
        for name, command in (("ceiling", ceiling), ("ours", ours)):
            # A fresh output directory per run: the Arrow and MindRecord writers refuse existing outputs.
            shutil.rmtree(os.path.join(scratch, "run"), ignore_errors=True)
            os.makedirs(os.path.join(scratch, "run"))
            seconds, cpu_seconds, peak, output = measure(command)
            results[name].append((seconds, cpu_seconds, peak))
            if name == "ceiling":
                tokens[name] = int(output.split()[0])
            else:
                tokens[name] = int(output.split(" tokens,")[0].rsplit(" ", 1)[1])
                replacements = output.count(REPLACED)
    size = os.path.getsize(corpus)
    summary = {}
    for name, samples in results.items():
        seconds = statistics.median(s for s, _, _ in samples)
        summary[name] = {"seconds": seconds, "cpu_seconds": statistics.median(c for _, c, _ in samples),
                         "mb_per_s": size / MEGABYTE / seconds, "tokens_per_s": tokens[name] / seconds,
                         "peak_rss_mb": max(p for _, _, p in samples) / MEGABYTE,
                         "all_seconds": [round(s, 2) for s, _, _ in samples]}
    summary["ratio"] = summary["ceiling"]["seconds"] / summary["ours"]["seconds"]
    summary["run_ratios"] = [round(c[0] / o[0], 2) for c, o in zip(results["ceiling"], results["ours"])]
    summary["replacements"] = replacements
    # Best runs are the least disturbed by other jobs on a shared machine.
    summary["best_ratio"] = min(summary["ceiling"]["all_seconds"]) / min(summary["ours"]["all_seconds"])
    summary["size_mb"] = size / MEGABYTE
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpora", nargs="+", help="JSONL corpora ({'text': ...} per line)")
    parser.add_argument("--runs", type=int, default=3, help="fresh-process runs of each command (median taken)")
    parser.add_argument("--large-runs", type=int, default=None,
                        help=f"runs for corpora over {LARGE_CORPUS_BYTES // 10**6} MB (default: --runs)")
    parser.add_argument("--workers", type=int, default=None, help="preprocess-data --workers (default: its default)")
    parser.add_argument("--output-format", nargs="+", default=["mmap"], help="preprocess-data --output-format")
    args = parser.parse_args()
    print(f"cpus {os.cpu_count()}, load average before {os.getloadavg()}")
    peaks = []
    with tempfile.TemporaryDirectory() as scratch:
        for corpus in args.corpora:
            large = os.path.getsize(corpus) > LARGE_CORPUS_BYTES and args.large_runs is not None
            runs = args.large_runs if large else args.runs
            summary = bench_corpus(corpus, runs, args.workers, args.output_format, scratch)
            print(f"\n{corpus} ({summary['size_mb']:.1f} MB), medians of {runs} runs, load average after "
                  f"{tuple(round(x, 2) for x in os.getloadavg())}")
            for name in ("ours", "ceiling"):
                row = summary[name]
                print(f"  {name:8s} {row['seconds']:6.2f} s  cpu {row['cpu_seconds']:6.2f} s  "
                      f"{row['mb_per_s']:6.1f} MB/s  {row['tokens_per_s'] / 1e6:6.2f} M tokens/s  "
                      f"peak RSS {row['peak_rss_mb']:6.0f} MB  "
                      f"runs {row['all_seconds']}")
            print(f"  speed vs ceiling: {summary['ratio']:.2f} of medians, runs {summary['run_ratios']}, "
                  f"{summary['best_ratio']:.2f} of best runs (target >= {SPEED_TARGET} median, never < {SPEED_FLOOR})")
            print(f"  encoder processes replaced: {summary['replacements']} (last run)")
            peaks.append((corpus, summary["ours"]["peak_rss_mb"]))
    if len(peaks) > 1:
        print(f"\npeak RSS of preprocess-data (target <= {PEAK_RSS_TARGET_MB} MB on every corpus):")
        for corpus, peak in peaks:
            print(f"  {peak:6.0f} MB  {corpus}")
        print(f"  growth, first corpus to last: {peaks[-1][1] / peaks[0][1]:.2f}x; "
              f"largest {max(peak for _, peak in peaks):.0f} MB")
    print(f"load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
