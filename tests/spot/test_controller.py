"""The controller with real local processes: strays are terminated and a handle-less attempt
is adopted (no duplicate), --max-total stops a running attempt, a failing script fails the
job with its exit code."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest

from costguard.checkpoint.store import Store
from costguard.errors import CostguardError
from costguard.spot.controller import Controller, Event, summarise
from costguard.spot.job import Job, Simulation, exit_record_path, load_job, save_job
from costguard.spot.launcher.local import LocalLauncher, pid_alive
from costguard.spot.recovery import Attempt, AttemptOutcome, Launch
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
    assert (final.status, final.attempts[0].outcome) == ("stopped", AttemptOutcome.STOPPED)
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
    assert [(a.outcome, a.exit_code) for a in final.attempts] == [(AttemptOutcome.FAILED, 3)] * 2
    assert "exited with code 3" in final.reason
    assert replace(load_job(store), heartbeat_unix=0.0) == replace(final, heartbeat_unix=0.0)


def test_the_chosen_region_is_split_into_zones_once(
    tmp_path: Path, launcher: LocalLauncher
) -> None:
    """Offers come per region; the controller asks the launcher for the zones of the region
    a launch is headed to (only that one), and every zone keeps the region's price."""
    west = replace(SPOT, region="gcp:us-west1", usd_per_hour=Decimal("0.9"))
    events: list[Event] = []
    asked: list[tuple[str, str]] = []
    zones = launcher.zones

    def counting(region: str, instance_type: str = "") -> Sequence[str]:
        asked.append((region, instance_type))
        return zones(region, instance_type)

    launcher.zones = counting  # type: ignore[method-assign]
    controller = Controller(Store.open(tmp_path / "ckpt"), launcher, [SPOT, west, ON_DEMAND],
                            on_event=events.append)  # fmt: skip
    job = Job(spec(controller.store.url))
    limits = job.spec.limits()
    first = controller.decide(job, limits)
    assert isinstance(first, Launch)
    assert first.offer == replace(SPOT, zone="us-east-1a")
    assert asked == [("aws:us-east-1", "g5.xlarge")]
    # The on-demand offer of us-east-1 is split too; us-west1 is not asked about.
    assert {o.place for o in controller.offers} == {
        "local/aws:us-east-1/us-east-1a",
        "local/aws:us-east-1/us-east-1b",
        "local/aws:us-east-1/us-east-1c",
        "local/gcp:us-west1",
    }
    assert {o.usd_per_hour for o in controller.offers if o.region == "aws:us-east-1"} == {
        SPOT.usd_per_hour,
        ON_DEMAND.usd_per_hour,
    }
    (note,) = [e.message for e in events if e.kind == "zones"]
    assert "priced at the region's $0.4/h (the price tables are per region)" in note
    # After a preemption in zone a: zone b, asking nothing more.
    now = time.time()
    hit = Attempt(1, first.offer, now - 60, ended_unix=now, outcome=AttemptOutcome.PREEMPTED)
    second = controller.decide(replace(job, attempts=(hit,)), limits)
    assert isinstance(second, Launch)
    assert second.offer.place == "local/aws:us-east-1/us-east-1b"
    assert len(asked) == 1


def test_zones_that_cannot_be_listed_leave_the_offer_regional(
    tmp_path: Path, launcher: LocalLauncher
) -> None:
    def refused(region: str, instance_type: str = "") -> Sequence[str]:
        msg = "UnauthorizedOperation: ec2:DescribeAvailabilityZones"
        raise CostguardError(msg)

    launcher.zones = refused  # type: ignore[method-assign]
    events: list[Event] = []
    controller = Controller(Store.open(tmp_path / "ckpt"), launcher, [SPOT, ON_DEMAND],
                            on_event=events.append)  # fmt: skip
    job = Job(spec(controller.store.url))
    decision = controller.decide(job, job.spec.limits())
    assert isinstance(decision, Launch)
    assert decision.offer == SPOT  # no zone: the provider places it
    (note,) = [e.message for e in events if e.kind == "zones"]
    assert "zones of aws:us-east-1 unknown (UnauthorizedOperation" in note
    assert controller.decide(job, job.spec.limits()) == decision  # asked once
    assert len(events) == 1


@pytest.mark.parametrize(
    "record",
    [
        b"[]",
        b"{}",
        b"null",
        b'"x"',
        b'{"attempt": 1, "exit_code": "x", "finished_unix": 1.0}',
        b'{"attempt": 1, "exit_code": 1e400, "finished_unix": 1.0}',
        b'{"attempt": 1, "exit_code": true, "finished_unix": 1.0}',
        b'{"attempt": 1, "exit_code": 0, "finished_unix": NaN}',
        b'{"attempt": 1, "exit_code": 0, "finished_unix": 1.0, "last_step": [1]}',
        b'{"attempt": 1, "exit_code": 0, "finished_unix": 1.0, "job_id": {"a": 1}}',
        b'{"attempt": 1, "exit_code": 0, "finished_unix": "1"}',
        b"[" * 100_000,
        b"\xff\xfe",
    ],
)
def test_a_malformed_exit_record_does_not_raise_out_of_reconcile(
    tmp_path: Path, launcher: LocalLauncher, record: bytes
) -> None:
    """Anyone who can write the store can write ``job/attempt-N.exit.json`` (issue 28):
    a record that is not what ``costguard run`` writes counts as no record."""
    store = Store.open(tmp_path / "ckpt")
    job_spec = spec(store.url, command=STUBBORN, simulation=Simulation())
    job = save_job(store, Job(job_spec, attempts=(Attempt(1, ON_DEMAND, time.time()),)))
    store.put(exit_record_path(1), record)
    reconciled = Controller(store, launcher, [ON_DEMAND]).reconcile(job)
    closed = reconciled.attempts[0]
    assert closed.outcome is not None  # closed: the launch was never confirmed
    assert closed.exit_code is None
