"""The controller with real local processes: strays are terminated and a handle-less attempt
is adopted (no duplicate), --max-total stops a running attempt, a failing script fails the
job with its exit code."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest

from costguard.checkpoint.store import Store
from costguard.spot.controller import Controller, Event, summarise
from costguard.spot.job import Job, Simulation, load_job, save_job
from costguard.spot.launcher.local import LocalLauncher, pid_alive
from costguard.spot.recovery import Attempt, Outcome
from tests.spot.test_offers_and_job import spec
from tests.spot.test_simulator import ON_DEMAND, SPOT, STUBBORN


@pytest.fixture
def launcher(tmp_path: Path, spot_env: Callable[..., dict[str, str]]) -> Iterator[LocalLauncher]:
    local = LocalLauncher(
        Simulation(notice_s=2.0),
        job_started_unix=time.time(),
        state_dir=tmp_path / "state",
        env=spot_env(),
    )
    try:
        yield local
    finally:
        for handle in local.find("cg-test-1"):
            local.terminate(handle)
        local.close()


def test_adopt_keeps_the_attempt_and_terminates_strays(
    tmp_path: Path, launcher: LocalLauncher
) -> None:
    store = Store.open(tmp_path / "ckpt")
    job_spec = spec(store.url, command=STUBBORN, simulation=Simulation())
    ours = launcher.launch(ON_DEMAND, job_spec.launch_spec(), attempt=1)
    stray = launcher.launch(ON_DEMAND, job_spec.launch_spec(), attempt=7)
    # The controller died after launching attempt 1 and before writing its handle.
    job = save_job(store, Job(job_spec, attempts=(Attempt(1, ON_DEMAND, time.time()),)))
    events: list[Event] = []
    adopted = Controller(store, launcher, [ON_DEMAND], on_event=events.append).adopt(job)
    current = adopted.current
    assert current is not None
    assert current.handle is not None
    assert current.handle.instance_id == ours.instance_id
    assert adopted.strays_terminated == (stray.instance_id,)
    assert not pid_alive(int(stray.extra["pid"]))
    assert pid_alive(int(ours.extra["pid"]))
    assert [h.instance_id for h in launcher.find("cg-test-1")] == [ours.instance_id]
    assert load_job(store) == adopted
    assert [e.kind for e in events] == ["adopt", "stray"]


def test_max_total_terminates_a_running_attempt(tmp_path: Path, launcher: LocalLauncher) -> None:
    store = Store.open(tmp_path / "ckpt")
    job_spec = spec(
        store.url, command=STUBBORN, spot=False, max_total_usd=Decimal("1.5"), simulation=None
    )
    job = save_job(store, Job(job_spec))
    skew = {"s": 0.0}

    def sleep(seconds: float) -> None:
        skew["s"] += 1800.0  # half an hour passes on the bill at each poll
        time.sleep(seconds)

    # 1.006 $/h: the first hour fits in $1.50; 1.5 hours later the money is spent.
    controller = Controller(
        store,
        launcher,
        [ON_DEMAND, SPOT],
        poll_s=0.1,
        clock=lambda: time.time() + skew["s"],
        sleep=sleep,
    )
    final = controller.run(job)
    assert (final.status, final.attempts[0].outcome) == ("stopped", Outcome.STOPPED)
    assert "max-total" in final.reason
    handle = final.attempts[0].handle
    assert handle is not None
    assert not pid_alive(int(handle.extra["pid"]))
    assert summarise(final, [ON_DEMAND], time.time() + skew["s"]).spent_usd >= Decimal("1.5")
    assert len(final.attempts) == 1


def test_a_failing_script_fails_the_job_with_its_exit_code(
    tmp_path: Path, launcher: LocalLauncher
) -> None:
    store = Store.open(tmp_path / "ckpt")
    job_spec = spec(
        store.url,
        command=(sys.executable, "-c", "raise SystemExit(3)"),
        max_failures=1,
        simulation=Simulation(),
    )
    final = Controller(store, launcher, [SPOT, ON_DEMAND], poll_s=0.1).run(
        save_job(store, Job(job_spec))
    )
    assert final.status == "failed"
    assert [(a.outcome, a.exit_code) for a in final.attempts] == [(Outcome.FAILED, 3)] * 2
    assert "exited with code 3" in final.reason
    assert replace(load_job(store), heartbeat_unix=0.0) == replace(final, heartbeat_unix=0.0)
