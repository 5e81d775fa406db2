"""`costguard launch --nodes`: a gang of nodes as one attempt.

End to end on the local simulator: 2 nodes of 2 processes each (real torchrun, c10d
rendezvous on loopback, gloo DDP), one node preempted in each of two attempts, end bitwise
equal to an uninterrupted run of 4 ranks. Then the controller's rules with real local
processes (a node lost without notice, a gang started short, a clean exit on one node,
an attach, a limit), and the records, the plan and the flags.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from costguard import contract
from costguard.checkpoint.notices.aws import AwsMetadata
from costguard.checkpoint.store import Store
from costguard.errors import InputError
from costguard.reaper.agent import active_jobs
from costguard.spot import controller as controller_module
from costguard.spot.controller import Controller, Event, summarise
from costguard.spot.job import (
    ExitRecord,
    Job,
    Simulation,
    job_doc,
    load_job,
    parse_job,
    read_exit_record,
    save_job,
    spec_doc,
    write_exit_record,
)
from costguard.spot.launcher.base import Handle, Launcher, LaunchSpec, Offer
from costguard.spot.launcher.local import LocalLauncher, _Node, pid_alive
from costguard.spot.prepare import Prepared, check_launcher
from costguard.spot.recovery import (
    Attempt,
    AttemptOutcome,
    Finish,
    Launch,
    Limits,
    decide,
    gang_outcome,
)
from costguard.spot.simulator import MetadataEmulator
from tests.checkpoint.test_distributed import DDP_SCRIPT
from tests.helpers.training import STEP, SharedRuns, assert_bitwise_equal, ranks_reference
from tests.helpers.waiting import WaitTimeoutError, wait_for
from tests.spot.test_controller import launcher as local_launcher  # noqa: F401 - the fixture
from tests.spot.test_offers_and_job import spec
from tests.spot.test_ownership import signed
from tests.spot.test_simulator import ON_DEMAND, SPOT, STUBBORN

TIMEOUT_S = 600
JOB = "cg-test-1"


# -- end to end: the acceptance ------------------------------------------------------------


@pytest.mark.slow
def test_a_two_node_gang_preempted_twice_ends_bitwise_equal_to_an_uninterrupted_run(
    tmp_path: Path,
    shared_runs: SharedRuns,
    spot_env: Callable[..., dict[str, str]],
    run_cli: Callable[..., Any],
) -> None:
    """2 nodes x 2 processes; each spot attempt's notice reaches one node (node 0, then
    node 1), every rank of both nodes saves the same step and exits 75, the whole gang is
    relaunched, and the third (on-demand) attempt finishes. The ranks read their shards
    and seeds by global rank, so the 4-rank reference forked from one interpreter is the
    uninterrupted run."""
    env = spot_env()
    steps = 20
    args = ("--steps", str(steps), "--one-tensor")
    reference = ranks_reference(
        shared_runs, DDP_SCRIPT, 4, {**env, "COSTGUARD_CLOUD": "none"}, *args
    )
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.pt"
    argv = [
        sys.executable, "-m", "costguard", "launch", "--provider", "local", "--gpu", "a10g",
        "--checkpoint", str(ckpt), "--nodes", "2", "--procs-per-node", "2",
        # A node's notice 4 s into an attempt, the gang's 2 s: however fast the machine,
        # before 20 steps of 0.1 s, so both spot attempts are preempted.
        "--preempt-every", "4", "--max-preemptions", "2", "--notice-seconds", "120",
        "--every-steps", "5", "--poll-seconds", "0.2", "--yes", "--format", "json",
        "--", str(DDP_SCRIPT), *args, "--out", str(out), "--sleep", "0.1",
    ]  # fmt: skip
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-4000:]
    doc = json.loads(result.stdout)
    attempts, summary = doc["attempts"], doc["summary"]
    assert doc["status"] == "succeeded"
    # The report counts the node preemptions and the relaunches of the whole gang.
    assert (summary["nodes"], summary["preemptions"], summary["relaunches"]) == (2, 2, 2)
    assert [a["outcome"] for a in attempts] == ["preempted", "preempted", "succeeded"]
    assert [a["exit_code"] for a in attempts] == [75, 75, 0]
    assert summary["lost_steps"] == 0
    status = run_cli("jobs", "status", str(ckpt))
    assert status.exit_code == 0, status.stderr
    said = " ".join(status.stdout.split())
    assert "2 preemption(s) of a node, 2 relaunch(es) of the whole gang" in said
    # Each attempt was a whole gang of 2 (node-rank order), and one node of each spot
    # attempt got the notice: node 0 in attempt 1, node 1 in attempt 2.
    for attempt in attempts:
        assert attempt["node_count"] == 2
        assert [n["extra"]["node"] for n in attempt["nodes"]] == ["0", "1"]
        assert attempt["handle"] == attempt["nodes"][0]
    noticed = [[bool(n["extra"]["notice_unix"]) for n in a["nodes"]] for a in attempts]
    assert noticed == [[True, False], [False, True], [False, False]]
    # Every node of every attempt wrote its own exit record: all saved (75), then all done.
    store = Store.open(ckpt)
    codes = [
        [read_exit_record(store, a["number"], doc["job_id"], node=n) for n in (0, 1)]
        for a in attempts
    ]
    assert [[r.exit_code if r else None for r in pair] for pair in codes] == [
        [75, 75],
        [75, 75],
        [0, 0],
    ]
    # The $/h of a gang is its nodes', and so is its cost.
    assert Decimal(summary["cost_usd"]) > 0
    first = attempts[0]
    cost = load_job(store).attempts[0].cost_usd(0.0)
    hours = Decimal(repr(first["ended_unix"] - first["launched_unix"])) / 3600
    assert cost == Decimal(first["offer"]["usd_per_hour"]) * 2 * hours
    # Bitwise equal to the uninterrupted run: weights, optimizer, scheduler, every rank's RNG.
    assert_bitwise_equal(
        torch.load(out, weights_only=True), torch.load(reference, weights_only=True)
    )
    for rank in range(4):
        assert_bitwise_equal(
            torch.load(f"{out}.rank{rank}", weights_only=True),
            torch.load(f"{reference}.rank{rank}", weights_only=True),
        )
    # Nothing of the job runs any more.
    state = Path(env["COSTGUARD_LOCAL_DIR"])
    launcher = LocalLauncher(Simulation(), job_started_unix=0.0, state_dir=state)
    assert launcher.find(doc["job_id"]) == []


@pytest.mark.slow
def test_a_node_lost_without_notice_has_the_gang_resume_from_its_last_checkpoint(
    tmp_path: Path, shared_runs: SharedRuns, spot_env: Callable[..., dict[str, str]]
) -> None:
    """2 nodes of 1 process on spot: node 1 vanishes mid-run without a notice (SIGKILL to
    all of it). Node 0's gloo fails at once on its lost peer, and the attempt is the
    loss, not a failure; node 0 is terminated, the whole gang relaunched, and it resumes
    from the last complete checkpoint to the uninterrupted run's exact state."""
    env = spot_env()
    args = ("--steps", "20", "--one-tensor")
    reference = ranks_reference(
        shared_runs, DDP_SCRIPT, 2, {**env, "COSTGUARD_CLOUD": "none"}, *args
    )
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.pt"
    argv = [
        sys.executable, "-m", "costguard", "launch", "--provider", "local", "--gpu", "a10g",
        # Spot, its one notice hours away: the node is lost without any.
        "--preempt-at", "10000", "--checkpoint", str(ckpt), "--nodes", "2", "--every-steps", "5",
        "--poll-seconds", "0.2", "--yes", "--format", "json",
        "--", str(DDP_SCRIPT), *args, "--out", str(out), "--sleep", "0.3",
    ]  # fmt: skip
    launch = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    state = Path(env["COSTGUARD_LOCAL_DIR"])
    watcher = LocalLauncher(Simulation(), job_started_unix=0.0, state_dir=state)

    def past_the_checkpoint() -> Handle | None:
        logs = " ".join(p.read_text(errors="replace") for p in state.glob("*/attempt-1.node-*.log"))
        if not any(int(step) >= 7 for _, step in STEP.findall(logs)):  # the checkpoint is at 5
            return None
        jobs = [d.name for d in state.iterdir() if d.is_dir()]
        return next(h for h in watcher.find(jobs[0]) if h.extra.get("node") == "1")

    node1 = wait_for(past_the_checkpoint, "node 1 past step 7", timeout_s=TIMEOUT_S, poll_s=0.1)
    assert _node_processes(ckpt, 1)  # costguard run, torchrun and its worker
    watcher._kill(node1)
    # All of node 1 is gone at once, torchrun's worker too (torchrun starts it in a
    # session of its own: a kill of the groups alone left it training on, orphaned).
    # A SIGKILL is delivered at the process's next turn.
    with contextlib.suppress(WaitTimeoutError):
        wait_for(lambda: not _node_processes(ckpt, 1), "node 1's processes gone", timeout_s=5)
    assert [_cmdline(pid) for pid in _node_processes(ckpt, 1)] == []
    stdout, stderr = launch.communicate(timeout=TIMEOUT_S)
    assert launch.returncode == 0, stderr[-4000:]
    doc = json.loads(stdout)
    first, second = doc["attempts"]
    assert (first["outcome"], second["outcome"]) == ("lost", "succeeded")
    assert first["detail"].startswith("node 1:")
    assert (doc["summary"]["preemptions"], doc["summary"]["relaunches"]) == (1, 1)
    # The last scheduled checkpoint: a lost node's worker took part in no save after it.
    assert second["resumed_step"] in (5, 10, 15)
    assert second["resumed_step"] == first["last_step"]
    assert watcher.find(doc["job_id"]) == []
    final = torch.load(out, weights_only=True)
    assert_bitwise_equal(final, torch.load(reference, weights_only=True))


