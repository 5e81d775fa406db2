"""``costguard launch --array``: one controller supervising every task of an array.

Each task is a job of its own (``job/job.json`` under ``URL/task-<index>``), with its own
launcher, relaunches after its preemptions and ``--max-failures``: the sweep runs one
round of :class:`~costguard.spot.controller.Controller`'s loop (reconcile, decide, act)
for each running task at each poll, so a task recovers exactly as a single job does.
Around them it decides (:mod:`costguard.spot.array`, pure) which pending task starts
next (at most the concurrency at once) and keeps one budget: ``--max-total`` counts what
every task spent plus the projection of the running ones; no task starts past it, each
task's own recovery limit is the cap less what the others spent (so the running ones stop
within a poll of the cap), and with ``--stop-at-projection`` the running tasks are asked
to save and stop once the projection passes it. A stop request at the array's URL
(``costguard jobs stop``) stops every task the same way.

Like the controller it is stateless: the array's record and every task's ``job.json``
are all it needs, so ``costguard launch --attach URL`` takes a sweep over.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from costguard import contract, proof
from costguard.errors import CostguardError
from costguard.spot import array
from costguard.spot.controller import HEARTBEAT_S, STOP_GRACE_S, Controller, Event, summarise
from costguard.spot.job import (
    FINAL,
    JOB_FILE,
    Job,
    clear_stop,
    job_doc,
    load_job,
    parse_job,
    request_stop,
    save_job,
    sign_spec,
)
from costguard.spot.projection import USD_PLACES
from costguard.spot.recovery import Finish, Launch, spent_usd

if TYPE_CHECKING:
    from costguard.checkpoint.pace import Pace
    from costguard.checkpoint.store import Store
    from costguard.spot.job import JobSpec
    from costguard.spot.launcher.base import Handle, Launcher, Offer, Status

logger = logging.getLogger(__name__)

#: A task stopped before its first attempt says so in its reason, and the roll-up shows it
#: as ``not started``.
NOT_STARTED = "not started"


def task_state(job: Job) -> str:
    """``pending`` (no attempt yet, not stopped), ``running``, or the job's final status."""
    if job.status in FINAL:
        return job.status
    return array.RUNNING if job.attempts else array.PENDING


def rollup_status(job: Job) -> str:
    """The status the roll-up prints: :func:`task_state`, or ``not started`` for a task
    stopped before its first attempt."""
    if job.status == "stopped" and not job.attempts:
        return NOT_STARTED
    return task_state(job)


def task_specs(template: JobSpec, record: array.ArrayRecord) -> list[JobSpec]:
    """Each task's spec: the template's, with the task's job id and checkpoint prefix, no
    cap of its own (the array's is kept by the sweep) and, simulated, its own schedule of
    preemptions (the seed plus its index) and its own metadata port (chosen at its start).
    ``COSTGUARD_ARRAY_TASK_ID`` is in its recorded environment when the template has one;
    otherwise the launcher's environment carries it (the CLI's ``make_launcher``), and on
    a cloud the boot script exports it (the task's :meth:`~JobSpec.launch_spec` reads its
    index from its job id and prefix).
    """
    specs = []
    for index in record.indexes:
        sim = template.simulation
        if sim is not None:
            seed = None if sim.seed is None else sim.seed + index
            sim = replace(sim, seed=seed, metadata_port=0)
        environment = dict(template.environment)
        if environment:  # a recorded environment is the whole of it: the index goes in
            environment[contract.ENV_ARRAY_TASK_ID] = str(index)
        specs.append(
            replace(
                template,
                job_id=array.task_job_id(record.array_id, index),
                checkpoint_url=array.task_url(record.url, index),
                max_total_usd=None,
                stop_at_projection=False,
                simulation=sim,
                environment=environment,
            )
        )
    return specs


@dataclass
class Task:
    """One task under the sweep: its store and job, and while it runs its launcher."""

    index: int
    store: Store
    job: Job
    launcher: Launcher | None = None
    controller: Controller | None = None
    last_write: float = field(default_factory=time.monotonic)
    #: Its pace as the roll-up holds it, where that is its ``pace.json`` byte for byte.
    pace_copy: Pace | None = None

    @property
    def state(self) -> str:
        return task_state(self.job)


