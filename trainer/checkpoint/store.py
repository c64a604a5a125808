"""Sharded checkpoints with torch.distributed.checkpoint (DCP): save, find the latest, load and reshard.

Layout (Megatron's names)::

    <dir>/iter_0000100/            one DCP checkpoint: .metadata + one shard file per rank
    <dir>/latest_checkpointed_iteration.txt   "100"

A checkpoint is written under ``iter_XXXXXXX.tmp`` and renamed when every rank has finished, and the
pointer file is replaced atomically after that, so a crash never leaves a valid-looking half
checkpoint; a full disk, SIGTERM or Ctrl-C during a save removes the staging and keeps what was there.
Without a pointer file the latest complete iteration directory is used; a broken pointer is an error. Everything saved is a tensor keyed by its full-model name (``model.layers.0.attention.wq.
weight``, ``optim.<param>.exp_avg``, ``train.iteration``), so a checkpoint loads into any tp/pp/dp
layout: DCP reshards DTensors by their global offsets. Loading never unpickles arbitrary objects: DCP's
``.metadata`` pickle is read with an unpickler that builds only the exact classes DCP's metadata holds,
no bytes entries are ever saved, and tensor files are read by DCP with ``weights_only=True``.

Every checkpoint directory also holds ``manifest.json`` (`trainer.checkpoint.manifest`): the size and
SHA-256 of each of its files, written at save and checked at load (``verify=False`` skips it), so a
damaged file is an error naming it, not a silently different model.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import re
import shutil
import warnings
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.tensor import DTensor, distribute_tensor

from indexed_dataset.cli_support import Interrupted
from trainer.checkpoint.manifest import (
    MANIFEST_FILE,
    MANIFESTED_FILE,
    has_listed_sizes,
    mark_manifested,
    read_manifest,
    verify_files,
    write_manifest,
)
from trainer.checkpoint.disk_space import free_space_shortfall, is_disk_full, no_space_message
from trainer.errors import CheckpointError

logger = logging.getLogger(__name__)

LATEST_FILE = "latest_checkpointed_iteration.txt"
# Beside the iterations: what the tensors cannot tell about the model (`trainer.models.gpt.convert`, `trainer.models.t5.convert`).
MODEL_CONFIG_FILE = "model_config.json"
# Model tensors are saved as "model.<parameter name>", optimiser states as "optim.<parameter name>.<key>".
MODEL_PREFIX = "model."
OPTIMIZER_PREFIX = "optim."
# A checkpoint converted from Hugging Face: the model only, at iteration 0 (training starts afresh from it).
IMPORTED_ITERATION = 0
TEMP_SUFFIX = ".tmp"
# Characters of a malformed pointer file shown in its error.
_SHOWN_CHARS = 40
# Files of an iteration directory written by DCP: the tensor shards.
_SHARD_SUFFIX = ".distcp"
# One checkpoint's directory under a root: iter_0000100.
ITERATION_DIR = re.compile(r"^iter_(\d+)$")
# The files of a Megatron --ckpt-format torch iteration directory (one per model-parallel rank).
LEGACY_TORCH_FILES = "mp_rank_*/model_optim_rng.pt"
METADATA_FILE = ".metadata"
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


def checkpoint_dir(root: str | os.PathLike, iteration: int) -> Path:
    return Path(root) / f"iter_{iteration:07d}"


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


def _is_distributed() -> bool:
    return dist.is_initialized() and dist.get_world_size() > 1


def _barrier(group: dist.ProcessGroup | None = None) -> None:
    if _is_distributed():
        dist.barrier(group=group)


def _is_rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def save_checkpoint(root: str | os.PathLike, iteration: int, state: dict[str, torch.Tensor]) -> Path:
    """Write ``state`` as checkpoint ``iteration`` under ``root`` (collective: every rank calls it).

    Any failure (a full disk, SIGTERM or Ctrl-C) removes the staging ``iter_XXXXXXX.tmp`` and leaves the
    checkpoints already there, and the pointer, as they were.

    Returns:
        The checkpoint directory.

    Raises:
        CheckpointError: the disk has no room for it (checked first against the tensors' bytes, and again
            if the disk fills during the write), or the directory cannot be written; on every rank.
    """
    temp, needed = begin_save(root, iteration, state)
    try:
        _barrier()
        with warnings.catch_warnings():
            # Single-process DCP warns that it assumes a single process, which is what we mean.
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save(state, checkpoint_id=temp, no_dist=not _is_distributed())
        complete_save(root, iteration, temp)
    except BaseException as error:
        if _is_rank0():
            shutil.rmtree(temp, ignore_errors=True)
        raise save_failure(error, root, needed) from None
    _barrier()
    return checkpoint_dir(root, iteration)


def begin_save(root: str | os.PathLike, iteration: int, state: dict[str, torch.Tensor]) -> tuple[Path, int]:
    """The first part of a save (collective): remove stale staging, refuse a disk without room for ``state``.

    Returns:
        The staging directory of checkpoint ``iteration`` and the bytes the checkpoint needs.

    Raises:
        CheckpointError: the disk has no room for it (on every rank).
    """
    final = checkpoint_dir(root, iteration)
    if _is_rank0():
        Path(root).mkdir(parents=True, exist_ok=True)
        # Staging left by a process that was killed outright (SIGKILL, a launcher's stop of its workers). A run
        # holds the directory's lock (`trainer.checkpoint.save_directory`): no other run is writing staging there.
        for stale in Path(root).glob(f"iter_*{TEMP_SUFFIX}"):
            shutil.rmtree(stale, ignore_errors=True)
    needed = _checkpoint_bytes(state)
    refuse_on_every_rank(free_space_shortfall(root, needed) if _is_rank0() else None)
    return final.with_name(final.name + TEMP_SUFFIX), needed


def complete_save(root: str | os.PathLike, iteration: int, temp: Path,
                  group: dist.ProcessGroup | None = None) -> None:
    """The last part of a save, once every rank's DCP files are in ``temp`` (collective over ``group``, default
    the whole world): the manifest, then the rename to the final name, then the pointer: a checkpoint is
    named, and pointed to, only when it is complete."""
    final = checkpoint_dir(root, iteration)
    if _is_rank0():
        mark_manifested(temp)
    _barrier(group)
    write_manifest(temp, is_writer=_is_rank0(), group=group)
    if _is_rank0():
        shutil.rmtree(final, ignore_errors=True)
        os.replace(temp, final)
        pointer = Path(root) / LATEST_FILE
        pointer_temp = pointer.with_name(pointer.name + TEMP_SUFFIX)
        try:
            pointer_temp.write_text(f"{iteration}\n")
            os.replace(pointer_temp, pointer)
        finally:
            pointer_temp.unlink(missing_ok=True)
        logger.info("saved checkpoint %s", final)


def _checkpoint_bytes(state: dict[str, torch.Tensor]) -> int:
    """Bytes of the tensors of a checkpoint, over every rank (their global sizes: a DTensor's numel is its
    global one; collective when distributed). DCP's own files add a few kilobytes."""
    sizes = {name: tensor.numel() * tensor.element_size() for name, tensor in state.items()}
    if _is_distributed():
        gathered: list[dict[str, int] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, sizes)
        sizes = {name: size for part in gathered for name, size in part.items()}
    return sum(sizes.values())


