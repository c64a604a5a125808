"""Tiny Llama-class models made locally with transformers (never downloaded) for the HF Llama tests: one per
architecture we convert, each with the features that architecture adds, weights drawn by
`hf_testing.seed_weights` from our own seeded generator (not transformers' initialiser)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from hf_testing import DATA_TEST, TINY_STD, TINY_VOCAB, seed_weights

EOS = TINY_VOCAB - 1
SP_BPE = str(DATA_TEST / "tokenizers" / "sp-bpe.model")
# 2 layers, hidden 64, 4 heads of 16, a SwiGLU of 96, 128 positions.
COMMON = {"vocab_size": TINY_VOCAB, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
          "num_attention_heads": 4, "max_position_embeddings": 128, "bos_token_id": 1, "eos_token_id": EOS}
# name -> (config class, model class, what the variant adds): every feature of point 3 of issue 30.
VARIANTS = {
    # Llama 2's shapes: multi-head attention, rope base 10000, untied head; with linear rope scaling.
    "llama2": ("LlamaConfig", "LlamaForCausalLM",
               {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    # Llama 3.x: grouped-query attention, base 500000, Llama 3.1's rope_scaling (original 64 < 128 positions,
    # so the scaling changes the frequencies the tests use).
    "llama3": ("LlamaConfig", "LlamaForCausalLM",
               {"num_key_value_heads": 2, "rope_theta": 500000.0,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    # Mistral: multi-query attention, no sliding window.
    "mistral": ("MistralConfig", "MistralForCausalLM", {"num_key_value_heads": 1, "sliding_window": None}),
    # Qwen2: q/k/v biases, embeddings tied to the head (the small sizes).
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"num_key_value_heads": 2, "tie_word_embeddings": True}),
    # Qwen3: q/k RMSNorm per head, a head width that is not hidden / heads.
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"num_key_value_heads": 2, "head_dim": 32}),
    # Mixtral: 4 SwiGLU experts, top-2 routing.
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_key_value_heads": 2, "num_local_experts": 4,
                                                        "num_experts_per_tok": 2}),
}
LLAMA_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")


def make_tiny_llama(directory: Path, variant: str, seed: int = 0, **overrides) -> Path:
    """A random ``variant`` model saved with save_pretrained."""
    import transformers

    config_class, model_class, extra = VARIANTS[variant]
    config = getattr(transformers, config_class)(**{**COMMON, **extra, **overrides})
    model = getattr(transformers, model_class)(config)
    seed_weights(model, seed, TINY_STD).save_pretrained(directory)
    return directory


def add_tokenizer_files(directory: Path) -> dict[str, bytes]:
    """Give a model directory Llama's four tokenizer files (a tiny SentencePiece model and its description,
    as `trainer.checkpoint.tokenizer.record_tokenizer` writes them); returns their bytes by name."""
    from preprocess.tokenizers import TokenizerConfig
    from trainer.checkpoint.tokenizer import record_tokenizer

    record_tokenizer(directory, TokenizerConfig(tokenizer_type="Llama2Tokenizer", tokenizer_model=SP_BPE))
    (directory / "tokenizer_settings.json").unlink()  # ours, not a Hugging Face file
    return {name: (directory / name).read_bytes() for name in LLAMA_TOKENIZER_FILES}


def hf_llama(directory: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory).eval()


def copy_model(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def max_logit_tolerance(logits: torch.Tensor, relative: float) -> float:
    """``relative`` times the largest logit's magnitude: "within 1e-5 of the largest logit"."""
    return relative * logits.abs().max().item()