class Sweep:
    """Supervises every task of an array until each is over."""

    def __init__(
        self,
        record: array.ArrayRecord,
        store: Store,
        tasks: Sequence[Task],
        offers: Sequence[Offer],
        make_launcher: Callable[[JobSpec], Launcher],
        *,
        task_estimate_usd: Decimal,
        poll_s: float = 10.0,
        timeout_s: float = 7 * 24 * 3600.0,
        on_event: Callable[[Event], None] | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        launch_interval_s: float = 0.0,
        owner: str | None = None,
    ) -> None:
        self.record = record
        self.store = store
        self.tasks = list(tasks)
        self.offers = tuple(offers)
        self.make_launcher = make_launcher
        self.task_estimate_usd = task_estimate_usd
        self.poll_s = poll_s
        self.timeout_s = timeout_s
        self._on_event = on_event
        self._clock = clock
        self._sleep = sleep
        #: The most tasks seen running at once (the report, and the tests, read it).
        self.peak_running = 0
        self._rolled_up: tuple[tuple[int, Job], ...] = ()
        self._paces: dict[int, str] = {}
        self._paces_read = float("-inf")
        self._rolled_up_states: tuple[tuple[int, str], ...] = ()
        self._rollup_written = float("-inf")
        self._said: set[str] = set()
        #: The least time between two launches of the array's tasks, first launches and
        #: relaunches alike (:data:`costguard.spot.array.LAUNCH_INTERVAL_S`), and when the
        #: last one was sent (this sweep's clock).
        self.launch_interval_s = launch_interval_s
        self._last_launch: float | None = None
        #: The user the tasks' controllers act for (``Controller(owner=...)``).
        self.owner = owner

    def _emit(self, kind: str, message: str) -> None:
        logger.info("costguard launch --array: %s: %s", kind, message)
        if self._on_event is not None:
            self._on_event(Event(kind, message))

    def _once(self, kind: str, message: str) -> None:
        """Say ``message`` only the first time something of ``kind`` is said (the figures
        in it change from poll to poll)."""
        if kind not in self._said:
            self._said.add(kind)
            self._emit(kind, message)

    def _controller(self, task: Task) -> Controller:
        """The task's controller, its launcher made on first need (a simulated task binds
        its metadata port then, recorded in its spec for ``--attach``)."""
        if task.controller is not None:
            return task.controller
        from costguard.spot.launcher.local import LocalLauncher

        launcher = self.make_launcher(task.job.spec)
        task.launcher = launcher
        sim = task.job.spec.simulation
        if (
            isinstance(launcher, LocalLauncher)
            and sim is not None
            and sim.metadata_port != launcher.emulator.port
        ):
            port = launcher.emulator.port
            spec = replace(task.job.spec, simulation=replace(sim, metadata_port=port))
            key = proof.user_key()  # still this user's spec: signed again, as launch signs
            task.job = save_job(
                task.store, replace(task.job, spec=spec if key is None else sign_spec(spec, key))
            )

        def say(event: Event, index: int = task.index) -> None:
            self._emit(event.kind, f"task {index}: {event.message}")

        task.controller = Controller(
            task.store,
            launcher,
            self.offers,
            poll_s=self.poll_s,
            timeout_s=self.timeout_s,
            on_event=say,
            clock=self._clock,
            sleep=self._sleep,
            owner=self.owner,
        )
        return task.controller

    def _release(self, task: Task) -> None:
        if task.launcher is not None:
            task.launcher.close()
        task.launcher = task.controller = None

    def views(self, now: float) -> list[array.TaskView]:
        """What the decisions read of every task now: its state, and with ``--max-total``
        (only the cap reads them) what it spent and, running, its projection from its
        recorded pace, when it has one."""
        from costguard.checkpoint.pace import read_pace_or_warn
        from costguard.spot.projection import of_job

        if self.record.max_total_usd is None:
            return [array.TaskView(task.index, task.state) for task in self.tasks]
        views = []
        for task in self.tasks:
            projected = None
            if task.state == array.RUNNING and task.job.spec.total_steps is not None:
                try:
                    found = of_job(task.job, read_pace_or_warn(task.store), now)
                except CostguardError:
                    found = None
                projected = found.projected_total_usd if found is not None else None
            views.append(
                array.TaskView(task.index, task.state, spent_usd(task.job.attempts, now), projected)
            )
        return views

    # -- one task's round -----------------------------------------------------------------

    def _poll(self) -> dict[int, list[Status]]:
        """What the provider says of every running task's instances, by task index: one
        :meth:`~costguard.spot.launcher.base.Launcher.statuses` call per launcher (a
        cloud's one launcher serves every task: one describe for all of them, not one per
        task; a local task's launcher holds its own processes)."""
        asked: dict[int, tuple[Launcher, list[tuple[int, tuple[Handle, ...]]]]] = {}
        for task in self.tasks:
            current = task.job.current
            if task.state != array.RUNNING or current is None or not current.instances:
                continue
            launcher = self._controller(task).launcher
            asked.setdefault(id(launcher), (launcher, []))[1].append(
                (task.index, current.instances)
            )
        polled: dict[int, list[Status]] = {}
        for launcher, owned in asked.values():
            said = iter(launcher.statuses([h for _, handles in owned for h in handles]))
            for index, handles in owned:
                polled[index] = [next(said) for _ in handles]
        return polled

    def _round(
        self,
        task: Task,
        views: Sequence[array.TaskView],
        statuses: Sequence[Status] | None = None,
    ) -> None:
        """One round of the controller's loop for ``task``, its recovery limit the array's
        cap less what the other tasks spent (a relaunch follows a single job's rule: not
        when one more hour at its price would pass that share); ``statuses``: what
        :meth:`_poll` read of its instances."""
        controller = self._controller(task)
        # A pending task's first launch was decided by the array's rule (its estimate
        # within the cap: :func:`array.to_start`); after that the task's own recovery rules
        # hold it to its share, relaunches included.
        share = array.remaining_usd(views, task.index, self.record.max_total_usd)
        first = task.state == array.PENDING
        job = controller.reconcile(task.job, statuses)
        limits = replace(job.spec.limits(), max_total_usd=None if first else share)
        if job.stop_requested and (
            job.current is None or self._clock() - job.stop_requested_unix > STOP_GRACE_S
        ):
            job = controller.finish(job, Finish("stopped", job.stop_requested))
        else:
            decision = controller.decide(job, limits)
            if isinstance(decision, Finish):
                if decision.status == "stopped" and self.record.max_total_usd is not None:
                    decision = Finish("stopped", f"the array's --max-total: {decision.reason}")
                job = controller.finish(job, decision)
            elif isinstance(decision, Launch):
                self._pace()
                job = controller.launch(job, decision)
                task.last_write = time.monotonic()
            elif time.monotonic() - task.last_write > HEARTBEAT_S:
                job = save_job(task.store, job)
                task.last_write = time.monotonic()
        task.job = job
        if task.state in FINAL:
            self._release(task)

    def _pace(self) -> None:
        """Wait until the launch interval has passed since the array's last launch (the
        provider's request limits: a sweep of many tasks must not send its launches at
        once; each launch's own throttling answers are the controller's to back off)."""
        now = self._clock()
        wait = array.launch_wait_s(self._last_launch, now, self.launch_interval_s)
        if wait > 0:
            self._sleep(wait)
            now += wait
        self._last_launch = now

    # -- the array's decisions ------------------------------------------------------------

    def _stop_all(self, reason: str) -> None:
        """Ask every running task to save and stop, and stop the pending ones unstarted."""
        now = self._clock()
        for task in self.tasks:
            current = task.job.current
            if task.state == array.PENDING:
                self._not_started(task, reason)
            elif task.state == array.RUNNING and current is None:  # between two attempts
                task.job = self._controller(task).finish(task.job, Finish("stopped", reason))
                self._release(task)
            elif current is not None and not task.job.stop_requested:
                request_stop(task.store, task.job.spec.job_id, current.number, reason, now)
                task.job = save_job(
                    task.store, replace(task.job, stop_requested=reason, stop_requested_unix=now)
                )

    def _not_started(self, task: Task, reason: str) -> None:
        task.job = save_job(
            task.store, replace(task.job, status="stopped", reason=f"{NOT_STARTED}: {reason}")
        )
        self._release(task)

    def _stop_requested(self) -> str | None:
        """The reason of a stop request for the whole array (``costguard jobs stop``), signed
        with the array's key; ``None`` when there is none."""
        key = proof.user_key()
        array_id = self.record.array_id
        check = None if key is None else proof.stop_check(proof.job_key(key, array_id), array_id, 1)
        return proof.stop_request(self.store, array_id, 1, check)

    def _watch_budget(self, views: Sequence[array.TaskView]) -> None:
        """With ``--max-total``: say once when the projection passes it; with
        ``--stop-at-projection`` stop every task (saved) then."""
        cap = self.record.max_total_usd
        if cap is None:
            return
        committed = array.committed_usd(views)
        if committed <= cap or not any(v.state == array.RUNNING for v in views):
            return
        text = (
            f"the array's projected total ${committed:.2f} (spent, and projected for the "
            f"running tasks) passes --max-total ${cap}"
        )
        if self.record.stop_at_projection:
            self._once("projection", f"{text}: asking every running task to save and stop")
            self._stop_all(f"stopped at the projection: {text}")
        else:
            self._once(
                "projection",
                f"{text}; tasks stop when the money is spent (--stop-at-projection saves "
                "and stops them now)",
            )

    def _start_next(self, views: Sequence[array.TaskView]) -> None:
        starts = array.to_start(
            views, self.record.concurrency, self.record.max_total_usd, self.task_estimate_usd
        )
        by_index = {t.index: t for t in self.tasks}
        for index in starts.indexes:
            task = by_index[index]
            self._round(task, views)
            if task.state == array.PENDING:
                # Its launch was throttled (no attempt counted): the provider asked for
                # fewer requests, so the others wait for the next poll too.
                text = f"task {index}'s launch was throttled: the others wait a poll"
                self._once("throttled", text)
                break
        if starts.held:
            if any(t.state == array.RUNNING for t in self.tasks):
                self._once("held", f"not starting more tasks: {starts.held}")
            else:  # nothing runs that could free the budget: they will not start
                for task in self.tasks:
                    if task.state == array.PENDING:
                        self._not_started(task, starts.held)
                self._emit("stopped", f"tasks left unstarted: {starts.held}")

    # -- the loop -----------------------------------------------------------------------

    def run(self) -> list[Job]:
        """Supervise every task until each is over; returns their final jobs."""
        for task in self.tasks:
            if task.state == array.RUNNING:
                task.job = self._controller(task).adopt(task.job)
        started = time.monotonic()
        try:
            while True:
                views = self.views(self._clock())
                polled = self._poll()
                for task in self.tasks:
                    if task.state == array.RUNNING:
                        self._round(task, views, polled.get(task.index))
                reason = self._stop_requested()
                if reason is not None:
                    self._once("stop", f"stop requested for the whole array: {reason}")
                    self._stop_all(reason)
                views = self.views(self._clock())
                self._watch_budget(views)
                self._start_next(views)
                self._write_rollup()
                running = sum(1 for t in self.tasks if t.state == array.RUNNING)
                self.peak_running = max(self.peak_running, running)
                if all(t.state in FINAL for t in self.tasks):
                    break
                if time.monotonic() - started > self.timeout_s:
                    self._timeout()
                    break
                self._sleep(self.poll_s)
        finally:
            for task in self.tasks:
                self._release(task)
            self._write_rollup(at_end=True)
        if reason is not None:
            clear_stop(self.store)  # acted upon: a later attach must not read it again
        return [t.job for t in self.tasks]

    def _write_rollup(self, *, at_end: bool = False) -> None:
        """Store the roll-up when a task's state changed since it was last stored, and
        otherwise at most once a heartbeat when a task's job or pace did (every running
        task's heartbeat changes its job: a big array's roll-up is not rewritten each
        poll), and ``at_end``. A copy that lags costs ``jobs status`` a read of that
        record, as a store that refuses the roll-up does."""
        from costguard.checkpoint.pace import PACE_BYTES

        states = tuple((t.index, t.state) for t in self.tasks)
        due = time.monotonic() - self._rollup_written >= HEARTBEAT_S
        if not (at_end or due or states != self._rolled_up_states):
            return
        jobs = tuple((t.index, t.job) for t in self.tasks)

        paces = self._paces
        if not self.store.is_local and time.monotonic() - self._paces_read >= HEARTBEAT_S:
            # A running task's pace, read as often as its job.json is written: the copy
            # spares status a GET until the task next records its pace (a store on this
            # machine lists no MD5: no copy is of use there).
            paces = {}
            for task in self.tasks:
                if task.state == array.RUNNING:
                    with contextlib.suppress(CostguardError, OSError):
                        data = task.store.get(contract.PACE_FILE, PACE_BYTES)
                        # Not UTF-8: a copy whose MD5 matches none, never used.
                        paces[task.index] = data.decode(errors="replace")
            self._paces_read = time.monotonic()
        if jobs == self._rolled_up and paces == self._paces:
            return
        try:
            write_rollup(self.store, self.record.array_id, jobs, paces)
        except (CostguardError, OSError) as exc:
            logger.warning("the array's roll-up was not stored: %s", exc)
            return
        self._rolled_up, self._paces, self._rolled_up_states = jobs, paces, states
        self._rollup_written = time.monotonic()

    def _timeout(self) -> None:
        why = f"the controller's timeout of {self.timeout_s:.0f} s"
        for task in self.tasks:
            if task.state == array.RUNNING:
                controller = self._controller(task)
                task.job = controller.finish(task.job, Finish("stopped", why))
                self._release(task)
            elif task.state == array.PENDING:
                self._not_started(task, why)


