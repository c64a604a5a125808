"""Reading a checkpoint into a model and optimizer of any layout: DCP reshards DTensors by their global offsets, and
the padded vocabulary's rows follow the layout's padding.

Loading never unpickles arbitrary objects: DCP's ``.metadata`` pickle is read with an unpickler that builds only
the exact classes DCP's metadata holds, no bytes entries are ever saved, and tensor files are read by DCP with
``weights_only=True``. Every file is checked against the checkpoint's manifest first (``verify=False`` skips it),
so a damaged file is an error naming it, not a silently different model.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import warnings
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.tensor import DTensor, distribute_tensor

from trainer.checkpoint.manifest import MANIFEST_FILE, MANIFESTED_FILE, read_manifest, verify_files
from trainer.checkpoint.store import (
    METADATA_FILE,
    MODEL_PREFIX,
    OPTIMIZER_PREFIX,
    checkpoint_dir,
    is_distributed,
    is_rank0,
    one_line,
)
from trainer.errors import CheckpointError

logger = logging.getLogger(__name__)

# Files of an iteration directory written by DCP: the tensor shards.
_SHARD_SUFFIX = ".distcp"
# Every global DCP's ``.metadata`` pickle names (torch 2.13, read off checkpoints of every dtype we save):
# its metadata dataclasses, the storage record of the file system writer, the memory-format enum, the layout
# decoder (maps a name such as "torch.strided" to a torch.layout), sizes, paths and plain containers. Exact
# (module, qualified name) pairs only: a dotted name or a prefix match would reach any attribute of an
# allowed module (``os.system`` through ``torch.distributed.checkpoint.filesystem``).
_METADATA_GLOBALS = frozenset({
    ("torch.distributed.checkpoint.metadata", "Metadata"),
    ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "TensorProperties"),
    ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
    ("torch.distributed.checkpoint.metadata", "StorageMeta"),
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
})


class _MetadataUnpickler(pickle.Unpickler):
    """Builds only the classes of `_METADATA_GLOBALS` and torch dtypes; any other global is refused.

    Every way a pickle reaches a callable (GLOBAL, STACK_GLOBAL, INST, OBJ, the copyreg extension registry)
    goes through `find_class`; persistent ids are refused by `pickle.Unpickler` itself.
    """

    def find_class(self, module: str, name: str):
        if (module, name) in _METADATA_GLOBALS or _is_torch_dtype(module, name):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused global {module}.{name}")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("refused persistent id")


def _is_torch_dtype(module: str, name: str) -> bool:
    """``torch.float32`` and the like: a plain attribute of ``torch`` that is a dtype."""
    return module == "torch" and name.isidentifier() and isinstance(getattr(torch, name, None), torch.dtype)


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader with a restricted unpickler for the ``.metadata`` file.

    With ``verify`` (the default), ``.metadata`` is checked against the checkpoint's manifest before it
    is unpickled.
    """

    def __init__(self, path: str | os.PathLike, verify: bool = True) -> None:
        super().__init__(path)
        self.verify = verify

    def read_metadata(self, *args, **kwargs) -> Metadata:
        path = Path(self.path) / METADATA_FILE
        directory = Path(self.path)
        if self.verify and (read_manifest(directory) is not None or (directory / MANIFESTED_FILE).exists()):
            verify_files(directory, [METADATA_FILE])
        try:
            metadata = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
        except FileNotFoundError:
            raise CheckpointError(f"{path}: missing (not a complete checkpoint)") from None
        except pickle.UnpicklingError as error:
            raise CheckpointError(f"{path}: not a checkpoint's metadata: {error}") from None
        except Exception as error:  # noqa: BLE001 -- any other failure of a damaged pickle is one line too
            raise CheckpointError(f"{path}: unreadable checkpoint metadata ({type(error).__name__}: {error})") from None
        if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
            raise CheckpointError(f"{path}: not a checkpoint's metadata (holds {type(metadata).__name__})")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def saved_names(root: str | os.PathLike, iteration: int, verify: bool = True) -> frozenset[str]:
    """The names of the tensors checkpoint ``iteration`` holds (read from its ``.metadata``)."""
    return frozenset(SafeFileSystemReader(checkpoint_dir(root, iteration), verify).read_metadata().state_dict_metadata)


def vocab_row_names(state_names: Iterable[str], row_parameters: Iterable[str]) -> frozenset[str]:
    """The checkpoint names (``model.<p>``, ``optim.<p>.<key>``) of the parameters ``row_parameters``
    (those whose rows are the padded vocabulary: the embedding, an untied head)."""
    rows = tuple(row_parameters)
    return frozenset(name for name in state_names
                     if any(name == MODEL_PREFIX + p or name.startswith(f"{OPTIMIZER_PREFIX}{p}.") for p in rows))


