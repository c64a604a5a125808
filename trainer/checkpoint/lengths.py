"""The sequence lengths a checkpoint was trained with, recorded beside its ``model_config.json``.

``train --load RUN`` takes them as defaults with the rest of the model's shape, so that resuming needs no
``--seq-length`` again. Checkpoints saved before this record existed fall back on their position table:
a GPT or BERT trains at ``max_position_embeddings`` tokens.

    sequence_lengths.json: {"seq_length": 64}        (a T5: {"encoder_seq_length": 512, "decoder_seq_length": 128})

(A file of its own, not a key of model_config.json: that file holds the model's shape, which is checked key
by key.)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainer.checkpoint.store import MODEL_CONFIG_FILE
from trainer.errors import CheckpointError
from trainer.checkpoint.hf_files import read_json, write_json

SEQUENCE_LENGTHS_FILE = "sequence_lengths.json"


def record_sequence_lengths(root: str | os.PathLike, lengths: Mapping[str, int]) -> None:
    """Write the run's sequence lengths (field name -> positions: those its family reads,
    `ModelSpec.sequence_lengths`) into checkpoint root ``root`` (call on one rank)."""
    write_json(Path(root) / SEQUENCE_LENGTHS_FILE, dict(lengths))


def sequence_length_defaults(root: str | os.PathLike, length_sections: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """``train --load ROOT``'s sequence-length defaults by `TrainConfig` section: the recorded lengths, else
    (an older checkpoint) ``seq_length`` = the model's ``max_position_embeddings``; {} when neither is known.
    ``length_sections``: each length field any family records -> its section (`trainer.models.length_sections`).

    Raises:
        CheckpointError: the record is not an object of known names and positive integers.
    """
    path = Path(root) / SEQUENCE_LENGTHS_FILE
    if not path.is_file():
        positions = (read_json(Path(root) / MODEL_CONFIG_FILE).get("shape") or {}).get("max_position_embeddings")
        return {"model": {"seq_length": positions}} if isinstance(positions, int) and positions > 0 else {}
    lengths = read_json(path)
    sections: dict[str, dict[str, Any]] = {}
    for name, length in lengths.items():
        if name not in length_sections or isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise CheckpointError(f"{path}: {name}={length!r}: expected one of {', '.join(length_sections)} "
                                  "as a positive integer")
        sections.setdefault(length_sections[name], {})[name] = length
    return sections
