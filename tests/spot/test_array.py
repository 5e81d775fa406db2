"""`costguard launch --array`: the input it refuses, the array's record, and sweeps of real
torch training tasks on the local simulator (real notices, real SIGKILLs) under one
budget, rolled up by `costguard jobs status`."""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import torch

from costguard import contract
from costguard.checkpoint.pace import Pace, write_pace
from costguard.checkpoint.store import Store
from costguard.errors import InputError
from costguard.spot import array
from costguard.spot.controller import Event
from costguard.spot.job import Job, save_job
from costguard.spot.launcher.local import LocalLauncher
from costguard.spot.recovery import Attempt
from costguard.spot.simulator import Simulation
from costguard.spot.sweep import Sweep, Task, rollup_document, rows, task_specs
from tests.helpers.training import TRAIN_SCRIPT, SharedRuns, assert_bitwise_equal, train_reference
from tests.helpers.waiting import wait_for
from tests.spot.test_launch_cli import assert_refused
from tests.spot.test_offers_and_job import spec
from tests.spot.test_ownership import signed
from tests.spot.test_projection import ON_NOTICE_75
from tests.spot.test_simulator import ON_DEMAND

#: Every child process is bounded by this (the machine may be shared and slow).
TIMEOUT_S = 600
LOCAL_A10G = ("--provider", "local", "--gpu", "a10g")


def task_command(out_dir: Path, steps: int, sleep: float) -> list[str]:
    """The seeded torch training script, writing its weights to out-<task index>.pt (the
    index from COSTGUARD_ARRAY_TASK_ID, as a SLURM array script reads SLURM_ARRAY_TASK_ID)."""
    script = (
        f"exec {sys.executable} {TRAIN_SCRIPT} --steps {steps} --sleep {sleep} "
        f'--out {out_dir}/out-"$COSTGUARD_ARRAY_TASK_ID".pt'
    )
    return ["sh", "-c", script]


def launch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "costguard", "launch", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def task_jobs(url: Path, indexes: range) -> list[dict[str, Any]]:
    return [json.loads((url / f"task-{i}" / "job" / "job.json").read_text()) for i in indexes]


def most_at_once(jobs: list[dict[str, Any]]) -> int:
    """The most attempts (of any task) running at one moment, from their recorded launch
    and end times."""
    spans = [
        (a["launched_unix"], a["ended_unix"])
        for job in jobs
        for a in job["attempts"]
        if a["outcome"] != "launch_failed"
    ]
    return max(sum(1 for start, end in spans if start <= t < end) for t, _ in spans)


# -- input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("5-2", "5-2 goes down"),
        ("0-100000", "has 100,001 tasks; an array has at most 1,000"),
        ("0-3%0", "the %limit must be 1 or more"),
        ("1,2,1", "names task 1 twice"),
        ("0-9:3,6", "names task 6 twice"),
        ("0-3:0", "the :step must be 1 or more"),
        ("zero", "is not a SLURM array"),
    ],
)
def test_bad_arrays_are_refused_before_anything_exists(
    value: str, message: str, tmp_path: Path, run_cli: Callable[..., Any]
) -> None:
    ckpt = tmp_path / "ckpt"
    result = run_cli(
        "launch", *LOCAL_A10G, "--checkpoint", str(ckpt), "--array", value, "--yes",
        "--", "python", "train.py",
    )  # fmt: skip
    assert_refused(result, message)
    assert not ckpt.exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--attach", "ATTACH"), "--array and --attach exclude each other"),
        (("--stop-at-projection",), "--stop-at-projection needs --max-total"),
        (("--pilot-steps", "100"), "--pilot-steps prices one job, not an array"),
    ],
)
def test_array_with_excluded_options_is_refused(
    extra: tuple[str, ...], message: str, tmp_path: Path, run_cli: Callable[..., Any]
) -> None:
    ckpt = tmp_path / "ckpt"
    attach = tmp_path / "other"
    attach.mkdir()
    extra = tuple(str(attach) if word == "ATTACH" else word for word in extra)
    result = run_cli(
        "launch", *LOCAL_A10G, "--checkpoint", str(ckpt), "--array", "0-3%2", *extra,
        "--yes", "--", "python", "train.py",
    )  # fmt: skip
    assert_refused(result, message)
    assert not ckpt.exists()
    assert list(attach.iterdir()) == []


