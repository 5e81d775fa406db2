"""A running job's finish time and projected total (``jobs status``), and the controller
acting on the projection (``launch --max-total`` warns; ``--stop-at-projection`` has the
script save and stop). The pace is written with the library's own writer, as the script's
Checkpointer writes it; the controller runs real local processes."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from costguard.checkpoint.pace import Pace, write_pace
from costguard.checkpoint.store import Store
from costguard.proof import job_key, stop_check, stop_request, user_key
from costguard.spot.controller import Controller, Event
from costguard.spot.job import STOP_FILE, Job, load_job, save_job
from costguard.spot.launcher.local import LocalLauncher
from costguard.spot.projection import of_job, project
from costguard.spot.recovery import Attempt, spent_usd
from tests.helpers.waiting import wait_for
from tests.spot import test_controller
from tests.spot.test_offers_and_job import spec
from tests.spot.test_simulator import ON_DEMAND

#: Local attempts, terminated after the test: the controller tests' fixture.
launcher = test_controller.launcher

#: A script that stops as a Checkpointer does on a notice: it exits 75 once one arrives
#: on the pipe of costguard run (it saves nothing: the controller's part is tested here).
ON_NOTICE_75 = (
    sys.executable,
    "-c",
    "import os, sys\n"
    "line = os.fdopen(int(os.environ['COSTGUARD_NOTICE_FD'])).readline()\n"
    "sys.exit(75 if 'costguard' in line else 1)",
)


def test_projection_extrapolates_within_the_running_attempt_only() -> None:
    pace = Pace(200, 100.0, 1000, updated_unix=5000.0, started_unix=4000.0, total_steps=3000,
                saves=4, overhead_s=10.0)  # fmt: skip
    running = project(pace, spent_usd=Decimal(2), usd_per_hour=Decimal(3), now_unix=5110.0,
                      running_since_unix=4500.0)  # fmt: skip
    assert running is not None
    # 0.5 s/step, the time inside step() 10% more: 110 s since the record are 200 steps.
    assert running.extrapolated_steps == 200
    assert running.steps_done == 1200
    assert running.left_s == pytest.approx(1800 * 0.55)
    assert running.projected_total_usd == Decimal("2.8250")
    idle = project(pace, spent_usd=Decimal(2), usd_per_hour=None, now_unix=5110.0,
                   running_since_unix=None)  # fmt: skip
    assert idle is not None
    assert (idle.steps_done, idle.projected_total_usd) == (1000, None)
    stale = project(pace, spent_usd=Decimal(2), usd_per_hour=Decimal(3), now_unix=5110.0,
                    running_since_unix=5100.0)  # fmt: skip
    assert stale is not None
    assert stale.extrapolated_steps == 0
    # Evaluations are part of the wall-clock rate; the wind-down comes once, at the end.
    evaluating = Pace(200, 100.0, 1000, 5000.0, 4000.0, total_steps=3000, outlier_steps=10,
                      outlier_s=10.0)  # fmt: skip
    ending = project(evaluating, spent_usd=Decimal(0), usd_per_hour=Decimal(1),
                     now_unix=5000.0, running_since_unix=4500.0, wind_down_s=30.0)  # fmt: skip
    assert ending is not None
    assert ending.left_s == pytest.approx(2000 * 110 / 210 + 30)
    assert ending.seconds_per_step == 0.5  # the pace shown is training's alone
    done = Pace(200, 100.0, 3000, 5000.0, 4000.0, total_steps=3000)
    finished = project(done, spent_usd=Decimal(7), usd_per_hour=Decimal(1), now_unix=5000.0,
                       running_since_unix=4500.0, wind_down_s=30.0)  # fmt: skip
    assert finished is not None
    assert (finished.left_s, finished.projected_total_usd) == (0.0, Decimal("7.0000"))
    no_total = Pace(200, 100.0, 1000, 5000.0, 4000.0)
    assert (
        project(
            no_total,
            spent_usd=Decimal(0),
            usd_per_hour=Decimal(1),
            now_unix=1.0,
            running_since_unix=None,
        )
        is None
    )


def running_job(tmp_path: Path, *, launched_ago_s: float, **changes: object) -> tuple[Job, Store]:
    store = Store.open(tmp_path / "ckpt")
    now = time.time()
    job_spec = spec(store.url, spot=False, simulation=None, created_unix=now - launched_ago_s - 5,
                    **changes)  # fmt: skip
    job = Job(job_spec, attempts=(Attempt(1, ON_DEMAND, launched_unix=now - launched_ago_s),))
    return save_job(store, job), store


def test_jobs_status_shows_elapsed_spend_finish_and_projected_total(
    run_cli, tmp_path: Path
) -> None:
    _job, store = running_job(tmp_path, launched_ago_s=600, max_total_usd=Decimal("0.30"))
    # Its Checkpointer started 10 s after the launch: a 10 s wind-down is projected.
    write_pace(store, Pace(400, 200.0, 500, time.time(), time.time() - 590, total_steps=2000))
    result = run_cli("jobs", "status", store.url, "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    projection = doc["projection"]
    assert projection["total_steps"] == 2000
    assert 500 <= projection["steps_done"] <= 510  # the record is fresh: a step or so since
    assert projection["seconds_per_step"] == 0.5
    assert projection["left_s"] == pytest.approx(
        (2000 - projection["steps_done"]) * 0.5 + 10, abs=0.2
    )
    spent = Decimal(projection["spent_usd"])
    assert Decimal("0.1676") <= spent <= Decimal("0.1700")  # 600 s at $1.006/h
    rest = Decimal("1.006") * Decimal(str(projection["left_s"])) / 3600
    assert abs(Decimal(projection["projected_total_usd"]) - spent - rest) < Decimal("0.001")
    assert doc["elapsed_s"] >= 605
    table = run_cli("jobs", "status", store.url)
    assert table.exit_code == 0, table.stderr
    text = " ".join(table.stdout.split())
    assert "step 50" in text
    assert "of 2000 (25%) at 0.5 s/step measured; finish in" in text
    assert "projected total: $0.3" in text
    assert "over --max-total $0.30" in text


def test_the_notebook_api_gives_the_same_projection(run_cli, tmp_path: Path) -> None:
    import costguard

    _job, store = running_job(tmp_path, launched_ago_s=600)
    write_pace(store, Pace(400, 200.0, 500, time.time(), time.time() - 590, total_steps=2000))
    status = costguard.job_status(store.url)
    cli = run_cli("jobs", "status", store.url, "--format", "json").json()
    assert status["projection"]["total_steps"] == cli["projection"]["total_steps"] == 2000
    assert isinstance(status["projection"]["projected_total_usd"], Decimal)
    assert abs(
        status["projection"]["projected_total_usd"]
        - Decimal(cli["projection"]["projected_total_usd"])
    ) < Decimal("0.001")


def test_jobs_status_without_a_pace_has_no_projection(run_cli, tmp_path: Path) -> None:
    _job, store = running_job(tmp_path, launched_ago_s=60)
    doc = run_cli("jobs", "status", store.url, "--format", "json").json()
    assert doc["projection"] is None


def test_max_total_warns_once_when_the_projection_passes_it(
    tmp_path: Path, launcher: LocalLauncher
) -> None:
    job, store = running_job(tmp_path, launched_ago_s=60, max_total_usd=Decimal(5),
                             total_steps=10**6)  # fmt: skip
    events: list[Event] = []
    controller = Controller(store, launcher, [ON_DEMAND], on_event=events.append)
    assert controller.watch_projection(job) == job  # no pace yet: nothing to say
    write_pace(store, Pace(100, 50.0, 120, time.time(), time.time() - 60))
    for _ in range(3):
        assert controller.watch_projection(job) == job
    assert [e.kind for e in events] == ["projection"]
    assert "passes --max-total $5" in events[0].message
    assert "--stop-at-projection" in events[0].message
    assert STOP_FILE not in store.listing()


def test_stop_at_projection_has_the_script_stop_and_ends_the_job(
    tmp_path: Path, launcher: LocalLauncher
) -> None:
    store = Store.open(tmp_path / "ckpt")
    job_spec = spec(
        store.url, command=ON_NOTICE_75, spot=False, simulation=None, max_total_usd=Decimal(5),
        total_steps=10**6, stop_at_projection=True,
    )  # fmt: skip
    write_pace(store, Pace(100, 50.0, 120, time.time(), time.time() - 60))  # 139 h left
    events: list[Event] = []
    final = Controller(store, launcher, [ON_DEMAND], poll_s=0.1, on_event=events.append).run(
        save_job(store, Job(job_spec))
    )
    assert final.status == "stopped"
    assert final.reason.startswith("stopped at the projection: projected total $")
    assert [(a.number, a.exit_code) for a in final.attempts] == [(1, 75)]  # it saved, then exited
    assert STOP_FILE not in store.listing()  # acted upon: cleared
    assert spent_usd(final.attempts, time.time()) < Decimal("0.05")  # far from the $5 cap
    assert load_job(store).stop_requested == final.reason
    assert "projection" in [e.kind for e in events]
    assert of_job(final, None, time.time()) is None


def test_jobs_stop_has_the_script_save_and_the_job_end_stopped(
    tmp_path: Path, launcher: LocalLauncher, run_cli: Callable[..., Any]
) -> None:
    """`costguard jobs stop URL`: a request signed with this user's key, for the running
    attempt; the script exits 75 and the controller ends the job stopped, no relaunch."""
    store = Store.open(tmp_path / "ckpt")
    job_spec = spec(store.url, command=ON_NOTICE_75, spot=False, simulation=None)
    ended: list[Job] = []
    events: list[Event] = []
    polls: list[float] = []  # each of the controller's waits between two polls

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        time.sleep(seconds)

    controller = Controller(
        store, launcher, [ON_DEMAND], poll_s=0.1, on_event=events.append, sleep=sleep
    )
    job = save_job(store, Job(job_spec))
    thread = threading.Thread(target=lambda: ended.append(controller.run(job)))
    thread.start()
    try:

        def launched() -> bool:
            current = load_job(store).current
            return current is not None and current.handle is not None

        wait_for(launched, "the attempt launched", poll_s=0.1)
        # A forged request first: named once, and the attempt goes on.
        forged = {"job_id": "cg-test-1", "attempt": 1, "reason": "x", "requested_unix": 1.0,
                  "proof": "0" * 64}  # fmt: skip
        store.put(STOP_FILE, json.dumps(forged).encode())
        wait_for(lambda: any(e.kind == "warning" for e in events), "the forged request named")
        seen = len(polls)  # three more polls of the forged request: still one warning
        wait_for(lambda: len(polls) >= seen + 3, "three more polls of the forged request")
        result = run_cli("jobs", "stop", store.url)
        assert result.exit_code == 0, result.stderr
        assert "asked attempt 1" in result.stderr
    finally:
        thread.join(timeout=120)
    (final,) = ended
    warnings = [e.message for e in events if e.kind == "warning"]
    assert len(warnings) == 1
    assert "not signed with this job's key" in warnings[0]
    assert final.status == "stopped"
    assert final.reason == "stopped by costguard jobs stop"
    assert [(a.number, a.exit_code) for a in final.attempts] == [(1, 75)]  # saved, not relaunched
    assert STOP_FILE not in store.listing()  # acted upon: cleared
    refused = run_cli("jobs", "stop", store.url)
    assert refused.exit_code == 2
    assert "no running attempt" in refused.stderr


def test_a_stop_request_for_another_job_or_attempt_is_not_ours(tmp_path: Path) -> None:
    from costguard.spot.job import request_stop

    store = Store.open(tmp_path / "ckpt")
    request_stop(store, "cg-other-1", 2, "why", 1.0)
    key = user_key()
    assert key is not None
    assert (
        stop_request(store, "cg-test-1", 2, stop_check(job_key(key, "cg-test-1"), "cg-test-1", 2))
        is None
    )
    assert (
        stop_request(
            store, "cg-other-1", 3, stop_check(job_key(key, "cg-other-1"), "cg-other-1", 3)
        )
        is None
    )
    assert (
        stop_request(
            store, "cg-other-1", 2, stop_check(job_key(key, "cg-other-1"), "cg-other-1", 2)
        )
        == "why"
    )
    store.put(STOP_FILE, b"not json")
    assert (
        stop_request(
            store, "cg-other-1", 2, stop_check(job_key(key, "cg-other-1"), "cg-other-1", 2)
        )
        is None
    )


@pytest.mark.parametrize("stop", [False, True])
def test_launch_shows_the_projection_of_a_recorded_pace_and_warns(
    run_cli, tmp_path: Path, spot_env, monkeypatch: pytest.MonkeyPatch, stop: bool
) -> None:
    for name, value in spot_env().items():
        monkeypatch.setenv(name, value)
    url = str(tmp_path / "ckpt")
    # A pilot's pace: 0.5 s a step (and 0.1 s of saves), measured on an A10G.
    write_pace(Store.open(url), Pace(190, 95.0, 200, time.time(), time.time(), overhead_s=19.0,
                                     device="NVIDIA A10G", pilot=True))  # fmt: skip
    result = run_cli(
        "launch", "--provider", "local", "--gpu", "a10g", "--on-demand", "--checkpoint", url,
        "--total-steps", "36000", "--max-total", "3", *(["--stop-at-projection"] if stop else []),
        "--", sys.executable, "-c", "pass",
    )  # fmt: skip
    assert result.exit_code == 2  # no terminal to confirm on: nothing launched
    said = " ".join(result.stderr.split())
    # 36000 x 0.6 s = 6 h at $1.006/h
    assert "projection: 36000 steps x 0.6 s/step (measured on NVIDIA A10G, a pilot) = 6 h" in said
    assert "$6.04 if nothing is preempted" in said
    assert "Warning: the projection passes --max-total $3.00" in said
    then = "--stop-at-projection saves and stops" if stop else "stops when the money is spent"
    assert then in said