# -- reading an array -----------------------------------------------------------------


#: How many of an array's task records are read at once (``jobs status`` of 1,000 tasks
#: on S3 is 1,000 GETs of job.json and one of each running task's pace: in series, a round
#: trip each), within the 10 connections s3fs's client keeps to a host.
READ_WORKERS = 8


def _each(items: Sequence[int], read: Callable[[int], Any], workers: int) -> list[Any]:
    """``read(item)`` of every item, ``workers`` at a time, in the items' order: a
    :class:`CostguardError` is given back in its item's place, for the caller to judge."""
    from costguard.workers import worker_pool

    def guarded(item: int) -> Any:
        try:
            return read(item)
        except CostguardError as exc:
            return exc

    if workers <= 1 or len(items) <= 1:
        return [guarded(item) for item in items]
    with worker_pool(min(workers, len(items)), "costguard-array") as pool:
        return list(pool.map(guarded, items))


def rollup_copy(job: Job) -> str:
    """The text of ``job.json`` as :func:`~costguard.spot.job.save_job` wrote ``job``
    (the same writer: what it returned is what it stored)."""
    return contract.dump(job_doc(job), contract.JOB, JOB_FILE).decode()


def write_rollup(
    store: Store,
    array_id: str,
    jobs: Iterable[tuple[int, Job]],
    paces: Mapping[int, str] | None = None,
) -> None:
    """Store the roll-up: a copy of each task's ``job.json``, and of the ``pace.json``
    texts in ``paces`` (:data:`contract.ROLLUP`)."""
    paces = paces or {}
    doc = {
        "version": contract.VERSION,
        "array_id": array_id,
        "tasks": [
            {"index": i, "job": rollup_copy(job), "pace": paces.get(i, "")} for i, job in jobs
        ],
    }
    contract.write(store, contract.ROLLUP_FILE, contract.ROLLUP, doc)