def refuse_on_every_rank(message: str | None) -> None:
    """Raise CheckpointError(``message``) on every rank when rank 0's ``message`` is not None (collective when
    distributed: what only rank 0 can decide, every rank must raise, or the others would wait for it)."""
    if _is_distributed():
        shared = [message]
        dist.broadcast_object_list(shared, src=0)
        message = shared[0]
    if message is not None:
        raise CheckpointError(message)


def save_failure(error: BaseException, root: str | os.PathLike, needed: int) -> BaseException:
    """What a failed save raises: the interruption itself (SIGTERM, Ctrl-C), one line for a full disk or
    an unwritable directory, any other error as it is (a bug keeps its traceback)."""
    if isinstance(error, CheckpointException):
        # DCP catches everything its ranks raise, interruptions included, and gathers them.
        causes = [failure[0] if isinstance(failure, tuple) else failure for failure in error.failures.values()]
        error = next((c for c in causes if isinstance(c, (Interrupted, KeyboardInterrupt))),
                     next((c for c in causes if isinstance(c, OSError)), error))
    if is_disk_full(error):
        return CheckpointError(no_space_message(root, needed) + "; the checkpoints already there are kept")
    if isinstance(error, OSError):
        return CheckpointError(f"cannot write a checkpoint into {root}: {_one_line(error)}")
    return error


