"""The --sync-dir syncer on its own (:mod:`costguard.checkpoint.foldersync`), on every
store: what counts as a finished trainer checkpoint, the upload as a costguard checkpoint
(files, sha256, manifest last), the restore (all or nothing, verified), and what it
refuses: half folders, rewritten files, manifests that name paths outside the folder.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from costguard.checkpoint.checkpointer import DEFAULT_SAVE_NICENESS
from costguard.checkpoint.completion import items_in
from costguard.checkpoint.foldersync import ASIDE, RESTORE_READS, FolderSync
from costguard.checkpoint.manifest import FOLDER_FORMAT_VERSION, Manifest
from costguard.checkpoint.restoring import Restorer
from costguard.checkpoint.store import Store
from costguard.errors import StoreError
from tests.helpers.stores import Backend, make_s3_bucket, open_store
from tests.helpers.waiting import wait_for


def safetensors(payload: bytes) -> bytes:
    """A whole safetensors file holding ``payload`` as one uint8 tensor."""
    header = json.dumps(
        {"w": {"dtype": "U8", "shape": [len(payload)], "data_offsets": [0, len(payload)]}}
    )
    return len(header).to_bytes(8, "little") + header.encode() + payload


def hf_folder(root: Path, step: int, *, finished: bool = True) -> Path:
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(safetensors(os.urandom(3000) + bytes([step])))
    (folder / "optimizer.pt").write_bytes(os.urandom(5000))
    if finished:
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return folder


def syncer(store: Store, root: Path, lines: list[str]) -> FolderSync:
    return FolderSync(store, root, keep=2, say=lines.append, settle_s=0.0)


def folder_files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def test_each_trainer_marks_a_finished_checkpoint_its_own_way(tmp_path: Path) -> None:
    hf_folder(tmp_path, 10)
    hf_folder(tmp_path, 20, finished=False)
    accelerate = tmp_path / "checkpoints" / "checkpoint_3"
    accelerate.mkdir(parents=True)
    (accelerate / "model.safetensors").write_bytes(safetensors(b"x"))
    (accelerate / "random_states_0.pkl").write_bytes(b"y")
    torch.save(
        {"epoch": 2, "global_step": 37, "state_dict": {"w": torch.ones(3)}}, tmp_path / "last.ckpt"
    )
    torch.save({"global_step": 5}, tmp_path / "epoch=0-step=40.ckpt")
    whole = (tmp_path / "epoch=0-step=40.ckpt").read_bytes()
    (tmp_path / "epoch=0-step=50.ckpt").write_bytes(whole[: len(whole) // 2])  # cut short
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "events.txt").write_text("not a checkpoint")
    found = {i.path: (i.kind, i.step, i.marked) for i in items_in(tmp_path)}
    assert found == {
        "checkpoint-10": ("transformers", 10, True),
        "checkpoint-20": ("transformers", 20, False),
        "checkpoints/checkpoint_3": ("accelerate", 3, True),
        "last.ckpt": ("lightning", 37, True),  # read from the pickle, nothing executed
        "epoch=0-step=40.ckpt": ("lightning", 40, True),  # the name says
        "epoch=0-step=50.ckpt": ("lightning", None, False),
    }


def test_a_finished_folder_goes_up_and_comes_back_whole_on_every_store(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(backend)
    out, lines = tmp_path / "out", list[str]()
    first = syncer(store, out, lines)
    first.prepare()  # nothing there yet
    hf_folder(out, 10)
    half = hf_folder(out, 20, finished=False)
    assert first.sync(finished=False) == []  # seen once: not settled yet
    committed = first.sync(finished=False)
    assert [(m.step, m.format_version) for m in committed] == [(10, FOLDER_FORMAT_VERSION)]
    assert first.sync(finished=True) == []  # kept already; the half one never
    (half / "trainer_state.json").write_text("{}")
    assert [m.step for m in first.sync(finished=True)] == [20]
    uploaded = folder_files(half)

    new_machine = tmp_path / "new"
    # No room in TMPDIR (a small /tmp): the files go straight into the sync dir's staging.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-tmp"))
    restored = syncer(store, new_machine, lines).prepare()
    assert [m.step for m in restored] == [20]
    assert sorted(p.name for p in new_machine.iterdir()) == ["checkpoint-20"]
    assert folder_files(new_machine / "checkpoint-20") == uploaded


def test_a_folder_rewritten_while_it_uploads_is_not_committed(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path / "store"))
    out, lines = tmp_path / "out", list[str]()
    sync = syncer(store, out, lines)
    folder = hf_folder(out, 10)
    sync.sync(finished=False)
    original = store.write_stream

    def rewriting(path: str, produce: Any, **kw: Any) -> tuple[int, str]:
        result = original(path, produce, **kw)
        (folder / "optimizer.pt").write_bytes(os.urandom(5001))  # the trainer writes on
        return result

    store.write_stream = rewriting  # type: ignore[method-assign]
    assert sync.sync(finished=False) == []
    store.write_stream = original  # type: ignore[method-assign]
    assert not Restorer(store).survey().manifests
    sync.sync(finished=False)
    assert [m.step for m in sync.sync(finished=False)] == [10]


def test_a_half_folder_in_out_is_moved_aside_and_the_store_one_restored(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path / "store"))
    out, lines = tmp_path / "out", list[str]()
    hf_folder(out, 10)
    syncer(store, out, lines).sync(finished=True)
    hf_folder(out, 20, finished=False)  # a kill mid-save, on this machine
    restored = syncer(store, out, lines).prepare()
    assert [m.step for m in restored] == [10]
    assert sorted(p.name for p in out.iterdir()) == [ASIDE, "checkpoint-10"]
    assert [p.name.split(".")[0] for p in (out / ASIDE).iterdir()] == ["checkpoint-20"]
    assert any("half written" in line for line in lines)


def test_a_manifest_naming_a_path_outside_the_folder_is_never_followed(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path / "store"))
    out, lines = tmp_path / "out", list[str]()
    hf_folder(out, 10)
    (manifest,) = syncer(store, out, lines).sync(finished=True)
    record = json.loads(store.get(manifest.manifest_path))
    record["extra"]["folder"]["path"] = "../escaped"
    record["extra"]["folder"]["files"] = dict.fromkeys(
        record["extra"]["folder"]["files"], "../escaped/x"
    )
    store.put(manifest.manifest_path, json.dumps(record).encode())
    new_machine = tmp_path / "new"
    assert syncer(store, new_machine, lines).prepare() == []
    assert not (tmp_path / "escaped").exists()
    assert list(new_machine.iterdir()) == []


def accelerate_folder(root: Path, step: int, files: int) -> Path:
    """A ``save_state`` folder of ``files`` files besides its mark."""
    folder = root / f"checkpoint_{step}"
    folder.mkdir(parents=True)
    for index in range(files):
        (folder / f"model_{index}.safetensors").write_bytes(safetensors(os.urandom(2000 + index)))
    # A whole pickle: random bytes that begin with its protocol mark (1 in 256) and do not
    # end with its STOP are a pickle cut short, and the folder is rightly not finished.
    (folder / "random_states_0.pkl").write_bytes(pickle.dumps({"step": step, "x": os.urandom(100)}))
    return folder


def test_a_restore_reads_several_files_at_once_and_no_more_than_its_bound(
    tmp_path: Path,
) -> None:
    """Each read waits (a safety net of 10 s, once) until another one has started: a
    restore reading one file after another never has two at once."""
    store = Store.open(str(tmp_path / "store"))
    out = tmp_path / "out"
    uploaded = folder_files(accelerate_folder(out, 3, files=3 * RESTORE_READS))
    syncer(store, out, []).sync(finished=True)
    original, changed = store.download, threading.Condition()
    reading, peak, waited_out = 0, 0, False

    def counted(*args: Any, **kwargs: Any) -> None:
        nonlocal reading, peak, waited_out
        with changed:
            reading += 1
            peak = max(peak, reading)
            changed.notify_all()
            if not changed.wait_for(lambda: peak >= 2 or waited_out, timeout=10):
                waited_out = True
        try:
            original(*args, **kwargs)
        finally:
            with changed:
                reading -= 1

    store.download = counted  # type: ignore[method-assign]
    new_machine = tmp_path / "new"
    assert [m.step for m in syncer(store, new_machine, []).prepare()] == [3]
    assert 2 <= peak <= RESTORE_READS, peak
    assert not waited_out
    assert folder_files(new_machine / "checkpoint_3") == uploaded


def two_checkpoints(tmp_path: Path, lines: list[str]) -> tuple[Store, Manifest]:
    """checkpoint-10 and checkpoint-20 kept in a local store; the newest's manifest."""
    store = Store.open(str(tmp_path / "store"))
    out = tmp_path / "out"
    sync = syncer(store, out, lines)
    hf_folder(out, 10)
    sync.sync(finished=True)
    hf_folder(out, 20)
    (newest,) = sync.sync(finished=True)
    return store, newest