def _copies(base: Store, record: array.ArrayRecord) -> tuple[dict[int, Job], dict[int, Pace]]:
    """The tasks' jobs the roll-up holds the very bytes of: a copy whose MD5 is the one
    the store lists for that task's ``job.json`` (the roll-up is trusted for nothing: a
    forged or stale copy differs from the record and is not used; the record is read).
    None when the roll-up is missing, not costguard's, of another array, or the store
    lists no MD5."""
    import hashlib

    from costguard.checkpoint.pace import parse_pace

    try:
        doc = contract.read(base, contract.ROLLUP_FILE, contract.ROLLUP, contract.ROLLUP_BYTES)
    except CostguardError as exc:
        logger.debug("%s", exc)
        return {}, {}
    if doc is None or doc["array_id"] != record.array_id:
        return {}, {}
    digests = base.digests()
    wanted = set(record.indexes)

    def same(index: int, path: str, data: bytes) -> bool:
        # MD5 because the store lists it; forging a copy means finding other bytes of the
        # same MD5 as a record already there (a second preimage, out of reach), and one
        # who can write the record itself gains nothing from the copy.
        listed = digests.get(f"{array.task_name(index)}/{path}")
        return listed is not None and hashlib.md5(data).hexdigest() == listed  # noqa: S324

    jobs, paces = {}, {}
    for task in doc["tasks"]:
        index, data, pace = task["index"], task["job"].encode(), task["pace"].encode()
        if index not in wanted or not same(index, JOB_FILE, data):
            continue
        try:
            jobs[index] = parse_job(data, array.task_url(record.url, index))
        except CostguardError:
            continue  # read from its record, which says what is wrong with it
        found = parse_pace(pace) if pace and same(index, contract.PACE_FILE, pace) else None
        if found is not None:
            paces[index] = found
    return jobs, paces