def test_array_bounds_and_syntax_are_slurms() -> None:
    assert array.parse("0-999").indexes == tuple(range(1000))
    with pytest.raises(InputError, match="1,001 tasks"):
        array.parse("0-1000")
    # Huge ranges are counted, never listed: refused at once.
    with pytest.raises(InputError, match="tasks; an array has at most"):
        array.parse("0-4000000")
    assert array.parse("3,1,10-20:5%2") == array.ArraySpec("3,1,10-20:5%2", (3, 1, 10, 15, 20), 2)
    assert array.parse("0-2%8").concurrency == 3  # never more than the tasks


def test_the_plan_prices_the_array(tmp_path: Path, run_cli: Callable[..., Any]) -> None:
    result = run_cli(
        "launch", *LOCAL_A10G, "--checkpoint", str(tmp_path / "ckpt"), "--array", "0-9%4",
        "--hours", "2", "--max-total", "30", "--", "python", "train.py",
    )  # fmt: skip
    # No terminal to confirm on: refused after the plan, nothing written.
    assert_refused(result, "confirmation needed")
    plan = " ".join(result.stderr.split())
    price = Decimal(re.search(r"price: \$([0-9.]+)/h", plan).group(1))  # type: ignore[union-attr]
    total = price * 2 * 10
    assert "array 0-9%4: 10 task(s), at most 4 at once" in plan
    assert f"10 task(s) x 2 h x ${price}/h = ${total:.2f}" in plan
    assert f"peak spend: 4 running x ${price}/h = ${price * 4}/h" in plan
    assert "cap: --max-total $30.00 for the whole array" in plan
    assert contract.ENV_ARRAY_TASK_ID in plan
    assert not (tmp_path / "ckpt").exists()


# -- the record --------------------------------------------------------------------------


def test_the_array_record_round_trips_and_a_forged_one_is_refused(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "sweep")
    record = array.ArrayRecord(
        "cg-me-20260101-000000-abc123", store.url, "0-3%2", (0, 1, 2, 3), 2, 1.0e9,
        Decimal("12.5"), stop_at_projection=True,
    )  # fmt: skip
    array.write_record(store, record)
    assert array.read_record(store) == record
    doc = json.loads(store.get(contract.ARRAY_FILE))
    assert [t["prefix"] for t in doc["tasks"]] == [f"{store.url}/task-{i}" for i in range(4)]
    forged = [
        ("tasks", [{"index": 0, "prefix": "/elsewhere/task-0"}], "prefix is not under"),
        ("tasks", [{"index": 1, "prefix": f"{store.url}/task-1"}] * 2, "comes twice"),
        ("concurrency", 9, "concurrency above its task count"),
        ("concurrency", 0, "concurrency"),
        ("tasks", [], "tasks"),
        ("max_total_usd", "NaN", "max_total_usd"),
        ("array_id", "../x", "array_id"),
    ]
    for field, value, message in forged:
        store.put(contract.ARRAY_FILE, json.dumps({**doc, field: value}).encode())
        with pytest.raises(contract.RecordError, match=re.escape(message)):
            array.read_record(store)
    store.put(contract.ARRAY_FILE, b"{" * (contract.ARRAY_BYTES + 1))
    with pytest.raises(contract.RecordError, match="more than"):
        array.read_record(store)