def _node_processes(ckpt: Path, rank: int) -> list[int]:
    """This user's live processes of node ``rank`` of the job checkpointing to ``ckpt``
    (their environment says so)."""
    marks = (f"COSTGUARD_NODE_RANK={rank}".encode(), f"COSTGUARD_CHECKPOINT_URL={ckpt}".encode())
    found = []
    for entry in Path("/proc").iterdir():
        try:
            environ = (entry / "environ").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if all(mark in environ for mark in marks):
            found.append(int(entry.name))
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:300]
    except OSError:
        return f"{pid} (gone)"


# -- the controller's rules, with real local processes ------------------------------------


class PlainGang(LocalLauncher):
    """The local launcher, its nodes started without torchrun (each runs the command under
    `costguard run` with its node rank), so a gang costs no torch start-up; ``short``: it
    starts every node but returns only the first ``short``."""

    short: int | None = None

    def launch_gang(self, offer: Offer, spec: LaunchSpec, attempt: int) -> tuple[Handle, ...]:
        self.emulator.clear()
        handles = tuple(
            self._start(offer, spec, attempt, _Node(rank), None) for rank in range(spec.nodes)
        )
        return handles[: self.short] if self.short is not None else handles


@pytest.fixture
def gang(local_launcher: LocalLauncher) -> Iterator[PlainGang]:  # noqa: F811
    """A :class:`PlainGang` in the state folder of test_controller's local launcher, whose
    teardown terminates what is left of the job there."""
    base = local_launcher
    local = PlainGang(base.simulation, job_started_unix=base.job_started_unix,
                      state_dir=base.state_dir, env=base.env)  # fmt: skip
    try:
        yield local
    finally:
        local.close()