def load_tasks(
    record: array.ArrayRecord, *, skip_bad: bool = False, workers: int = READ_WORKERS
) -> list[Task]:
    """Every task's job (its ``job.json`` under its prefix), ``workers`` read at once. A
    task whose record is missing or not costguard's is an error naming it (the sweep
    cannot supervise it), or with ``skip_bad`` (a report) named in a warning and left
    out."""
    from costguard.spot.prepare import open_store

    base = open_store(record.url)  # one filesystem, its connections, for every task
    copies, paces = _copies(base, record)

    def load(index: int) -> Task:
        task_store = base.child(array.task_name(index))
        copy = copies.get(index)
        job = copy if copy is not None else load_job(task_store)
        return Task(index, task_store, job, pace_copy=paces.get(index))

    tasks = []
    for found in _each(record.indexes, load, workers):
        if not isinstance(found, CostguardError):
            tasks.append(found)
        elif skip_bad:
            contract.warn(found)
        else:
            raise found
    return tasks


def as_one_job(record: array.ArrayRecord, tasks: Sequence[Task]) -> Job:
    """The array as one job, for what sums a job's attempts (``costguard spend --job``'s
    reconciliation): every task's attempts, renumbered in launch order, under the
    array's id and its first task's spec, with ``--hours`` counted once per task (its
    estimate prices every task)."""
    first = tasks[0].job.spec
    attempts = sorted((a for t in tasks for a in t.job.attempts), key=lambda a: a.launched_unix)
    hours = None if first.hours is None else first.hours * len(tasks)
    spec = replace(first, job_id=record.array_id, checkpoint_url=record.url, hours=hours)
    numbered = tuple(replace(a, number=n) for n, a in enumerate(attempts, start=1))
    finished = all(t.job.status in FINAL for t in tasks)
    return Job(spec, numbered, status="succeeded" if finished else "running")


