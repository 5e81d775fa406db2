"""Bulk copies into a buffer that let the other threads run.

A slice assignment (``buffer[a:b] = view``) or ``bytearray +=`` copies with the GIL held:
for a checkpoint that means the training loop, and the event loop that sends an upload's
parts, wait for every megabyte copied. ``ctypes.memmove`` is a foreign call, during which
Python releases the GIL, so a copy of 64 KiB or more goes through it.
"""

from __future__ import annotations

import ctypes
from typing import Any

#: Copies at least this big go through ``memmove``; smaller ones are not worth the call.
BIG = 1 << 16


def address_of(view: memoryview) -> int | None:
    """The address of a contiguous buffer, read-only ones included (needs NumPy)."""
    if not view.c_contiguous:
        return None
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy comes with the train extra
        return None
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


def writable_address(buffer: Any) -> int:
    """The address of a writable buffer (a ``bytearray`` or an ``mmap``); while it is
    known, the buffer must not be resized."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


def copy_into(buffer: Any, address: int, at: int, view: memoryview) -> None:
    """Copy the bytes of ``view`` into ``buffer`` (whose address is ``address``) at
    offset ``at``; the caller has checked that they fit."""
    n = view.nbytes
    source = address_of(view) if n >= BIG else None
    if source is None:
        buffer[at : at + n] = view
    else:
        ctypes.memmove(address + at, source, n)