def _pid(handle: Handle) -> int:
    return int(handle.extra["pid"])


def _registered(handle: Handle) -> list[int]:
    """The jobs `costguard agent` on that node would see running (its jobs folder; a
    zombie is no job: this container's PID 1 does not reap the orphans a killed
    `costguard run` leaves, as a VM's init does)."""
    return active_jobs(Path(handle.extra["jobs_dir"]), alive=pid_alive)


def _wait_dead(handle: Handle, timeout_s: float = 60.0) -> bool:
    return wait_for(
        lambda: not pid_alive(_pid(handle), handle.extra["start_ticks"]),
        f"node {handle.extra.get('node')} dead",
        timeout_s=timeout_s,
        poll_s=0.1,
    )


def _gang_job(store: Store, **changes: Any) -> Job:
    job_spec = spec(
        store.url,
        command=STUBBORN,
        simulation=Simulation(),
        sync_dir=None,
        nodes=2,
        spot=False,
        max_total_usd=None,
    )
    return save_job(store, Job(replace(job_spec, **changes)))


def _unrecorded(store: Store, job: Job) -> Job:
    """``job`` with its first attempt as written before the launch, never after."""
    attempt = Attempt(1, ON_DEMAND, time.time(), node_count=2)
    return save_job(store, replace(job, attempts=(attempt,)))