@dataclass(frozen=True)
class TaskRow:
    """One task in the roll-up (``jobs status``, the launch's final report)."""

    index: int
    status: str
    attempts: int
    preemptions: int
    failures: int
    step: int | None
    spent_usd: Decimal
    projected_usd: Decimal | None
    #: Seconds to its last step at its measured pace (running, with --total-steps).
    left_s: float | None
    reason: str
    job_id: str
    checkpoint_url: str

    def document(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "status": self.status,
            "attempts": self.attempts,
            "preemptions": self.preemptions,
            "failures": self.failures,
            "step": self.step,
            "cost_usd": str(self.spent_usd.quantize(USD_PLACES)),
            "projected_usd": None
            if self.projected_usd is None
            else str(self.projected_usd.quantize(USD_PLACES)),
            "left_s": self.left_s,
            "reason": self.reason,
            "job_id": self.job_id,
            "checkpoint_url": self.checkpoint_url,
        }


def rows(
    url: str,
    jobs: Iterable[tuple[int, Job]],
    now: float,
    *,
    workers: int = READ_WORKERS,
    paces: Mapping[int, Pace] | None = None,
) -> list[TaskRow]:
    """The roll-up's rows, one per task of the array at ``url`` (the projection read from
    each running task's pace, at the task's own prefix, ``workers`` at once, or taken from
    ``paces``: the roll-up's copies proven to be those records)."""
    from costguard.checkpoint.pace import read_pace_or_warn
    from costguard.spot.prepare import open_store
    from costguard.spot.projection import of_job

    listed = list(jobs)
    running = [i for i, (_, job) in enumerate(listed) if task_state(job) == array.RUNNING]
    base = open_store(url) if running else None

    def project(at: int) -> Any:
        assert base is not None
        index, job = listed[at]
        copy = (paces or {}).get(index)
        pace = copy if copy is not None else read_pace_or_warn(base.child(array.task_name(index)))
        return of_job(job, pace, now)

    projections = dict(zip(running, _each(running, project, workers), strict=True))
    out = []
    for at, (index, job) in enumerate(listed):
        summary = summarise(job, (), now)
        projection = projections.get(at)
        if isinstance(projection, CostguardError):  # its pace unreadable: no projection
            projection = None
        out.append(
            TaskRow(
                index=index,
                status=rollup_status(job),
                attempts=summary.attempts,
                preemptions=summary.preemptions,
                failures=summary.failures,
                step=summary.last_step,
                spent_usd=summary.spent_usd,
                projected_usd=projection.projected_total_usd if projection else None,
                left_s=projection.left_s if projection else None,
                reason=job.reason,
                job_id=job.spec.job_id,
                checkpoint_url=job.spec.checkpoint_url,
            )
        )
    return out