def check_load_path(root: str | os.PathLike | None, save: str | os.PathLike | None = None) -> None:
    """A ``--load`` path must exist (a typo must not silently train from scratch); an empty directory
    is a fresh start, and so is ``--load P --save P`` with P not there yet (Megatron's and OneFlow's
    resume-or-start idiom: the same path twice is no typo).

    Raises:
        CheckpointError: ``root`` does not exist or is not a directory.
    """
    if root is None or Path(root).is_dir():
        return
    if save is not None and not Path(root).exists() and Path(root).resolve() == Path(save).resolve():
        return
    what = "is not a directory" if Path(root).exists() else "does not exist"
    raise CheckpointError(f"the checkpoint to load, {root}, {what}: give a checkpoint root, or an empty "
                          "directory to start from scratch")


def latest_iteration(root: str | os.PathLike) -> int | None:
    """The iteration the pointer file names, or None when ``root`` holds no checkpoint.

    Without a pointer file, the latest complete ``iter_XXXXXXX`` directory (`is_complete`) is the one, and a
    warning says so (a run that lost its pointer must not restart from scratch and save over itself).

    Raises:
        CheckpointError: the pointer is unreadable (a symlink loop, a dangling link, a directory), does
            not hold an iteration number, or names a missing checkpoint; there is no pointer and no
            complete iteration directory among several.
    """
    pointer = Path(root) / LATEST_FILE
    if not os.path.lexists(pointer):
        return _latest_complete_iteration(root)
    hint = f"remove it to resume from the latest complete iteration directory of {root}"
    try:
        text = pointer.read_text(encoding="ascii").strip()
    except OSError as error:
        raise CheckpointError(f"{pointer}: unreadable pointer file ({error.strerror}): {hint}") from None
    except UnicodeDecodeError:
        raise CheckpointError(f"{pointer}: not an iteration number (binary content): {hint}") from None
    if not text.isdigit():
        raise CheckpointError(f"{pointer}: expected an iteration number, found {text[:_SHOWN_CHARS]!r}: {hint}")
    iteration = int(text)
    legacy = next(checkpoint_dir(root, iteration).glob(LEGACY_TORCH_FILES), None)
    if legacy is not None:
        raise CheckpointError(f"{legacy} is a Megatron --ckpt-format torch checkpoint (per-rank files): train reads "
                              "torch_dist checkpoints only (Megatron's tools/checkpoint/convert.py converts it)")
    if not (checkpoint_dir(root, iteration) / METADATA_FILE).exists():
        raise CheckpointError(f"{pointer} names iteration {iteration} but {checkpoint_dir(root, iteration)} "
                              "is missing or incomplete")
    return iteration


def is_complete(directory: Path) -> bool:
    """True for an iteration directory that holds its ``.metadata`` and, when it has a manifest (or was written
    with one), every file the manifest lists at its listed size (the bytes are checked when it is loaded)."""
    if not (directory / METADATA_FILE).is_file():
        return False
    try:
        manifest = read_manifest(directory)
    except CheckpointError:
        return False
    if manifest is None:
        return not (directory / MANIFESTED_FILE).exists()
    return has_listed_sizes(directory, manifest[0])


