"""The recovery controller: reconcile, decide, act, until the job is over.

Each round it asks the launcher what became of the current attempt and reads the
attempt's exit record (:func:`reconcile`), asks :func:`costguard.spot.recovery.decide`
what to do, and does it: wait, launch the next attempt, or finish (terminate what still
runs). Every change is written to ``job.json`` before and after the provider call, so a
controller that dies can be replaced (``costguard launch --attach``) without a second
instance: a new controller first adopts the instances the provider knows for the job
(:meth:`Launcher.find`) and terminates any that ``job.json`` cannot account for.

The loop is bounded: a poll interval, an overall timeout (after which it terminates the
instance and stops), and every provider call bounded by its adapter.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import TypeVar

from costguard.checkpoint.store import Store
from costguard.errors import CostguardError, InputError
from costguard.logs import get_logger
from costguard.money import format_usd, gb_to_gib
from costguard.pricing.catalog import Market
from costguard.spot.job import (
    FINAL,
    RUNNING,
    ExitRecord,
    Job,
    clear_stop,
    latest_checkpoint_unix,
    latest_step,
    read_exit_record,
    request_stop,
    save_job,
)
from costguard.spot.launcher.base import (
    CapacityError,
    Handle,
    Launcher,
    Offer,
    State,
    Status,
    Stopped,
    ThrottledError,
    launch_token,
)
from costguard.spot.offers import expand_zones
from costguard.spot.recovery import (
    EXIT_PREEMPTED,
    INTERRUPTIONS,
    Attempt,
    AttemptOutcome,
    Decision,
    Finish,
    Launch,
    Limits,
    Wait,
    classify,
    decide,
    gang_outcome,
    interruptions,
    spent_usd,
)

logger = get_logger(__name__)
_T = TypeVar("_T")

#: ``job.json`` is rewritten at least this often while an attempt runs (the heartbeat
#: ``--attach`` reads to tell a live controller from a dead one).
HEARTBEAT_S = 30.0
#: After asking the script to save and stop (--stop-at-projection), how long it may take
#: before its instance is terminated anyway.
STOP_GRACE_S = 600.0
#: After a gang's node exited 0 or 75 by itself, how long the other nodes may take to do
#: the same (they finish or save the same step) before they are terminated.
GANG_SETTLE_S = 30.0


@dataclass(frozen=True)
class _NodeEnd:
    """One node of the current attempt as the controller sees it at a poll."""

    handle: Handle | None
    state: State
    detail: str
    record: ExitRecord | None
    code: int | None
    outcome: AttemptOutcome | None


class ControllerBusyError(InputError):
    """Another controller wrote the job's heartbeat recently."""


@dataclass(frozen=True)
class Event:
    """Something the controller did or saw, for the user."""

    kind: str  # launch, preempted, failed, lost, done, stopped, adopt, stray, notice
    message: str


def check_not_supervised(job: Job, now_unix: float, stale_s: float) -> None:
    """Refuse to attach while another controller's heartbeat is fresh.

    >>> from costguard.spot.job import JobSpec
    >>> from datetime import datetime, UTC
    >>> spec = JobSpec("j", "local", "T4", 1, (), True, "/c", ("x",), "me", 0.0,
    ...                datetime.now(UTC))
    >>> check_not_supervised(Job(spec, heartbeat_unix=0.0), now_unix=100.0, stale_s=60.0)
    """
    if job.status != RUNNING:
        return
    age = now_unix - job.heartbeat_unix
    if age < stale_s:
        msg = (
            f"job {job.spec.job_id} is supervised by {job.controller or 'another controller'} "
            f"(heartbeat {age:.0f} s ago)"
        )
        raise ControllerBusyError(
            msg,
            hint=f"wait {stale_s - age:.0f} s if that controller died, or pass --force",
        )


