"""Local files that are either the old version or the complete new one, even after a crash.

A file is written under a temporary name beside its target, synced, renamed over the
target (atomic on POSIX), and the rename is made durable by syncing the folder. It gets the
mode ``open()`` would give it (0666 less the umask), not the temporary file's 0600.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """Make a folder's entries (new files, a rename) durable; a no-op where folders
    cannot be opened (Windows)."""
    if os.name == "nt":
        return
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def atomic_write(
    target: str | os.PathLike[str], content: bytes | memoryview | Callable[[IO[bytes]], None]
) -> None:
    """Write ``content`` (bytes, or a function that writes into the open file) to
    ``target`` atomically and durably; on an error the target is untouched and the
    temporary file gone. The folder must exist.

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
    >>> atomic_write(path, b"one"); atomic_write(path, lambda file: file.write(b"two"))
    >>> path.read_bytes()
    b'two'
    """
    path = Path(target)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        if hasattr(os, "fchmod"):  # mkstemp's 0600, made what open() would create
            os.fchmod(descriptor, 0o666 & ~_umask())
        with os.fdopen(descriptor, "wb") as file:
            if callable(content):
                content(file)
            else:
                file.write(content)
            file.flush()
            os.fsync(file.fileno())
        Path(temporary).replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            Path(temporary).unlink()
        raise
    fsync_dir(path.parent)


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (os.umask can
    only be read by setting it, which races with other threads creating files)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
