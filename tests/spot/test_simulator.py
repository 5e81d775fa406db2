"""The preemption simulator: its IMDSv2 read by costguard's own AWS watcher, and the local
launcher's real processes (notice, SIGKILL at the deadline, find after a restart)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from costguard.checkpoint.notices import fetch
from costguard.checkpoint.notices.aws import AwsMetadata
from costguard.checkpoint.notices.azure import AzureScheduledEvents
from costguard.checkpoint.notices.gcp import GcpMetadata
from costguard.spot.job import Simulation
from costguard.spot.launcher.base import LaunchSpec, Market, Offer, State
from costguard.spot.launcher.local import LocalLauncher, pid_alive
from costguard.spot.simulator import MetadataEmulator, notice_time
from tests.helpers.waiting import wait_for

SPOT = Offer("local", "aws:us-east-1", "g5.xlarge", Market.SPOT, Decimal("0.4"), "A10G", 1)
ON_DEMAND = Offer(
    "local", "aws:us-east-1", "g5.xlarge", Market.ON_DEMAND, Decimal("1.006"), "A10G", 1
)
#: A script that ignores notices (it never reads the relay pipe) and outlives any test.
STUBBORN = (sys.executable, "-c", "import time\nfor _ in range(1200): time.sleep(0.1)")


@pytest.fixture
def emulator() -> Iterator[MetadataEmulator]:
    server = MetadataEmulator()
    try:
        yield server
    finally:
        server.close()


def test_the_emulator_speaks_imdsv2_to_the_aws_watcher(emulator: MetadataEmulator) -> None:
    watcher = AwsMetadata(emulator.url)
    assert watcher.poll() == []
    # Without a token: 401, as on an instance with HttpTokens=required.
    status, _ = fetch("GET", f"{emulator.url}/latest/meta-data/spot/instance-action", {})
    assert status == 401
    deadline = time.time() + 30
    emulator.announce(deadline)
    (notice,) = watcher.poll()
    assert (notice.source, notice.kind) == ("aws", "terminate")
    assert notice.deadline_unix == pytest.approx(deadline, abs=1.0)
    emulator.clear()  # a new attempt is a new instance: old tokens die, no notice
    assert watcher.poll() == []


def test_the_emulator_speaks_gcp_and_azure_to_their_watchers(emulator: MetadataEmulator) -> None:
    gcp, azure = GcpMetadata(emulator.url), AzureScheduledEvents(emulator.url)
    assert gcp.poll() == []
    assert azure.poll() == []
    # Without their headers: refused, as the real services do.
    assert fetch("GET", f"{emulator.url}/computeMetadata/v1/instance/preempted", {})[0] == 403
    assert fetch("GET", f"{emulator.url}/metadata/scheduledevents", {})[0] == 400
    deadline = time.time() + 30
    emulator.announce(deadline)
    (preempted,) = gcp.poll()
    assert (preempted.source, preempted.kind) == ("gcp", "preempt")
    (evicted,) = azure.poll()
    assert (evicted.source, evicted.kind) == ("azure", "preempt")
    assert evicted.deadline_unix == pytest.approx(deadline, abs=1.0)
    event = evicted.detail.removeprefix("event ")
    assert azure.acknowledge([event])
    assert emulator.acknowledged == [event]


def test_notice_schedules() -> None:
    every = Simulation(every_s=40.0)
    assert notice_time(every, attempt=5, launched_unix=100.0, job_started_unix=0.0) == 140.0
    fixed = Simulation(at_s=(30.0, 90.0))
    assert notice_time(fixed, attempt=1, launched_unix=0.0, job_started_unix=0.0) == 30.0
    # Launched after its time had passed: a notice soon after the start instead.
    assert notice_time(fixed, attempt=2, launched_unix=95.0, job_started_unix=0.0) == 96.0
    assert notice_time(fixed, attempt=3, launched_unix=95.0, job_started_unix=0.0) is None
    seeded = [
        notice_time(Simulation(every_s=60.0, seed=1), attempt=n, launched_unix=0.0,
                    job_started_unix=0.0)
        for n in range(1, 30)
    ]  # fmt: skip
    again = [
        notice_time(Simulation(every_s=60.0, seed=1), attempt=n, launched_unix=0.0,
                    job_started_unix=0.0)
        for n in range(1, 30)
    ]  # fmt: skip
    assert seeded == again
    assert len(set(seeded)) > 20
    assert all(t is not None and 12.0 <= t <= 180.0 for t in seeded)


def launch_spec(url: Path, command: tuple[str, ...] = STUBBORN) -> LaunchSpec:
    return LaunchSpec(
        job_id="cg-sim-1",
        checkpoint_url=str(url),
        command=command,
        owner="me",
        expires_at=datetime.now(UTC) + timedelta(hours=1),
    )


@pytest.fixture
def local_env(spot_env: Callable[..., dict[str, str]]) -> dict[str, str]:
    return spot_env()


def test_a_process_that_ignores_its_notice_is_killed_at_the_deadline(
    tmp_path: Path, local_env: dict[str, str]
) -> None:
    launcher = LocalLauncher(
        Simulation(every_s=1.0, notice_s=3.0),
        job_started_unix=time.time(),
        state_dir=tmp_path / "state",
        env=local_env,
    )
    spec = launch_spec(tmp_path / "ckpt")
    try:
        launcher.check(spec)
        handle = launcher.launch(SPOT, spec, attempt=1)
        jobs_dir = Path(handle.extra["jobs_dir"])
        wait_for(lambda: any(jobs_dir.glob("*.pid")), "costguard run starting the script")
        script_pid = int(next(jobs_dir.glob("*.pid")).read_text())
        wrapper_pid = int(handle.extra["pid"])
        # The simulated provider acts when polled: the notice first, the kill later.
        seen = []

        def polled_until_gone() -> bool:
            seen.append((launcher.status(handle).state, launcher.emulator.announced))
            return seen[-1][0] is not State.RUNNING

        wait_for(polled_until_gone, "the attempt's end", timeout_s=120)
        assert (State.RUNNING, True) in seen  # notice served while it still ran
        status = launcher.status(handle)
        assert status.state is State.PREEMPTED, status
        # Both the wrapper and the script it started are gone: a real SIGKILL (a killed
        # process on a loaded machine may take a moment to be scheduled out of existence).
        wait_for(
            lambda: not pid_alive(wrapper_pid) and not pid_alive(script_pid),
            "the wrapper and the script gone",
            timeout_s=10,
        )
        log = Path(handle.extra["log"]).read_text()
        assert "aws terminate notice" in log  # costguard run's watcher saw it
        assert launcher.find("cg-sim-1") == []
    finally:
        for live in launcher.find("cg-sim-1"):
            launcher.terminate(live)
        launcher.close()


def test_an_on_demand_attempt_is_never_interrupted_and_find_survives_a_restart(
    tmp_path: Path, local_env: dict[str, str]
) -> None:
    sim = Simulation(every_s=1.0, notice_s=1.0)
    state = tmp_path / "state"
    first = LocalLauncher(sim, job_started_unix=time.time(), state_dir=state, env=local_env)
    spec = launch_spec(tmp_path / "ckpt")
    handle = first.launch(ON_DEMAND, spec, attempt=1)
    first.close()  # the controller goes away; the attempt runs on
    # The new controller's clock is past the notice and deadline a spot attempt launched
    # with this one would have had: its status would serve the notice, or kill.
    launched = float(handle.extra["launched_unix"])
    spot_notice = notice_time(sim, attempt=1, launched_unix=launched, job_started_unix=launched)
    assert spot_notice is not None
    assert sim.notice_s is not None
    late = spot_notice + sim.notice_s + 1.0
    second = LocalLauncher(
        sim, job_started_unix=time.time(), state_dir=state, env=local_env, clock=lambda: late
    )
    try:
        assert second.status(handle).state is State.RUNNING
        assert not second.emulator.announced
        (found,) = second.find("cg-sim-1")
        assert found.instance_id == handle.instance_id
        second.terminate(found)
        wait_for(lambda: not pid_alive(int(handle.extra["pid"])), "its end", timeout_s=30)
        assert second.status(handle).state is State.TERMINATED
        assert second.find("cg-sim-1") == []
    finally:
        second.close()
        first.terminate(handle)


def test_each_local_attempt_runs_costguard_run_with_the_jobs_sync_dir(tmp_path: Path) -> None:
    launcher = LocalLauncher(Simulation(every_s=1.0), job_started_unix=0.0, state_dir=tmp_path)
    spec = replace(launch_spec(tmp_path / "ckpt", ("python", "t.py")), every_steps=5,
                   sync_dir=str(tmp_path / "out"))  # fmt: skip
    assert launcher.command(spec, "gcp")[2:] == [
        "costguard", "run", "--checkpoint", str(tmp_path / "ckpt"), "--cloud", "gcp",
        "--every-steps", "5", "--sync-dir", str(tmp_path / "out"), "--", "python", "t.py",
    ]  # fmt: skip
