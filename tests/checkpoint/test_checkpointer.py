"""The Checkpointer on a local folder and moto S3: async saves, restore with integrity
fallback, retention, failures that are reported and never stop training, bad input."""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import random
import resource
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import pytest
import torch

from costguard.checkpoint import Checkpointer, Preempted, RestoreError, ResumableLoader
from costguard.checkpoint.manifest import MANIFEST_FILE, parse_manifest, scan
from costguard.checkpoint.notices import Notice, NoticeBoard
from costguard.checkpoint.state import CpuCopier, TrainState, capture, rng_state, set_rng_state
from costguard.checkpoint.store import RetryPolicy
from costguard.errors import InputError
from tests.checkpoint.test_notices_azure_ack import PREEMPT, watched_notice
from tests.helpers.metadata import AckState
from tests.helpers.stores import make_s3_bucket
from tests.helpers.waiting import wait_for


def tiny() -> tuple[torch.nn.Linear, torch.optim.Optimizer]:
    model = torch.nn.Linear(6, 3)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def train(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    loss = model(torch.randn(4, 6)).pow(2).sum() + random.random() + float(np.random.rand())
    opt.zero_grad()
    loss.backward()
    opt.step()


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_rng_state_round_trips() -> None:
    state = rng_state()
    a = (random.random(), float(np.random.rand()), torch.rand(2))
    set_rng_state(state)
    b = (random.random(), float(np.random.rand()), torch.rand(2))
    assert a[:2] == b[:2]
    assert torch.equal(a[2], b[2])


def test_copier_reuses_buffers_and_detaches_from_live_tensors() -> None:
    model, opt = tiny()
    train(model, opt)
    copier = CpuCopier()
    first = copier.copy(capture(1, TrainState(model=model, optimizer=opt)))
    train(model, opt)
    assert not torch.equal(first["model"]["weight"], model.weight)  # a copy, not a view
    second = copier.copy(capture(2, TrainState(model=model, optimizer=opt)))
    assert second["model"]["weight"].data_ptr() == first["model"]["weight"].data_ptr()
    assert torch.equal(second["model"]["weight"], model.weight)


def test_loader_resumes_mid_epoch_without_repeats_or_skips() -> None:
    dataset = torch.utils.data.TensorDataset(torch.arange(23))
    full = ResumableLoader(dataset, batch_size=4, seed=7)
    expected = [b[0].tolist() for _ in range(2) for b in full]
    first = ResumableLoader(dataset, batch_size=4, seed=7)
    seen = []
    for i, batch in enumerate(first):
        seen.append(batch[0].tolist())
        if i == 3:
            break
    state = first.state_dict()
    resumed = ResumableLoader(dataset, batch_size=4, seed=7, num_workers=0)
    resumed.load_state_dict(state)
    for _ in range(2 - resumed.epoch):
        seen.extend(b[0].tolist() for b in resumed)
    assert seen == expected
    with pytest.raises(ValueError, match="seed"):
        ResumableLoader(dataset, batch_size=4, seed=8).load_state_dict(state)


def test_save_restore_is_exact_and_keeps_the_last_n(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, opt = tiny()
    ckpt = Checkpointer(tmp_path, every_steps=2, keep_last=2)
    assert ckpt.restore(model=model, optimizer=opt) == 0
    extra = {"tokens": 0}
    for step in range(7):
        train(model, opt)
        extra["tokens"] += 4
        ckpt.step(step, model=model, optimizer=opt, extra=extra)
    ckpt.close()  # commits the 7th step: the result of the run is in the store
    assert [(r.step, r.reason) for r in ckpt.results] == [
        (2, "schedule"),
        (4, "schedule"),
        (6, "schedule"),
        (7, "final"),
    ]
    assert all(r.ok for r in ckpt.results)
    assert sorted(c.step for c in scan(ckpt.store.listing())) == [6, 7]
    # The state after step index 6 (7 steps done) comes back exactly, RNG included.
    model2, opt2 = tiny()
    got: dict[str, Any] = {}
    ckpt2 = Checkpointer(tmp_path)
    assert ckpt2.restore(model=model2, optimizer=opt2, extra=got) == 7
    assert got == {"tokens": 28}
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters(), strict=True)
    )
    torch.manual_seed(123)  # restore must override this
    train(model2, opt2)
    ckpt2.close()