class Controller:
    """Supervises one job until it succeeds, fails or reaches a limit."""

    def __init__(
        self,
        store: Store,
        launcher: Launcher,
        offers: Sequence[Offer],
        *,
        poll_s: float = 10.0,
        timeout_s: float = 7 * 24 * 3600.0,
        on_event: Callable[[Event], None] | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        owner: str | None = None,
    ) -> None:
        self.store = store
        #: The user this controller acts for: it terminates only instances the provider
        #: tags with this owner (``None``: any owner, for library use within one account).
        self.owner = owner
        #: Instances this controller launched itself (proven the job's without a listing,
        #: which may not show a new instance yet).
        self._launched: set[str] = set()
        #: Warnings said already (a forged record is named once, not at every poll).
        self._warned: set[str] = set()
        self.launcher = launcher
        self.offers = tuple(offers)
        self.poll_s = poll_s
        self.timeout_s = timeout_s
        self._on_event = on_event
        self._clock = clock
        self._sleep = sleep
        #: (region, instance type) -> the zones the launcher named (empty: none / unknown).
        self.zones: dict[tuple[str, str], tuple[str, ...]] = {}
        #: Whether the projection's passing --max-total was said already.
        self._warned_projection = False
        #: Attempt number -> when its first node was seen ended (a gang's others get
        #: :data:`GANG_SETTLE_S` to end by themselves after a clean exit).
        self._gang_ended: dict[int, float] = {}

    def _emit(self, kind: str, message: str) -> None:
        logger.info("costguard launch: %s: %s", kind, message)
        if self._on_event is not None:
            self._on_event(Event(kind, message))

    def _save(self, job: Job) -> Job:
        return save_job(self.store, job)

    # -- adopt ------------------------------------------------------------------------

    def adopt(self, job: Job) -> Job:
        """Match the provider's live instances of this job with ``job.json``.

        The current attempt without a handle (the controller died between the launch
        and the write) adopts the live instance of its attempt number, or else the one
        the launcher finds by the attempt's launch token (:meth:`_resume`: a listing by
        tag may not show a new instance yet); live instances that no attempt accounts
        for are terminated (they carry the job's tag, so they are ours, and nothing
        would supervise them).
        """
        live = list(self.launcher.find(job.spec.job_id))
        known = {h.instance_id for a in job.attempts for h in a.instances}
        current = job.current
        strays, nodes = [], []
        for handle in live:
            if handle.instance_id in known:
                continue
            if (
                current is not None
                and current.handle is None
                and handle.extra.get("attempt", str(current.number)) == str(current.number)
            ):
                if job.spec.nodes > 1:
                    nodes.append(handle)  # a gang's nodes: adopted together below
                    continue
                current = replace(current, handle=handle)
                job = job.with_attempt(current)
                self._emit("adopt", f"attempt {current.number} runs as {handle.instance_id}")
                continue
            strays.append(handle)
        if current is not None and nodes:
            # In node-rank order; a node not found is missing, and reconcile ends the gang.
            nodes.sort(key=lambda h: _node_rank(h))
            current = replace(current, handle=nodes[0], nodes=tuple(nodes))
            job = job.with_attempt(current)
            ids = ", ".join(h.instance_id for h in nodes)
            self._emit("adopt", f"attempt {current.number} runs as {ids}")
        if (
            current is not None
            and current.handle is None
            and current.outcome is None
            and job.spec.nodes == 1
        ):
            job = self._resume(job, current)
        strays = [h for h in strays if self._owners(job, h)]
        for handle in strays:
            self.launcher.terminate(handle)
            self._emit("stray", f"terminated {handle.instance_id}: no attempt in job.json owns it")
        if strays:
            job = replace(
                job, strays_terminated=(*job.strays_terminated, *(h.instance_id for h in strays))
            )
        return self._save(job)

    def _resume(self, job: Job, current: Attempt) -> Job:
        """The current attempt's instance found by its launch token, where the launcher
        can (``resume``: AWS, whose ``RunInstances`` is idempotent by ``ClientToken``);
        unchanged when it finds none (reconcile then closes the attempt as never
        confirmed). GCP and Azure name the instance after the job and attempt, so the
        listing by label or tag already finds it."""
        if not current.token:
            return job
        handle = self.launcher.resume(
            current.offer,
            job.spec.launch_spec(),
            current.number,
            current.token,
            current.launched_unix,
        )
        if handle is None:
            return job
        self._emit(
            "adopt",
            f"attempt {current.number} runs as {handle.instance_id} (found by its launch "
            f"token {current.token})",
        )
        return job.with_attempt(replace(current, handle=handle))

    # -- reconcile --------------------------------------------------------------------

    def reconcile(self, job: Job, statuses: Sequence[Status] | None = None) -> Job:
        """Close the current attempt if it has ended (provider state + exit record).

        ``statuses``: what the launcher said of the current attempt's instances, in their
        order (:meth:`Launcher.statuses`: a sweep asks of every task's at once); ``None``
        (or said of other instances): asked here, in one :meth:`Launcher.statuses` call
        for a gang's nodes."""
        current = job.current
        if current is None:
            return job
        if statuses is None or [s.handle for s in statuses] != list(current.instances):
            statuses = self.launcher.statuses(current.instances)
        now = self._clock()
        # The signed spec says how many nodes there are (job.json's attempts are not signed).
        nodes = [self._node(job, current, rank, statuses) for rank in range(job.spec.nodes)]
        first_end = now
        if any(n.outcome is not None for n in nodes):
            first_end = self._gang_ended.setdefault(current.number, now)
        decisive = gang_outcome(
            [(n.outcome, n.code) for n in nodes], settled=now - first_end >= GANG_SETTLE_S
        )
        if decisive is None:
            return job
        self._gang_ended.pop(current.number, None)
        # Of nodes that ended alike, the one the provider says it took back speaks.
        alike = [n for n in nodes if n.outcome is nodes[decisive].outcome]
        node = next((n for n in alike if n.state is State.PREEMPTED), nodes[decisive])
        decisive = nodes.index(node)
        code, record, outcome = node.code, node.record, node.outcome
        assert outcome is not None  # the decisive node has ended
        for other in nodes:
            if other.state in (State.RUNNING, State.PENDING) and other.handle is not None:
                # The job ended but an instance lives on (a VM after its script, a gang's
                # node after another's end): stop paying; never a partial gang left.
                self._terminate(job, other.handle)
        detail = node.detail
        if job.spec.nodes > 1:
            detail = f"node {decisive}: {detail or outcome.value}"
        # The newest checkpoint any node's record names (a gang's nodes name the same one).
        steps = [n.record.last_step for n in nodes if n.record and n.record.last_step is not None]
        if steps:
            last_step: int | None = max(steps)
        else:
            last_step = record.last_step if record is not None else self._latest_step()
        lost_s, lost_steps = 0.0, None
        if outcome in INTERRUPTIONS:
            if code == EXIT_PREEMPTED:
                lost_steps = 0  # the emergency save holds every step done
            else:
                lost_s, lost_steps = self._lost_work(current, now, last_step)
        # When the job ended, not when this controller noticed (it may have been away).
        ended = now
        if record is not None and current.launched_unix <= record.finished_unix < now:
            ended = record.finished_unix
        closed = replace(
            current,
            ended_unix=ended,
            outcome=outcome,
            exit_code=code,
            detail=detail,
            last_step=last_step,
            lost_s=lost_s,
            lost_steps=lost_steps,
        )
        text = f"attempt {current.number} on {current.offer.place}: {outcome.value}"
        if code is not None:
            text += f" (exit {code})"
        if detail:
            text += f"; {detail}"
        if last_step is not None:
            text += f"; latest checkpoint: step {last_step}"
        self._emit(outcome.value, text)
        job = job.with_attempt(closed)
        for other in nodes:
            if other.state is State.PREEMPTED and other.handle is not None:
                job = self._stopped_instance(job, other.handle)
        return self._save(job)

    def _node(self, job: Job, attempt: Attempt, rank: int, statuses: Sequence[Status]) -> _NodeEnd:
        """What the provider (``statuses``, of ``attempt``'s instances in their order) and
        the exit record say of node ``rank`` of ``attempt`` (its one instance when it is
        no gang); a node with no handle is missing."""
        gang = job.spec.nodes > 1
        handles = attempt.instances
        handle = handles[rank] if rank < len(handles) else None
        if handle is None:
            state, detail = State.MISSING, "the launch was never confirmed"
        else:
            state, detail = statuses[rank].state, statuses[rank].detail
        record = read_exit_record(
            self.store, attempt.number, job.spec.job_id, node=rank if gang else None
        )
        code = record.exit_code if record is not None else None
        outcome = classify(state, code, attempt.offer.market)
        return _NodeEnd(handle, state, detail, record, code, outcome)

    def _stop_asked(self, job: Job) -> Job:
        """A stop request ``costguard jobs stop`` wrote for the running attempt, signed with
        the job's key (this user's): the job then ends ``stopped`` once the attempt has
        saved, instead of being relaunched. Anything else in job/stop.json is left to the
        attempt's own check (a warning there; the job goes on)."""
        from costguard import proof

        current = job.current
        if job.stop_requested or current is None:
            return job
        key = proof.user_key()
        job_id = job.spec.job_id
        check = (
            None
            if key is None
            else proof.stop_check(proof.job_key(key, job_id), job_id, current.number)
        )
        try:
            reason = proof.stop_request(self.store, job_id, current.number, check, self._warn_once)
        except CostguardError:
            return job  # the store cannot be read now: asked again at the next poll
        if reason is None:
            return job
        self._emit("stop", f"{reason}: the script saves and stops")
        return self._save(replace(job, stop_requested=reason, stop_requested_unix=self._clock()))

    def _warn_once(self, message: str) -> None:
        """An event for a record left out, once per message (the loop polls it again)."""
        if message not in self._warned:
            self._warned.add(message)
            self._emit("warning", message)

    # -- what is proven the job's -------------------------------------------------------

    def _owners(self, job: Job, found: Handle) -> bool:
        """Whether an instance the provider lists as this job's (``find``: tagged with its
        id) is also tagged with this controller's owner; one that is not is named and left
        alone (a job id reused by someone else's job.json is not proof)."""
        if self.owner is None or found.extra.get("owner") in (self.owner, _label(self.owner)):
            return True
        self._emit(
            "refused",
            f"not acting on {found.instance_id}: tagged as job {job.spec.job_id} of "
            f"{found.extra.get('owner') or 'no owner'}, not of {self.owner}",
        )
        return False

    def _terminate(self, job: Job, handle: Handle) -> bool:
        """Terminate ``handle`` (an instance job.json names) only when it is proven the
        job's: the provider lists it as tagged with the job's id (``find``) and this
        controller's owner, and where the provider keeps the launch's client token (AWS),
        it is the token recorded for the attempt that names it. Anything else (a forged
        attempt naming someone else's instance) is named in an event and left alone."""
        if handle.instance_id in self._launched:
            self.launcher.terminate(handle)
            return True
        found = next(
            (h for h in self.launcher.find(job.spec.job_id) if h.instance_id == handle.instance_id),
            None,
        )
        if found is None:
            self._emit(
                "refused",
                f"not terminating {handle.instance_id}: the provider does not list it as "
                f"an instance of job {job.spec.job_id}",
            )
            return False
        if not self._owners(job, found):
            return False
        token = found.extra.get("client_token", "")
        recorded = {a.token for a in job.attempts if handle in a.instances and a.token}
        if token and recorded and token not in recorded:
            self._emit(
                "refused",
                f"not terminating {handle.instance_id}: it was not launched by this job's "
                "attempt (its launch token differs)",
            )
            return False
        self.launcher.terminate(found)
        return True

    def _stopped_instance(self, job: Job, handle: Handle) -> Job:
        """An instance the provider stopped rather than deleted keeps billing its disks
        while the next attempt runs elsewhere (GCP host maintenance stops GPU VMs). Where
        the launcher can tell (``stopped``: it proves the instance is the job's), it is
        deleted once the store's latest checkpoint is complete (the work is there, not
        only on that disk), and otherwise kept and reported with what its disk costs."""
        found: Stopped | None = self.launcher.stopped(handle, job.spec.job_id)
        if found is None:
            return job
        step = self._latest_step()
        where = f"{handle.instance_id} in {handle.zone or handle.region}"
        if step is not None and not found.kept_because:
            self.launcher.terminate(handle)
            self._emit(
                "cleanup",
                f"deleted {where}: stopped by the provider, its {found.disk_gb} GB of disk "
                f"billed on; the checkpoint of step {step} holds its work",
            )
            return job
        why = found.kept_because or "no complete checkpoint holds its work yet"
        monthly = _disk_usd_per_month(handle, found.disk_gb)
        note = (
            f"{where}: {found.disk_gb} GB of disk, "
            + (f"about {format_usd(monthly)}/month" if monthly is not None else "billed")
            + f" while it exists; kept because {why}: {found.delete_command}"
        )
        self._emit("kept", note)
        return replace(job, kept_stopped=(*job.kept_stopped, note))

    def _latest_step(self) -> int | None:
        try:
            return latest_step(self.store)
        except CostguardError:
            return None

    def _lost_work(
        self, attempt: Attempt, now: float, last_step: int | None
    ) -> tuple[float, int | None]:
        """Seconds since the last checkpoint, and the steps that likely took (by pace)."""
        try:
            saved_unix = latest_checkpoint_unix(self.store)
        except CostguardError:
            saved_unix = None
        start = attempt.launched_unix
        saved = saved_unix if saved_unix is not None and saved_unix > start else None
        lost_s = max(0.0, now - (saved if saved is not None else start))
        resumed = attempt.resumed_step or 0
        if saved is None or last_step is None or last_step <= resumed or saved <= start:
            return lost_s, None
        pace = (last_step - resumed) / (saved - start)  # steps per second, startup included
        return lost_s, round(pace * lost_s)

    # -- zones ------------------------------------------------------------------------

    def _zones_of(self, offer: Offer) -> tuple[str, ...]:
        """The launcher's zones for ``offer``'s region and type, asked once per controller.

        A launcher that cannot say (no permission; a provider without zones) leaves the offer
        regional: the provider places the instance, and recovery moves between regions.
        """
        key = (offer.region, offer.instance_type)
        if key not in self.zones:
            found: tuple[str, ...] = ()
            try:
                found = tuple(dict.fromkeys(z for z in self.launcher.zones(*key) if z))
            except CostguardError as exc:
                self._emit(
                    "zones",
                    f"zones of {offer.region} unknown ({exc.message}): the provider "
                    "picks the zone, and recovery moves between regions only",
                )
            self.zones[key] = found
            if found:
                self._emit(
                    "zones",
                    f"{offer.instance_type} in {offer.region}: zones {', '.join(found)}, each "
                    f"priced at the region's ${offer.usd_per_hour}/h (the price tables are per "
                    "region); a preempted zone is backed off first",
                )
        return self.zones[key]

    def decide(self, job: Job, limits: Limits) -> Decision:
        """:func:`~costguard.spot.recovery.decide`, with the chosen region split into its
        zones first (the launcher is asked only for the regions a launch is headed to)."""
        decision = decide(job.attempts, self.offers, limits, self._clock())
        for _ in range(len(self.offers) + 1):  # bounded: each round zones one more offer
            if not isinstance(decision, Launch) or decision.offer.zone:
                return decision
            chosen = decision.offer
            if (chosen.region, chosen.instance_type) in self.zones:
                return decision  # asked already: no zones there
            zones = self._zones_of(chosen)
            if not zones:
                return decision
            self.offers = tuple(
                expand_zones(self.offers, chosen.region, chosen.instance_type, zones)
            )
            decision = decide(job.attempts, self.offers, limits, self._clock())
        return decision

    # -- act --------------------------------------------------------------------------

    def launch(self, job: Job, decision: Launch) -> Job:
        """Record the attempt, create the instance, record its handle."""
        now = self._clock()
        spec = job.spec.launch_spec()
        attempt = Attempt(
            decision.number,
            decision.offer,
            launched_unix=now,
            resumed_step=self._latest_step(),
            token=launch_token(job.spec.job_id, decision.number),
            node_count=spec.nodes,
        )
        job = self._save(job.with_attempt(attempt))  # intent first: --attach can adopt it
        clear_stop(self.store)  # a request for an earlier attempt is not this one's
        if spec.nodes > 1:
            return self._launch_gang(job, decision, attempt)
        try:
            handle = self._through_throttling(
                lambda: self.launcher.launch(decision.offer, spec, decision.number)
            )
        except ThrottledError as exc:
            return self._throttled(job, decision, attempt, exc)
        except CapacityError as exc:
            refused = replace(
                attempt,
                ended_unix=self._clock(),
                outcome=AttemptOutcome.LAUNCH_FAILED,
                detail=f"{exc.code}: {exc.message}",
            )
            self._emit("refused", f"{decision.offer.place}: {exc.message}")
            return self._save(job.with_attempt(refused))
        except CostguardError as exc:
            found = self._launched_anyway(job, attempt)
            if found is None:
                refused = replace(
                    attempt,
                    ended_unix=self._clock(),
                    outcome=AttemptOutcome.FAILED,
                    detail=exc.message,
                )
                job = job.with_attempt(refused)
                return self.finish(job, Finish("failed", f"launch failed: {exc.message}"))
            handle = found
        self._launched.add(handle.instance_id)
        launched = replace(attempt, handle=handle)
        price = f"${decision.offer.usd_per_hour}/h"
        if decision.offer.zone:
            price += " (the region's list price)"
        self._emit(
            "launch",
            f"attempt {decision.number}: {decision.offer.instance_type} "
            f"{decision.offer.market.value} in {decision.offer.place} at "
            f"{price} as {handle.instance_id} ({decision.reason})",
        )
        return self._save(job.with_attempt(launched))

    def _through_throttling(self, launch: Callable[[], _T]) -> _T:
        """``launch()``, sent again after the provider's throttling answers as
        :mod:`costguard.retry`'s one rule paces them (:data:`~costguard.retry.API_RETRY`:
        exponential backoff with full jitter, the provider's ``Retry-After`` honoured); the
        last :class:`ThrottledError` raised when they go on."""
        from costguard.retry import API_RETRY, Transient, call_with_retry

        def throttled(exc: Exception) -> Transient | None:
            if isinstance(exc, ThrottledError):
                return Transient(exc.code, exc.retry_after_s)
            return None

        def say(exc: Exception, retry: int, retries: int, wait_s: float) -> None:
            text = exc.message if isinstance(exc, CostguardError) else str(exc)
            self._emit(
                "throttled", f"{text}; launching again in {wait_s:.1f} s ({retry}/{retries})"
            )

        return call_with_retry(launch, throttled, API_RETRY, sleep=self._sleep, on_retry=say)

    def _throttled(self, job: Job, decision: Launch, attempt: Attempt, exc: ThrottledError) -> Job:
        """The provider's request rate, not the place nor the job: the attempt is not
        counted (no capacity verdict, no failure), and a later round asks again."""
        self._emit("throttled", f"{decision.offer.place}: {exc.message}; asking again later")
        kept = tuple(a for a in job.attempts if a.number != attempt.number)
        return self._save(replace(job, attempts=kept))

    def _launch_gang(self, job: Job, decision: Launch, attempt: Attempt) -> Job:
        """Start the attempt's gang, all or none (:meth:`Launcher.launch_gang`). A launcher
        that gives fewer nodes than asked, or fails after starting some, leaves no node
        running: every instance the provider lists for the attempt is terminated, and the
        attempt is a refused launch, so recovery tries again (elsewhere)."""
        spec = job.spec.launch_spec()
        try:
            handles = tuple(
                self._through_throttling(
                    lambda: self.launcher.launch_gang(decision.offer, spec, decision.number)
                )
            )
        except ThrottledError as exc:
            self._end_partial_gang(job, attempt, ())
            return self._throttled(job, decision, attempt, exc)
        except CostguardError as exc:
            self._end_partial_gang(job, attempt, ())
            capacity = isinstance(exc, CapacityError)
            detail = f"{exc.code}: {exc.message}" if isinstance(exc, CapacityError) else exc.message
            refused = replace(
                attempt,
                ended_unix=self._clock(),
                outcome=AttemptOutcome.LAUNCH_FAILED if capacity else AttemptOutcome.FAILED,
                detail=detail,
            )
            if capacity:
                self._emit("refused", f"{decision.offer.place}: {exc.message}")
                return self._save(job.with_attempt(refused))
            job = job.with_attempt(refused)
            return self.finish(job, Finish("failed", f"launch failed: {exc.message}"))
        self._launched.update(h.instance_id for h in handles)
        if len(handles) != spec.nodes:
            self._end_partial_gang(job, attempt, handles)
            text = f"the launcher started {len(handles)} of {spec.nodes} nodes: none kept"
            self._emit("refused", f"{decision.offer.place}: {text}")
            refused = replace(
                attempt,
                ended_unix=self._clock(),
                outcome=AttemptOutcome.LAUNCH_FAILED,
                detail=text,
            )
            return self._save(job.with_attempt(refused))
        launched = replace(attempt, handle=handles[0], nodes=handles)
        ids = ", ".join(h.instance_id for h in handles)
        self._emit(
            "launch",
            f"attempt {decision.number}: {spec.nodes} x {decision.offer.instance_type} "
            f"{decision.offer.market.value} in {decision.offer.place} at "
            f"{spec.nodes} x ${decision.offer.usd_per_hour}/h as {ids} ({decision.reason})",
        )
        return self._save(job.with_attempt(launched))

    def _end_partial_gang(self, job: Job, attempt: Attempt, handles: Sequence[Handle]) -> None:
        """Terminate every node of a gang that did not start whole: those the launcher
        returned, and those the provider lists for the attempt (proven the job's), so no
        node is left running or billed; each node is tried, and any the provider did not
        confirm ending is said, with what to do (never left unsaid)."""
        tried: set[str] = set()
        ended: list[str] = []
        left: list[str] = []

        def end(handle: Handle) -> None:
            tried.add(handle.instance_id)
            try:
                self.launcher.terminate(handle)
            except CostguardError as exc:
                hint = f" ({exc.hint})" if exc.hint else ""
                left.append(f"{handle.instance_id}: {exc.message}{hint}")
            else:
                ended.append(handle.instance_id)

        for handle in handles:
            end(handle)
        try:
            listed = self.launcher.find(job.spec.job_id)
        except CostguardError as exc:
            left.append(f"the attempt's nodes could not be listed: {exc.message}")
            listed = []
        for found in listed:
            if found.instance_id in tried or found.extra.get("attempt") != str(attempt.number):
                continue
            if self._owners(job, found):
                end(found)
        if ended:
            self._emit("cleanup", f"terminated {', '.join(sorted(ended))}: the gang was not whole")
        if left:
            self._emit("cleanup", f"not terminated, may still bill: {'; '.join(left)}")

    def _launched_anyway(self, job: Job, attempt: Attempt) -> Handle | None:
        """The instance of a launch that raised: what failed may be the answer, not the
        launch (a timeout or a 503 after the provider acted), so the attempt is asked for
        again by its token (:meth:`_resume`); ``None`` when there is none to be had."""
        try:
            current = self._resume(job, attempt).current
        except CostguardError:
            return None
        return current.handle if current is not None else None

    def finish(self, job: Job, decision: Finish) -> Job:
        """Terminate what still runs and write the final state."""
        current = job.current
        if current is not None:
            for handle in current.instances:
                self._terminate(job, handle)
            job = job.with_attempt(
                replace(
                    current,
                    ended_unix=self._clock(),
                    outcome=AttemptOutcome.STOPPED,
                    detail=f"terminated by costguard: {decision.reason}",
                )
            )
        job = replace(job, status=decision.status, reason=decision.reason)
        self._release(job)
        self._emit("done" if decision.status == "succeeded" else decision.status, decision.reason)
        clear_stop(self.store)  # acted upon: no later run of the job reads it
        return self._save(job)

    def _release(self, job: Job) -> None:
        """Delete what the launcher made for a gang besides its nodes (its security group or
        firewall rule, placement group, launch templates) once the job is over; what is
        left (still in use after the launcher's bounded wait) is said, never fatal: the
        job's state must still be written."""
        if job.spec.nodes <= 1:
            return
        try:
            self.launcher.release(job.spec.launch_spec())
        except CostguardError as exc:
            hint = f" ({exc.hint})" if exc.hint else ""
            self._emit("cleanup", f"not released: {exc}{hint}")

    # -- the projection ------------------------------------------------------------------

    def watch_projection(self, job: Job) -> Job:
        """Act on the projected total of a running job with --max-total: warn once when it
        passes the limit; with --stop-at-projection, ask the script to save and stop (the
        job then ends ``stopped``, its checkpoint committed, before the money is spent)."""
        from costguard.checkpoint.pace import read_pace
        from costguard.money import duration
        from costguard.spot.projection import of_job

        cap = job.spec.max_total_usd
        if cap is None or job.current is None or job.stop_requested:
            return job
        now = self._clock()
        try:
            projection = of_job(job, read_pace(self.store), now)
        except CostguardError:
            return job  # no pace to read now: the hard limit still holds
        total = projection.projected_total_usd if projection is not None else None
        if projection is None or total is None or total <= cap:
            return job
        text = (
            f"projected total ${total:.2f} passes --max-total ${cap} (step "
            f"{projection.steps_done} of {projection.total_steps} at "
            f"{projection.seconds_per_step:.3g} s/step, {duration(projection.left_s)} left)"
        )
        if not job.spec.stop_at_projection:
            if not self._warned_projection:
                self._warned_projection = True
                self._emit(
                    "projection",
                    f"{text}; it will stop when the money is spent (--stop-at-projection "
                    "saves and stops now)",
                )
            return job
        reason = f"stopped at the projection: {text}"
        request_stop(self.store, job.spec.job_id, job.current.number, reason, now)
        self._emit("projection", f"{text}: asking the script to save and stop")
        return self._save(replace(job, stop_requested=reason, stop_requested_unix=now))

    # -- the loop -----------------------------------------------------------------------

    def run(self, job: Job) -> Job:
        """Supervise ``job`` until it is over; returns its final state."""
        if job.status in FINAL:
            return job
        job = self.adopt(job)
        started = time.monotonic()
        last_write = time.monotonic()
        limits = job.spec.limits()
        while True:
            job = self._stop_asked(job)
            job = self.reconcile(job)
            if job.stop_requested and (
                job.current is None or self._clock() - job.stop_requested_unix > STOP_GRACE_S
            ):
                return self.finish(job, Finish("stopped", job.stop_requested))
            decision = self.decide(job, limits)
            if isinstance(decision, Finish):
                return self.finish(job, decision)
            timeout = Finish("stopped", f"the controller's timeout of {self.timeout_s:.0f} s")
            if isinstance(decision, Launch):
                job = self.launch(job, decision)
                last_write = time.monotonic()
                if job.status in FINAL:
                    return job
                if job.current is None:  # refused or throttled: do not hammer the provider
                    if time.monotonic() - started > self.timeout_s:
                        return self.finish(job, timeout)
                    self._sleep(self.poll_s)
                continue
            if time.monotonic() - started > self.timeout_s:
                return self.finish(job, timeout)
            if time.monotonic() - last_write > HEARTBEAT_S:
                job = self._save(job)
                last_write = time.monotonic()
            assert isinstance(decision, Wait)
            job = self.watch_projection(job)
            self._sleep(self.poll_s)