def _controller(store: Store, launcher: LocalLauncher, **kwargs: Any) -> Controller:
    events: list[Event] = kwargs.pop("events", [])
    return Controller(store, launcher, [ON_DEMAND], poll_s=0.1, on_event=events.append, **kwargs)


def test_a_node_lost_without_notice_ends_every_node_and_the_gang_is_relaunched_whole(
    tmp_path: Path, gang: PlainGang
) -> None:
    store = Store.open(tmp_path / "ckpt")
    controller = _controller(store, gang)
    job = _gang_job(store)
    decision = controller.decide(job, job.spec.limits())
    assert isinstance(decision, Launch)
    job = controller.launch(job, decision)
    first = job.attempts[0]
    assert (first.node_count, len(first.nodes)) == (2, 2)
    assert controller.reconcile(job).current == first  # both run: the attempt runs
    # The agent on each node sees the gang's job registered there (busy) while it runs.
    wait_for(lambda: all(_registered(h) for h in first.nodes), "both nodes registered", poll_s=0.1)
    gang._kill(first.nodes[1])  # node 1 vanishes (SIGKILL to all of it): no notice, no record
    assert _wait_dead(first.nodes[1])
    job = controller.reconcile(job)
    ended = job.attempts[0]
    assert ended.outcome is AttemptOutcome.LOST
    assert ended.detail.startswith("node 1:")
    # Node 0 is no partial gang left running: terminated with the attempt.
    assert not pid_alive(_pid(first.nodes[0]), first.nodes[0].extra["start_ticks"])
    assert gang.find(JOB) == []
    assert not any(_registered(h) for h in first.nodes)
    # The next attempt is the whole gang again, in another place.
    decision = controller.decide(job, job.spec.limits())
    assert isinstance(decision, Launch)
    job = controller.launch(job, decision)
    second = job.attempts[1]
    assert len(second.nodes) == 2
    assert {h.instance_id for h in gang.find(JOB)} == {h.instance_id for h in second.nodes}
    controller.finish(job, Finish("stopped", "test over"))
    assert gang.find(JOB) == []


def test_a_gang_started_short_leaves_no_node_running(tmp_path: Path, gang: PlainGang) -> None:
    """A launcher that gives fewer nodes than asked (even one that started the others
    without saying so): the controller terminates every node of the attempt it can prove
    is the job's, and records a refused launch, never a partial gang."""
    store = Store.open(tmp_path / "ckpt")
    events: list[Event] = []
    controller = _controller(store, gang, events=events)
    gang.short = 1
    job = _gang_job(store)
    decision = controller.decide(job, job.spec.limits())
    assert isinstance(decision, Launch)
    job = controller.launch(job, decision)
    attempt = job.attempts[0]
    assert attempt.outcome is AttemptOutcome.LAUNCH_FAILED
    assert "started 1 of 2 nodes" in attempt.detail
    registrations = sorted((tmp_path / "state" / JOB).glob("attempt-1.node-*.json"))
    assert len(registrations) == 2
    for registration in registrations:
        extra = json.loads(registration.read_text())["extra"]
        assert not pid_alive(int(extra["pid"]), extra["start_ticks"]), registration.name
    assert gang.find(JOB) == []
    assert any(e.kind == "cleanup" for e in events)


