"""Sharded checkpoints with torch.distributed.checkpoint (DCP): save, find the latest, load and reshard.

Layout (Megatron's names)::

    <dir>/iter_0000100/            one DCP checkpoint: .metadata + one shard file per rank
    <dir>/latest_checkpointed_iteration.txt   "100"

A checkpoint is written under ``iter_XXXXXXX.tmp`` and renamed when every rank has finished, and the
pointer file is replaced atomically after that, so a crash never leaves a valid-looking half
checkpoint. Everything saved is a tensor keyed by its full-model name (``model.layers.0.attention.wq.
weight``, ``optim.<param>.exp_avg``, ``train.iteration``), so a checkpoint loads into any tp/pp/dp
layout: DCP reshards DTensors by their global offsets. Loading never unpickles arbitrary objects: DCP's
``.metadata`` pickle is read with an unpickler that only builds DCP's own metadata classes, and no
bytes entries are ever saved.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.tensor import DTensor, distribute_tensor

from trainer.errors import CheckpointError

logger = logging.getLogger(__name__)

LATEST_FILE = "latest_checkpointed_iteration.txt"
# Beside the iterations: what the tensors cannot tell about the model (`trainer.hf_convert`, `trainer.t5_convert`).
MODEL_CONFIG_FILE = "model_config.json"
# Model tensors are saved as "model.<parameter name>".
MODEL_PREFIX = "model."
# A checkpoint converted from Hugging Face: the model only, at iteration 0 (training starts afresh from it).
IMPORTED_ITERATION = 0
TEMP_SUFFIX = ".tmp"
_SAFE_MODULE_PREFIXES = ("torch.distributed.checkpoint.",)
# What DCP's metadata pickle refers to besides its own classes (torch 2.13): sizes, the layout decoder
# (maps a name to a torch.layout), the storage path type and plain containers.
_SAFE_GLOBALS = {("collections", "OrderedDict"), ("torch", "Size"), ("torch.serialization", "_get_layout"),
                 ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("builtins", "set"), ("builtins", "frozenset")}


def checkpoint_dir(root: str | os.PathLike, iteration: int) -> Path:
    return Path(root) / f"iter_{iteration:07d}"


class _MetadataUnpickler(pickle.Unpickler):
    """Builds only DCP metadata classes, torch dtypes/sizes and plain containers."""

    def find_class(self, module: str, name: str):
        if module.startswith(_SAFE_MODULE_PREFIXES) or (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout,
                                                                          torch.memory_format)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from checkpoint metadata")


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader with a restricted unpickler for the ``.metadata`` file."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        path = Path(self.path) / ".metadata"
        try:
            metadata = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError) as error:
            raise CheckpointError(f"{path}: unreadable checkpoint metadata ({error})") from error
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _is_distributed() -> bool:
    return dist.is_initialized() and dist.get_world_size() > 1


def _barrier() -> None:
    if _is_distributed():
        dist.barrier()


def _is_rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def save_checkpoint(root: str | os.PathLike, iteration: int, state: dict[str, torch.Tensor]) -> Path:
    """Write ``state`` as checkpoint ``iteration`` under ``root`` (collective: every rank calls it).

    Returns:
        The checkpoint directory.
    """
    final = checkpoint_dir(root, iteration)
    temp = final.with_name(final.name + TEMP_SUFFIX)
    if _is_rank0():
        Path(root).mkdir(parents=True, exist_ok=True)
        shutil.rmtree(temp, ignore_errors=True)
    _barrier()
    with warnings.catch_warnings():
        # Single-process DCP warns that it assumes a single process, which is what we mean.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(state, checkpoint_id=temp, no_dist=not _is_distributed())
    _barrier()
    if _is_rank0():
        shutil.rmtree(final, ignore_errors=True)
        os.replace(temp, final)
        pointer = Path(root) / LATEST_FILE
        pointer_temp = pointer.with_name(pointer.name + TEMP_SUFFIX)
        pointer_temp.write_text(f"{iteration}\n")
        os.replace(pointer_temp, pointer)
        logger.info("saved checkpoint %s", final)
    _barrier()
    return final


def latest_iteration(root: str | os.PathLike) -> int | None:
    """The iteration the pointer file names, or None when ``root`` holds no checkpoint.

    Raises:
        CheckpointError: the pointer is unreadable or names a missing checkpoint.
    """
    pointer = Path(root) / LATEST_FILE
    if not pointer.exists():
        return None
    text = pointer.read_text().strip()
    if not text.isdigit():
        raise CheckpointError(f"{pointer}: expected an iteration number, found {text!r}")
    iteration = int(text)
    if not (checkpoint_dir(root, iteration) / ".metadata").exists():
        raise CheckpointError(f"{pointer} names iteration {iteration} but {checkpoint_dir(root, iteration)} "
                              "is missing or incomplete")
    return iteration


def load_checkpoint(root: str | os.PathLike, iteration: int, state: dict[str, torch.Tensor],
                    optional: frozenset[str] = frozenset(), model_names: frozenset[str] | None = None) -> set[str]:
    """Load checkpoint ``iteration`` into the tensors of ``state`` in place, resharding as needed.

    Args:
        root: the checkpoint root directory.
        iteration: which checkpoint.
        state: name -> tensor (or DTensor) to fill; shapes are the global ones.
        optional: names that may be absent from the checkpoint (left untouched).
        model_names: every ``model.`` name of the full model (this rank may hold only some); a
            saved ``model.`` tensor outside it means the checkpoint is of another model shape.

    Returns:
        The names that were loaded.

    Raises:
        CheckpointError: a required name is missing or a tensor's shape differs (another model shape).
    """
    path = checkpoint_dir(root, iteration)
    reader = SafeFileSystemReader(path)
    saved = reader.read_metadata().state_dict_metadata
    if model_names is not None:
        extra = sorted(name for name in saved if name.startswith("model.") and name not in model_names)
        if extra:
            raise CheckpointError(f"{path} holds {extra[0]}, which this model lacks: the checkpoint was saved for "
                                  "another model shape")
    for name, tensor in state.items():
        if name not in saved:
            if name in optional:
                continue
            raise CheckpointError(f"{path} has no {name}: it was saved for another model shape or trainer")
        meta = saved[name]
        if not isinstance(meta, TensorStorageMetadata) or tuple(meta.size) != tuple(tensor.shape):
            shape = tuple(meta.size) if isinstance(meta, TensorStorageMetadata) else "a non-tensor"
            raise CheckpointError(f"{path} holds {name} of shape {shape} but the model's is {tuple(tensor.shape)}: "
                                  "the checkpoint was saved for another model shape")
    to_load = {name: tensor for name, tensor in state.items() if name in saved}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(to_load, storage_reader=reader, no_dist=not _is_distributed())
    logger.info("loaded checkpoint %s", path)
    return set(to_load)


@torch.no_grad()
def copy_into_parameter(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy the full tensor ``full`` into ``param``, or into this rank's shard when it is a DTensor."""
    if isinstance(param, DTensor):
        # Every rank holds the same full tensor, so each cuts its own shard without communication.
        shard = distribute_tensor(full.to(param.device), param.device_mesh, param.placements, src_data_rank=None)
        param.to_local().copy_(shard.to_local())
    else:
        param.copy_(full)