def rollup_document(record: array.ArrayRecord, task_rows: Sequence[TaskRow]) -> dict[str, Any]:
    """``jobs status URL --format json`` of an array: ``{"tasks": [...], ...}``."""
    counts: dict[str, int] = {}
    for row in task_rows:
        counts[row.status] = counts.get(row.status, 0) + 1
    spent = sum((r.spent_usd for r in task_rows), Decimal(0))
    return {
        "array_id": record.array_id,
        "url": record.url,
        "array": record.array,
        "concurrency": record.concurrency,
        "max_total_usd": None if record.max_total_usd is None else str(record.max_total_usd),
        "stop_at_projection": record.stop_at_projection,
        "spent_usd": str(spent.quantize(USD_PLACES)),
        "counts": counts,
        "unreadable": unreadable(record, task_rows),
        "tasks": [r.document() for r in task_rows],
    }


def unreadable(record: array.ArrayRecord, task_rows: Sequence[TaskRow]) -> list[int]:
    """The array's tasks that have no row: their ``job.json`` was not costguard's."""
    shown = {r.index for r in task_rows}
    return [i for i in record.indexes if i not in shown]


def outcome_lines(record: array.ArrayRecord, task_rows: Sequence[TaskRow]) -> list[str]:
    """What was done and what was not, one line each, with the reasons of what was not."""
    done = [r.index for r in task_rows if r.status == "succeeded"]
    total = len(record.indexes)
    lines = [f"done: {len(done)} of {total} task(s) succeeded" + _listed(done)]
    missing = unreadable(record, task_rows)
    if missing:
        lines.append(
            f"not shown: {len(missing)} task(s) whose job.json is not costguard's"
            + _listed(missing)
        )
    for status in ("failed", "stopped", NOT_STARTED, array.RUNNING, array.PENDING):
        these = [r for r in task_rows if r.status == status]
        if these:
            reasons = dict.fromkeys(r.reason for r in these if r.reason)
            lines.append(
                f"not done: {len(these)} task(s) {status}"
                + _listed([r.index for r in these])
                + (f" ({'; '.join(reasons)})" if reasons else "")
            )
    return lines


def _listed(indexes: Sequence[int]) -> str:
    if not indexes:
        return ""
    shown = ", ".join(str(i) for i in indexes[:20])
    return f": {shown}" + (f" and {len(indexes) - 20} more" if len(indexes) > 20 else "")
