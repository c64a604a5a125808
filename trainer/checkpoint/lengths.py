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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.checkpoint.store import MODEL_CONFIG_FILE
from trainer.errors import CheckpointError
from trainer.checkpoint.hf_files import read_json, write_json

if TYPE_CHECKING:
    from trainer.config import TrainConfig

SEQUENCE_LENGTHS_FILE = "sequence_lengths.json"
# Each length field -> the `TrainConfig` section holding it.
LENGTH_SECTIONS = {"seq_length": "model", "encoder_seq_length": "t5", "decoder_seq_length": "t5"}


def record_sequence_lengths(root: str | os.PathLike, config: TrainConfig, unused_fields: tuple[str, ...]) -> None:
    """Write the run's sequence lengths (those its family reads) into checkpoint root ``root`` (call on one rank)."""
    write_json(Path(root) / SEQUENCE_LENGTHS_FILE,
               {name: getattr(getattr(config, section), name) for name, section in LENGTH_SECTIONS.items()
                if name not in unused_fields})


def sequence_length_defaults(root: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """``train --load ROOT``'s sequence-length defaults by `TrainConfig` section: the recorded lengths, else
    (an older checkpoint) ``seq_length`` = the model's ``max_position_embeddings``; {} when neither is known.

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
        if name not in LENGTH_SECTIONS or isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise CheckpointError(f"{path}: {name}={length!r}: expected one of {', '.join(LENGTH_SECTIONS)} "
                                  "as a positive integer")
        sections.setdefault(LENGTH_SECTIONS[name], {})[name] = length
    return sections
