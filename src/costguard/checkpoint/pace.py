"""A training run's measured pace: how long a step takes, recorded next to its checkpoints.

The :class:`~costguard.checkpoint.checkpointer.Checkpointer` times the training between
two :meth:`~costguard.checkpoint.checkpointer.Checkpointer.step` calls (:class:`PaceMeter`):
the time spent inside ``step()`` (a save's copy to CPU memory, a wait for the previous
save) is counted apart, as the checkpoints' overhead, the first save's one-time set-up
apart from that; the first :data:`WARMUP_STEPS` steps of each process are left out
(compilation, autotuning, the data loader filling up), and so is a step longer than
:data:`OUTLIER_FACTOR` times the median of the recent ones (an evaluation, a stall). What
is left is the pace of training alone, and the record says what was left out.

Rank 0 writes the record (:class:`Pace`) to ``job/pace.json`` in the checkpoint store
after each save, every :data:`PUBLISH_S` seconds and at the end. ``costguard estimate
--from-run URL`` turns it into hours, ``costguard jobs status`` into a finish time and a
projected cost; ``costguard pilot`` stops a script after its first steps
(:data:`ENV_PILOT_STEPS`) to get one.

>>> meter = PaceMeter(warmup=1)
>>> for t in range(6):
...     meter.lap(float(t), t)
...     meter.resume(t + 0.5)   # 0.5 s inside step(): counted apart
>>> meter.steps, meter.seconds, meter.warmup_steps, meter.overhead_s
(4, 2.0, 1, 2.5)
"""

from __future__ import annotations

import json
import math
import os
import socket
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from costguard import contract
from costguard.errors import CostguardError
from costguard.logs import get_logger
from costguard.tags import ATTEMPT

logger = get_logger(__name__)

VERSION = contract.VERSION
PACE_FILE = contract.PACE_FILE
ENV_TOTAL_STEPS = contract.ENV_TOTAL_STEPS
ENV_PILOT_STEPS = contract.ENV_PILOT_STEPS
#: Steps of each process left out at the start (compilation, autotuning, data loading).
WARMUP_STEPS = 5
#: A step that takes this many times the median of the recent ones is not a training
#: step's pace (an evaluation, a stall) and is left out.
OUTLIER_FACTOR = 3.0
#: How many recent steps the median is taken over.
WINDOW = 64
#: Seconds between two records written while training (besides after each save).
PUBLISH_S = 60.0
#: A record is a few hundred bytes; a longer one is not costguard's.
PACE_BYTES = 64 * 1024


class PaceMeter:
    """Times the training between ``step()`` calls; see the module's docstring."""

    def __init__(self, *, warmup: int = WARMUP_STEPS) -> None:
        self.warmup = warmup
        #: Steps measured and the seconds they took (warm-up and outliers left out).
        self.steps = 0
        self.seconds = 0.0
        self.warmup_steps = 0
        self.outlier_steps = 0
        self.outlier_s = 0.0
        #: Seconds inside ``step()`` after the warm-up (save copies, waits for a save);
        #: ``setup_s``: those of the first save, its one-time set-up.
        self.overhead_s = 0.0
        self.setup_s = 0.0
        #: Steps this process has run (``lap`` calls).
        self.laps = 0
        self._resumed_s: float | None = None
        self._lapped_s: float | None = None
        self._recent: deque[float] = deque(maxlen=WINDOW)

    def lap(self, now_s: float, steps_done: int) -> None:
        """A step ended at ``now_s`` (``step()`` was called); ``steps_done`` is unused but
        for the count of laps this process ran."""
        del steps_done
        self.laps += 1
        self._lapped_s = now_s
        if self._resumed_s is None:
            return  # the first step of this process: from its start, not measurable
        took = max(0.0, now_s - self._resumed_s)
        self._resumed_s = None
        if self.warmup_steps < self.warmup:
            self.warmup_steps += 1
            return
        if len(self._recent) >= 3 and took > OUTLIER_FACTOR * statistics.median(self._recent):
            self.outlier_steps += 1
            self.outlier_s += took
            return
        self._recent.append(took)
        self.steps += 1
        self.seconds += took

    def pause(self, seconds: float) -> bool:
        """Training stood still for ``seconds`` within the step now running (an evaluation
        or a save a trainer reported): left out of that step's time. Whether it counts
        (after the warm-up, within a measured step) for the record's stalls.

        >>> meter = PaceMeter(warmup=0)
        >>> meter.lap(0.0, 1); meter.resume(0.0)
        >>> meter.pause(3.0), meter.lap(4.0, 2), meter.seconds
        (True, None, 1.0)
        """
        if self._resumed_s is None:
            return False
        self._resumed_s += max(0.0, seconds)
        return self.warmup_steps >= self.warmup

    def resume(self, now_s: float, *, setup: bool = False) -> None:
        """Training resumed at ``now_s`` (``step()`` returned); ``setup``: this call made the
        process's first save (its time is a one-time set-up, not a save's usual cost)."""
        if self._lapped_s is not None and self.warmup_steps >= self.warmup:
            inside = max(0.0, now_s - self._lapped_s)
            if setup:
                self.setup_s += inside
            else:
                self.overhead_s += inside
        self._resumed_s = now_s


