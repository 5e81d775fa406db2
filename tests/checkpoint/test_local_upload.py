"""A local upload's sha256 is the hash of exactly the bytes it wrote, whichever thread
hashes them: ``write`` has hashed its bytes when it returns (the caller may reuse the
buffer at once, as torch.save does); ``write_held`` leaves the hash running while the
next bytes are written and the file is synced; an abort stops cleanly."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from costguard.checkpoint.store import Store
from costguard.checkpoint.uploads import LocalUpload

BIG = 3 * LocalUpload.PIPELINE_BYTES // 2  # hashed on the second thread
SMALL = 1000  # hashed in the caller's thread, or copied behind held bytes


def hasher_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("costguard-sha256")]


@pytest.mark.parametrize("size", [SMALL, BIG])
def test_a_buffer_reused_after_write_returns_does_not_change_the_hash(
    tmp_path: Path, size: int
) -> None:
    store = Store.open(str(tmp_path))
    buffer = bytearray(os.urandom(size))
    expected = hashlib.sha256()
    with store.upload("obj") as upload:
        for _ in range(3):
            upload.write(buffer)
            expected.update(buffer)
            buffer[:] = os.urandom(size)  # reused at once, as torch.save reuses its buffers
    assert upload.sha256 == expected.hexdigest()
    assert hashlib.sha256((tmp_path / "obj").read_bytes()).hexdigest() == upload.sha256
    assert upload.size == 3 * size


def test_held_writes_and_small_writes_between_them_hash_in_order(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path))
    held = [os.urandom(BIG) for _ in range(3)]
    small = bytearray(os.urandom(SMALL))
    expected = hashlib.sha256()
    with store.upload("obj") as upload:
        for block in held:
            upload.write_held(block)  # left unchanged until the upload ends
            expected.update(block)
            upload.write(small)  # queued behind the held bytes' hashes: copied
            expected.update(small)
            small[:] = os.urandom(SMALL)
    assert upload.sha256 == expected.hexdigest()
    assert hashlib.sha256((tmp_path / "obj").read_bytes()).hexdigest() == upload.sha256
    assert not hasher_threads()


def test_an_upload_that_fails_with_hashes_running_leaves_no_file_and_no_thread(
    tmp_path: Path,
) -> None:
    store = Store.open(str(tmp_path))

    def produce() -> None:
        with store.upload("obj") as upload:
            upload.write_held(os.urandom(BIG))
            raise RuntimeError("the producer failed")

    with pytest.raises(RuntimeError, match="the producer failed"):
        produce()
    assert list(tmp_path.iterdir()) == []
    assert not hasher_threads()