def _node_rank(handle: Handle) -> int:
    """The node rank a launcher noted in a gang node's handle (``extra["node"]``)."""
    text = handle.extra.get("node", "")
    return int(text) if text.isdigit() and len(text) <= 6 else 0


def _label(owner: str) -> str:
    """The owner as a GCP label value holds it."""
    from costguard.spot.launcher.gcp import label_value

    return label_value(owner)


def _disk_usd_per_month(handle: Handle, disk_gb: int) -> Decimal | None:
    """What ``disk_gb`` of the provider's block storage costs a month in the handle's
    region, at the bundled tables' first (cheapest) rate; ``None`` when they have none
    or price it per disk."""
    from costguard.pricing.tables import load_catalog

    rates = load_catalog().storage_rates(handle.provider, handle.region, "block")
    if not rates or rates[0].unit == "disk-month":
        return None
    size = Decimal(disk_gb)
    return rates[0].usd * (gb_to_gib(size) if rates[0].unit.startswith("GiB") else size)


# -- the report ----------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """What the job did and cost."""

    status: str
    reason: str
    attempts: int
    preemptions: int
    failures: int
    wall_s: float
    running_s: float
    lost_s: float
    lost_steps: int | None
    last_step: int | None
    spent_usd: Decimal
    estimate_usd: Decimal | None
    on_demand_usd: Decimal | None
    spot_usd_per_hour: Decimal | None
    #: ``--nodes``: the instances of each attempt (a gang's, relaunched whole).
    nodes: int = 1

    @property
    def relaunches(self) -> int:
        """Attempts launched after the first (each a whole gang's, for ``--nodes``)."""
        return max(0, self.attempts - 1)

    @property
    def overhead_s(self) -> float:
        """Wall time not spent running an attempt, plus work redone after kills."""
        return max(0.0, self.wall_s - self.running_s) + self.lost_s