def test_restore_falls_back_when_the_newest_is_corrupt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model, opt = tiny()
    with Checkpointer(tmp_path, keep_last=3) as ckpt:
        for step in range(3):
            train(model, opt)
            ckpt.save(step, model=model, optimizer=opt, block=True)
        good = weights(model)  # state after 3 steps is the newest; corrupt it
    folders = sorted(p for p in tmp_path.iterdir() if p.name.startswith("ckpt-"))
    payload = folders[-1] / "state.pt"
    data = bytearray(payload.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one bit flipped: only sha256 sees it
    payload.write_bytes(bytes(data))
    (folders[-2] / "manifest.json").write_text("{ not json")
    model2, opt2 = tiny()
    with caplog.at_level(logging.WARNING):
        start = Checkpointer(tmp_path).restore(model=model2, optimizer=opt2)
    assert start == 1
    assert "sha256" in caplog.text
    assert "not valid JSON" in caplog.text
    assert not torch.equal(model2.weight, good["weight"])


def test_restore_into_a_different_model_is_a_clear_error(tmp_path: Path) -> None:
    model, opt = tiny()
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(0, model=model, optimizer=opt, block=True)
    with pytest.raises(RestoreError, match="does not fit"):
        Checkpointer(tmp_path).restore(model=torch.nn.Linear(2, 2))


def test_a_failing_store_is_reported_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model, opt = tiny()
    store = tmp_path / "store"
    ckpt = Checkpointer(store, every_steps=1, retry=RetryPolicy(attempts=2, base_delay_s=0.01))
    train(model, opt)
    ckpt.step(0, model=model, optimizer=opt)
    ckpt.flush()
    before = ckpt.store.listing()
    ckpt.store.root = str(tmp_path / "file-not-dir" / "x")  # every write now fails
    (tmp_path / "file-not-dir").write_text("")
    with caplog.at_level(logging.ERROR):
        for step in range(1, 3):
            train(model, opt)
            assert ckpt.step(step, model=model, optimizer=opt) is False
        ckpt.close()
    # The scheduled saves of steps 2 and 3 failed; close() tried step 3 once more.
    assert [(r.ok, r.reason) for r in ckpt.results] == [
        (True, "schedule"),
        (False, "schedule"),
        (False, "schedule"),
        (False, "final"),
    ]
    assert "training goes on" in caplog.text
    ckpt.store.root = str(store)
    assert ckpt.store.listing() == before


@contextlib.contextmanager
def files_cut_at(size_bytes: int) -> Iterator[None]:
    """The kernel refuses to write past ``size_bytes`` of any file this process writes
    (``RLIMIT_FSIZE``: a write there fails with EFBIG, "File too large", SIGXFSZ being
    ignored) until the block ends or :func:`uncut` is called: a disk that fails midway."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def uncut() -> None:
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))


class RepairOnRetry(logging.Handler):
    """Lifts :func:`files_cut_at`'s cut when the store says it retries a write (the first
    attempt has failed): the disk fails once."""

    def __init__(self) -> None:
        super().__init__()
        self.retries: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "writing " in message and " retry " in message:
            self.retries.append(message)
            uncut()


def test_a_local_save_streams_into_the_file_and_a_failed_write_is_produced_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real failing write (the kernel's EFBIG past a file-size limit, midway through the
    state's 15 kB): the save is produced again into a fresh file and commits."""
    from costguard.checkpoint import state as state_mod

    def no_copy_in_memory(state: Any) -> Any:
        raise AssertionError("a local save must not serialise the whole state into memory")

    monkeypatch.setattr(state_mod, "serialise", no_copy_in_memory)
    model, opt = tiny()
    train(model, opt)
    ckpt = Checkpointer(tmp_path, retry=RetryPolicy(attempts=2, base_delay_s=0.01))
    repair = RepairOnRetry()
    calls = logging.getLogger("costguard.checkpoint.calls")
    calls.addHandler(repair)
    try:
        with files_cut_at(8 * 2**10):
            future = ckpt.save(5, model=model, optimizer=opt, block=True)
    finally:
        calls.removeHandler(repair)
    assert future is not None
    result = future.result()
    assert result.ok, result.error
    assert len(repair.retries) == 1, repair.retries  # the first attempt failed
    assert "File too large" in repair.retries[0]
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert not [f for f in files if ".tmp-" in f]  # the failed attempt's file is gone
    (manifest_file,) = tmp_path.rglob(MANIFEST_FILE)
    manifest = parse_manifest(manifest_file.read_bytes(), manifest_file.parent.name)
    (entry,) = manifest.objects
    data = (manifest_file.parent / entry.name).read_bytes()
    assert entry.size_bytes > 8 * 2**10  # past the cut: written whole the second time
    assert (len(data), hashlib.sha256(data).hexdigest()) == (entry.size_bytes, entry.sha256)
    fresh, fresh_opt = tiny()
    assert Checkpointer(tmp_path).restore(model=fresh, optimizer=fresh_opt) == manifest.step
    assert torch.equal(fresh.weight, model.weight)

    # A disk that keeps failing: the report names the disk's error, not torch.save's.
    with files_cut_at(8 * 2**10):
        failed = ckpt.save(6, model=model, optimizer=opt, block=True)
    assert failed is not None
    assert not failed.result().ok
    assert "File too large" in str(failed.result().error)
    assert "unexpected pos" not in str(failed.result().error)
    ckpt.close()


