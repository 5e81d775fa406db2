"""Never delete on doubt: restore under read faults, odd manifests, retention rules.

Reads fail on the real backends (a local folder, moto S3, Azurite, the GCS emulator)
through :class:`FaultyFS`, a wrapper around the store's own fsspec filesystem that raises
what the backends raise (dropped connections, timeouts, 403s) for chosen objects, and on
S3 also through the HTTP fault proxy of :mod:`test_faults` (real 503 and 403 replies).
Whatever fails, every checkpoint that was committed before a restore is there after it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from costguard.checkpoint import Checkpointer, RetryPolicy
from costguard.checkpoint.manifest import MANIFEST_FILE, READ_FORMAT_VERSION, parse_name, scan
from costguard.checkpoint.restoring import NoUsableCheckpointError
from costguard.checkpoint.store import Store
from tests.helpers.faults import Faults, fault_proxy, train
from tests.helpers.stores import Backend

FAST = RetryPolicy(attempts=3, base_delay_s=0.01, max_delay_s=0.02)
FAULTS: dict[str, Callable[[], Exception]] = {
    "reset": lambda: ConnectionResetError(104, "Connection reset by peer"),
    "timeout": lambda: TimeoutError("read timed out"),
    "forbidden": lambda: PermissionError(403, "Forbidden"),
}


@dataclass
class FaultyFS:
    """An fsspec filesystem whose reads of chosen objects fail.

    ``rules`` maps a substring of the path to the number of reads to fail (``-1``: every
    one) and the exception to raise. Listing, writing and deleting pass through.
    """

    fs: Any
    rules: dict[str, tuple[int, Callable[[], Exception]]] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)

    def _check(self, path: str) -> None:
        for part, (left, make) in list(self.rules.items()):
            if part in str(path) and left != 0:
                self.rules[part] = (left - 1, make)
                self.failed.append(str(path))
                raise make()

    def cat_file(self, path: str, *args: Any, **kwargs: Any) -> Any:
        self._check(path)
        return self.fs.cat_file(path, *args, **kwargs)

    def get_file(self, rpath: str, lpath: str, *args: Any, **kwargs: Any) -> Any:
        self._check(rpath)
        return self.fs.get_file(rpath, lpath, *args, **kwargs)

    def open(self, path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        if "r" in mode:
            self._check(path)
        return self.fs.open(path, mode, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fs, name)


def tiny() -> tuple[torch.nn.Linear, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def make_steps(url: str, steps: int, **options: Any) -> list[str]:
    """Commit one checkpoint per step 1..steps; their folder names, oldest first."""
    model, opt = tiny()
    with Checkpointer(url, every_steps=1, keep_last=10, retry=FAST, **options) as ckpt:
        for step in range(steps):
            train(model, opt)
            ckpt.step(step, model=model, optimizer=opt)
            ckpt.flush()
    return [r.name for r in ckpt.results if r.ok]


def committed(store: Store) -> set[str]:
    """Folders with a manifest and every object it lists (read without faults)."""
    sizes = store.listing()
    out = set()
    for folder in scan(sizes):
        if folder.has_manifest:
            manifest = json.loads(store.get(f"{folder.name}/{MANIFEST_FILE}"))
            if all(
                sizes.get(f"{folder.name}/{o['name']}") == o["size_bytes"]
                for o in manifest["objects"]
            ):
                out.add(folder.name)
    return out


def faulty(
    url: str, rules: dict[str, tuple[int, Callable[[], Exception]]], **options: Any
) -> Checkpointer:
    """A Checkpointer on ``url`` whose store's reads fail by ``rules``."""
    ckpt = Checkpointer(url, retry=FAST, check=False, partial_grace_s=0.0, **options)
    ckpt.store.fs = FaultyFS(ckpt.store.fs, rules)
    return ckpt