def test_the_record_of_an_array_of_the_most_tasks_reads_back(tmp_path: Path) -> None:
    # 1,000 tasks under a 60-character URL: about 90 KB of record, which the 64 KiB bound
    # of a small record refused ("not a costguard record": jobs status of the array failed).
    url = str(tmp_path / ("sweep-" + "x" * 40))
    spec_ = array.parse(f"0-{contract.MAX_ARRAY_TASKS - 1}%10")
    record = array.ArrayRecord("cg-me-20261206-000000-abc123", url, spec_.text, spec_.indexes,
                               spec_.concurrency, time.time())  # fmt: skip
    store = Store.open(url)
    array.write_record(store, record)
    assert len((tmp_path / url / contract.ARRAY_FILE).read_bytes()) > contract.RECORD_BYTES
    assert array.read_record(store) == record


def test_starts_keep_the_concurrency_and_the_cap() -> None:
    pending = [array.TaskView(i, array.PENDING) for i in range(5)]
    assert array.to_start(pending, 2, None, Decimal(1)).indexes == (0, 1)
    running = [
        array.TaskView(0, array.RUNNING, Decimal(1), Decimal(4)),  # projected at 4
        array.TaskView(1, "succeeded", Decimal(2)),
        *pending[2:],
    ]
    starts = array.to_start(running, 4, Decimal(8), Decimal(1))
    assert starts.indexes == (2, 3)  # 4 + 2 committed, +1 +1 = 8
    assert "task 4 would pass --max-total $8.00" in starts.held
    assert array.to_start(running, 1, None, Decimal(1)).indexes == ()
    assert array.remaining_usd(running, 0, Decimal(8)) == Decimal(6)


# -- sweeps on the simulator ---------------------------------------------------------------


