"""The bert flag section of ``train`` (`BertConfig`): BERT pre-training's own settings, which the registry
(`trainer.models`) adds to the flag table as section ``bert``; the masking settings BERT shares with T5 are
the core `trainer.config.MaskingConfig`.

    bert_settings(config).bert_no_binary_head
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.config import TrainConfig

SECTION = "bert"


@dataclass(kw_only=True, slots=True)
class BertConfig:
    """BERT pre-training (read with model bert; shape from model, --mask-prob and --short-seq-prob from masking)."""

    bert_no_binary_head: bool = False
    """Train masked LM only: no pooler, no sentence-order head, single-segment samples (Megatron's spelling)."""


# What the registry lists as the family's own section (`trainer.models.FAMILY_SETTINGS`).
SETTINGS = BertConfig


def bert_settings(config: TrainConfig) -> BertConfig:
    """The run's bert section (its defaults, kept in ``config``, when the config was built without one)."""
    return config.section(SECTION, BertConfig)
