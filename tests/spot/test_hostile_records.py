"""Records forged by someone who can write the bucket: named, left out, never a crash
(issue 43 items 2-5: job.json, pace.json, stop.json and exit records as an attacker with
write access to the store and nothing else writes them)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from costguard import contract
from costguard.checkpoint.pace import Pace, write_pace
from costguard.checkpoint.store import Store
from costguard.spot.controller import Controller
from costguard.spot.job import JOB_FILE, Job, Simulation, job_doc, save_job
from costguard.spot.launcher.base import Handle
from costguard.spot.launcher.local import LocalLauncher
from costguard.spot.recovery import Attempt
from tests.spot.test_offers_and_job import spec
from tests.spot.test_simulator import ON_DEMAND


def running_doc(url: str, **spec_changes: object) -> dict[str, Any]:
    """A running job's job.json as costguard writes it: one attempt 600 s old."""
    now = time.time()
    handle = Handle("local", "aws:us-east-1", "local-1", extra={"pid": "1"})
    attempt = Attempt(1, ON_DEMAND, launched_unix=now - 600, handle=handle)
    job = Job(
        spec(url, spot=False, simulation=None, created_unix=now - 605, total_steps=2000,
             **spec_changes),
        attempts=(attempt,),
    )  # fmt: skip
    return json.loads(json.dumps(job_doc(job), default=str))


def forge(store: Store, doc: object) -> None:
    """Write ``doc`` as job.json the way an attacker would: raw JSON, NaN and all."""
    data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    store.put(JOB_FILE, data)