def test_skip_when_busy(tmp_path: Path) -> None:
    model, opt = tiny()
    ckpt = Checkpointer(tmp_path, every_steps=1, when_busy="skip", keep_last=100)
    for step in range(30):
        ckpt.step(step, model=model, optimizer=opt)
    ckpt.close()
    assert 1 <= len(ckpt.results) <= 30
    assert all(r.ok for r in ckpt.results)


def test_an_urgent_notice_saves_the_current_step_and_exits_75(tmp_path: Path) -> None:
    board = NoticeBoard()
    model, opt = tiny()
    ckpt = Checkpointer(tmp_path, every_steps=100, notices=board)
    ckpt.step(0, model=model, optimizer=opt)
    board.post(Notice("aws", "terminate", None))
    with pytest.raises(Preempted) as info:
        ckpt.step(1, model=model, optimizer=opt)
    assert info.value.code == 75
    assert info.value.result is not None
    assert info.value.result.ok
    assert info.value.result.step == 2
    assert Checkpointer(tmp_path).restore(model=model) == 2


def test_a_rebalance_recommendation_saves_and_training_goes_on(tmp_path: Path) -> None:
    board = NoticeBoard()
    model, opt = tiny()
    ckpt = Checkpointer(tmp_path, notices=board, exit_on_notice=False)
    board.post(Notice("aws", "rebalance", None))
    assert ckpt.step(4, model=model, optimizer=opt) is False
    ckpt.close()
    assert [(r.step, r.reason) for r in ckpt.results] == [(5, "notice:aws-rebalance")]


def test_s3_store_saves_and_restores(aws_env: str) -> None:
    make_s3_bucket(aws_env, "ckpt")
    model, opt = tiny()
    with Checkpointer("s3://ckpt/run", keep_last=1) as ckpt:
        for step in range(3):
            train(model, opt)
            ckpt.save(step, model=model, optimizer=opt)
    assert len(scan(ckpt.store.listing())) == 1
    model2, opt2 = tiny()
    assert Checkpointer("s3://ckpt/run").restore(model=model2, optimizer=opt2) == 3
    assert torch.equal(model2.weight, model.weight)
    digest = hashlib.sha256(ckpt.store.get(ckpt.results[-1].name + "/state.pt")).hexdigest()
    assert digest in ckpt.store.get(ckpt.results[-1].name + "/manifest.json").decode()


def test_bad_urls_fail_before_training(tmp_path: Path, aws_env: str) -> None:
    with pytest.raises(InputError, match="does not exist"):
        Checkpointer("s3://missing-bucket/run")
    with pytest.raises(InputError, match="looks like a store URL"):
        Checkpointer("ftp://host/run")
    with pytest.raises(InputError, match="keep_last"):
        Checkpointer(tmp_path, keep_last=0)
    (tmp_path / "f").write_text("")
    with pytest.raises(InputError):
        Checkpointer(tmp_path / "f" / "sub")


def test_unreachable_endpoint_fails_fast(monkeypatch: pytest.MonkeyPatch, aws_env: str) -> None:
    from tests.helpers.processes import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(InputError, match="cannot write"):
        Checkpointer("s3://b/run", retry=RetryPolicy(attempts=2, base_delay_s=0.01))


