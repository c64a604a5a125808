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

from indexed_dataset.path_rules import file_inside
from indexed_dataset.permissions import give_default_permissions
from indexed_dataset.structured_files import read_json_file
from preprocess.tokenizers import TokenizerConfig
from trainer.checkpoint.disk_space import free_space_shortfall, is_disk_full, no_space_message
from trainer.errors import HFConversionError
from trainer.checkpoint.tokenizer_record import (
    GPT2_MERGES,
    GPT2_VOCAB,
    LLAMA_SPM,
    T5_SPIECE,
    TOKENIZER_JSON,
    WORDPIECE_VOCAB,
    recorded_tokenizer,
)

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
PYTORCH_FILE = "pytorch_model.bin"
INDEX_SUFFIX = ".index.json"
# Weight files in the order transformers prefers them.
WEIGHT_FILES = (SAFETENSORS_FILE, SAFETENSORS_FILE + INDEX_SUFFIX, PYTORCH_FILE, PYTORCH_FILE + INDEX_SUFFIX)
# transformers refuses safetensors files whose metadata does not name the framework.
SAFETENSORS_METADATA = {"format": "pt"}
TOKENIZER_FILES = (GPT2_VOCAB, GPT2_MERGES, TOKENIZER_JSON, T5_SPIECE, LLAMA_SPM, WORDPIECE_VOCAB,
                   "tokenizer_config.json", "special_tokens_map.json")
TEMP_SUFFIX = ".tmp"
# The folder of a Hugging Face cache that holds one folder per downloaded revision.
HUB_SNAPSHOTS_FOLDER = "snapshots"
# The OS error code inside a safetensors I/O error's text.
_OS_ERROR_CODE = re.compile(r"Os \{ code: (\d+)")
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
        value = read_json_file(path, error=HFConversionError)
    except FileNotFoundError:
        raise HFConversionError(f"{path}: not found") from None
    except OSError as error:
        raise HFConversionError(f"{path}: not readable ({error.strerror})") from None
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


def _links_boundary(root: Path) -> Path:
    """Where the files a shard index names may lead through links: the model directory itself, or, for a
    Hugging Face cache snapshot (`models--org--name/snapshots/<revision>/`, whose files are links into
    the cached model's `blobs/`), the cached model's folder."""
    resolved = root.resolve()
    return resolved.parent.parent if resolved.parent.name == HUB_SNAPSHOTS_FOLDER else root


