"""Finished outputs get the permissions a plain ``open()`` / ``mkdir()`` would give them.

Temporary files and folders made by ``tempfile`` (and files some libraries write, such as safetensors)
are private (0600 / 0700); an output renamed into place from one must honour the umask instead, as
Megatron's own files do (usually 0644 / 0755).
"""

from __future__ import annotations

import os

# What open() and mkdir() ask for before the umask is applied.
FILE_MODE = 0o666
DIRECTORY_MODE = 0o777


def current_umask() -> int:
    """The process's umask (reading it means setting it, so it is set back at once)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


def give_default_permissions(path: str | os.PathLike) -> None:
    """chmod ``path`` (a file or a folder) to what a plain open()/mkdir() would have made it."""
    mode = DIRECTORY_MODE if os.path.isdir(path) else FILE_MODE
    os.chmod(path, mode & ~current_umask())