def test_from_env_reads_what_costguard_run_sets(tmp_path: Path) -> None:
    env = {
        "COSTGUARD_CHECKPOINT_URL": str(tmp_path / "c"),
        "COSTGUARD_CHECKPOINT_EVERY_STEPS": "7",
        "COSTGUARD_CHECKPOINT_KEEP": "2",
        "COSTGUARD_CLOUD": "none",
    }
    ckpt = Checkpointer.from_env(default="elsewhere/", env=env, watch=False, every_steps=3)
    assert ckpt.schedule.every_steps == 7
    assert ckpt.keep_last == 2
    assert ckpt.store.root.endswith("/c")
    with pytest.raises(InputError, match="not a valid number"):
        Checkpointer.from_env(env={**env, "COSTGUARD_CHECKPOINT_KEEP": "x"}, watch=False)
    with pytest.raises(InputError, match="JSON object"):
        Checkpointer.from_env(env={**env, "COSTGUARD_STORAGE_OPTIONS": "[1]"}, watch=False)


def test_serialise_gives_torch_save_bytes_without_bytesio_or_zip_crc(tmp_path: Path) -> None:
    from costguard.checkpoint.state import _Sink, deserialise, serialise

    model, opt = tiny()
    train(model, opt)
    snapshot = CpuCopier().copy(capture(3, TrainState(model=model, optimizer=opt, extra={"k": 1})))
    # torch.save's own bytes, minus the zip records' CRC32 (the manifest's sha256 covers them).
    from torch.utils.serialization import config

    reference = io.BytesIO()
    with config.patch({"save.compute_crc32": False}):  # type: ignore[attr-defined]
        torch.save(snapshot, reference)
    assert bytes(serialise(snapshot)) == reference.getvalue()
    assert config.save.compute_crc32  # the process-wide setting is back
    with_crc = io.BytesIO()
    torch.save(snapshot, with_crc)
    assert with_crc.getvalue() != reference.getvalue()
    small = _Sink(16)  # far too small: it grows and keeps what was written
    torch.save(snapshot, cast(IO[bytes], small))
    assert bytes(small.view()) == with_crc.getvalue()
    back = deserialise(serialise(snapshot))
    assert torch.equal(back["model"]["weight"], model.weight)
    assert back["extra"] == {"k": 1}


def test_watch_uses_the_pipe_only_in_the_direct_child_else_the_notice_file(
    tmp_path: Path,
) -> None:
    from costguard.checkpoint.distributed import append_notice

    notices = tmp_path / "notices.jsonl"
    read_fd, write_fd = os.pipe()
    try:
        env = {
            "COSTGUARD_CLOUD": "none",
            "COSTGUARD_NOTICE_FD": str(read_fd),
            "COSTGUARD_NOTICE_FILE": str(notices),
            "COSTGUARD_RUN_PID": str(os.getpid()),  # not our parent: a launcher's worker
        }
        ckpt = Checkpointer(tmp_path / "c", notices=NoticeBoard())
        ckpt.watch(env)
        append_notice(notices, Notice("gcp", "preempt", None))
        noticed = wait_for(
            lambda: ckpt.preempting, "the appended notice", timeout_s=10, poll_s=0.02
        )
        assert noticed == Notice("gcp", "preempt", None)
        os.fstat(read_fd)  # the pipe was left alone: it is not this process's to read
        ckpt.close()
    finally:
        os.close(write_fd)
        os.close(read_fd)
    with pytest.raises(InputError, match="sync_every"):
        Checkpointer(tmp_path / "d", sync_every=0)


def test_an_azure_eviction_is_acknowledged_only_after_the_save_is_durable(
    tmp_path: Path,
    acking_metadata_server: tuple[str, AckState],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base, state = acking_metadata_server
    monkeypatch.setenv("COSTGUARD_AZURE_METADATA_URL", base)
    state.azure_events = [dict(PREEMPT)]
    committed_at_ack: list[list[str]] = []
    state.on_start = lambda _ids: committed_at_ack.append(
        sorted(p.parent.name for p in tmp_path.glob("*/manifest.json"))
    )
    board = NoticeBoard()
    model, opt = tiny()
    ckpt = Checkpointer(tmp_path, every_steps=100, notices=board)
    ckpt.step(0, model=model, optimizer=opt)
    board.post(watched_notice(base))
    assert state.started == []  # seen, not yet acknowledged
    with pytest.raises(Preempted) as info:
        ckpt.step(1, model=model, optimizer=opt)

    assert info.value.result is not None
    assert state.started == [PREEMPT["EventId"]]
    (committed,) = committed_at_ack
    assert info.value.result.name in committed  # the emergency checkpoint was already there