def restores_the_previous_one(store: Store, tmp_path: Path, lines: list[str]) -> None:
    """A new machine gets checkpoint-10, whole, and nothing else (no staging, no half)."""
    new_machine = tmp_path / "new"
    assert [m.step for m in syncer(store, new_machine, lines).prepare()] == [10]
    assert sorted(p.name for p in new_machine.iterdir()) == ["checkpoint-10"]


@pytest.mark.parametrize("victim", [0, -1])
def test_a_corrupt_object_falls_back_to_the_previous_checkpoint(
    tmp_path: Path, victim: int
) -> None:
    lines: list[str] = []
    store, newest = two_checkpoints(tmp_path, lines)
    victim_path = Path(store.full(newest.object_path(newest.objects[victim])))
    victim_path.write_bytes(b"\0" * victim_path.stat().st_size)  # same size, other bytes
    restores_the_previous_one(store, tmp_path, lines)
    assert any("corrupt" in line for line in lines)


def test_a_file_that_cannot_be_read_leaves_no_half_folder(tmp_path: Path) -> None:
    """One read fails while the others of the folder go on: the folder is not put back
    (nor any part of it), the previous one is."""
    lines: list[str] = []
    store, newest = two_checkpoints(tmp_path, lines)
    failing, original = newest.object_path(newest.objects[-1]), store.download

    def flaky(path: str, *args: Any, **kwargs: Any) -> None:
        if path == failing:
            raise StoreError(f"reading {path}: connection reset")
        original(path, *args, **kwargs)

    store.download = flaky  # type: ignore[method-assign]
    restores_the_previous_one(store, tmp_path, lines)
    assert any("could not restore" in line and "connection reset" in line for line in lines)