def test_a_clean_exit_on_one_node_waits_for_the_others_then_ends_them(
    tmp_path: Path, gang: PlainGang
) -> None:
    """Node 1 saves and exits 75 by itself: node 0 is given GANG_SETTLE_S to do the same
    (as it would after the shared save), then terminated; the attempt is a preemption with
    no lost step."""
    store = Store.open(tmp_path / "ckpt")
    skew = {"s": 0.0}
    controller = _controller(store, gang, clock=lambda: time.time() + skew["s"])
    saves = (
        "import os, sys, time\n"
        "if os.environ['COSTGUARD_NODE_RANK'] == '1': sys.exit(75)\n"
        "for _ in range(1200): time.sleep(0.1)"
    )
    job = _gang_job(store, command=(sys.executable, "-c", saves))
    decision = controller.decide(job, job.spec.limits())
    assert isinstance(decision, Launch)
    job = controller.launch(job, decision)
    nodes = job.attempts[0].nodes
    assert _wait_dead(nodes[1])
    record = wait_for(
        lambda: read_exit_record(store, 1, JOB, node=1), "node 1's exit record", poll_s=0.1
    )
    assert record.exit_code == 75
    job = controller.reconcile(job)
    assert job.current is not None  # node 0 has its time to save too
    assert pid_alive(_pid(nodes[0]), nodes[0].extra["start_ticks"])
    skew["s"] = controller_module.GANG_SETTLE_S + 1
    job = controller.reconcile(job)
    ended = job.attempts[0]
    assert (ended.outcome, ended.exit_code, ended.lost_steps) == (
        AttemptOutcome.PREEMPTED,
        75,
        0,
    )
    assert not pid_alive(_pid(nodes[0]), nodes[0].extra["start_ticks"])


def test_an_attach_adopts_the_whole_gang_and_a_missing_node_ends_it(
    tmp_path: Path, gang: PlainGang
) -> None:
    """The controller died between launching a gang and writing its handles: a new one
    adopts every node in rank order; when a node is gone by then, the gang cannot go on,
    and the survivors are terminated."""
    store = Store.open(tmp_path / "ckpt")
    job = _gang_job(store)
    handles = gang.launch_gang(ON_DEMAND, job.spec.launch_spec(), 1)
    job = save_job(
        store, replace(job, attempts=(Attempt(1, ON_DEMAND, time.time(), node_count=2),))
    )
    adopted = _controller(store, LocalLauncher(gang.simulation, job_started_unix=0.0,
                          state_dir=gang.state_dir, env=gang.env)).adopt(job)  # fmt: skip
    current = adopted.current
    assert current is not None
    assert [h.instance_id for h in current.nodes] == [h.instance_id for h in handles]
    assert current.handle == current.nodes[0]
    # Again, with node 0 gone before the new controller looks.
    job = save_job(
        store, replace(job, attempts=(Attempt(1, ON_DEMAND, time.time(), node_count=2),))
    )
    gang._kill(handles[0])  # node 0 vanishes
    assert _wait_dead(handles[0])
    controller = _controller(store, gang)
    adopted = controller.adopt(job)
    assert adopted.current is not None
    assert [h.instance_id for h in adopted.current.nodes] == [handles[1].instance_id]
    job = controller.reconcile(adopted)
    assert job.attempts[0].outcome is AttemptOutcome.LOST
    assert gang.find(JOB) == []


def test_a_limit_ends_every_node_of_the_gang(tmp_path: Path, gang: PlainGang) -> None:
    store = Store.open(tmp_path / "ckpt")
    skew = {"s": 0.0}

    def sleep(seconds: float) -> None:
        skew["s"] += 1800.0  # half an hour of both nodes' bill at each poll
        time.sleep(seconds)

    job = _gang_job(store, spot=False, max_total_usd=Decimal("3"))
    controller = Controller(store, gang, [ON_DEMAND], poll_s=0.1, sleep=sleep,
                            clock=lambda: time.time() + skew["s"])  # fmt: skip
    final = controller.run(job)
    assert (final.status, final.attempts[0].outcome) == ("stopped", AttemptOutcome.STOPPED)
    nodes = final.attempts[0].nodes
    assert len(nodes) == 2
    assert not any(pid_alive(_pid(h), h.extra["start_ticks"]) for h in nodes)
    # 2 nodes at $1.006/h: $3 is spent within 1.5 hours, not 3.
    spent = summarise(final, [ON_DEMAND], time.time() + skew["s"]).spent_usd
    assert Decimal("3") <= spent < Decimal("4.1")


# -- pure rules: money and records -------------------------------------------------------


