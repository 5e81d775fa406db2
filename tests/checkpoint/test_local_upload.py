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


def test_held_writes_far_below_a_pipelined_write_are_hashed_aside(tmp_path: Path) -> None:
    # A DCP shard's tensors are often a few MiB or less (a 1024 x 1024 fp32 weight over
    # two ranks is 2 MiB each): hashed here, between writes, they made a 2-rank sharded
    # save 2.3 x dcp.save's wall on two cores (benchmarks/sharded.py); hashed aside, 1.1 x.
    store = Store.open(str(tmp_path))
    blocks = [os.urandom(256 << 10) for _ in range(8)]  # well below PIPELINE_BYTES
    with store.upload("obj") as upload:
        for block in blocks:
            upload.write_held(block)
        upload.write(b"tail")  # small: queued behind the held hashes, not hashed first
        assert hasher_threads()
    assert upload.sha256 == hashlib.sha256(b"".join(blocks) + b"tail").hexdigest()
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


def test_without_hash_aside_big_writes_are_hashed_on_the_writing_thread(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path))
    blocks = [os.urandom(BIG) for _ in range(2)]
    with store.upload("obj", hash_aside=False) as upload:
        for block in blocks:
            upload.write(block)
            upload.write_held(block)
            assert not hasher_threads()  # none was started: this thread hashed it all
    assert upload.sha256 == hashlib.sha256(b"".join(b + b for b in blocks)).hexdigest()
    assert hashlib.sha256((tmp_path / "obj").read_bytes()).hexdigest() == upload.sha256


def test_a_save_beside_training_takes_one_core_one_training_waits_for_may_take_two(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On two cores a second hashing thread beside a background save cost the training
    # loop 10% of its steps/s (benchmarks/checkpoint.py, part 3): only a save that
    # training waits for (a blocking, final or emergency one) hashes aside.
    import torch

    from costguard.checkpoint import Checkpointer, Preempted
    from costguard.checkpoint.notices import Notice, NoticeBoard

    asides: list[bool] = []
    real_init = LocalUpload.__init__

    def spy(self: LocalUpload, target: str, *, hash_aside: bool = True) -> None:
        if Path(target).name == "state.pt":
            asides.append(hash_aside)
        real_init(self, target, hash_aside=hash_aside)

    monkeypatch.setattr(LocalUpload, "__init__", spy)
    model = torch.nn.Linear(4, 4)
    board = NoticeBoard()
    ckpt = Checkpointer(tmp_path, every_steps=2, notices=board, keep_last=10)
    ckpt.step(0, model=model)
    ckpt.step(1, model=model)  # a scheduled save, in the background
    ckpt.flush()
    future = ckpt.save(2, model=model)  # on demand, in the background
    assert future is not None
    future.result()
    ckpt.save(3, model=model, block=True)
    ckpt.step(4, model=model)
    ckpt.close()  # commits step 5, the last one passed to step()
    assert asides == [False, False, True, True]

    asides.clear()
    ckpt = Checkpointer(tmp_path, every_steps=100, notices=board)
    board.post(Notice("aws", "terminate", None))
    with pytest.raises(Preempted):
        ckpt.step(9, model=model)
    assert asides == [True]
