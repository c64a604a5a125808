"""What Arrow and MindRecord output costs next to Megatron's mmap `.bin/.idx`, on real token data.

    python -m benchmarks.shards                       # bench_data/corpus_en_10m.jsonl, 3 runs
    python -m benchmarks.shards --corpus bench_data/corpus_en.jsonl --runs 5

(Run it with -m from the repository root: run by path, `benchmarks/preprocess.py` would shadow the
`preprocess` package.)

1. The baseline: `preprocess_data` (GPT-2 BPE, eod appended) tokenizes the corpus to mmap; its wall
   time (median of the runs) is the "mmap run".
2. The same documents, read back from that mmap dataset in batches, are written again with each
   format's writer (median of the runs). What a run writing Arrow or MindRecord instead of mmap
   adds is that writer's time minus the mmap writer's; the budget is 15 % of the mmap run.
3. Every dataset is read back through our readers (all tokens, in document batches): tokens/s,
   with the tokens checked equal to the mmap ones.
4. MindRecord's CompressInt on the first documents (about `KERNEL_SAMPLE_TOKENS` tokens): the numba
   kernels against their numpy reference twins, outputs checked equal.

Build the corpus first: `bash benchmarks/make_corpus.sh bench_data`.
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from indexed_dataset import IndexedDataset
from indexed_dataset.compress_int import (
    compress_int_rows,
    compress_int_rows_reference,
    decompress_int_rows,
    decompress_int_rows_reference,
)
from indexed_dataset.convert import DEFAULT_BATCH_DOCUMENTS
from indexed_dataset.formats import FORMATS, open_reader, open_writer
from preprocess.config import PreprocessConfig
from preprocess.pipeline import preprocess_data
from preprocess.tokenizers import TokenizerConfig

REPO = Path(__file__).resolve().parents[1]
OVERHEAD_BUDGET = 0.15  # the limit on what a shard format may add to the mmap run
KERNEL_SAMPLE_TOKENS = 2**21  # the numpy twins need ~100 bytes of temporaries per token
OUTPUT_NAMES = {"mmap": "out_text_document", "arrow": "out_arrow", "mindrecord": "out.mindrecord"}


def median_seconds(function, runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def tokenize(corpus: str, output_prefix: str, workers: int) -> None:
    tokenizer = TokenizerConfig(
        tokenizer_type="GPT2BPETokenizer",
        vocab_file=str(REPO / "data_test" / "gpt2" / "gpt2-vocab.json"),
        merge_file=str(REPO / "data_test" / "gpt2" / "gpt2-merges.txt"),
    )
    config = PreprocessConfig(
        input=corpus, output_prefix=output_prefix, tokenizer=tokenizer, append_eod=True, workers=workers
    )
    preprocess_data(config, use_progress_bar=False)


def write_all(source: IndexedDataset, fmt: str, path: str) -> None:
    with open_writer(fmt, path, source.dtype) as writer:
        for first in range(0, source.num_documents, DEFAULT_BATCH_DOCUMENTS):
            batch = source.read_documents(first, min(first + DEFAULT_BATCH_DOCUMENTS, source.num_documents))
            writer.add_documents(batch.tokens, batch.sequence_lengths, batch.document_sequence_counts)


def read_all(path: str) -> np.uint64:
    """Open the dataset and decode every token; returns a checksum of the ids."""
    reader = open_reader(path)
    total = np.uint64(0)
    num_documents = len(reader.document_indices) - 1
    for first in range(0, num_documents, DEFAULT_BATCH_DOCUMENTS):
        tokens = reader.read_documents(first, min(first + DEFAULT_BATCH_DOCUMENTS, num_documents)).tokens
        total += tokens.sum(dtype=np.uint64)
    return total


def compress_int_rates(source: IndexedDataset, runs: int) -> None:
    """Print CompressInt encode and decode rates: numba kernels vs numpy twins, on real documents."""
    corpus = source.read_documents(0, source.num_documents)  # views of the memory map
    offsets = corpus.document_token_offsets()
    batch = corpus.documents(0, max(int(np.searchsorted(offsets, KERNEL_SAMPLE_TOKENS, "right")) - 1, 1))
    counts = np.diff(batch.document_token_offsets())
    encoded, sizes = compress_int_rows(batch.tokens, counts)
    starts = np.cumsum(sizes) - sizes
    if encoded.tobytes() != compress_int_rows_reference(batch.tokens, counts)[0].tobytes():
        raise SystemExit("CompressInt: the kernel's bytes differ from the numpy twin's")
    if not np.array_equal(decompress_int_rows(encoded, starts, sizes)[0], batch.tokens):
        raise SystemExit("CompressInt: decoding does not give the tokens back")
    if not np.array_equal(decompress_int_rows_reference(encoded, starts)[0], batch.tokens):
        raise SystemExit("CompressInt: the numpy twin does not decode the tokens back")
    pairs = {
        "encode": (lambda: compress_int_rows(batch.tokens, counts),
                   lambda: compress_int_rows_reference(batch.tokens, counts)),
        "decode": (lambda: decompress_int_rows(encoded, starts, sizes),
                   lambda: decompress_int_rows_reference(encoded, starts)),
    }
    print(f"\nCompressInt, {len(counts)} documents, {len(batch.tokens)} tokens")
    print(f"{'':<8} {'kernel Mtok/s':>14} {'numpy twin Mtok/s':>18} {'ratio':>7}")
    for name, (kernel, twin) in pairs.items():
        kernel_rate = len(batch.tokens) / median_seconds(kernel, runs) / 1e6
        twin_rate = len(batch.tokens) / median_seconds(twin, runs) / 1e6
        print(f"{name:<8} {kernel_rate:>14.1f} {twin_rate:>18.1f} {kernel_rate / twin_rate:>6.1f}x")


def disk_bytes(path: str) -> tuple[int, int]:
    """(apparent, allocated) bytes of every file of a dataset (MindRecord leaves its padding as holes)."""
    if os.path.isdir(path):
        files = [os.path.join(path, name) for name in os.listdir(path)]
    else:
        files = glob.glob(glob.escape(path) + "*")
    stats = [os.stat(f) for f in files]
    return sum(s.st_size for s in stats), sum(s.st_blocks * 512 for s in stats)


def fresh(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    for name in os.listdir(os.path.dirname(path)):
        if name.startswith(os.path.basename(path)):
            os.remove(os.path.join(os.path.dirname(path), name))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", default=str(REPO / "bench_data" / "corpus_en_10m.jsonl"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="tokenmill-shards-") as workdir:
        prefix = os.path.join(workdir, "corpus")

        def tokenize_once() -> None:
            for name in os.listdir(workdir):
                os.remove(os.path.join(workdir, name))
            tokenize(args.corpus, prefix, args.workers)

        mmap_run = median_seconds(tokenize_once, args.runs)
        source = IndexedDataset(f"{prefix}_text_document")
        print(f"corpus {args.corpus}: {source.num_documents} documents, {source.num_tokens} tokens "
              f"({source.dtype.name}); mmap run (preprocess_data) {mmap_run:.2f} s, median of {args.runs}")

        write_seconds, paths = {}, {}
        for fmt in FORMATS:
            paths[fmt] = os.path.join(workdir, "formats", OUTPUT_NAMES[fmt])
            os.makedirs(os.path.dirname(paths[fmt]), exist_ok=True)

            def write_once(fmt=fmt) -> None:
                fresh(paths[fmt])
                write_all(source, fmt, paths[fmt])

            write_seconds[fmt] = median_seconds(write_once, args.runs)

        print(f"\n{'format':<11} {'write s':>8} {'added s':>8} {'added/mmap run':>15} {'budget':>7}"
              f" {'MB apparent':>12} {'MB on disk':>11}")
        for fmt in FORMATS:
            added = write_seconds[fmt] - write_seconds["mmap"]
            verdict = "" if fmt == "mmap" else ("OK" if added <= OVERHEAD_BUDGET * mmap_run else "OVER")
            apparent, allocated = disk_bytes(paths[fmt])
            print(f"{fmt:<11} {write_seconds[fmt]:>8.3f} {added:>8.3f} {added / mmap_run:>14.1%} {verdict:>7}"
                  f" {apparent / 1e6:>12.1f} {allocated / 1e6:>11.1f}")

        expected = read_all(paths["mmap"])
        print(f"\n{'format':<11} {'read s':>8} {'Mtokens/s':>10} {'vs mmap':>8}")
        read_seconds = {}
        for fmt in FORMATS:
            if read_all(paths[fmt]) != expected:
                raise SystemExit(f"{fmt}: tokens read back differ from the mmap dataset")
            read_seconds[fmt] = median_seconds(lambda fmt=fmt: read_all(paths[fmt]), args.runs)
            rate = source.num_tokens / read_seconds[fmt] / 1e6
            relative = read_seconds["mmap"] / read_seconds[fmt]
            print(f"{fmt:<11} {read_seconds[fmt]:>8.3f} {rate:>10.1f} {relative:>7.2f}x")

        compress_int_rates(source, args.runs)


if __name__ == "__main__":
    main()
