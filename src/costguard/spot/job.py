"""The job's state in the checkpoint store, next to its checkpoints.

The job's record (its spec, its attempts, their exit records) is written and read back
here only, so the file format has one owner.

``job/job.json`` holds what the user asked for (:class:`JobSpec`) and every attempt (where
it ran, how it ended); the controller rewrites it (atomically: a local rename, or one PUT)
after each change, so it keeps no state of its own and ``costguard launch --attach URL``
can take over from a controller that died. ``costguard run`` adds one exit record per
attempt (``job/attempt-N.exit.json``) when it runs under the launcher
(``COSTGUARD_JOB_ID`` and ``COSTGUARD_JOB_ATTEMPT`` set): the exit code and the latest
checkpoint step, so the controller can tell "done" from "failed" from "preempted".

The checkpoint library ignores these files (they are not in a ``ckpt-*`` folder).

>>> import tempfile
>>> from costguard.checkpoint.store import Store
>>> store = Store.open(tempfile.mkdtemp())
>>> write_exit_record(store, ExitRecord(attempt=2, exit_code=75, last_step=40, finished_unix=1.0))
>>> read_exit_record(store, 2).exit_code, read_exit_record(store, 3)
(75, None)
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

from costguard import contract, proof
from costguard.checkpoint.inventory import latest
from costguard.checkpoint.store import Store
from costguard.errors import CostguardError, InputError
from costguard.logs import get_logger
from costguard.money import usd_str
from costguard.pricing.catalog import Market
from costguard.spot.launcher.base import Handle, LaunchSpec, Offer
from costguard.spot.recovery import Attempt, AttemptOutcome, Limits

# The simulation settings are the simulator's; job.json holds them, and its readers name
# them here too.
from costguard.spot.simulator import Simulation as Simulation

logger = get_logger(__name__)

JOB_FILE = contract.JOB_FILE
STOP_FILE = contract.STOP_FILE
ENV_JOB_ID = contract.ENV_JOB_ID
ENV_JOB_ATTEMPT = contract.ENV_JOB_ATTEMPT
ENV_NODE_RANK = contract.ENV_NODE_RANK
exit_record_path = contract.exit_record_path
#: Job states; ``running`` is the only one a controller supervises.
RUNNING = "running"
FINAL = ("succeeded", "failed", "stopped")


class JobError(InputError):
    """``job.json`` cannot be read as a costguard job (bad input: exit 2)."""


@dataclass(frozen=True)
class ExitRecord:
    """What ``costguard run`` says about how an attempt ended."""

    attempt: int
    exit_code: int
    last_step: int | None
    finished_unix: float
    host: str = ""
    #: The job it belongs to: a record left by an earlier job at the same URL is ignored.
    job_id: str = ""
    #: The node of a gang that wrote it (``None``: the attempt's one instance).
    node: int | None = None


def write_exit_record(store: Store, record: ExitRecord) -> None:
    """Store ``record`` (one atomic write)."""
    path = exit_record_path(record.attempt, record.node)
    contract.write(store, path, contract.EXIT, asdict(record))


def read_exit_record(
    store: Store, attempt: int, job_id: str = "", node: int | None = None
) -> ExitRecord | None:
    """Attempt ``attempt``'s exit record (of its gang's node ``node``), ``None`` when there
    is none (yet), when it is not costguard's (named in a warning), or when it belongs to
    another job than ``job_id`` (an earlier job at the same URL), another attempt or
    another node."""
    doc = contract.read_or_warn(store, exit_record_path(attempt, node), contract.EXIT)
    if doc is None or doc["attempt"] != attempt or (job_id and doc["job_id"] != job_id):
        return None
    if doc["node"] != node:
        return None
    return ExitRecord(**doc)


def latest_step(store: Store) -> int | None:
    """The step of the latest complete checkpoint in ``store`` (``None``: none yet)."""
    entry = latest(store)
    return entry.step if entry is not None else None


def latest_checkpoint_unix(store: Store) -> float | None:
    """When the latest complete checkpoint was written (unix time), if any."""
    entry = latest(store)
    return entry.created_unix if entry is not None else None


def request_stop(store: Store, job_id: str, attempt: int, reason: str, now_unix: float) -> None:
    """Ask attempt ``attempt`` of the job (its ``costguard run``) to have its script save and
    stop (exit 75): ``job/stop.json``, which it polls (:func:`proof.stop_request`), signed
    with the job's key (derived from this user's: :mod:`costguard.proof`)."""
    key = proof.user_key(create=True)
    assert key is not None  # created, or InputError
    doc = {
        "job_id": job_id,
        "attempt": attempt,
        "reason": reason,
        "requested_unix": now_unix,
        "proof": proof.stop_proof(proof.job_key(key, job_id), job_id, attempt),
    }
    contract.write(store, STOP_FILE, contract.STOP, doc)


def clear_stop(store: Store) -> None:
    """Remove the stop request once acted upon (or a forged one), if there is one."""
    try:
        store.delete([STOP_FILE])
    except CostguardError as exc:
        logger.warning("costguard: could not remove %s: %s", STOP_FILE, exc.message)


@dataclass(frozen=True)
class JobSpec:
    """What the user asked for; the same for every attempt."""

    job_id: str
    provider: str
    gpu: str
    gpu_count: int
    regions: tuple[str, ...]
    spot: bool
    checkpoint_url: str
    command: tuple[str, ...]
    owner: str
    created_unix: float
    expires_at: datetime
    max_usd_per_hour: Decimal | None = None
    max_total_usd: Decimal | None = None
    max_preemptions: int = 3
    max_failures: int = 0
    every_steps: int | None = None
    every_minutes: float | None = None
    idle_minutes: int = 30
    hours: Decimal | None = None  # the user's expected run time, for the estimate
    options: Mapping[str, str] = field(default_factory=dict)
    #: ``--sync-dir``: the trainer's own checkpoint folder (on the instance), kept in the store.
    sync_dir: str | None = None
    simulation: Simulation | None = None
    #: ``--total-steps``: the whole run's steps, for its finish time and projected cost.
    total_steps: int | None = None
    #: ``--stop-at-projection``: save and stop once the projected total passes --max-total.
    stop_at_projection: bool = False
    #: ``--pilot-steps``: a pilot: the script stops after so many steps, their pace recorded.
    pilot_steps: int | None = None
    #: What ``costguard launch`` set in the job's environment (no secrets): an attach runs
    #: the job with this, never the attaching shell's.
    environment: Mapping[str, str] = field(default_factory=dict)
    #: The launching user's keyed digest of the spec (:func:`costguard.proof.spec_proof`):
    #: ``--attach`` runs only a spec it holds for.
    proof: str = ""
    #: ``--nodes``: instances started together, all or none, as one attempt (1: one).
    nodes: int = 1
    #: ``--procs-per-node``: processes each node's torchrun starts (``None``: one per GPU).
    procs_per_node: int | None = None

    def limits(self) -> Limits:
        """The recovery limits these settings imply."""
        return Limits(
            spot=self.spot,
            max_preemptions=self.max_preemptions,
            max_total_usd=self.max_total_usd,
            max_failures=self.max_failures,
            nodes=self.nodes,
        )

    def launch_spec(self) -> LaunchSpec:
        """What every adapter gets with each launch (a task of an array: its array's id,
        its index and the array's URL, read from its job id and prefix)."""
        from costguard.spot.array import task_of

        task = task_of(self.job_id, self.checkpoint_url)
        array_id, array_task, array_url = task if task is not None else ("", None, "")
        return LaunchSpec(
            job_id=self.job_id,
            checkpoint_url=self.checkpoint_url,
            command=self.command,
            owner=self.owner,
            expires_at=self.expires_at,
            idle_minutes=self.idle_minutes,
            every_steps=self.every_steps,
            every_minutes=self.every_minutes,
            total_steps=self.total_steps,
            max_usd_per_hour=self.max_usd_per_hour,
            options=dict(self.options),
            sync_dir=self.sync_dir,
            pilot_steps=self.pilot_steps,
            environment=dict(self.environment),
            job_key=_job_key(self.job_id),
            array_id=array_id,
            array_task=array_task,
            array_url=array_url,
            nodes=self.nodes,
            procs_per_node=self.procs_per_node,
        )


def _job_key(job_id: str) -> str:
    """The key of job ``job_id`` (hex) derived from this user's (made if needed)."""
    key = proof.user_key(create=True)
    assert key is not None  # made, or InputError
    return proof.job_key(key, job_id).hex()


@dataclass(frozen=True)
class Job:
    """The whole state: the spec, every attempt, and where it stands."""

    spec: JobSpec
    attempts: tuple[Attempt, ...] = ()
    status: str = RUNNING
    reason: str = ""
    updated_unix: float = 0.0
    #: The controller supervising it (pid@host) and when it last wrote.
    controller: str = ""
    heartbeat_unix: float = 0.0
    #: Handles of instances found running for this job that job.json did not know.
    strays_terminated: tuple[str, ...] = ()
    #: Instances the provider stopped that costguard kept, each with its disk's cost and
    #: the command that deletes it (``Controller._stopped_instance``).
    kept_stopped: tuple[str, ...] = ()
    #: Why the controller asked the running attempt to save and stop (``job/stop.json``),
    #: and when: the job then ends ``stopped`` instead of being relaunched.
    stop_requested: str = ""
    stop_requested_unix: float = 0.0

    @property
    def current(self) -> Attempt | None:
        """The attempt still running, if any."""
        if self.attempts and self.attempts[-1].running:
            return self.attempts[-1]
        return None

    def with_attempt(self, attempt: Attempt) -> Job:
        """This job with ``attempt`` added, or replacing the one with the same number."""
        kept = [a for a in self.attempts if a.number != attempt.number]
        return replace(self, attempts=tuple(sorted([*kept, attempt], key=lambda a: a.number)))


# -- JSON ------------------------------------------------------------------------------


def _offer_doc(offer: Offer) -> dict[str, Any]:
    return {
        "provider": offer.provider,
        "region": offer.region,
        "zone": offer.zone,
        "instance_type": offer.instance_type,
        "market": offer.market.value,
        "usd_per_hour": usd_str(offer.usd_per_hour),
        "gpu": offer.gpu,
        "gpu_count": offer.gpu_count,
        "verified": offer.verified,
    }


def _offer(doc: Mapping[str, Any]) -> Offer:
    """An offer from its record, checked by :data:`contract.OFFER`."""
    return Offer(**{**doc, "market": Market(doc["market"])})


def handle_doc(handle: Handle) -> dict[str, Any]:
    """A handle as JSON."""
    return {
        "provider": handle.provider,
        "region": handle.region,
        "zone": handle.zone,
        "instance_id": handle.instance_id,
        "extra": dict(handle.extra),
    }


def attempt_doc(attempt: Attempt) -> dict[str, Any]:
    """An attempt as JSON."""
    return {
        "number": attempt.number,
        "offer": _offer_doc(attempt.offer),
        "handle": handle_doc(attempt.handle) if attempt.handle else None,
        "launched_unix": attempt.launched_unix,
        "ended_unix": attempt.ended_unix,
        "outcome": attempt.outcome.value if attempt.outcome else None,
        "exit_code": attempt.exit_code,
        "detail": attempt.detail,
        "resumed_step": attempt.resumed_step,
        "last_step": attempt.last_step,
        "lost_s": attempt.lost_s,
        "lost_steps": attempt.lost_steps,
        "token": attempt.token,
        "node_count": attempt.node_count,
        "nodes": [handle_doc(h) for h in attempt.nodes],
    }


def _attempt(doc: Mapping[str, Any]) -> Attempt:
    outcome, handle = doc["outcome"], doc["handle"]
    return Attempt(
        **{
            **doc,
            "offer": _offer(doc["offer"]),
            "handle": Handle(**handle) if handle else None,
            "outcome": AttemptOutcome(outcome) if outcome else None,
            "nodes": tuple(Handle(**node) for node in doc["nodes"]),
        }
    )


def spec_doc(spec: JobSpec) -> dict[str, Any]:
    """The spec as JSON (money as exact decimal strings)."""
    sim = spec.simulation
    # A gang's settings only where there is a gang: a one-instance spec reads (and is
    # signed) as it was before gangs, so its signature still holds.
    gang = {"nodes": spec.nodes, "procs_per_node": spec.procs_per_node}
    return {
        **(gang if spec.nodes > 1 or spec.procs_per_node is not None else {}),
        "job_id": spec.job_id,
        "provider": spec.provider,
        "gpu": spec.gpu,
        "gpu_count": spec.gpu_count,
        "regions": list(spec.regions),
        "spot": spec.spot,
        "checkpoint_url": spec.checkpoint_url,
        "command": list(spec.command),
        "owner": spec.owner,
        "created_unix": spec.created_unix,
        "expires_at": spec.expires_at.isoformat(timespec="seconds"),
        "max_usd_per_hour": None if spec.max_usd_per_hour is None else str(spec.max_usd_per_hour),
        "max_total_usd": None if spec.max_total_usd is None else str(spec.max_total_usd),
        "max_preemptions": spec.max_preemptions,
        "max_failures": spec.max_failures,
        "every_steps": spec.every_steps,
        "every_minutes": spec.every_minutes,
        "idle_minutes": spec.idle_minutes,
        "hours": None if spec.hours is None else str(spec.hours),
        "total_steps": spec.total_steps,
        "stop_at_projection": spec.stop_at_projection,
        "pilot_steps": spec.pilot_steps,
        "options": dict(spec.options),
        "sync_dir": spec.sync_dir,
        "environment": dict(spec.environment),
        "proof": spec.proof,
        "simulation": None
        if sim is None
        else {
            "every_s": sim.every_s,
            "at_s": list(sim.at_s),
            "seed": sim.seed,
            "notice_s": sim.notice_s,
            "metadata_port": sim.metadata_port,
            "state_dir": sim.state_dir,
        },
    }


def _spec(doc: Mapping[str, Any]) -> JobSpec:
    sim = doc["simulation"]
    return JobSpec(
        **{
            **doc,
            "every_minutes": doc["every_minutes"] or None,
            "sync_dir": doc["sync_dir"] or None,
            "simulation": Simulation(**sim) if sim else None,
        }
    )


def canonical_spec_doc(spec: JobSpec) -> dict[str, Any]:
    """The spec as its record reads back (types and defaults as the reader makes them),
    the text a signature covers."""
    raw = json.loads(json.dumps(spec_doc(spec), default=str))
    return spec_doc(_spec(contract.checked(raw, contract.SPEC, "the job's spec")))


def sign_spec(spec: JobSpec, key: bytes) -> JobSpec:
    """``spec`` signed with this user's ``key`` (:func:`costguard.proof.spec_proof`)."""
    return replace(spec, proof=proof.spec_proof(key, canonical_spec_doc(spec)))


def signed_by(spec: JobSpec, key: bytes | None) -> bool:
    """Whether ``spec`` carries ``key``'s signature (the user launched it as it is)."""
    return proof.spec_holds(key, canonical_spec_doc(spec))


def job_doc(job: Job) -> dict[str, Any]:
    """The whole job as the JSON document stored in ``job/job.json``."""
    return {
        "version": contract.VERSION,
        "status": job.status,
        "reason": job.reason,
        "updated_unix": job.updated_unix,
        "controller": job.controller,
        "heartbeat_unix": job.heartbeat_unix,
        "strays_terminated": list(job.strays_terminated),
        "kept_stopped": list(job.kept_stopped),
        "stop_requested": job.stop_requested,
        "stop_requested_unix": job.stop_requested_unix,
        "spec": spec_doc(job.spec),
        "attempts": [attempt_doc(a) for a in job.attempts],
    }


def job_from(doc: Mapping[str, Any]) -> Job:
    """The job in a record checked by :data:`contract.JOB`."""
    fields = {k: v for k, v in doc.items() if k not in ("version", "spec", "attempts")}
    spec = _spec(doc["spec"])
    # An attempt bills at most the signed spec's nodes, whatever its unsigned record says.
    attempts = (_attempt(a) for a in doc["attempts"])
    return Job(
        spec=spec,
        attempts=tuple(replace(a, node_count=min(a.node_count, spec.nodes)) for a in attempts),
        **fields,
    )


def parse_job(data: bytes, url: str = "") -> Job:
    """Read ``job.json``; :class:`JobError` when it is not a costguard job document (the
    contract's reader names the field)."""
    try:
        return job_from(contract.parse(data, contract.JOB, f"{JOB_FILE} in {url or 'the store'}"))
    except contract.RecordError as exc:
        raise JobError(exc.message, hint=exc.hint) from None


def save_job(store: Store, job: Job) -> Job:
    """Write ``job.json`` (atomically) and return the job with its new timestamps."""
    now = time.time()
    stamped = replace(
        job,
        updated_unix=now,
        heartbeat_unix=now,
        controller=_controller_id(),
    )
    contract.write(store, JOB_FILE, contract.JOB, job_doc(stamped))
    return stamped


def release_job(store: Store) -> bool:
    """Give up supervising the job, so that ``--attach`` can take over at once.

    A controller stopped by Ctrl-C calls this: it clears the heartbeat it wrote, but only
    while ``job.json`` still names this process as the controller of a running job.
    Returns whether it did; a store it cannot read or write is left as it is.
    """
    try:
        job = load_job(store)
        if job.status != RUNNING or job.controller != _controller_id():
            return False
        released = replace(job, controller="", heartbeat_unix=0.0)
        contract.write(store, JOB_FILE, contract.JOB, job_doc(released))
    except (OSError, CostguardError):
        return False
    return True


def _controller_id() -> str:
    return f"{os.getpid()}@{socket.gethostname()}"


def load_job(store: Store) -> Job:
    """Read the job in ``store``; :class:`InputError` when there is none."""
    try:
        doc = contract.read(store, JOB_FILE, contract.JOB, contract.JOB_BYTES)
    except contract.RecordError as exc:
        raise JobError(exc.message, hint=exc.hint) from None
    if doc is None:
        msg = f"no costguard job at {store.url} (no {JOB_FILE})"
        raise InputError(msg, hint="pass the --checkpoint URL the job was launched with")
    return job_from(doc)


def job_exists(store: Store) -> bool:
    """Whether ``store`` already holds a job."""
    return JOB_FILE in store.listing()
