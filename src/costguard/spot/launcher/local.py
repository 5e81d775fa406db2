"""``--provider local``: the job runs on this machine, under ``costguard run``, and the
preemption simulator plays the cloud.

Each attempt is a process group of its own (``costguard run`` and the training script
under it), with its output in ``<state dir>/<job id>/attempt-N.log``. Its "instance
metadata" is the simulator's loopback metadata service (:class:`~costguard.spot.simulator.
MetadataEmulator`, in the shapes of the cloud the offer's region simulates), which
announces a spot interruption at the time
:func:`~costguard.spot.simulator.notice_time` picked; at the notice's deadline a process
still running is killed with SIGKILL, as a reclaimed VM would be. An on-demand attempt
(the recovery policy's fallback) is never interrupted. Each simulated region has three
zones (:func:`~costguard.spot.simulator.simulated_zones`), all one process on this
machine: they exist so that the report shows recovery moving zone to zone.

Every attempt is registered in ``<state dir>/<job id>/attempt-N.json`` (pid and process
start time), the local equivalent of the ``costguard:job`` tag: :meth:`LocalLauncher.find`
reads them, so ``costguard launch --attach`` supervises a running attempt instead of
starting a second one.

A gang (``--nodes N``, :meth:`LocalLauncher.launch_gang`) is N such process groups, each
``costguard run`` around one node's ``torchrun`` (:func:`costguard.gang.torchrun_args`,
as ``slurm script --nodes`` starts them), meeting at a c10d rendezvous on 127.0.0.1, each
with its own simulated instance metadata (``/node-<rank>``, registration
``attempt-N.node-R.json``): an attempt's notice goes to one node, the one
``(attempt - 1) % N``, and every node saves the same step because the ranks agree on
notices.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from costguard import contract
from costguard.checkpoint.notices import ENDPOINT_ENV
from costguard.errors import CostguardError, InputError
from costguard.gang import torchrun_args
from costguard.pricing.catalog import Market
from costguard.secrets import secret_name_kind
from costguard.spot.bootstrap import refuse_secrets
from costguard.spot.launcher.base import Handle, Launcher, LaunchSpec, Offer, State, Status
from costguard.spot.simulator import (
    NOTICE_S,
    MetadataEmulator,
    Simulation,
    notice_time,
    simulated_cloud,
    simulated_zones,
)
from costguard.tags import check_job_id

PROVIDER = "local"
#: How often ``costguard run`` polls the simulated metadata service (at the most: see
#: :attr:`LocalLauncher.notice_poll_max_s`).
NOTICE_POLL_S = 0.25
#: The share of its notice's warning an attempt may take to hear of it, polling.
NOTICE_POLLS_PER_WARNING = 24
#: How long :meth:`LocalLauncher.terminate` waits after SIGTERM before SIGKILL.
TERMINATE_GRACE_S = 10.0
#: The most digits a process id has (Linux's pid_max is at most 2**22).
MAX_PID_DIGITS = 7


def recorded_environment(env: Mapping[str, str]) -> dict[str, str]:
    """What ``costguard launch`` records of the launching environment for a local job:
    every variable but those named like a secret (kept out of the bucket), costguard's
    own job variables, and those the job record cannot hold (control characters such as a
    prompt's colours, a value longer than the record's limit), at most the record's
    count."""
    kept = {
        name: value
        for name, value in sorted(env.items())
        if secret_name_kind(name) is None
        and not name.startswith("COSTGUARD_JOB")
        and _RECORDABLE.fullmatch(name)
        and len(value) <= ENV_VALUE_CHARS
        and not _CONTROL.search(value)
    }
    return dict(list(kept.items())[:ENV_VARIABLES])


#: What a job record holds of an environment (``contract.SPEC``'s ``environment``).
ENV_VARIABLES = 1024
ENV_VALUE_CHARS = 100_000
_RECORDABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,99}")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def job_environment(spec: LaunchSpec, env: Mapping[str, str]) -> dict[str, str]:
    """A local attempt's environment: what launch recorded (``spec.environment``), with
    only the secret-named variables (the credentials to reach the store) taken from
    ``env``, the launching or attaching process's; a job recorded before it had an
    environment runs with ``env``."""
    if not spec.environment:
        return dict(env)
    secrets = {name: value for name, value in env.items() if secret_name_kind(name)}
    return {**spec.environment, **secrets}


@dataclass(frozen=True)
class _Node:
    """Which node of a gang a process group is (``rank`` ``None``: the attempt's one
    instance) and the ``torchrun`` words its ``costguard run`` starts the command with."""

    rank: int | None = None
    torchrun: tuple[str, ...] = ()


#: Where the kernel's range of ports for port 0 and outgoing connections starts when
#: ``/proc`` does not say (Linux's default), and the lowest port a rendezvous takes.
EPHEMERAL_LOW, RENDEZVOUS_LOW = 32768, 10000


def rendezvous_port(ports_file: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    """A loopback port free now for a gang's rendezvous, drawn at random below the
    kernel's ephemeral range. Node 0's ``torchrun`` binds it seconds later, after importing
    torch; a port the kernel hands out (``bind`` to port 0, an outgoing connection's own
    port) could be taken by any program in between, and a stranger's store on it would
    have the gang's nodes join that store and wait there for the rendezvous' 10 minutes."""
    try:
        low = int(ports_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = EPHEMERAL_LOW
    size = max(low - RENDEZVOUS_LOW, 1024)
    start = random.SystemRandom().randrange(size)
    for step in range(size):  # from a random port on, round the range once
        port = RENDEZVOUS_LOW + (start + step) % size
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use
            return port
    msg = f"no free loopback port between {RENDEZVOUS_LOW} and {low} for the rendezvous"
    raise CostguardError(msg, hint="stop the programs holding those ports, then retry")


def default_state_dir(env: Mapping[str, str]) -> Path:
    """Where local attempts keep their logs and registrations.

    >>> default_state_dir({"COSTGUARD_LOCAL_DIR": "/tmp/x"})
    PosixPath('/tmp/x')
    >>> default_state_dir({"XDG_STATE_HOME": "/s"})
    PosixPath('/s/costguard/local')
    """
    if env.get(contract.ENV_LOCAL_DIR):
        return Path(env[contract.ENV_LOCAL_DIR])
    base = env.get("XDG_STATE_HOME") or str(Path("~/.local/state").expanduser())
    return Path(base) / "costguard" / "local"


def process_start_ticks(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux ``/proc``), or ``""``.

    Recorded with the pid, so a recycled pid is never mistaken for our attempt.
    """
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    # The command name (field 2) may hold spaces; fields after its closing parenthesis.
    fields = text[text.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else ""


def descendants(roots: Sequence[int]) -> list[int]:
    """Every process under ``roots`` (their children, theirs, ...), from each process's
    parent in Linux ``/proc``; none where ``/proc`` cannot be read."""
    children: dict[int, list[int]] = {}
    try:
        entries = [e for e in Path("/proc").iterdir() if e.name.isdigit()]
    except OSError:
        return []
    for entry in entries:
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        fields = text[text.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.append(child)
                todo.append(child)
    return found


def _pid(handle: Handle) -> int | None:
    """The process id a handle names (job.json gives it: untrusted), or ``None`` when it
    is not a plain decimal number a pid can be.

    >>> _pid(Handle("local", "aws:us-east-1", "local-12", extra={"pid": "12"}))
    12
    >>> [_pid(Handle("local", "r", "local-1", extra=e)) for e in ({}, {"pid": "²"}, {"pid": "-1"})]
    [None, None, None]
    """
    text = handle.extra.get("pid", "")
    if not (text.isascii() and text.isdigit()) or len(text) > MAX_PID_DIGITS:
        return None
    return int(text)


def _instant(text: str | None) -> float | None:
    """A time a registration gives (seconds since the epoch), or ``None``: blank, not a
    number, or not finite.

    >>> _instant("1796582602.5"), _instant(""), _instant("abc"), _instant("nan")
    (1796582602.5, None, None, None)
    """
    try:
        value = float(text or "")
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def pid_alive(pid: int, start_ticks: str = "") -> bool:
    """Whether ``pid`` runs and is the process that was started (same start time)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # someone else's process: not ours, the pid was recycled
    if start_ticks and process_start_ticks(pid) not in ("", start_ticks):
        return False
    # A zombie (exited, not yet reaped by its parent) is not running.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat[stat.rfind(")") + 2 :].startswith("Z"):
            return False
    return True


class LocalLauncher(Launcher):
    """Runs attempts as local processes and preempts them on the simulator's schedule."""

    provider = PROVIDER
    state_dir: Path

    def __init__(
        self,
        simulation: Simulation,
        *,
        job_started_unix: float,
        state_dir: Path,
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.simulation = simulation
        self.job_started_unix = job_started_unix
        self.state_dir = state_dir
        self.env = dict(os.environ if env is None else env)
        self.python = python
        self._clock = clock
        self._emulator: MetadataEmulator | None = None
        #: The longest an attempt waits between two polls of its notices: a single job
        #: polls every :data:`NOTICE_POLL_S`; an array's tasks, all answered by this
        #: process, as long as the array sets (:func:`costguard.spot.array.
        #: notice_poll_max_s`), within 1/:data:`NOTICE_POLLS_PER_WARNING` of their warning
        #: (5 s of AWS's 2 minutes is AWS's own advice).
        self.notice_poll_max_s = NOTICE_POLL_S
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._announced: set[str] = set()
        #: Registrations read or written, by (pid, start time): a poll asks of every
        #: task's process, and a pid with its start time names one process for good.
        self._registrations: dict[tuple[str, str], dict[str, str]] = {}

    # -- the simulator ---------------------------------------------------------------

    @property
    def emulator(self) -> MetadataEmulator:
        """The metadata emulator, started on first use on the job's port."""
        if self._emulator is None:
            self._emulator = MetadataEmulator(self.simulation.metadata_port)
        return self._emulator

    def close(self) -> None:
        """Stop the emulator (running attempts keep running, and polling in vain)."""
        if self._emulator is not None:
            self._emulator.close()
            self._emulator = None

    def _job_dir(self, job_id: str) -> Path:
        return self.state_dir / check_job_id(job_id, "the local launcher's job")

    # -- Launcher -------------------------------------------------------------

    def check(self, spec: LaunchSpec) -> None:
        """The command is there, carries no credential (it goes into job.json and each
        attempt's log) and the state folder is writable."""
        if not spec.command:
            msg = "no command to run"
            raise InputError(msg, hint="put the command after --, e.g. -- python train.py")
        refuse_secrets(
            spec.command, spec.options, spec.checkpoint_url, self.env, sync_dir=spec.sync_dir
        )
        folder = self.state_dir  # the job's own folder is made at its first launch
        try:
            folder.mkdir(parents=True, exist_ok=True)
            probe = folder / f".probe-{os.getpid()}"
            probe.write_text("ok")
            probe.unlink()
        except OSError as exc:
            msg = f"cannot write the local state folder {folder}: {exc.strerror or exc}"
            raise InputError(msg, hint="set COSTGUARD_LOCAL_DIR to a writable folder") from None
        self.emulator  # noqa: B018 - bind the port now: a busy one is an input error

    def command(self, spec: LaunchSpec, cloud: str = "aws", node: Sequence[str] = ()) -> list[str]:
        """``costguard run`` around the user's command (a gang's: after its node's
        ``torchrun`` words, ``node``), with the job's checkpoint settings."""
        argv = [self.python, "-m", "costguard", "run", "--checkpoint", spec.checkpoint_url]
        return [*argv, "--cloud", cloud, *spec.run_options(), "--", *node, *spec.command]

    def torchrun(self) -> list[str]:
        """How a node starts ``torchrun``: the one beside this Python, else its module."""
        beside = Path(self.python).with_name("torchrun")
        return [str(beside)] if beside.is_file() else [self.python, "-m", "torch.distributed.run"]

    def launch(self, offer: Offer, spec: LaunchSpec, attempt: int) -> Handle:
        """Start attempt ``attempt`` as a new process group, and schedule its notice."""
        self.emulator.clear()
        return self._start(offer, spec, attempt, _Node(), self._notice(offer, attempt))

    def launch_gang(self, offer: Offer, spec: LaunchSpec, attempt: int) -> tuple[Handle, ...]:
        """Start the ``spec.nodes`` nodes of attempt ``attempt``, each ``costguard run``
        around its ``torchrun`` (rendezvous on a free loopback port), all or none: a node
        that cannot start takes the started ones down with it. The attempt's notice goes
        to node ``(attempt - 1) % nodes`` only."""
        if spec.nodes == 1:
            return (self.launch(offer, spec, attempt),)
        self.emulator.clear()
        endpoint = f"127.0.0.1:{rendezvous_port()}"
        notice = self._notice(offer, attempt, spec.nodes)
        noticed = (attempt - 1) % spec.nodes
        handles: list[Handle] = []
        try:
            for rank in range(spec.nodes):
                words = torchrun_args(
                    self.torchrun(),
                    spec.nodes,
                    spec.procs_per_node or max(1, offer.gpu_count),
                    node_rank=rank,
                    endpoint=endpoint,
                    rdzv_id=f"{spec.job_id}-{attempt}",
                )
                node = _Node(rank, tuple(words))
                handles.append(
                    self._start(offer, spec, attempt, node, notice if rank == noticed else None)
                )
        except CostguardError:
            for handle in handles:
                self.terminate(handle)
            raise
        return tuple(handles)

    def _notice(self, offer: Offer, attempt: int, nodes: int = 1) -> float | None:
        """When attempt ``attempt`` gets its notice (never on-demand). ``--preempt-every``
        is each node's: a gang of ``nodes`` is preempted ``nodes`` times as often (the
        first of its nodes' notices); ``--preempt-at`` lists the gang's notices."""
        if offer.market is not Market.SPOT:
            return None
        simulation = self.simulation
        if simulation.every_s is not None and nodes > 1:
            simulation = replace(simulation, every_s=simulation.every_s / nodes)
        return notice_time(
            simulation,
            attempt=attempt,
            launched_unix=self._clock(),
            job_started_unix=self.job_started_unix,
        )

    def _start(
        self, offer: Offer, spec: LaunchSpec, attempt: int, node: _Node, notice: float | None
    ) -> Handle:
        """Start one process group: the attempt's one instance, or a node of its gang."""
        folder = self._job_dir(spec.job_id)
        folder.mkdir(parents=True, exist_ok=True)
        name = f"attempt-{attempt}" + ("" if node.rank is None else f".node-{node.rank}")
        jobs_dir = folder / f"{name}.jobs"
        jobs_dir.mkdir(exist_ok=True)
        log = folder / f"{name}.log"
        now = self._clock()
        cloud = simulated_cloud(offer.region)
        notice_s = self.simulation.notice_s or NOTICE_S[cloud]
        emulator = self.emulator
        env = job_environment(spec, self.env)
        env.update(
            {
                contract.ENV_STOP_CHECK: spec.stop_check(attempt),
                contract.ENV_CLOUD: cloud,
                ENDPOINT_ENV[cloud]: emulator.node_url(node.rank or 0),
                contract.ENV_NOTICE_POLL_S: str(self._notice_poll_s(notice_s)),
                contract.ENV_JOBS_DIR: str(jobs_dir),
                contract.ENV_JOB_ID: spec.job_id,
                contract.ENV_JOB_ATTEMPT: str(attempt),
            }
        )
        if node.rank is not None:
            env[contract.ENV_NODE_RANK] = str(node.rank)
        with log.open("ab") as output:
            try:
                child = subprocess.Popen(
                    self.command(spec, cloud, node.torchrun),
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                msg = f"cannot start the local attempt: {exc.strerror or exc}"
                raise InputError(msg, hint="check the command after --") from None
        self._children[child.pid] = child
        extra = {
            "pid": str(child.pid),
            "start_ticks": process_start_ticks(child.pid),
            "attempt": str(attempt),
            "launched_unix": repr(now),
            "notice_unix": "" if notice is None else repr(notice),
            "deadline_unix": "" if notice is None else repr(notice + notice_s),
            "cloud": cloud,
            "jobs_dir": str(jobs_dir),
            "log": str(log),
            "owner": spec.owner,
        }
        if node.rank is not None:
            extra["node"] = str(node.rank)
        registration = folder / f"{name}.json"
        tmp = registration.with_suffix(".tmp")
        tmp.write_text(json.dumps({"region": offer.region, "zone": offer.zone, "extra": extra}))
        tmp.replace(registration)
        if extra["start_ticks"]:
            self._registrations[(extra["pid"], extra["start_ticks"])] = dict(extra)
        return Handle(PROVIDER, offer.region, f"local-{child.pid}", zone=offer.zone, extra=extra)

    def _notice_poll_s(self, notice_s: float) -> float:
        """Seconds between an attempt's polls of its notices, for a warning of
        ``notice_s``."""
        share = notice_s / NOTICE_POLLS_PER_WARNING
        return max(NOTICE_POLL_S, min(self.notice_poll_max_s, share))

    def zones(self, region: str, instance_type: str = "") -> Sequence[str]:
        """Three simulated zones per region, named as the simulated cloud names them, so
        the simulator shows recovery moving between zones before it moves between
        regions."""
        return simulated_zones(region)

    def _registered(self, handle: Handle) -> dict[str, str] | None:
        """The registration this launcher wrote when it started ``handle``'s process (in
        this user's state folder, never the bucket): its pid and start time must match,
        and a start time must have been recorded. ``None``: not proven ours, so never
        signalled (a job.json may name any process). What the simulator does to a
        process (its notice, its kill at the deadline) is read from here, never from the
        handle, which job.json gives."""
        pid, ticks = _pid(handle), handle.extra.get("start_ticks", "")
        if not ticks or pid is None or handle.instance_id != f"local-{pid}":
            return None
        known = self._registrations.get((str(pid), ticks))
        if known is not None:
            return known
        for registration in self.state_dir.glob("*/attempt-*.json"):
            try:
                extra = json.loads(registration.read_text())["extra"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if isinstance(extra, dict) and (extra.get("pid"), extra.get("start_ticks")) == (
                str(pid),
                ticks,
            ):
                found = {str(k): str(v) for k, v in extra.items()}
                self._registrations[(str(pid), ticks)] = found
                return found
        return None

    def _alive(self, handle: Handle) -> bool:
        pid = _pid(handle)
        if pid is None:
            return False
        child = self._children.get(pid)
        if child is not None:
            return child.poll() is None
        registered = self._registered(handle)
        return registered is not None and pid_alive(pid, registered["start_ticks"])

    def status(self, handle: Handle) -> Status:
        """Running, or preempted (after its notice), or terminated (it exited by itself).

        Delivers the notice when it is due and kills the process at the deadline: the
        simulated provider acts when it is asked, so the controller's poll interval is
        the simulator's resolution.
        """
        now = self._clock()
        # The schedule this launcher registered for the process, not the handle's: a
        # forged job.json could name another job's process with a notice due now.
        registered = self._registered(handle) or {}
        notice = _instant(registered.get("notice_unix"))
        deadline = _instant(registered.get("deadline_unix"))
        launched = _instant(registered.get("launched_unix")) or 0.0
        alive = self._alive(handle)
        due = notice is not None and now >= notice
        if alive and due and deadline is not None:
            if handle.instance_id not in self._announced:
                node = registered.get("node", "0")
                self.emulator.announce(deadline, node=int(node) if node.isdigit() else 0)
                self._announced.add(handle.instance_id)
            if now >= deadline:
                self._kill(handle)
                return Status(
                    handle,
                    State.PREEMPTED,
                    f"simulated {registered.get('cloud', 'aws')} spot interruption: killed "
                    f"(SIGKILL) at the notice deadline, {deadline - (notice or deadline):g} s "
                    "after the notice",
                    launched_at=None,
                )
            return Status(handle, State.RUNNING, "interruption notice served", None)
        if alive:
            return Status(handle, State.RUNNING, "", None)
        self._reap(handle)
        if due and handle.instance_id in self._announced:
            # Only a notice this launcher served interrupted it: a process that ended
            # while no controller was there to serve its notice simply exited.
            return Status(
                handle,
                State.PREEMPTED,
                f"simulated {registered.get('cloud', 'aws')} spot interruption: notice "
                f"{notice - launched:.0f} s after launch"
                if notice is not None
                else "simulated spot interruption",
            )
        return Status(handle, State.TERMINATED, "the process exited")

    def _pids(self, handle: Handle) -> list[int]:
        """The wrapper and the training script it started (its pid file), as this
        launcher registered them: nothing for a process it cannot prove it started."""
        registered = self._registered(handle)
        if registered is None:
            return []
        wrapper = int(registered["pid"])
        pids = [wrapper] if pid_alive(wrapper, registered["start_ticks"]) else []
        jobs_dir = Path(registered.get("jobs_dir", ""))
        if registered.get("jobs_dir") and jobs_dir.is_dir():
            for pid_file in jobs_dir.glob("*.pid"):
                with contextlib.suppress(ValueError, OSError):
                    pids.append(int(pid_file.read_text().strip()))
        return pids

    def _signal(self, handle: Handle, signum: int) -> None:
        # Each is a process-group leader: the wrapper (new session) and the script
        # (costguard run starts it in its own group); a group takes its children along.
        # A kill takes every process under them too, found before any is signalled:
        # torchrun starts each worker in a session of its own, which no group reaches,
        # and a reclaimed VM leaves none of them running.
        leaders = self._pids(handle)
        under = descendants(leaders) if signum == signal.SIGKILL else []
        for pid in leaders:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signum)
        for pid in under:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    def _kill(self, handle: Handle) -> None:
        self._signal(handle, signal.SIGKILL)
        self._reap(handle)

    def _reap(self, handle: Handle) -> None:
        pid = _pid(handle)
        child = None if pid is None else self._children.pop(pid, None)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=10)

    def terminate(self, handle: Handle) -> None:
        """SIGTERM (the script saves and exits 75), then SIGKILL after a grace period."""
        if self._alive(handle):
            self._signal(handle, signal.SIGTERM)
            end = time.monotonic() + min(TERMINATE_GRACE_S, self.simulation.notice_s or 30.0)
            while self._alive(handle) and time.monotonic() < end:
                time.sleep(0.1)
        if self._alive(handle):
            self._kill(handle)
        self._reap(handle)

    def find(self, job_id: str) -> Sequence[Handle]:
        """Attempts of ``job_id`` whose process still runs (from their registrations)."""
        found = []
        for registration in sorted(self._job_dir(job_id).glob("attempt-*.json")):
            try:
                doc: dict[str, Any] = json.loads(registration.read_text())
                extra = {str(k): str(v) for k, v in doc["extra"].items()}
                pid = int(extra["pid"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            handle = Handle(
                PROVIDER,
                str(doc.get("region", "")),
                f"local-{pid}",
                zone=str(doc.get("zone", "")),
                extra=extra,
            )
            if self._alive(handle):
                found.append(handle)
        return found
