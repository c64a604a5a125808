#!/usr/bin/env bash
# The README quickstart's main job on the bundled data: tokenize data_test/sample_en.jsonl with GPT-2's
# BPE into Megatron token files, inspect and validate them, then train a tiny GPT on them for a few steps
# on the CPU. Outputs go to runs/quickstart/ (git-ignored); a rerun starts afresh.
set -euo pipefail
cd "$(dirname "$0")/.."
out=runs/quickstart
rm -rf "$out" && mkdir -p "$out"
tokenizer=(--tokenizer-type GPT2BPETokenizer --vocab-file data_test/gpt2/gpt2-vocab.json --merge-file data_test/gpt2/gpt2-merges.txt)

preprocess-data --input data_test/sample_en.jsonl --output-prefix "$out/sample" "${tokenizer[@]}" --append-eod --workers 1
inspect-index "$out/sample_text_document" --validate --docs 0 "${tokenizer[@]}"

# A few training steps of a tiny GPT on those tokens, on the CPU, with a checkpoint and metrics.jsonl.
train --dataset "$out/sample_text_document" "${tokenizer[@]}" --split 90,5,5 --data-cache-path "$out/index-cache" \
  --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 \
  --micro-batch-size 4 --global-batch-size 4 --train-iters 10 --lr 1e-3 \
  --log-interval 5 --eval-interval 5 --eval-iters 1 --device cpu --save "$out/checkpoint"

# What was made, and what to try next.
cat <<SUMMARY

Made: $out/sample_text_document.bin/.idx (the tokens) and $out/checkpoint (a tiny GPT after 10 steps, with
its tokenizer and metrics.jsonl). Ten steps of a tiny model barely move the loss: this shows that every
piece works, not a trained model. Next:
  generate --load $out/checkpoint --prompt "Hello, my name is" --max-new-tokens 20
  plot-metrics $out/checkpoint --out $out/metrics.png
  README.md, then docs/training.md and docs/huggingface-and-generation.md
SUMMARY
