"""Rules for the paths our files name and the paths our commands write, shared by every room.

    path = file_inside(folder, name, manifest="x/state.json", entry="_data_files[0]")   # or raises
    refuse_output_over_inputs(["out/a.bin", "out/a.idx"], ["out/a.bin", "out/a.idx", "out/b.bin"])  # raises
    refuse_unreplaceable("out/x_text_document.bin")   # a directory, link or FIFO there: raises

* A file a manifest names (a `save_to_disk` folder's `state.json`, a MindRecord header or `.db`, a
  Hugging Face shard index, a checkpoint manifest) must resolve inside the manifest's own folder: no
  absolute name, no `..`, no symbolic link that leads out. A crafted folder must not make us read (or
  quote in a message) any other file of the machine.
* An output must not replace, contain or lie inside one of the command's inputs, whatever the spelling
  (`./a`, `d/../d/a`, an absolute path, a symbolic link to the folder).
* An output name is replaced only when what is there is what an earlier run of ours could have left: a
  regular file (or, for a folder output, a folder). A user's directory, a symbolic link, a FIFO or a
  device at that name is refused, never deleted.

It lives in the lowest room so that the data tools, the samplers and the trainer share one rule.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

from .errors import ShardFormatError, TokenmillError

# What a non-regular thing at an output name is called in messages, by its `stat` file type.
_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"),
          (stat.S_ISREG, "a regular file"))


def _is_within(path: str, folder: str) -> bool:
    """Whether the (real, absolute) `path` is `folder` or lies under it."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def file_inside(folder: str | os.PathLike, name: object, manifest: str | os.PathLike, *, entry: str | None = None,
                root: str | os.PathLike | None = None, error: type[Exception] = ShardFormatError) -> str:
    """The path of the file `name` that `manifest` lists, checked to lie inside `folder`.

    Args:
        folder: the folder the name is relative to (the manifest's own).
        name: the name as the manifest gives it (anything: it is checked to be a string).
        manifest: the file that names it, for the message.
        entry: how the message points at the entry (default: the name itself).
        root: the folder symbolic links may lead into (default `folder`; a Hugging Face cache snapshot's
            links lead into the cached model's `blobs/`).
        error: the exception raised, so each reader keeps its own error type.

    Returns:
        `folder` joined with `name` (not resolved: messages keep the user's spelling).

    Raises:
        error: `name` is not a non-empty relative name, has a `..` part, or resolves (through symbolic
            links) outside `root`; the message names the manifest and the entry.
    """
    where = f"{manifest}: {entry or repr(name)}"
    if not isinstance(name, str) or not name or "\0" in name:
        raise error(f"{where} is {name!r}, not a file name")
    parts = name.replace("\\", "/").split("/")
    if os.path.isabs(name) or ".." in parts or all(part in ("", ".") for part in parts):
        raise error(f"{where} names {name!r}, which is not a file inside {folder}")
    path = os.path.join(folder, name)
    boundary = os.path.realpath(root if root is not None else folder)
    if not _is_within(os.path.realpath(path), boundary) or os.path.realpath(path) == boundary:
        raise error(f"{where} names {name!r}, a link that leads outside {boundary}")
    return path


def refuse_output_over_inputs(outputs: Iterable[str | os.PathLike], inputs: Iterable[str | os.PathLike]) -> None:
    """Refuse outputs that are one of the inputs, or a folder holding one, or a file inside an input
    folder, however the paths are spelled (symbolic links and `..` resolved, hard links compared).

    Raises:
        TokenmillError: naming the output and the input.
    """
    inputs = [(str(path), os.path.realpath(path)) for path in inputs]
    for output in map(str, outputs):
        real = os.path.realpath(output)
        for given, real_input in inputs:
            same = os.path.exists(output) and os.path.exists(given) and os.path.samefile(output, given)
            if same or _is_within(real, real_input) or _is_within(real_input, real):
                raise TokenmillError(f"{output}: this output would overwrite the input {given}; "
                                     "choose another output name")


def refuse_unreplaceable(path: str | os.PathLike, *, folder: bool = False) -> None:
    """Refuse to replace `path` unless nothing is there or what an earlier run of ours could have left:
    a regular file, or with `folder` a folder (its contents are the caller's to check). Symbolic links
    are refused, even to a regular file: replacing one would silently cut it from its target.

    Raises:
        TokenmillError: naming the path and what is there.
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if (stat.S_ISDIR(mode) if folder else stat.S_ISREG(mode)):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    expected = "a folder" if folder else "a file"
    raise TokenmillError(f"{path}: {kind} is there, not {expected} an earlier run wrote; refusing to replace it "
                         "(move it away or choose another output name)")