@dataclass(frozen=True)
class Pace:
    """What ``job/pace.json`` holds: the measured pace and what it was measured on."""

    steps_measured: int
    seconds_measured: float
    #: The newest step done (completed steps) when the record was written.
    steps_done: int
    updated_unix: float
    started_unix: float
    warmup_steps: int = 0
    outlier_steps: int = 0
    outlier_s: float = 0.0
    #: Durable saves of this process; the seconds training spent inside ``step()`` (their
    #: copies, waits for a save) after the warm-up, the first save's set-up apart.
    saves: int = 0
    overhead_s: float = 0.0
    setup_s: float = 0.0
    #: The whole run's steps, when the script or ``--total-steps`` said it.
    total_steps: int | None = None
    #: Evaluations a trainer reported (its integration's callback) after the warm-up, and
    #: the seconds training stood still for them (left out of the steps' time).
    evaluations: int = 0
    evaluation_s: float = 0.0
    #: Steps in one epoch, when the trainer knows it (``estimate --from-run --epochs``).
    steps_per_epoch: int | None = None
    #: The accelerator (``torch.cuda.get_device_name``), ``cpu`` when none was in use.
    device: str = "cpu"
    ranks: int = 1
    host: str = ""
    job_id: str = ""
    attempt: int | None = None
    #: Whether a pilot wrote it (``costguard pilot``: the script was stopped after it).
    pilot: bool = False

    @property
    def seconds_per_step(self) -> float:
        """The measured seconds a training step takes (``nan`` with no step measured)."""
        return self.seconds_measured / self.steps_measured if self.steps_measured else math.nan

    @property
    def wall_seconds_per_step(self) -> float:
        """Seconds a step takes on the wall clock: its pace, the slow steps among them
        (evaluations), the time inside ``step()`` (saves) and the evaluations a trainer
        reported, the first save's set-up apart (``nan`` with no step measured).

        >>> Pace(90, 90.0, 100, 2.0, 1.0, outlier_steps=10, outlier_s=50.0,
        ...      overhead_s=10.0).wall_seconds_per_step
        1.5
        """
        steps = self.steps_measured + self.outlier_steps
        wall = self.seconds_measured + self.outlier_s + self.overhead_s + self.evaluation_s
        return wall / steps if self.steps_measured else math.nan

    def to_json(self) -> bytes:
        """The record as UTF-8 JSON."""
        return json.dumps({"version": VERSION, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def measured(
        cls,
        meter: PaceMeter,
        *,
        steps_done: int,
        started_unix: float,
        env: Mapping[str, str],
        **counts: Any,
    ) -> Pace:
        """The record of what ``meter`` measured so far, with this process's device, host,
        job and attempt (``env``: as ``costguard launch`` set it); ``counts``: the saves,
        stalls, evaluations and totals its caller knows (the Checkpointer, a trainer's)."""
        return cls(
            steps_measured=meter.steps,
            seconds_measured=round(meter.seconds, 6),
            steps_done=steps_done,
            updated_unix=time.time(),
            started_unix=started_unix,
            warmup_steps=meter.warmup_steps,
            outlier_steps=meter.outlier_steps,
            outlier_s=round(meter.outlier_s, 6),
            device=device_name(),
            host=host_name(),
            job_id=env.get(contract.ENV_JOB_ID, "")[:48],
            attempt=_attempt_number(env.get(contract.ENV_JOB_ATTEMPT, "")),
            **counts,
        )


def _attempt_number(text: str) -> int | None:
    """The attempt number ``costguard launch`` set, ``None`` when there is none.

    >>> _attempt_number("3"), _attempt_number(""), _attempt_number("0x1")
    (3, None, None)
    """
    return int(text) if ATTEMPT.fullmatch(text.strip()) else None


def parse_pace(data: bytes) -> Pace | None:
    """The record in ``data``; ``None`` unless every field has its type and range by the
    contract's schema (anyone who can write the store can write the file).

    >>> parse_pace(Pace(10, 5.0, 12, 2.0, 1.0).to_json()).seconds_per_step
    0.5
    >>> [parse_pace(d) for d in (b"[]", b"{}", b'{"version": 1, "steps_measured": -1}')]
    [None, None, None]
    """
    try:
        return _pace(contract.parse(data, contract.PACE, PACE_FILE))
    except contract.RecordError:
        return None


def _pace(doc: dict[str, Any]) -> Pace:
    """The pace in a record checked by :data:`contract.PACE`."""
    del doc["version"]
    return Pace(**doc)


class PaceError(contract.RecordError):
    """``job/pace.json`` is there and is not a costguard pace record."""


class _Store(Protocol):
    url: str

    def put(self, path: str, data: bytes) -> None: ...

    def get(self, path: str, max_bytes: int | None = None) -> bytes: ...


def write_pace(store: _Store, pace: Pace) -> None:
    """Store ``pace`` as ``job/pace.json`` (one atomic write)."""
    contract.write(store, PACE_FILE, contract.PACE, {"version": VERSION, **asdict(pace)})


def read_pace(store: _Store) -> Pace | None:
    """The store's pace record, ``None`` when there is none; :class:`PaceError` (naming
    the field) when it is not a costguard pace record (too long, not JSON, a field out of
    range)."""
    try:
        doc = contract.read(store, PACE_FILE, contract.PACE, PACE_BYTES)
    except contract.RecordError as exc:
        raise PaceError(exc.message, hint=exc.hint) from None
    return None if doc is None else _pace(doc)


def read_pace_or_warn(store: _Store) -> Pace | None:
    """:func:`read_pace`, a record that is not costguard's named in a warning and read as
    none (the reports that go on without a pace)."""
    try:
        return read_pace(store)
    except PaceError as exc:
        contract.warn(exc)
        return None


class _Queue(Protocol):
    """What the recorder needs of the Checkpointer's save thread (``saving.Saver``)."""

    @property
    def durable_saves(self) -> int: ...

    def background(self, work: Callable[[], None]) -> Future[None]: ...

    def note(self, event: dict[str, Any]) -> None: ...


class PaceRecorder:
    """The Checkpointer's pace, published: measured between ``step()`` calls
    (:attr:`meter`), recorded in the store (``job/pace.json``) and told to ``costguard
    run`` (its events file) after each save started, every :data:`PUBLISH_S`, and when a
    pilot's steps are done. Rank 0 only. Each record is written on the save thread after
    what is queued there (so an older record never lands last, and the saves queued
    before are counted).
    """

    def __init__(
        self,
        store: _Store,
        queue: _Queue,
        *,
        clock: Callable[[], float],
        total_steps: int | None = None,
        pilot_steps: int | None = None,
    ) -> None:
        self.store = store
        self.queue = queue
        self.meter = PaceMeter()
        self.total_steps = total_steps
        self.pilot_steps = pilot_steps
        self._clock = clock
        self._started_unix = time.time()
        self._published_s = clock()
        #: The save (its steps done) after which the pace was last published.
        self._published_saved = 0
        #: The latest record queued on the save thread (:meth:`wait` waits for it).
        self._written: Future[None] | None = None

    @property
    def pilot_done(self) -> bool:
        """Whether a pilot has run its steps (the script is then stopped)."""
        return self.pilot_steps is not None and self.meter.laps >= self.pilot_steps

    def pace(self, steps_done: int, *, ranks: int = 1) -> Pace:
        """The pace measured so far, as :meth:`publish` records it."""
        meter = self.meter
        return Pace.measured(
            meter,
            steps_done=steps_done,
            started_unix=self._started_unix,
            env=os.environ,
            saves=self.queue.durable_saves,
            overhead_s=round(meter.overhead_s, 6),
            setup_s=round(meter.setup_s, 6),
            total_steps=self.total_steps,
            ranks=ranks,
            pilot=self.pilot_steps is not None,
        )

    def publish(self, steps_done: int, *, ranks: int = 1, block: bool = False) -> None:
        """Queue a record of the pace (with ``block``, wait for it). Never raises: a record
        that cannot be written is logged."""

        def write() -> None:
            pace = self.pace(steps_done, ranks=ranks)
            self.queue.note({"event": "pace", **as_dict(pace)})  # costguard run: the ETA
            try:
                write_pace(self.store, pace)
            except CostguardError as exc:
                logger.warning("costguard: could not record the pace: %s", exc.message)

        written = self._written = self.queue.background(write)
        if block:
            written.result()

    def after_step(self, steps_done: int, saved: int, *, ranks: int = 1) -> None:
        """Publish when a save was started since the last record (``saved``: the steps
        done of the newest save started) or :data:`PUBLISH_S` have passed."""
        now = self._clock()
        if saved != self._published_saved or now - self._published_s >= PUBLISH_S:
            self._published_saved, self._published_s = saved, now
            self.publish(steps_done, ranks=ranks)

    def wait(self, timeout_s: float | None) -> bool:
        """Wait for the latest record queued; whether it was written within ``timeout_s``."""
        if self._written is None:
            return True
        try:
            self._written.result(timeout=timeout_s)
        except FutureTimeoutError:
            return False
        return True


def device_name() -> str:
    """The CUDA device this process trains on, when CUDA is in use; else ``cpu``.

    Never initialises CUDA (a script that does not use it is not made to).
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return "cpu"
    try:
        if not torch.cuda.is_initialized():
            return "cpu"
        return str(torch.cuda.get_device_name(torch.cuda.current_device()))
    except (RuntimeError, AttributeError, AssertionError):
        return "cpu"


def host_name() -> str:
    """This machine's name, for the record."""
    return socket.gethostname()[:200]


def describe(pace: Pace) -> str:
    """The measurement in words, for an assumption line.

    >>> describe(Pace(190, 95.0, 200, 2.0, 1.0, warmup_steps=5, device="NVIDIA A10G"))
    '190 steps measured over 95.0 s on NVIDIA A10G (0.5000 s/step; 5 warm-up steps left out)'
    """
    left_out = [f"{pace.warmup_steps} warm-up steps"] if pace.warmup_steps else []
    if pace.outlier_steps:
        left_out.append(
            f"{pace.outlier_steps} slow steps ({pace.outlier_s:.1f} s: evaluation or stalls)"
        )
    if pace.evaluations:
        left_out.append(f"{pace.evaluations} evaluations ({pace.evaluation_s:.1f} s)")
    if pace.saves or pace.overhead_s:
        left_out.append(
            f"{pace.overhead_s:.1f} s inside step() around {pace.saves} saves (and "
            f"{pace.setup_s:.1f} s of the first's set-up)"
        )
    where = pace.device if pace.ranks == 1 else f"{pace.ranks} ranks, {pace.device} each"
    text = (
        f"{pace.steps_measured} steps measured over {pace.seconds_measured:.1f} s on {where} "
        f"({pace.seconds_per_step:.4f} s/step"
    )
    return text + (f"; {', '.join(left_out)} left out)" if left_out else ")")


def as_dict(pace: Pace) -> dict[str, Any]:
    """The record as a JSON-ready mapping."""
    return asdict(pace)


#: How far the clock may step back between a pilot's start and its script's first step.
CLOCK_SLACK_S = 1.0


def not_own_pilot(
    pace: Pace, *, since_unix: float, now_unix: float, host: str, env: Mapping[str, str]
) -> str | None:
    """Why ``pace`` is not the record of the pilot that began at ``since_unix`` on ``host``
    with its script's environment ``env`` (its job and attempt, when it runs in one), or
    ``None`` when it is: a pilot prices only what its own run measured, never a stale or
    forged record.

    >>> own = Pace(20, 2.0, 25, 105.0, 101.0, host="box", pilot=True)
    >>> not_own_pilot(own, since_unix=100.0, now_unix=110.0, host="box", env={})
    >>> not_own_pilot(own, since_unix=200.0, now_unix=210.0, host="box", env={})
    'its measurement began at 101 (Unix time), before this pilot did (200)'
    """
    # What the pilot's own run recorded of them (:meth:`Pace.measured`).
    job_id = env.get(contract.ENV_JOB_ID, "")[:48]
    attempt = _attempt_number(env.get(contract.ENV_JOB_ATTEMPT, ""))
    if not pace.pilot:
        return "no pilot wrote it (it is a full run's pace)"
    if pace.started_unix < since_unix - CLOCK_SLACK_S:
        return (
            f"its measurement began at {pace.started_unix:.0f} (Unix time), before this pilot "
            f"did ({since_unix:.0f})"
        )
    if not pace.started_unix <= pace.updated_unix <= now_unix + CLOCK_SLACK_S:
        return f"it is dated {pace.updated_unix:.0f} (Unix time), after this pilot ended"
    if pace.host != host:
        return f"it was measured on another machine ({pace.host!r}, this is {host!r})"
    if (pace.job_id, pace.attempt) != (job_id, attempt):
        return f"it belongs to job {pace.job_id!r} attempt {pace.attempt}, not to this pilot"
    return None
