"""Paths into data_test/ and small helpers shared by the preprocess tests."""

from __future__ import annotations

import json
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(REPO, "data_test")
SAMPLE = os.path.join(DATA, "sample_en.jsonl")
GOLDEN = os.path.join(DATA, "megatron")
TOKENIZERS = os.path.join(DATA, "tokenizers")
GPT2_VOCAB = os.path.join(DATA, "gpt2", "gpt2-vocab.json")
GPT2_MERGES = os.path.join(DATA, "gpt2", "gpt2-merges.txt")
GPT2_FLAGS = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", GPT2_VOCAB, "--merge-file", GPT2_MERGES]


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def same_dataset(prefix_a: str, prefix_b: str) -> bool:
    """Whether two datasets are byte-identical (.bin and .idx)."""
    return all(read_bytes(prefix_a + suffix) == read_bytes(prefix_b + suffix) for suffix in (".bin", ".idx"))


def write_jsonl(path: str, documents: list, raw_lines: list[bytes] | None = None) -> str:
    """Write documents (dicts, dumped as JSON) or raw lines to `path`; returns the path."""
    with open(path, "wb") as f:
        for document in documents:
            f.write(json.dumps(document).encode() + b"\n")
        for line in raw_lines or []:
            f.write(line)
    return path


def sample_texts() -> list[str]:
    with open(SAMPLE, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