@pytest.mark.parametrize("target", ["state.pt", MANIFEST_FILE])
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_read_that_fails_never_deletes_the_checkpoint(
    backend: Backend, fault: str, target: str, caplog: pytest.LogCaptureFixture
) -> None:
    names = make_steps(backend.url, 3)
    store = Store.open(backend.url, retry=FAST)
    before = committed(store)
    assert len(before) == 3
    newest = names[-1]
    ckpt = faulty(backend.url, {f"{newest}/{target}": (-1, FAULTS[fault])})
    model, opt = tiny()
    with caplog.at_level(logging.WARNING):
        assert ckpt.restore(model=model, optimizer=opt) == 2  # step 3 could not be read
    ckpt.close()
    assert ckpt.store.fs.failed, "the fault was never hit"
    assert committed(store) == before  # nothing deleted: it could not be judged
    assert "deleted" not in caplog.text
    assert newest in caplog.text
    assert "kept" in caplog.text
    if target == "state.pt":
        assert "repeats 1 steps" in caplog.text
    # Once the store answers again, the newest checkpoint is the one restored.
    model2, opt2 = tiny()
    with Checkpointer(backend.url, retry=FAST, check=False) as again:
        assert again.restore(model=model2, optimizer=opt2) == 3


def test_a_403_and_503_from_s3_itself_delete_nothing(
    aws_env: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.helpers.stores import make_s3_bucket

    make_s3_bucket(aws_env, "trust")
    url = "s3://trust/run"
    names = make_steps(url, 3)
    before = committed(Store.open(url))
    newest = names[-1]

    def newest_gets(method: str, path: str) -> bool:
        return method == "GET" and newest in path

    for status, body in (
        (403, b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"),
        (503, b"<Error><Code>SlowDown</Code><Message>Please reduce</Message></Error>"),
    ):
        faults = Faults(
            fail_puts=10**6,
            status=status,
            error_body=body,
            eligible=newest_gets,
        )
        with fault_proxy(aws_env, faults) as proxy:
            monkeypatch.setenv("AWS_ENDPOINT_URL", proxy)
            model, opt = tiny()
            with Checkpointer(url, retry=FAST, check=False, partial_grace_s=0.0) as ckpt:
                assert ckpt.restore(model=model, optimizer=opt) == 2
        monkeypatch.setenv("AWS_ENDPOINT_URL", aws_env)
        assert faults.failed > 0
        assert committed(Store.open(url)) == before


def test_a_manifest_from_a_newer_costguard_is_skipped_and_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    names = make_steps(str(tmp_path), 3)
    path = tmp_path / names[-1] / MANIFEST_FILE
    data = json.loads(path.read_text())
    data["format_version"] = READ_FORMAT_VERSION + 1
    path.write_text(json.dumps(data))
    model, opt = tiny()
    with caplog.at_level(logging.WARNING), Checkpointer(tmp_path, partial_grace_s=0.0) as ckpt:
        assert ckpt.restore(model=model, optimizer=opt) == 2
        # A newer save commits, and still the newer-format checkpoint stays.
        ckpt.save(2, model=model, optimizer=opt, block=True)
    assert path.exists()
    assert "newer costguard" in caplog.text


ODD_VALUES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "epoch 1e400": lambda d: d.update(epoch=float("inf")),
    "created_unix 400 digits": lambda d: d.update(created_unix=10**400),
    "created_unix a string": lambda d: d.update(created_unix="yesterday"),
    "epoch a float": lambda d: d.update(epoch=1.5),
    "reason a list": lambda d: d.update(reason=["x"]),
    "objects not a list": lambda d: d.update(objects={"a": 1}),
    "object entry a number": lambda d: d.update(objects=[7]),
    "size 1e400": lambda d: d["objects"][0].update(size_bytes=float("inf")),
}


def _write_odd(path: Path, mutate: Callable[[dict[str, Any]], Any]) -> None:
    data = json.loads(path.read_text())
    mutate(data)
    text = json.dumps(data)  # inf is written as Infinity, which json.loads reads back
    path.write_text(text.replace("Infinity", "1e400"))


@pytest.mark.parametrize("odd", sorted(ODD_VALUES))
def test_odd_manifest_values_fall_back_and_ls_verify_report_them(
    tmp_path: Path, odd: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from costguard.cli import cli

    names = make_steps(str(tmp_path), 3)
    _write_odd(tmp_path / names[-1] / MANIFEST_FILE, ODD_VALUES[odd])
    model, opt = tiny()
    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.restore(model=model, optimizer=opt) == 2
    for args, code in ((["ls"], 0), (["verify"], 1)):
        with pytest.raises(SystemExit) as info:
            cli.main(["checkpoint", *args, str(tmp_path), "--format", "json"])
        assert info.value.code == code
        report = json.loads(capsys.readouterr().out)
        by_name = {c["name"]: c for c in report["checkpoints"]}
        assert set(by_name) == set(names)
        assert by_name[names[-1]]["problem"]


def test_a_deeply_nested_and_a_huge_manifest_are_corrupt_not_a_crash(tmp_path: Path) -> None:
    names = make_steps(str(tmp_path), 3)
    nested = tmp_path / names[-1] / MANIFEST_FILE
    data = json.loads(nested.read_text())
    nested.write_text(json.dumps(data)[:-1] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}")
    huge = tmp_path / names[-2] / MANIFEST_FILE
    data = json.loads(huge.read_text())
    data["extra"] = {"pad": "x" * (5 * 2**20)}
    huge.write_text(json.dumps(data))
    model, opt = tiny()
    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.restore(model=model, optimizer=opt) == 1


def test_a_corrupt_payload_is_proof_and_goes_only_after_a_newer_commit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    names = make_steps(str(tmp_path), 3)
    payload = tmp_path / names[-1] / "state.pt"
    raw = bytearray(payload.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size, other bytes
    payload.write_bytes(bytes(raw))
    model, opt = tiny()
    with Checkpointer(tmp_path, partial_grace_s=0.0, keep_last=10) as ckpt:
        with caplog.at_level(logging.WARNING):
            assert ckpt.restore(model=model, optimizer=opt) == 2
        assert "corrupt" in caplog.text
        assert payload.exists()  # step 3 is newer than anything committed and good
        ckpt.save(3, model=model, optimizer=opt, block=True)  # step 4 commits
        assert not payload.parent.exists()  # now the corrupt step 3 is garbage


def test_partial_folders_go_only_when_older_than_a_commit_and_quiet(tmp_path: Path) -> None:
    names = make_steps(str(tmp_path), 2)
    newer_partial = tmp_path / "ckpt-000000000009-0000000a" / "state.pt"
    older_partial = tmp_path / "ckpt-000000000001-0000000b" / "state.pt"
    for path in (newer_partial, older_partial):
        path.parent.mkdir()
        path.write_bytes(b"half")
    model, opt = tiny()
    # A live writer may still be filling a young folder: within the grace, nothing goes.
    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.restore(model=model, optimizer=opt) == 2
    assert older_partial.exists()
    assert newer_partial.exists()
    with Checkpointer(tmp_path, partial_grace_s=0.0) as ckpt:
        assert ckpt.restore(model=model, optimizer=opt) == 2
    assert not older_partial.exists()
    assert newer_partial.exists()  # newer than the newest commit: maybe a live writer's
    assert {p.name for p in tmp_path.iterdir()} >= set(names)


def test_a_restore_never_applies_count_retention(tmp_path: Path) -> None:
    names = make_steps(str(tmp_path), 4)
    model, opt = tiny()
    with Checkpointer(tmp_path, keep_last=1, partial_grace_s=0.0) as ckpt:
        assert ckpt.restore(model=model, optimizer=opt) == 4
        assert committed(ckpt.store) == set(names)  # nothing newer was committed yet
        ckpt.save(4, model=model, optimizer=opt, block=True)
        assert committed(ckpt.store) == {ckpt.results[-1].name}


fault_plans = st.lists(
    st.tuples(
        st.sampled_from(["state.pt", MANIFEST_FILE]),
        st.integers(0, 3),  # which checkpoint (by age)
        st.integers(1, 6),  # how many reads fail (-1 below: all)
        st.sampled_from(sorted(FAULTS)),
        st.booleans(),  # every read fails
    ),
    max_size=4,
)


def test_no_fault_sequence_loses_a_committed_checkpoint(backend: Backend) -> None:
    # Many sequences on the local store, a few on each emulator (each costs a few seconds).
    examples = 25 if backend.name == "local" else 4

    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(plan=fault_plans, keep=st.integers(1, 4))
    @example(plan=[("state.pt", age, 1, "forbidden", True) for age in range(4)], keep=1)
    def check(plan: list[Any], keep: int) -> None:
        no_fault_sequence_loses_a_committed_checkpoint(
            f"{backend.url}/ex{time.monotonic_ns()}", plan, keep
        )

    check()


def no_fault_sequence_loses_a_committed_checkpoint(url: str, plan: list[Any], keep: int) -> None:
    names = make_steps(url, 4)
    store = Store.open(url)
    before = committed(store)
    rules = {
        f"{names[index]}/{target}": (-1 if always else count, FAULTS[fault])
        for target, index, count, fault, always in plan
    }
    ckpt = faulty(url, rules, keep_last=keep)
    model, opt = tiny()
    try:
        start = ckpt.restore(model=model, optimizer=opt)
    except NoUsableCheckpointError:
        # None could be read: refused, not a start from step 0 past them, and none lost.
        assert all(any(key.startswith(f"{name}/") for key in rules) for name in names), rules
        assert committed(store) == before
        ckpt.close(final=False)
        return
    assert start in {parse_name(n) for n in names}
    assert committed(store) >= before
    # A save after the restore commits, and only then may count retention act.
    ckpt.save(start, model=model, optimizer=opt, block=True)
    ckpt.close()
    after = committed(store)
    new = ckpt.results[-1]
    assert new.ok
    assert new.name in after
    for name in before - after:
        # Lost only by count: older than the new commit, and not among the newest ``keep``.
        step = parse_name(name) or 0
        assert step < new.step, (name, new.name)
        assert sum((parse_name(n) or 0) > step for n in after) >= keep


def test_restore_streams_the_payload_and_never_holds_it_as_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from costguard.checkpoint import state as state_mod

    make_steps(str(tmp_path), 2)

    def in_memory(*_: Any, **__: Any) -> Any:
        raise AssertionError("restore must not deserialise the payload from memory")

    monkeypatch.setattr(state_mod, "deserialise", in_memory)
    monkeypatch.setattr(Store, "get", _no_payload_get(Store.get))
    model, opt = tiny()
    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.restore(model=model, optimizer=opt) == 2


def _no_payload_get(get: Callable[..., bytes]) -> Callable[..., bytes]:
    def guarded(self: Store, path: str, max_bytes: int | None = None) -> bytes:
        assert not path.endswith("state.pt"), "restore read the whole payload into memory"
        return get(self, path, max_bytes)

    return guarded


def test_an_emergency_save_on_a_failing_gcs_store_reports_before_the_deadline(
    gcs_emulator: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from costguard.checkpoint import Preempted
    from costguard.checkpoint.notices import Notice, NoticeBoard
    from tests.checkpoint.test_faults_gcs_azure import gcs_error

    faults = Faults(eligible=lambda method, path: True)
    with fault_proxy(gcs_emulator, faults) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy)
        monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        board = NoticeBoard()
        model, opt = tiny()
        ckpt = Checkpointer(
            f"gs://ckpt-bucket/deadline{time.monotonic_ns()}",
            storage_options={"token": "anon", "project": "test"},
            notices=board,
            every_steps=1000,
        )
        ckpt.step(0, model=model, optimizer=opt)
        # From now on GCS answers every request with 503, which gcsfs retries on its own.
        faults.status, faults.error_body = 503, gcs_error(503, "Backend Error")
        faults.error_headers = {"Content-Type": "application/json"}
        faults.fail_puts = 10**6
        deadline = time.time() + 12  # GCP gives 30 s; this store needs far longer to give up
        board.post(Notice("gcp", "preempt", deadline))
        with caplog.at_level(logging.WARNING), pytest.raises(Preempted) as info:
            ckpt.step(1, model=model, optimizer=opt)
        reported = time.time()
    assert reported < deadline, f"reported {reported - deadline:.1f} s after the deadline"
    assert info.value.result is None or not info.value.result.ok
    assert "emergency save of step 2 did not commit" in caplog.text
    assert "newest durable checkpoint is none" in caplog.text


def test_a_save_after_falling_back_never_deletes_the_newer_checkpoints_it_skipped(
    tmp_path: Path,
) -> None:
    names = make_steps(str(tmp_path), 4)
    unreadable = {f"{n}/state.pt": (-1, FAULTS["forbidden"]) for n in names}
    model, opt = tiny()
    with faulty(str(tmp_path), unreadable) as refused, pytest.raises(NoUsableCheckpointError):
        refused.restore(model=model, optimizer=opt)  # none could be read: no silent step 0
    ckpt = faulty(str(tmp_path), unreadable, keep_last=1, start_fresh=True)
    assert ckpt.restore(model=model, optimizer=opt) == 0  # starting over, on purpose
    ckpt.save(0, model=model, optimizer=opt, block=True)  # step 1 commits, keep_last=1
    ckpt.close()
    # Count retention deletes only what is older than the new commit: nothing here.
    assert committed(ckpt.store) == {*names, ckpt.results[-1].name}