def test_retention_keeps_the_newest_two(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path / "store"))
    out, lines = tmp_path / "out", list[str]()
    sync = syncer(store, out, lines)
    for step in (10, 20, 30):
        hf_folder(out, step)
        sync.sync(finished=True)
    assert sorted(m.step for m in Restorer(store).survey().manifests) == [20, 30]


def killed_at_the_manifest(store: Store, sync: FolderSync) -> None:
    """One look of ``sync`` whose process dies (kill -9) as the manifest is written: every
    file of the folder in the store, no manifest."""
    original = store.put

    def dying(path: str, data: bytes | memoryview) -> None:
        if path.endswith("/manifest.json"):
            raise KeyboardInterrupt  # the process dies here
        original(path, data)

    store.put = dying  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        sync.sync(finished=True)
    store.put = original  # type: ignore[method-assign]


def test_an_upload_cut_off_before_its_manifest_is_never_restored(tmp_path: Path) -> None:
    """What a kill -9 of costguard run leaves mid-upload: every file of checkpoint-20 in
    the store, no manifest. A new machine gets checkpoint-10."""
    store = Store.open(str(tmp_path / "store"))
    out, lines = tmp_path / "out", list[str]()
    sync = syncer(store, out, lines)
    hf_folder(out, 10)
    sync.sync(finished=True)
    hf_folder(out, 20)
    killed_at_the_manifest(store, sync)
    uploaded = {p.split("/")[0] for p in store.listing()}
    assert len(uploaded) == 2  # both folders' files are there
    new_machine = tmp_path / "new"
    assert [m.step for m in syncer(store, new_machine, lines).prepare()] == [10]
    assert sorted(p.name for p in new_machine.iterdir()) == ["checkpoint-10"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="threads' nice values: Linux")
def test_the_sync_and_the_thread_that_sends_its_calls_are_nicer_than_the_trainer(
    aws_env: str, tmp_path: Path
) -> None:
    """The parts are signed and sent on the store's event loop thread, which the first
    use of the store started at the supervisor's priority (``prepare`` runs before the
    script): a sync made nicer only in its own thread took the trainer's CPU
    (benchmarks/foldersync.py, part 1)."""
    make_s3_bucket(aws_env, "ckpt-bucket")
    # A loop of the test's own, so the worker's fsspec loop keeps its priority.
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    store = Store.open("s3://ckpt-bucket/run1", {"loop": loop, "skip_instance_cache": True})
    sync = FolderSync(store, tmp_path / "out", keep=2, say=print, poll_s=0.01)
    sync.prepare()  # the store's first calls, at the supervisor's priority
    loop_tid = asyncio.run_coroutine_threadsafe(thread_id(), loop).result(timeout=10)
    before = os.getpriority(os.PRIO_PROCESS, loop_tid)
    assert before == os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    sync.start()
    try:
        assert sync._thread is not None
        sync_tid = sync._thread.native_id
        assert sync_tid is not None
        wait_for(
            lambda: os.getpriority(os.PRIO_PROCESS, loop_tid) != before,
            "the sync thread to lower the store's event loop as it starts",
        )
        expected = min(19, before + DEFAULT_SAVE_NICENESS)
        assert os.getpriority(os.PRIO_PROCESS, sync_tid) == expected
        assert os.getpriority(os.PRIO_PROCESS, loop_tid) == expected
        # The supervisor's main thread (which waits on the script) keeps its priority.
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before
        # A second sync in the same process does not lower the loop again.
        again = FolderSync(store, tmp_path / "out", keep=2, say=print, poll_s=0.01)
        again.start()
        again.finish()
        assert os.getpriority(os.PRIO_PROCESS, loop_tid) == expected
    finally:
        sync.finish()
        asyncio.run_coroutine_threadsafe(store.fs.s3.close(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        runner.join(timeout=10)
        loop.close()


async def thread_id() -> int:
    return threading.get_native_id()