def load_checkpoint(root: str | os.PathLike, iteration: int, state: dict[str, torch.Tensor],
                    optional: frozenset[str] = frozenset(), model_names: frozenset[str] | None = None,
                    verify: bool = True, vocab_rows: frozenset[str] = frozenset()) -> set[str]:
    """Load checkpoint ``iteration`` into the tensors of ``state`` in place, resharding as needed.

    Args:
        root: the checkpoint root directory.
        iteration: which checkpoint.
        state: name -> tensor (or DTensor) to fill; shapes are the global ones.
        optional: names that may be absent from the checkpoint (left untouched).
        model_names: every ``model.`` name of the full model (this rank may hold only some); a
            saved ``model.`` tensor outside it means the checkpoint is of another model shape.
        verify: check every file against the checkpoint's manifest first (collective when distributed:
            the files are split over the ranks).
        vocab_rows: names whose first dimension is the padded vocabulary (`vocab_row_names`). The
            padding depends on the tensor-parallel size, so a checkpoint saved in another layout may hold
            more or fewer such rows: the common rows are loaded (every real token's row among them), and
            rows the checkpoint lacks copy its last row (a padding row when it has one: such a class
            was never a target, so its logit is low) -- Megatron's offline converter pads the same way.

    Returns:
        The names that were loaded.

    Raises:
        CheckpointError: a file is damaged, a required name is missing or a tensor's shape differs
            (another model shape).
    """
    path = checkpoint_dir(root, iteration)
    manifest = None
    if verify:
        # .metadata is checked when it is read (`SafeFileSystemReader`); the ranks share the tensor files.
        manifest = read_manifest(path)
        verify_files(path, sorted(set(manifest[0]) - {METADATA_FILE}) if manifest else None, shared=True)
    if is_rank0():
        _warn_about_unknown_files(path, set(manifest[0]) if manifest else None)
    reader = SafeFileSystemReader(path, verify=verify)
    saved = reader.read_metadata().state_dict_metadata
    if model_names is not None:
        extra = sorted(name for name in saved if name.startswith("model.") and name not in model_names)
        if extra:
            raise CheckpointError(f"{path} holds {extra[0]}, which this model lacks: the checkpoint was saved for "
                                  "another model shape")
    resized: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name not in saved:
            if name in optional:
                continue
            raise CheckpointError(f"{path} has no {name}: it was saved for another model shape or trainer")
        meta = saved[name]
        if (name in vocab_rows and isinstance(meta, TensorStorageMetadata) and len(meta.size) == tensor.dim() > 0
                and tuple(meta.size)[1:] == tuple(tensor.shape)[1:] and meta.size[0] != tensor.shape[0]):
            resized[name] = torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
            continue
        if not isinstance(meta, TensorStorageMetadata) or tuple(meta.size) != tuple(tensor.shape):
            shape = tuple(meta.size) if isinstance(meta, TensorStorageMetadata) else "a non-tensor"
            raise CheckpointError(f"{path} holds {name} of shape {shape} but the model's is {tuple(tensor.shape)}: "
                                  "the checkpoint was saved for another model shape")
    to_load = {name: tensor for name, tensor in state.items() if name in saved and name not in resized}
    to_load |= resized
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        try:
            dcp.load(to_load, storage_reader=reader, no_dist=not is_distributed())
        except CheckpointException as error:
            # DCP gathers each rank's failure (a damaged shard fails inside it in many ways): report the first.
            cause = next(iter(error.failures.values()))[0] if error.failures else error
            raise CheckpointError(f"{path}: cannot read the checkpoint's tensors ({one_line(cause)})") from None
    for name, rows in resized.items():
        _copy_rows(state[name], rows)
    if resized and is_rank0():
        name = min(resized)
        logger.info("%s: re-padded the vocabulary rows from %d to %d (this layout's padding)", path,
                    resized[name].shape[0], state[name].shape[0])
    logger.info("loaded checkpoint %s", path)
    return set(to_load)


def _warn_about_unknown_files(directory: Path, listed: set[str] | None) -> None:
    """A warning naming each file of a checkpoint directory that is not part of it: not in its manifest
    (``listed``), or, unverified, not one DCP writes."""
    own = {METADATA_FILE, MANIFEST_FILE, MANIFESTED_FILE}
    for path in sorted(directory.iterdir()):
        known = path.name in listed if listed is not None else path.name.endswith(_SHARD_SUFFIX)
        if path.name not in own and not known:
            logger.warning("%s: not part of the checkpoint (ignored)", path)


def _copy_rows(target: torch.Tensor, rows: torch.Tensor) -> None:
    """Fill ``target`` (a tensor or DTensor of global shape [R, ...]) with the first R rows of ``rows``,
    repeating its last row past its end."""
    full = torch.empty(tuple(target.shape), dtype=target.dtype)
    common = min(rows.shape[0], full.shape[0])
    full[:common] = rows[:common]
    full[common:] = rows[-1]
    copy_into_parameter(target, full)


@torch.no_grad()
def copy_into_parameter(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy the full tensor ``full`` into ``param``, or into this rank's shard when it is a DTensor."""
    if isinstance(param, DTensor):
        # Every rank holds the same full tensor, so each cuts its own shard without communication.
        shard = distribute_tensor(full.to(param.device), param.device_mesh, param.placements, src_data_rank=None)
        param.to_local().copy_(shard.to_local())
    else:
        param.copy_(full)