def read_hf_weights(directory: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of the model's weight file(s), by its saved name.

    Raises:
        HFConversionError: no weight file, an unreadable one, or a shard index naming a missing file or
            one outside the directory (`..`, an absolute path, a link leading out; see `_links_boundary`).
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
        boundary = _links_boundary(root)
        shards = {file_inside(root, shard, root / name, entry=f"weight_map[{tensor!r}]", root=boundary,
                              error=HFConversionError) for tensor, shard in weight_map.items()}
        tensors = {}
        for shard in sorted(shards):
            tensors |= _load_file(Path(shard))
    if not all(isinstance(t, torch.Tensor) for t in tensors.values()):
        raise HFConversionError(f"{root / name}: holds something other than tensors")
    return tensors


def replace_atomically(path: Path, write) -> None:
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
    replace_atomically(path, lambda temp: temp.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8"))


def copy_tokenizer_files(source: str | os.PathLike, destination: str | os.PathLike) -> list[str]:
    """Copy the tokenizer files present in ``source`` into ``destination``.

    Returns:
        The names copied.
    """
    copied = []
    for name in TOKENIZER_FILES:
        if (Path(source) / name).is_file() and Path(source).resolve() != Path(destination).resolve():
            replace_atomically(Path(destination) / name, lambda temp: shutil.copyfile(Path(source) / name, temp))
            copied.append(name)
    return copied


def write_hf_directory(directory: str | os.PathLike, config: dict[str, Any], tensors: dict[str, torch.Tensor],
                       tokenizer_source: str | os.PathLike | None = None) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (and copy tokenizer files) into ``directory``.

    A new directory is written whole under a hidden temporary name beside it and renamed at the end; in an
    existing one, tokenizer files and the weights are written first and ``config.json`` last, each under a
    temporary name. Either way an interrupted or failed export never looks like a loadable model, and
    leaves nothing of its own behind.

    Returns:
        The directory.

    Raises:
        HFConversionError: the disk has no room for the weights (checked first, and again if it fills
            during the write): naming the directory, its disk and the bytes needed.
    """
    root = Path(directory)
    needed = sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())
    shortfall = free_space_shortfall(root, needed)
    if shortfall is not None:
        raise HFConversionError(shortfall)
    target, staging = root, None
    if not root.exists():
        staging = root.with_name(f".{root.name}{TEMP_SUFFIX}")
        shutil.rmtree(staging, ignore_errors=True)
        target = staging
    try:
        target.mkdir(parents=True, exist_ok=True)
        if tokenizer_source is not None:
            copy_tokenizer_files(tokenizer_source, target)
        replace_atomically(target / SAFETENSORS_FILE, lambda temp: _save_safetensors(tensors, temp))
        write_json(target / CONFIG_FILE, config)
        if staging is not None:
            os.replace(staging, root)
    except BaseException as error:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if is_disk_full(error):
            raise HFConversionError(no_space_message(root, needed)) from None
        raise
    logger.info("wrote %s (%d tensors)", root, len(tensors))
    return root


def _save_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """``safetensors.torch.save_file``, whose I/O errors (a full disk) become the OSError they are."""
    try:
        safetensors.torch.save_file(tensors, path, metadata=SAFETENSORS_METADATA)
    except safetensors.SafetensorError as error:
        # The Rust error names the OS error's code: "IoError(Os { code: 28, kind: StorageFull, ... })".
        code = _OS_ERROR_CODE.search(str(error))
        if code is None:
            raise
        raise OSError(int(code.group(1)), f"{os.strerror(int(code.group(1)))}: {path}") from None


def tokenizer_config_for_directory(directory: str | os.PathLike) -> TokenizerConfig | None:
    """The tokenizer stored in a model or checkpoint directory, or None when it holds none.

    A checkpoint's own record (its ``tokenizer_settings.json``) comes first; otherwise the files tell:
    GPT-2's ``vocab.json`` + ``merges.txt`` give Megatron's GPT2BPETokenizer (what GPT-2 models use);
    otherwise a ``tokenizer.json`` gives the HuggingFaceTokenizer, T5's ``spiece.model`` the
    GPTSentencePieceTokenizer (the plain SentencePiece model, as T5Tokenizer reads it), and Llama's
    ``tokenizer.model`` the Llama2Tokenizer (BOS before every text, as LlamaTokenizer reads it).
    """
    root = Path(directory)
    recorded = recorded_tokenizer(root)
    if recorded is not None:  # a checkpoint that records its tokenizer type (`trainer.checkpoint.tokenizer_record`)
        return recorded
    if (root / GPT2_VOCAB).is_file() and (root / GPT2_MERGES).is_file():
        return TokenizerConfig(tokenizer_type="GPT2BPETokenizer", vocab_file=str(root / GPT2_VOCAB),
                               merge_file=str(root / GPT2_MERGES))
    if (root / TOKENIZER_JSON).is_file():
        return TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(root / TOKENIZER_JSON))
    if (root / T5_SPIECE).is_file():
        return TokenizerConfig(tokenizer_type="GPTSentencePieceTokenizer", tokenizer_model=str(root / T5_SPIECE))
    if (root / LLAMA_SPM).is_file():
        return TokenizerConfig(tokenizer_type="Llama2Tokenizer", tokenizer_model=str(root / LLAMA_SPM))
    return None


def tokenizer_train_defaults(directory: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """``{"data": tokenizer options}`` of the tokenizer stored in a directory (``train --load-hf``); {} if none."""
    tokenizer = tokenizer_config_for_directory(directory)
    if tokenizer is None:
        return {}
    return {"data": {name: getattr(tokenizer, name) for name in ("tokenizer_type", "vocab_file", "merge_file",
                                                                 "tokenizer_model")}}