def set_in(doc: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    """``doc`` with the field at dotted ``path`` (``attempts.0.offer.usd_per_hour``) set."""
    *parents, last = path.split(".")
    here: Any = doc
    for key in parents:
        here = here[int(key)] if isinstance(here, list) else here[key]
    here[int(last) if isinstance(here, list) else last] = value
    return doc


#: The forged fields of issue 43 item 5, and more of the same kind.
FORGERIES = [
    ("attempts.0.offer.usd_per_hour", "-5"),
    ("attempts.0.offer.usd_per_hour", float("nan")),
    ("attempts.0.offer.usd_per_hour", float("inf")),
    ("attempts.0.offer.usd_per_hour", 1e308),
    ("attempts.0.offer.usd_per_hour", "abc"),
    ("attempts.0.offer.usd_per_hour", "1E+400"),
    ("attempts.0.launched_unix", -1e12),
    ("attempts.0.launched_unix", 1e300),
    ("attempts.0.ended_unix", float("-inf")),
    ("spec.total_steps", -5),
    ("spec.total_steps", 10**400),
    ("spec.gpu_count", float("inf")),
    ("spec.max_total_usd", "NaN"),
    ("spec.expires_at", "year 306612827"),
    ("spec.command", []),
    ("spec.job_id", "*"),
    ("status", "running\nDone: all good"),
    ("reason", "\x1b]0;owned\x07"),
    ("attempts.0.offer.region", "us-east-1\x1b[2J"),
    ("kept_stopped", ["x" * 100_000]),
    ("attempts", [None] * 3),
    ("spec", [[[[[]]]]]),
]


@pytest.mark.parametrize(
    ("path", "value"), FORGERIES, ids=[f"{p}={v!r}"[:60] for p, v in FORGERIES]
)
def test_jobs_status_names_a_forged_field_and_exits_2(
    run_cli: Callable[..., Any], tmp_path: Path, path: str, value: object
) -> None:
    store = Store.open(tmp_path / "ckpt")
    forge(store, set_in(running_doc(store.url), path, value))
    for args in (("jobs", "status", store.url), ("jobs", "status", store.url, "--format", "json")):
        result = run_cli(*args)
        assert result.exit_code == 2, (result.stdout, result.stderr)
        assert "unexpected" not in result.stderr
        assert "is not a costguard record" in result.stderr
        # The field, or (NaN, Infinity, 10^400: refused while parsing) what was refused.
        named = (path.split(".")[-1], "is not a number", "more than 20 digits", "not JSON")
        assert any(word in result.stderr for word in named), result.stderr
        assert "\x1b" not in result.stderr + result.stdout


def test_deep_nesting_and_a_huge_job_json_are_refused_without_reading_it_whole(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    store = Store.open(tmp_path / "ckpt")
    forge(store, b"[" * 200_000 + b"]" * 200_000)
    result = run_cli("jobs", "status", store.url)
    assert result.exit_code == 2
    assert "unexpected" not in result.stderr
    big = tmp_path / "ckpt" / "job" / "job.json"
    with big.open("wb") as file:  # 40 MB: more than any job.json costguard writes
        file.write(b'{"version": 1, "reason": "')
        file.write(b"x" * (40 * 1024 * 1024))
        file.write(b'"}')
    result = run_cli("jobs", "status", store.url)
    assert result.exit_code == 2
    assert f"more than {contract.JOB_BYTES:,} bytes" in result.stderr


def test_a_pace_inside_the_old_range_checks_is_left_out_of_status_and_the_controller(
    run_cli: Callable[..., Any], tmp_path: Path, spot_env: Callable[..., dict[str, str]]
) -> None:
    """Item 4: ``seconds_measured`` 2^40-1 and ``total_steps`` 2^63-1 crashed the
    controller (InvalidOperation) and ``jobs status`` (year out of range)."""
    store = Store.open(tmp_path / "ckpt")
    now = time.time()
    attempt = Attempt(1, ON_DEMAND, launched_unix=now - 60)
    job_spec = spec(store.url, spot=False, simulation=None, total_steps=None,
                    max_total_usd=Decimal(5), stop_at_projection=True)  # fmt: skip
    job = save_job(store, Job(job_spec, attempts=(attempt,)))
    launcher = LocalLauncher(
        Simulation(), job_started_unix=now, state_dir=tmp_path / "state", env=spot_env()
    )
    forged = Pace(1, 2.0**40 - 1, 1, now, now - 10, total_steps=2**63 - 1)
    store.put("job/pace.json", forged.to_json())
    assert Controller(store, launcher, [ON_DEMAND]).watch_projection(job) == job
    result = run_cli("jobs", "status", store.url, "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["projection"] is None
    assert "job/pace.json" in result.stderr
    assert "left out" in result.stderr
    # Within the contract's ranges, a run of centuries is not projected: no date overflow.
    write_pace(store, Pace(1, 3e8, 1, now, now - 10, total_steps=10**12))
    assert Controller(store, launcher, [ON_DEMAND]).watch_projection(job) == job
    result = run_cli("jobs", "status", store.url)
    assert result.exit_code == 0, result.stderr
    assert "unexpected" not in result.stderr
    launcher.close()


def test_jobs_status_reads_the_pace_and_checkpoints_of_the_url_it_is_given(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    """Item 5: job.json naming another store must not make status read that store."""
    mine, elsewhere = Store.open(tmp_path / "mine"), Store.open(tmp_path / "elsewhere")
    now = time.time()
    write_pace(elsewhere, Pace(100, 50.0, 1900, now, now - 100, total_steps=2000))
    write_pace(mine, Pace(100, 50.0, 100, now, now - 100, total_steps=2000))
    forge(mine, running_doc(elsewhere.url))  # its spec names the other store
    doc = run_cli("jobs", "status", mine.url, "--format", "json").json()
    assert doc["projection"]["steps_done"] < 1900  # mine: 100 done, not elsewhere's 1900


def test_estimate_from_run_prices_the_pace_when_job_json_is_forged(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    store = Store.open(tmp_path / "ckpt")
    now = time.time()
    write_pace(store, Pace(100, 50.0, 100, now, now - 100, total_steps=2000))
    forge(store, set_in(running_doc(store.url), "spec.gpu_count", float("nan")))
    result = run_cli("estimate", "--from-run", store.url, "--gpu", "a10g", "--speedup", "1",
                     "--format", "json")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "job/job.json" in result.stderr
    assert "left out" in result.stderr
    store.put("job/pace.json", b'{"version": 1, "steps_measured": 1e999}')
    result = run_cli("estimate", "--from-run", store.url, "--gpu", "a10g", "--speedup", "1")
    assert result.exit_code == 2
    assert "unexpected" not in result.stderr
    assert "job/pace.json" in result.stderr


def test_a_forged_exit_record_is_named_and_not_believed(tmp_path: Path) -> None:
    from costguard.spot.job import read_exit_record

    store = Store.open(tmp_path / "ckpt")
    store.put("job/attempt-1.exit.json",
              b'{"attempt": 1, "exit_code": 0, "finished_unix": Infinity}')  # fmt: skip
    assert read_exit_record(store, 1, "cg-test-1") is None
    store.put("job/attempt-1.exit.json", b'{"attempt": 2, "exit_code": 0, "finished_unix": 1}')
    assert read_exit_record(store, 1) is None  # another attempt's record copied here


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_record_that_is_no_regular_file_is_refused_without_a_wait(
    tmp_path: Path, kind: str
) -> None:
    """A FIFO left at job.json in a shared folder hung `jobs status`, and at an attempt's
    exit record hung an attached controller (no --max-total or --timeout-hours enforced
    meanwhile): opening a FIFO waits for a writer. A folder there was an unexpected
    error (exit 1). Both are now records that are not costguard's: named, exit 2."""
    import os
    import subprocess
    import sys

    from costguard.spot.job import read_exit_record

    store = Store.open(tmp_path / "ckpt")
    save_job(store, Job(spec(store.url)))
    for name in ("job.json", "attempt-1.exit.json"):
        target = tmp_path / "ckpt" / "job" / name
        target.unlink(missing_ok=True)
        if kind == "fifo":
            os.mkfifo(target)
        else:
            target.mkdir()
    said: list[str] = []
    assert (
        contract.read_or_warn(store, "job/attempt-1.exit.json", contract.EXIT, say=said.append)
        is None
    )
    assert "not a regular file" in said[0]
    assert read_exit_record(store, 1) is None  # a warning, and no record: not a hang
    status = subprocess.run(
        [sys.executable, "-m", "costguard", "jobs", "status", store.url],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert status.returncode == 2, status.stderr
    assert "job/job.json" in status.stderr
    assert "not a regular file" in status.stderr


def test_an_attempt_that_ends_before_the_job_began_shows_no_negative_time(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    """An attempt's end forged (or clocked by another machine) before the job's creation:
    `jobs status` printed "time: -1796582820.7 s wall"."""
    store = Store.open(tmp_path / "ckpt")
    doc = running_doc(store.url)
    doc["status"] = "failed"
    doc["attempts"][0].update(ended_unix=1.0, outcome="failed", exit_code=1)
    forge(store, doc)
    result = run_cli("jobs", "status", store.url)
    assert result.exit_code == 0, result.stderr
    assert "time: 0.0 s wall" in result.stdout
    assert "time: -" not in result.stdout
    summary = run_cli("jobs", "status", store.url, "--format", "json").json()["summary"]
    assert summary["wall_s"] == 0
    assert all(v >= 0 for k, v in summary.items() if k.endswith("_s") and v is not None)