def test_a_gang_costs_and_is_capped_at_its_nodes_price() -> None:
    gang_hour = Attempt(1, ON_DEMAND, 0.0, ended_unix=3600.0, node_count=3)
    assert gang_hour.cost_usd(0.0) == Decimal("3.018")
    # One more hour of 2 nodes at $1.006/h passes $1.50; of one node it does not.
    one = decide((), [ON_DEMAND], Limits(spot=False, max_total_usd=Decimal("1.5")), 0.0)
    two = decide((), [ON_DEMAND], Limits(spot=False, max_total_usd=Decimal("1.5"), nodes=2), 0.0)
    assert isinstance(one, Launch)
    assert isinstance(two, Finish)
    assert "2.012/h (2 nodes)" in two.reason


def test_records_of_one_instance_read_as_before_and_a_gangs_round_trip(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "ckpt")
    single = spec(store.url)
    # A one-instance spec reads and is signed as before gangs: no gang keys in it.
    assert "nodes" not in spec_doc(single)
    handle = Handle("local", "aws:us-east-1", "local-1", extra={"pid": "1"})
    old = job_doc(Job(single, attempts=(Attempt(1, SPOT, 5.0, handle=handle),)))
    for attempt in old["attempts"]:
        del attempt["node_count"], attempt["nodes"]  # written before gangs
    read = parse_job(json.dumps(old).encode())
    assert (read.spec.nodes, read.attempts[0].node_count, read.attempts[0].nodes) == (1, 1, ())
    assert read.attempts[0].instances == (handle,)
    nodes = (handle, replace(handle, instance_id="local-2"))
    gang = Job(
        replace(single, nodes=4, procs_per_node=8),
        attempts=(Attempt(1, SPOT, 5.0, handle=handle, node_count=2, nodes=nodes),),
    )
    assert parse_job(json.dumps(job_doc(gang), default=str).encode()) == gang
    # An unsigned attempt record cannot bill more nodes than the signed spec has.
    forged = job_doc(Job(single, attempts=(Attempt(1, SPOT, 5.0, handle=handle),)))
    forged["attempts"][0]["node_count"] = 1024
    assert parse_job(json.dumps(forged, default=str).encode()).attempts[0].node_count == 1


def test_each_node_has_its_own_exit_record_and_one_claiming_another_node_is_ignored(
    tmp_path: Path,
) -> None:
    store = Store.open(tmp_path / "ckpt")
    write_exit_record(store, ExitRecord(1, 75, 10, 5.0, job_id=JOB, node=1))
    assert read_exit_record(store, 1, JOB, node=1) is not None
    assert read_exit_record(store, 1, JOB, node=0) is None
    assert read_exit_record(store, 1, JOB) is None  # the one-instance record is apart
    # A record at node 0's path that says it is node 1's is not node 0's.
    forged = json.loads(store.get(contract.exit_record_path(1, 1)))
    store.put(contract.exit_record_path(1, 0), json.dumps(forged).encode())
    assert read_exit_record(store, 1, JOB, node=0) is None


# -- the simulator ------------------------------------------------------------------------


def test_a_notice_reaches_only_the_node_it_is_for() -> None:
    emulator = MetadataEmulator()
    try:
        node0, node1 = (AwsMetadata(emulator.node_url(n)) for n in (0, 1))
        emulator.announce(time.time() + 60, node=1)
        assert node0.poll() == []
        assert [n.kind for n in node1.poll()] == ["terminate"]
        emulator.clear()
        assert node1.poll() == []
    finally:
        emulator.close()


def test_preempt_every_is_each_nodes_rate(tmp_path: Path) -> None:
    launcher = LocalLauncher(Simulation(every_s=60.0), job_started_unix=0.0,
                             state_dir=tmp_path, clock=lambda: 1000.0)  # fmt: skip
    assert launcher._notice(SPOT, 1) == 1060.0
    assert launcher._notice(SPOT, 1, nodes=3) == 1020.0
    assert launcher._notice(ON_DEMAND, 1, nodes=3) is None


# -- the command line ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--nodes", "2", "--array", "0-3"), "--nodes and --array do not go together"),
        (("--procs-per-node", "2"), "--procs-per-node is for a gang"),
        (("--nodes", "2", "--sync-dir", "out"), "--sync-dir is for one instance"),
        (("--nodes", "0"), "--nodes"),
    ],
)
def test_gang_flags_are_checked_before_anything_is_written(
    tmp_path: Path, run_cli: Callable[..., Any], flags: tuple[str, ...], said: str
) -> None:
    ckpt = tmp_path / "ckpt"
    run = run_cli("launch", "--provider", "local", "--gpu", "a10g", "--checkpoint", str(ckpt),
                  *flags, "--yes", "--", "train.py")  # fmt: skip
    assert run.exit_code == 2, run.stderr
    assert said in run.stderr
    assert "Error:" in run.stderr
    assert "Hint:" in run.stderr or "--nodes" in run.stderr
    assert not ckpt.exists()