def _latest_complete_iteration(root: str | os.PathLike) -> int | None:
    """The latest complete iteration directory of a root without a pointer file (None: no iteration at all).

    Raises:
        CheckpointError: there are iteration directories, none of them complete.
    """
    root = Path(root)
    iterations = sorted((int(m.group(1)) for m in map(ITERATION_DIR.match, os.listdir(root)) if m), reverse=True) \
        if root.is_dir() else []
    for iteration in iterations:
        if is_complete(checkpoint_dir(root, iteration)):
            if _is_rank0():
                logger.warning("%s has no %s: using %s, its latest complete iteration directory", root, LATEST_FILE,
                               checkpoint_dir(root, iteration))
            return iteration
    if iterations:
        raise CheckpointError(f"{root} has no {LATEST_FILE} and none of its {len(iterations)} iteration directories "
                              f"is complete (the latest: {checkpoint_dir(root, iterations[0])})")
    return None


def remove_old_checkpoints(root: str | os.PathLike, keep: int, protected: frozenset[int] = frozenset()) -> list[int]:
    """Remove the complete checkpoints of ``root`` older than its latest ``keep`` complete ones, except the
    iterations ``protected`` (the one the run loaded from); call on one rank, after a save.

    Each is first renamed to its staging name (atomic), so a crash during the removal leaves a directory that
    no load takes for a checkpoint (the next save deletes it).

    Returns:
        The removed iterations.
    """
    root = Path(root)
    complete = sorted(iteration for iteration in (int(m.group(1)) for m in map(ITERATION_DIR.match, os.listdir(root))
                                                  if m) if is_complete(checkpoint_dir(root, iteration)))
    protected = protected | {latest_iteration(root)}
    removed = [iteration for iteration in complete[:-keep] if iteration not in protected]
    for iteration in removed:
        directory = checkpoint_dir(root, iteration)
        doomed = directory.with_name(directory.name + TEMP_SUFFIX)
        os.replace(directory, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        logger.info("removed checkpoint %s (keeping the latest %d)", directory, keep)
    return removed


def saved_names(root: str | os.PathLike, iteration: int, verify: bool = True) -> frozenset[str]:
    """The names of the tensors checkpoint ``iteration`` holds (read from its ``.metadata``)."""
    return frozenset(SafeFileSystemReader(checkpoint_dir(root, iteration), verify).read_metadata().state_dict_metadata)


def resolve_checkpoint(path: str | os.PathLike) -> tuple[Path, int]:
    """(root, iteration) of a checkpoint root (its latest iteration) or of one ``iter_XXXXXXX`` directory.

    Raises:
        CheckpointError: ``path`` holds no checkpoint.
    """
    path = Path(path)
    match = ITERATION_DIR.match(path.name)
    if match and (path / METADATA_FILE).is_file():
        return path.parent, int(match.group(1))
    iteration = latest_iteration(path)
    if iteration is None:
        raise CheckpointError(f"{path}: no checkpoint ({LATEST_FILE} not found)")
    return path, iteration


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
    if _is_rank0():
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
            dcp.load(to_load, storage_reader=reader, no_dist=not _is_distributed())
        except CheckpointException as error:
            # DCP gathers each rank's failure (a damaged shard fails inside it in many ways): report the first.
            cause = next(iter(error.failures.values()))[0] if error.failures else error
            raise CheckpointError(f"{path}: cannot read the checkpoint's tensors ({_one_line(cause)})") from None
    for name, rows in resized.items():
        _copy_rows(state[name], rows)
    if resized and _is_rank0():
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


def _one_line(error: BaseException) -> str:
    """``Type: first line of the message`` (a damaged file is named by the caller)."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


@torch.no_grad()
def copy_into_parameter(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy the full tensor ``full`` into ``param``, or into this rank's shard when it is a DTensor."""
    if isinstance(param, DTensor):
        # Every rank holds the same full tensor, so each cuts its own shard without communication.
        shard = distribute_tensor(full.to(param.device), param.device_mesh, param.placements, src_data_rank=None)
        param.to_local().copy_(shard.to_local())
    else:
        param.copy_(full)