def summarise(job: Job, offers: Sequence[Offer], now_unix: float) -> Summary:
    """The figures ``costguard launch`` and ``costguard jobs status`` print. Pure.

    ``estimate_usd``: the first offer's price times ``--hours`` (when given), times the
    gang's nodes; ``on_demand_usd``: the same instance-hours at the cheapest on-demand
    offer.
    """
    attempts = job.attempts
    ends = [a.ended_unix if a.ended_unix is not None else now_unix for a in attempts]
    # Never negative: job.json's times are untrusted, and two controllers' clocks differ.
    wall_s = max(0.0, max(ends) - job.spec.created_unix) if attempts else 0.0
    running_s = sum(
        max(0.0, end - a.launched_unix)
        for a, end in zip(attempts, ends, strict=True)
        if a.outcome is not AttemptOutcome.LAUNCH_FAILED
    )
    # Instance-hours: a gang's attempt bills each of its nodes.
    hours = sum((a.hours(now_unix) * a.node_count for a in attempts), Decimal(0))
    interrupted = [a for a in attempts if a.outcome in INTERRUPTIONS]
    lost_steps: int | None = 0
    for attempt in interrupted:
        if attempt.lost_steps is None:
            lost_steps = None
            break
        lost_steps = (lost_steps or 0) + attempt.lost_steps
    on_demand = [o.usd_per_hour for o in offers if o.market is Market.ON_DEMAND]
    spot = [o.usd_per_hour for o in offers if o.market is Market.SPOT]
    first = attempts[0].offer.usd_per_hour if attempts else None
    hours_asked = job.spec.hours
    estimate = first * hours_asked * job.spec.nodes if first is not None and hours_asked else None
    steps = [a.last_step for a in attempts if a.last_step is not None]
    return Summary(
        status=job.status,
        reason=job.reason,
        attempts=sum(1 for a in attempts if a.outcome is not AttemptOutcome.LAUNCH_FAILED),
        preemptions=interruptions(attempts),
        failures=sum(1 for a in attempts if a.outcome is AttemptOutcome.FAILED),
        wall_s=wall_s,
        running_s=running_s,
        lost_s=sum(a.lost_s for a in interrupted),
        lost_steps=lost_steps,
        last_step=steps[-1] if steps else None,
        spent_usd=spent_usd(attempts, now_unix),
        estimate_usd=estimate,
        on_demand_usd=min(on_demand) * hours if on_demand else None,
        spot_usd_per_hour=min(spot) if spot else None,
        nodes=job.spec.nodes,
    )


def handle_label(handle: Handle | None) -> str:
    """An instance for a table cell (its region and zone are in the place column).

    >>> handle_label(Handle("aws", "us-east-1", "i-0abc", zone="us-east-1a"))
    'i-0abc'
    """
    if handle is None:
        return "-"
    return handle.instance_id


def instances_label(attempt: Attempt) -> str:
    """An attempt's instances for a table cell: a gang's nodes in rank order.

    >>> from costguard.spot.recovery import Offer, Market
    >>> o = Offer("aws", "r", "t", Market.SPOT, Decimal(1), "A10G", 1)
    >>> nodes = (Handle("aws", "r", "i-1"), Handle("aws", "r", "i-2"))
    >>> instances_label(Attempt(1, o, 0.0, handle=nodes[0], node_count=2, nodes=nodes))
    'i-1 i-2'
    """
    if attempt.node_count > 1 and attempt.nodes:
        return " ".join(handle_label(h) for h in attempt.nodes)
    return handle_label(attempt.handle)


def terminate_quietly(launcher: Launcher, handle: Handle) -> None:
    """Best-effort terminate, for cleanup paths that are already failing."""
    with contextlib.suppress(CostguardError):
        launcher.terminate(handle)