def test_a_gang_command_is_what_torchrun_runs(tmp_path: Path, run_cli: Callable[..., Any]) -> None:
    run = run_cli("launch", "--provider", "local", "--gpu", "a10g", "--checkpoint",
                  str(tmp_path / "c"), "--nodes", "2", "--yes", "--", "python", "t.py")  # fmt: skip
    assert run.exit_code == 2
    assert "COMMAND is what torchrun runs, not 'python'" in run.stderr
    assert "Hint:" in run.stderr


def test_the_plan_prices_every_node_and_the_gangs_preemptions(
    tmp_path: Path, run_cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the confirmation (refused here: no terminal), the plan prices N instances,
    with --hours the N-node estimate, and the gang's preemptions at N times a node's."""
    monkeypatch.setenv("COSTGUARD_LOCAL_DIR", str(tmp_path / "state"))
    run = run_cli("launch", "--provider", "local", "--gpu", "a10g", "--checkpoint",
                  str(tmp_path / "c"), "--nodes", "3", "--procs-per-node", "2", "--hours",
                  "10", "--preempt-every", "43200", "--", "train.py")  # fmt: skip
    assert run.exit_code == 2  # no terminal to confirm on: nothing launched
    text = " ".join(run.stderr.split())
    price = text.split("price: 3 x $", 1)[1].split("/h", 1)[0]
    total = text.split(f"price: 3 x ${price}/h = $", 1)[1].split("/h", 1)[0]
    assert Decimal(total) == Decimal(price) * 3
    assert f"estimate: ${Decimal(total) * 10:.2f} for 10 h" in text
    assert "torchrun --nnodes 3 --nproc-per-node 2" in text
    assert "on-demand 3 x g5.xlarge" in text
    # A node's notice every 12 h (2 a day): the gang's 3 x 2 = 6 a day.
    assert "about 3 x a node's rate: 6 a day (--preempt-every 43200 s per node)" in text
    assert "over 10 h: about 2.8 expected" in text


class OneAtATime(LocalLauncher):
    """A launcher that has not opted in to gangs: the base's ``launch_gang``."""

    launch_gang = Launcher.launch_gang


def test_a_launcher_without_gangs_refuses_nodes_before_anything_is_written(
    tmp_path: Path,
) -> None:
    store = Store.open(tmp_path / "ckpt")
    job_spec = spec(store.url, nodes=2, sync_dir=None, simulation=Simulation(),
                    command=("train.py",))  # fmt: skip
    prepared = Prepared(job_spec, store, [SPOT], Launch(SPOT, 1, "first"), "today")
    launcher = OneAtATime(Simulation(), job_started_unix=0.0, state_dir=tmp_path / "state")
    with pytest.raises(InputError, match="starts one instance per attempt") as refused:
        check_launcher(prepared, launcher)
    assert refused.value.hint
    assert not (tmp_path / "ckpt" / "job").exists()
    assert check_launcher(prepared, PlainGang(Simulation(), job_started_unix=0.0,
                          state_dir=tmp_path / "state")).spec.nodes == 2  # fmt: skip


def test_an_attach_of_a_gang_on_a_launcher_without_gangs_is_refused_before_it_acts(
    tmp_path: Path, run_cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Launch refuses --nodes on a launcher that starts one instance per attempt; an
    attach of a gang's job.json (this user's, signed) on such a launcher is refused the
    same way, before it lists, launches or records anything."""
    from costguard.spot import prepare

    store = Store.open(tmp_path / "ckpt")
    state = tmp_path / "state"
    job_spec = _gang_job(store, command=("train.py",),
                         simulation=Simulation(state_dir=str(state))).spec  # fmt: skip
    save_job(store, Job(signed(job_spec)))
    asked: list[str] = []

    class Recording(OneAtATime):
        def find(self, job_id: str) -> list[Handle]:
            asked.append("find")
            return list(super().find(job_id))

        def launch(self, offer: Offer, spec: LaunchSpec, attempt: int) -> Handle:
            asked.append("launch")
            return super().launch(offer, spec, attempt)

    def one_at_a_time(settings: Any, spec: Any, offers: Any) -> Recording:
        return Recording(spec.simulation, job_started_unix=spec.created_unix, state_dir=state)

    monkeypatch.setattr(prepare, "launcher_for", one_at_a_time)
    run = run_cli("launch", "--attach", store.url, "--force", "--yes")
    assert run.exit_code == 2, run.stderr
    said = " ".join(run.stderr.split())
    assert "starts one instance per attempt" in said, said
    assert "Hint:" in said
    assert asked == []
    assert load_job(store).attempts == ()


def test_a_gangs_nodes_speak_each_under_its_attempt_and_node(tmp_path: Path) -> None:
    """The output a local launch streams: each node's log named and its lines prefixed
    ``[attempt.node]`` (a gang's logs were not followed at all)."""
    from costguard.cli.follow import Follower

    (tmp_path / "attempt-2.node-0.log").write_text("STEP 0 1\n")
    (tmp_path / "attempt-2.node-1.log").write_text("STEP 2 1\n")
    (tmp_path / "attempt-1.log").write_text("READY\n")
    said: list[str] = []
    Follower(tmp_path, echo=said.append).drain(final=True)
    names = [line.split("\n")[0] for line in said if line.startswith("costguard:")]
    assert names == [
        "costguard: attempt 1 writes its output to",
        "costguard: attempt 2 node 0 writes its output to",
        "costguard: attempt 2 node 1 writes its output to",
    ]
    assert [line for line in said if not line.startswith("costguard:")] == [
        "  [1] READY",
        "  [2.0] STEP 0 1",
        "  [2.1] STEP 2 1",
    ]


def test_an_attach_shows_the_gang_it_would_supervise(
    tmp_path: Path, run_cli: Callable[..., Any]
) -> None:
    store = Store.open(tmp_path / "ckpt")
    nodes = tuple(
        Handle("local", "aws:us-east-1", f"local-{n}", extra={"pid": str(n)}) for n in (1, 2)
    )
    running = Attempt(1, ON_DEMAND, time.time(), handle=nodes[0], node_count=2, nodes=nodes)
    job = _gang_job(store, simulation=Simulation(state_dir=str(tmp_path / "state")))
    save_job(store, replace(job, attempts=(running,)))
    run = run_cli("launch", "--attach", store.url, "--force")
    assert run.exit_code == 2  # not this user's signed spec: refused after the plan
    text = " ".join(run.stderr.split())
    assert "2 nodes of 1 x T4" in text
    assert "(local-1 local-2) at $2.012/h" in text


_ENDS = st.sampled_from(
    [(None, None), (AttemptOutcome.SUCCEEDED, 0), (AttemptOutcome.PREEMPTED, 75),
     (AttemptOutcome.PREEMPTED, None), (AttemptOutcome.LOST, None), (AttemptOutcome.FAILED, 1),
     (AttemptOutcome.STOPPED, None)]
)  # fmt: skip


@given(nodes=st.lists(_ENDS, min_size=1, max_size=6), settled=st.booleans())
def test_any_nodes_unclean_end_ends_the_gang_and_success_needs_every_node(
    nodes: list[tuple[AttemptOutcome | None, int | None]], settled: bool
) -> None:
    decisive = gang_outcome(nodes, settled=settled)
    ended = [(o, c) for o, c in nodes if o is not None]
    unclean = any(c not in (0, 75) for _, c in ended)
    if not ended or (not unclean and not settled and len(ended) < len(nodes)):
        assert decisive is None
        return
    assert decisive is not None
    outcome = nodes[decisive][0]
    assert outcome is not None
    if outcome is AttemptOutcome.SUCCEEDED:
        assert all(o in (None, AttemptOutcome.SUCCEEDED) for o, _ in nodes)
    if any(o is AttemptOutcome.PREEMPTED for o, _ in ended):
        assert outcome is AttemptOutcome.PREEMPTED  # an interruption explains the rest
