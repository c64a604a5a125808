#!/usr/bin/env bash
# The README quickstart's main job on the bundled data: tokenize data_test/sample_en.jsonl with GPT-2's
# BPE into Megatron token files, inspect and validate them, then train a tiny GPT on them for a few steps
# on the CPU. Outputs go to runs/quickstart/ (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
out=runs/quickstart
mkdir -p "$out"
tokenizer=(--tokenizer-type GPT2BPETokenizer --vocab-file data_test/gpt2/gpt2-vocab.json --merge-file data_test/gpt2/gpt2-merges.txt)

preprocess-data --input data_test/sample_en.jsonl --output-prefix "$out/sample" "${tokenizer[@]}" --append-eod --workers 1
inspect-index "$out/sample_text_document" --validate --docs 0 "${tokenizer[@]}"
