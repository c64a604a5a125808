"""``convert-checkpoint``: Hugging Face directories <-> tokenmill checkpoints, for any model family.

The command's config. The family of the source (a HF directory's ``model_type``, a checkpoint's
``model_config.json``) converts (`trainer.family.spec.ModelSpec.import_hf_checkpoint` and
``export_hf_checkpoint``); `trainer.models.dispatch.convert_checkpoint` finds it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True, slots=True)
class ConvertCheckpointConfig:
    """One ``convert-checkpoint`` run: HF directory -> checkpoint, or checkpoint -> HF directory."""

    from_hf: str | None = None
    """Local HF GPT-2 (or T5/mT5) directory to import."""
    to: str | None = None
    """Checkpoint root to create from it."""
    from_checkpoint: str | None = None
    """Checkpoint root (latest iteration) or iter_XXXXXXX directory to export."""
    to_hf: str | None = None
    """HF directory to write."""
    make_vocab_size_divisible_by: int | None = None
    """Import: pad the vocabulary to a multiple of this x tensor_model_parallel_size (default 128)."""
    tensor_model_parallel_size: int | None = None
    """Import: tp degree of the run that will load the checkpoint (default 1)."""
    num_attention_heads: int | None = None
    """Export of a checkpoint without model_config.json: its head count."""
    vocab_size: int | None = None
    """Export of a checkpoint without model_config.json: its real vocabulary size."""
    no_verify: bool = False
    """Load without checking the checkpoint's files against its manifest (checksums written at save)."""

    def __post_init__(self) -> None:
        importing = self.from_hf is not None or self.to is not None
        exporting = self.from_checkpoint is not None or self.to_hf is not None
        pair = (self.from_hf, self.to) if importing else (self.from_checkpoint, self.to_hf)
        if importing == exporting or None in pair:
            raise ValueError("give from_hf with a checkpoint root (to), or from_checkpoint with to_hf")
        wrong = ("num_attention_heads", "vocab_size") if importing else ("make_vocab_size_divisible_by",
                                                                         "tensor_model_parallel_size")
        for name in wrong:
            if getattr(self, name) is not None:
                raise ValueError(f"{name} does not apply when {'importing' if importing else 'exporting'}")
        for name in ("make_vocab_size_divisible_by", "tensor_model_parallel_size", "num_attention_heads", "vocab_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