@pytest.mark.slow
def test_sweep_of_four_preempted_tasks_two_at_a_time_matches_uninterrupted_runs(
    tmp_path: Path,
    shared_runs: SharedRuns,
    spot_env: Callable[..., dict[str, str]],
    run_cli: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = spot_env()
    # Notices a random 0.4..6 s (seeded per task) into each spot attempt; 16 steps of 0.5 s
    # after torch's start cannot finish before the first one: every task is preempted.
    steps, step_s = 16, 0.5
    reference = train_reference(shared_runs, steps, env, TIMEOUT_S)
    ckpt, outs = tmp_path / "sweep", tmp_path / "outs"
    outs.mkdir()
    result = launch(
        env, *LOCAL_A10G, "--checkpoint", str(ckpt), "--array", "0-3%2",
        "--preempt-every", "2", "--seed", "11", "--notice-seconds", "120",
        "--every-steps", "4", "--poll-seconds", "0.2", "--yes", "--format", "json",
        "--", *task_command(outs, steps, step_s),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    jobs = task_jobs(ckpt, range(4))
    for index, job in enumerate(jobs):
        assert job["status"] == "succeeded", (index, job["reason"])
        outcomes = [a["outcome"] for a in job["attempts"]]
        assert "preempted" in outcomes, (index, outcomes)
        assert_bitwise_equal(torch.load(outs / f"out-{index}.pt", weights_only=True), reference)
    assert most_at_once(jobs) == 2
    assert "at most 2 task(s) ran at once" in result.stderr
    # Each task's own schedule: not every task preempted at the same moments.
    firsts = {
        round(j["attempts"][0]["ended_unix"] - j["attempts"][0]["launched_unix"]) for j in jobs
    }
    assert len(firsts) > 1, firsts
    status = run_cli("jobs", "status", str(ckpt), "--format", "json")
    assert status.exit_code == 0, status.stderr
    doc = json.loads(status.stdout)
    assert [t["index"] for t in doc["tasks"]] == [0, 1, 2, 3]
    assert {t["status"] for t in doc["tasks"]} == {"succeeded"}
    assert all(t["preemptions"] >= 1 and t["attempts"] >= 2 for t in doc["tasks"])
    assert all(t["step"] == steps for t in doc["tasks"])
    assert doc["counts"] == {"succeeded": 4}
    each = sum(Decimal(t["cost_usd"]) for t in doc["tasks"])  # each rounded to $0.0001
    assert abs(Decimal(doc["spent_usd"]) - each) <= Decimal("0.0001") * 4
    table = run_cli("jobs", "status", str(ckpt))
    assert table.exit_code == 0, table.stderr
    assert "done: 4 of 4 task(s) succeeded: 0, 1, 2, 3" in table.stdout
    # One task's record overwritten by someone else: named, left out; the others shown.
    (ckpt / "task-2" / "job" / "job.json").write_text('{"version": 1, "status": "NaN"}')
    caplog.set_level(logging.WARNING, logger="costguard")
    bad = run_cli("jobs", "status", str(ckpt), "--format", "json")
    assert bad.exit_code == 0, bad.stderr
    assert [t["index"] for t in json.loads(bad.stdout)["tasks"]] == [0, 1, 3]
    assert json.loads(bad.stdout)["unreadable"] == [2]
    assert f"job/job.json in {ckpt}/task-2 is not a costguard record" in caplog.text
    assert "left out" in caplog.text


@pytest.mark.slow
def test_max_total_stops_launching_and_says_what_was_done_and_not(
    tmp_path: Path,
    spot_env: Callable[..., dict[str, str]],
    run_cli: Callable[..., Any],
) -> None:
    env = spot_env()
    ckpt, outs = tmp_path / "sweep", tmp_path / "outs"
    outs.mkdir()
    common = (*LOCAL_A10G, "--checkpoint", str(ckpt), "--array", "0-3%2", "--hours", "0.001",
              "--preempt-every", "600", "--poll-seconds", "0.2")  # fmt: skip
    plan = run_cli("launch", *common, "--max-total", "1", "--", "true")
    price = Decimal(re.search(r"price: \$([0-9.]+)/h", plan.stderr).group(1))  # type: ignore[union-attr]
    # Room for the first two tasks' estimates (3.6 s each), and 9 s of one instance in all:
    # the two running ones reach it in about 4.5 s of their 30 s of steps.
    cap = (price * Decimal("0.0025")).quantize(Decimal("0.000001"))
    poll_s, grace_s = 0.2, 10.0
    result = launch(
        env, *common, "--max-total", str(cap), "--yes", "--",
        *task_command(outs, 60, 0.5),
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-4000:]
    jobs = task_jobs(ckpt, range(4))
    assert [j["status"] for j in jobs] == ["stopped"] * 4
    assert [len(j["attempts"]) for j in jobs[2:]] == [0, 0]  # never started
    assert all("--max-total" in j["reason"] for j in jobs[:2]), [j["reason"] for j in jobs]
    reasons = [j["reason"] for j in jobs]
    assert all(r.startswith("not started: ") for r in reasons[2:]), reasons
    spent = sum(
        (Decimal(a["offer"]["usd_per_hour"]) * Decimal(a["ended_unix"] - a["launched_unix"])) / 3600
        for j in jobs
        for a in j["attempts"]
    )
    # Past the cap by no more than a poll and a terminate's grace of the two running tasks
    # (without the cap they would run 30 s and more each).
    assert spent <= cap + 2 * price * Decimal(poll_s + grace_s) / 3600, (spent, cap)
    out = " ".join(result.stdout.split())
    assert "done: 0 of 4 task(s) succeeded" in out
    assert "not done: 2 task(s) stopped: 0, 1" in out
    assert "not done: 2 task(s) not started: 2, 3" in out
    status = run_cli("jobs", "status", str(ckpt), "--format", "json")
    doc = json.loads(status.stdout)
    assert [t["status"] for t in doc["tasks"]] == [
        "stopped",
        "stopped",
        "not started",
        "not started",
    ]


@pytest.mark.slow
def test_ctrl_c_detaches_attach_takes_the_array_over_and_jobs_stop_stops_it(
    tmp_path: Path,
    spot_env: Callable[..., dict[str, str]],
    run_cli: Callable[..., Any],
) -> None:
    env = spot_env()
    ckpt, outs = tmp_path / "sweep", tmp_path / "outs"
    outs.mkdir()
    task0 = ckpt / "task-0" / "job" / "job.json"

    def running_attempt() -> bool:
        job = json.loads(task0.read_text()) if task0.exists() else {"attempts": []}
        return any(a.get("handle") for a in job["attempts"])

    def supervise(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "costguard", "launch", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # A foreground process: Ctrl-C's SIGINT is not ignored (tests/spot/test_launch_local)
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )

    first = supervise(
        *LOCAL_A10G, "--checkpoint", str(ckpt), "--array", "0-2%1", "--preempt-every", "600",
        "--every-steps", "5", "--poll-seconds", "0.2", "--yes", "--",
        *task_command(outs, 400, 0.25),
    )  # fmt: skip
    try:
        wait_for(running_attempt, "a running attempt", timeout_s=120)
        first.send_signal(signal.SIGINT)
        _, stderr = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 130, stderr[-3000:]
    assert f"costguard launch --attach {ckpt}" in " ".join(stderr.split())
    status = run_cli("jobs", "status", str(ckpt), "--format", "json")
    doc = json.loads(status.stdout)
    assert [t["status"] for t in doc["tasks"]] == ["running", "pending", "pending"]
    second = supervise("--attach", str(ckpt), "--poll-seconds", "0.2", "--format", "json", "--yes")
    try:
        wait_for(
            lambda: "attached to array" in (second.stderr.readline() if second.stderr else ""),
            "the attached controller's line",
            timeout_s=120,
        )
        # The same user (the same key) as the controller's: a child with its environment.
        stop = subprocess.run(
            [sys.executable, "-m", "costguard", "jobs", "stop", str(ckpt), "--yes"],
            env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
        )  # fmt: skip
        assert stop.returncode == 0, stop.stderr
        stdout, stderr = second.communicate(timeout=120)
    finally:
        if second.poll() is None:
            second.kill()
            second.communicate(timeout=60)
    assert second.returncode == 1, stderr[-3000:]
    doc = json.loads(stdout)
    assert [t["status"] for t in doc["tasks"]] == ["stopped", "not started", "not started"]
    job = json.loads(task0.read_text())
    # The task the first controller started, adopted (no second attempt), saved and stopped.
    assert [a["exit_code"] for a in job["attempts"]] == [75], job["attempts"]
    assert "costguard jobs stop" in job["reason"]
    assert not (ckpt / "job" / "stop.json").exists()  # acted upon


def test_stop_at_projection_saves_and_stops_every_running_task(
    tmp_path: Path, spot_env: Callable[..., dict[str, str]]
) -> None:
    """Two of three tasks run (%2), each with a recorded pace 139 h from its end: the
    array's projection passes --max-total at once, so both are asked to save and stop
    (their scripts exit 75 on the notice) and the third never starts."""
    url = str(tmp_path / "sweep")
    record = array.ArrayRecord(
        "cg-test-1", url, "0-2%2", (0, 1, 2), 2, time.time(), Decimal(5), stop_at_projection=True
    )
    template = spec(url, command=ON_NOTICE_75, spot=False, simulation=None, total_steps=10**6)
    tasks = []
    for index, task_spec in zip(record.indexes, task_specs(template, record), strict=True):
        store = Store.open(task_spec.checkpoint_url)
        write_pace(store, Pace(100, 50.0, 120, time.time(), time.time() - 60))
        tasks.append(Task(index, store, save_job(store, Job(task_spec))))
    launchers: list[LocalLauncher] = []

    def make_launcher(_: object) -> LocalLauncher:
        launchers.append(
            LocalLauncher(Simulation(), job_started_unix=time.time(),
                          state_dir=tmp_path / "state", env=spot_env())
        )  # fmt: skip
        return launchers[-1]

    events: list[Event] = []
    sweep = Sweep(record, Store.open(url), tasks, [ON_DEMAND], make_launcher,
                  task_estimate_usd=Decimal("0.01"), poll_s=0.1,
                  on_event=events.append)  # fmt: skip
    jobs = sweep.run()
    assert [j.status for j in jobs] == ["stopped"] * 3
    assert [[a.exit_code for a in j.attempts] for j in jobs] == [[75], [75], []]
    assert all(j.reason.startswith("stopped at the projection: ") for j in jobs[:2])
    assert jobs[2].reason.startswith("not started: stopped at the projection")
    assert sum(1 for e in events if e.kind == "projection") == 1
    assert sweep.peak_running == 2
    assert len(launchers) == 2  # the third task never had one


def test_the_rollup_projects_each_running_task_and_counts_by_status(tmp_path: Path) -> None:
    url = str(tmp_path / "sweep")
    record = array.ArrayRecord("cg-test-1", url, "0-1", (0, 1), 2, time.time())
    template = spec(url, spot=False, simulation=None, total_steps=1000)
    running, pending = task_specs(template, record)
    now = time.time()
    store = Store.open(running.checkpoint_url)
    # 100 steps done in 50 s, 900 to go: 450 s more at $1.006/h.
    write_pace(store, Pace(100, 50.0, 100, now, now - 60))
    job = Job(running, attempts=(Attempt(1, ON_DEMAND, now - 60),))
    task_rows = rows(url, [(0, job), (1, Job(pending))], now)
    assert [r.status for r in task_rows] == ["running", "pending"]
    assert task_rows[0].left_s == pytest.approx(450, rel=0.2)
    assert task_rows[0].projected_usd is not None
    assert task_rows[0].projected_usd > task_rows[0].spent_usd > 0
    assert (task_rows[1].projected_usd, task_rows[1].left_s) == (None, None)
    doc = rollup_document(record, task_rows)
    assert doc["counts"] == {"running": 1, "pending": 1}
    assert [t["index"] for t in doc["tasks"]] == [0, 1]
    assert doc["tasks"][0]["left_s"] == task_rows[0].left_s


def test_attach_runs_no_task_spec_this_user_did_not_launch(
    tmp_path: Path, spot_env: Callable[..., dict[str, str]]
) -> None:
    # Issue 43 for arrays: whoever can write the bucket rewrites task 1's job.json (a
    # command of theirs, no signature by this user's key); attach shows it and refuses it.
    url = tmp_path / "sweep"
    record = array.ArrayRecord("cg-test-1", str(url), "0-1", (0, 1), 1, time.time())
    template = spec(str(url), simulation=Simulation(seed=1))
    pwned = tmp_path / "pwned"
    for task_spec in task_specs(template, record):
        if task_spec.checkpoint_url.endswith("task-1"):
            task_spec = replace(task_spec, command=("sh", "-c", f"touch {pwned}"))
        save_job(Store.open(task_spec.checkpoint_url), Job(task_spec))
    array.write_record(Store.open(str(url)), record)
    result = subprocess.run(
        [sys.executable, "-m", "costguard", "launch", "--attach", str(url), "--yes"],
        env=spot_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 2, result.stderr
    error = " ".join(result.stderr.split())
    assert "task(s) 0, 1 hold a spec you did not launch" in error, result.stderr
    assert f"task 1's command: `sh -c 'touch {pwned}'`" in error, result.stderr
    assert "Traceback" not in result.stderr
    assert not pwned.exists()


def test_attach_refuses_an_array_whose_task_is_a_gang(
    tmp_path: Path, run_cli: Callable[..., Any]
) -> None:
    """Launch refuses --nodes with --array (each task is one instance); a task's job.json
    that says a gang (signed: an older or hand-made spec) is refused the same way on
    attach, before any task starts."""
    url = tmp_path / "sweep"
    record = array.ArrayRecord("cg-test-1", str(url), "0-1", (0, 1), 1, time.time())
    template = spec(str(url), command=("train.py",), sync_dir=None,
                    simulation=Simulation(state_dir=str(tmp_path / "state")))  # fmt: skip
    for task_spec in task_specs(template, record):
        if task_spec.checkpoint_url.endswith("task-1"):
            task_spec = replace(task_spec, nodes=2)
        save_job(Store.open(task_spec.checkpoint_url), Job(signed(task_spec)))
    array.write_record(Store.open(str(url)), record)
    result = run_cli("launch", "--attach", str(url), "--yes", "--force")
    assert result.exit_code == 2, result.stderr
    said = " ".join(result.stderr.split())
    assert "--nodes and --array do not go together" in said, said
    assert not (tmp_path / "state").exists()  # no task was started


def test_the_notebook_gives_an_arrays_tasks_as_a_dataframe(
    tmp_path: Path, run_cli: Callable[..., Any]
) -> None:
    """`costguard.job_status(url)` of an array: one row per task with the roll-up's
    figures (what `jobs status --format json` lists), money a float column pandas sums,
    or the exact Decimals; the array's figures in attrs."""
    import costguard

    url = str(tmp_path / "sweep")
    record = array.ArrayRecord("cg-test-1", url, "0-2", (0, 1, 2), 3, time.time())
    template = spec(url, spot=False, simulation=None, total_steps=1000)
    done, running, pending = task_specs(template, record)
    now = time.time()
    store = Store.open(running.checkpoint_url)
    write_pace(store, Pace(100, 50.0, 100, now, now - 60))
    ended = replace(Attempt(1, ON_DEMAND, now - 7200), ended_unix=now - 3600)
    save_job(Store.open(done.checkpoint_url), Job(done, (ended,), status="succeeded"))
    save_job(store, Job(running, attempts=(Attempt(1, ON_DEMAND, now - 60),)))
    save_job(Store.open(pending.checkpoint_url), Job(pending))
    array.write_record(Store.open(url), record)

    frame = costguard.job_status(url)
    cli = run_cli("jobs", "status", url, "--format", "json").json()
    assert frame["index"].tolist() == [t["index"] for t in cli["tasks"]] == [0, 1, 2]
    assert frame["status"].tolist() == [t["status"] for t in cli["tasks"]]
    assert frame["status"].tolist() == ["succeeded", "running", "pending"]
    assert str(frame["cost_usd"].dtype) == "float64"
    assert frame["cost_usd"].sum() == pytest.approx(float(Decimal(cli["spent_usd"])), abs=0.01)
    assert frame["cost_usd"][0] == pytest.approx(1.006, abs=0.001)  # an hour on demand
    assert frame["projected_usd"][1] > frame["cost_usd"][1] > 0
    exact = costguard.job_status(url, exact=True)
    assert isinstance(exact["cost_usd"][0], Decimal)
    assert frame.attrs["array_id"] == "cg-test-1"
    assert frame.attrs["counts"] == {"succeeded": 1, "running": 1, "pending": 1}
    # A single job's URL still gives its dict.
    assert costguard.job_status(running.checkpoint_url)["job_id"] == running.job_id


def test_max_failures_retries_a_failing_task_and_fails_it_alone(
    tmp_path: Path, spot_env: Callable[..., dict[str, str]]
) -> None:
    """`--max-failures 1` on a local array of three: task 1's command fails every time,
    so it runs twice (one retry) and is marked failed, while tasks 0 and 2 succeed at
    their first attempt; the launch exits 1 and says so."""
    ckpt = tmp_path / "sweep"
    result = launch(
        spot_env(), *LOCAL_A10G, "--checkpoint", str(ckpt), "--array", "0-2%2",
        "--max-failures", "1", "--preempt-every", "600", "--poll-seconds", "0.2", "--yes",
        "--", "sh", "-c", 'test "$COSTGUARD_ARRAY_TASK_ID" != 1',
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-4000:]
    jobs = task_jobs(ckpt, range(3))
    assert [j["status"] for j in jobs] == ["succeeded", "failed", "succeeded"]
    assert [[a["outcome"] for a in j["attempts"]] for j in jobs] == [
        ["succeeded"], ["failed", "failed"], ["succeeded"],
    ]  # fmt: skip
    out = " ".join(result.stdout.split())
    assert "done: 2 of 3 task(s) succeeded: 0, 2" in out
    assert "not done: 1 task(s) failed: 1" in out
