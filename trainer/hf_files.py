"""Reading and writing local Hugging Face model directories (never the Hub).

A directory holds ``config.json`` and the weights as ``model.safetensors``, ``pytorch_model.bin``
(loaded with ``weights_only=True``: no arbitrary unpickling) or a sharded set named by
``model.safetensors.index.json`` / ``pytorch_model.bin.index.json``, plus, optionally, tokenizer files.

    config = read_hf_config("gpt2/")
    tensors = read_hf_weights("gpt2/")
    write_hf_directory("out/", config, tensors, tokenizer_source="gpt2/")
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch

from indexed_dataset.permissions import give_default_permissions
from preprocess.tokenizers import TokenizerConfig
from trainer.errors import HFConversionError

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
PYTORCH_FILE = "pytorch_model.bin"
INDEX_SUFFIX = ".index.json"
# Weight files in the order transformers prefers them.
WEIGHT_FILES = (SAFETENSORS_FILE, SAFETENSORS_FILE + INDEX_SUFFIX, PYTORCH_FILE, PYTORCH_FILE + INDEX_SUFFIX)
# transformers refuses safetensors files whose metadata does not name the framework.
SAFETENSORS_METADATA = {"format": "pt"}
GPT2_VOCAB, GPT2_MERGES, TOKENIZER_JSON = "vocab.json", "merges.txt", "tokenizer.json"
# T5/mT5's SentencePiece model.
T5_SPIECE = "spiece.model"
# BERT's WordPiece vocabulary.
WORDPIECE_VOCAB = "vocab.txt"
TOKENIZER_FILES = (GPT2_VOCAB, GPT2_MERGES, TOKENIZER_JSON, T5_SPIECE, WORDPIECE_VOCAB, "tokenizer_config.json",
                   "special_tokens_map.json")
TEMP_SUFFIX = ".tmp"
# The global named in torch's refusal of a pickle that is not weights-only ("... GLOBAL posix.system ...").
_REFUSED_GLOBAL = re.compile(r"GLOBAL (\S+)")


def is_hf_directory(path: str | os.PathLike) -> bool:
    """True when ``path`` is a directory with a ``config.json``."""
    return (Path(path) / CONFIG_FILE).is_file()


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``.

    Raises:
        HFConversionError: missing, unreadable, or not a JSON object.
    """
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HFConversionError(f"{path}: not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise HFConversionError(f"{path}: not readable JSON ({error})") from None
    if not isinstance(value, dict):
        raise HFConversionError(f"{path}: expected a JSON object")
    return value


def read_hf_config(directory: str | os.PathLike) -> dict[str, Any]:
    """The parsed ``config.json`` of a model directory (not checked; see `check_hf_config`)."""
    return read_json(Path(directory) / CONFIG_FILE)


def _load_file(path: Path) -> dict[str, torch.Tensor]:
    try:
        if path.name.endswith(".safetensors"):
            return safetensors.torch.load_file(path)
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise HFConversionError(f"{path}: not found") from None
    except pickle.UnpicklingError as error:
        # torch's message advises loading with weights_only=False, which would run the file's code: never.
        found = _REFUSED_GLOBAL.search(str(error))
        what = f"it refers to {found.group(1)}" if found else "it holds objects other than tensors"
        raise HFConversionError(f"{path}: refused, not a weights-only file ({what}); "
                                "convert it to model.safetensors where it came from") from None
    except (OSError, RuntimeError, ValueError, EOFError, safetensors.SafetensorError) as error:
        raise HFConversionError(f"{path}: cannot read weights ({str(error).splitlines()[0]})") from None


def read_hf_weights(directory: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of the model's weight file(s), by its saved name.

    Raises:
        HFConversionError: no weight file, an unreadable one, or a shard index naming a missing file.
    """
    root = Path(directory)
    name = next((n for n in WEIGHT_FILES if (root / n).is_file()), None)
    if name is None:
        raise HFConversionError(f"{root}: no model weights ({', '.join(WEIGHT_FILES)}); "
                                "only local directories are read, nothing is downloaded")
    if not name.endswith(INDEX_SUFFIX):
        tensors = _load_file(root / name)
    else:
        weight_map = read_json(root / name).get("weight_map")
        if not isinstance(weight_map, dict):
            raise HFConversionError(f"{root / name}: no weight_map")
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            tensors |= _load_file(root / shard)
    if not all(isinstance(t, torch.Tensor) for t in tensors.values()):
        raise HFConversionError(f"{root / name}: holds something other than tensors")
    return tensors


def _replace_atomically(path: Path, write) -> None:
    """Call ``write(temp_path)``, then rename the temporary file onto ``path``."""
    temp = path.with_name(path.name + TEMP_SUFFIX)
    try:
        write(temp)
        give_default_permissions(temp)  # safetensors writes its files 0600
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def write_json(path: Path, value: dict[str, Any]) -> None:
    """``value`` as indented JSON at ``path`` (written under a temporary name first)."""
    _replace_atomically(path, lambda temp: temp.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8"))


def copy_tokenizer_files(source: str | os.PathLike, destination: str | os.PathLike) -> list[str]:
    """Copy the tokenizer files present in ``source`` into ``destination``.

    Returns:
        The names copied.
    """
    copied = []
    for name in TOKENIZER_FILES:
        if (Path(source) / name).is_file() and Path(source).resolve() != Path(destination).resolve():
            _replace_atomically(Path(destination) / name, lambda temp: shutil.copyfile(Path(source) / name, temp))
            copied.append(name)
    return copied


def write_hf_directory(directory: str | os.PathLike, config: dict[str, Any], tensors: dict[str, torch.Tensor],
                       tokenizer_source: str | os.PathLike | None = None) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (and copy tokenizer files) into ``directory``.

    Tokenizer files and the weights are written first and ``config.json`` last, each under a
    temporary name, so an interrupted export never looks like a loadable model.

    Returns:
        The directory.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    if tokenizer_source is not None:
        copy_tokenizer_files(tokenizer_source, root)
    _replace_atomically(root / SAFETENSORS_FILE,
                        lambda temp: safetensors.torch.save_file(tensors, temp, metadata=SAFETENSORS_METADATA))
    write_json(root / CONFIG_FILE, config)
    logger.info("wrote %s (%d tensors)", root, len(tensors))
    return root


def tokenizer_config_for_directory(directory: str | os.PathLike) -> TokenizerConfig | None:
    """The tokenizer stored in a model or checkpoint directory, or None when it holds none.

    GPT-2's ``vocab.json`` + ``merges.txt`` give Megatron's GPT2BPETokenizer (what GPT-2 models use);
    otherwise a ``tokenizer.json`` gives the HuggingFaceTokenizer, and T5's ``spiece.model`` the
    GPTSentencePieceTokenizer (the plain SentencePiece model, as T5Tokenizer reads it).
    """
    root = Path(directory)
    if (root / GPT2_VOCAB).is_file() and (root / GPT2_MERGES).is_file():
        return TokenizerConfig(tokenizer_type="GPT2BPETokenizer", vocab_file=str(root / GPT2_VOCAB),
                               merge_file=str(root / GPT2_MERGES))
    if (root / TOKENIZER_JSON).is_file():
        return TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(root / TOKENIZER_JSON))
    if (root / T5_SPIECE).is_file():
        return TokenizerConfig(tokenizer_type="GPTSentencePieceTokenizer", tokenizer_model=str(root / T5_SPIECE))
    return None


def tokenizer_train_defaults(directory: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """``{"data": tokenizer options}`` of the tokenizer stored in a directory (``train --load-hf``); {} if none."""
    tokenizer = tokenizer_config_for_directory(directory)
    if tokenizer is None:
        return {}
    return {"data": {name: getattr(tokenizer, name) for name in ("tokenizer_type", "vocab_file", "merge_file",
                                                                 "tokenizer_model")}}
