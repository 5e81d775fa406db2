"""The job contract: what ``costguard launch``, ``costguard run``, the integrations and the
reaper agree on, defined once.

- the environment names the launcher and ``costguard run`` pass to a job's processes;
- the exit codes (75: saved on a notice or a stop request, resumable);
- where each record of a job lives in its checkpoint store, and each record's schema;
- ONE bounded, validating reader (and the writer that keeps to the same schema) for every
  record in a store: ``job/job.json``, the attempts in it, ``job/attempt-N.exit.json``,
  ``job/pace.json``, ``job/stop.json``;
- the jobs folder, where ``costguard run`` registers a running job for ``costguard agent``
  (the writer side: :func:`registered_job`; the agent reads it).

Anyone who can write to the store (a labmate, a leaked key, every job's instance role) can
write these files, so nothing read is trusted: at most :data:`RECORD_BYTES` are read (never
the whole of a large object), JSON constants (``NaN``, ``Infinity``) and numbers of more
than 20 digits are refused while parsing, and every field is checked against its schema:
its type, a finite number within its range, a string of bounded length without control
characters, a list or mapping of bounded length. A record that fails is one
:class:`RecordError` naming the file and the field; callers that read many records
(:func:`read_or_warn`) name it in a warning and leave it out, so no figure is ever
computed from an invalid field and one bad record never stops the rest.

It sits with ``errors.py`` and ``tags.py`` at the bottom floor (it imports nothing of
costguard but those), so ``checkpoint/`` (``costguard run``, the ``Checkpointer``), ``spot/``
(launch), ``reaper/``, ``integrations/`` and ``cli/`` all import it without climbing.

>>> parse(b'{"job_id": "cg-a", "attempt": 2, "reason": "cap", "requested_unix": 5.0}',
...       STOP, STOP_FILE)["reason"]
'cap'
>>> parse(b'{"job_id": "cg-a", "attempt": 2, "reason": "x", "requested_unix": NaN}',
...       STOP, STOP_FILE)
Traceback (most recent call last):
...
costguard.contract.RecordError: job/stop.json is not a costguard record: NaN is not a number
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, NoReturn, Protocol

from costguard.errors import (
    CostguardError,
    InputError,
    NotAnObjectError,
    StoreError,
    TooLargeError,
)
from costguard.logs import get_warning_logger
from costguard.tags import ATTEMPT as ATTEMPT_NUMBER
from costguard.tags import JOB_ID, is_job_id

logger = get_warning_logger(__name__)

# -- environment names ------------------------------------------------------------------

#: The job an attempt belongs to, and the attempt's number (``costguard launch`` sets them
#: on the instance; ``costguard run`` writes its exit record when both are there).
ENV_JOB_ID = "COSTGUARD_JOB_ID"
ENV_JOB_ATTEMPT = "COSTGUARD_JOB_ATTEMPT"
#: ``costguard run --total-steps N``: the steps the whole run takes (for its finish time).
ENV_TOTAL_STEPS = "COSTGUARD_TOTAL_STEPS"
#: ``costguard pilot --steps N``: stop the script after N steps, once the pace is recorded.
ENV_PILOT_STEPS = "COSTGUARD_PILOT_STEPS"
#: Where ``costguard run`` reads what the script reports (the trainers' integrations).
ENV_EVENTS_FILE = "COSTGUARD_EVENTS_FILE"
#: Two of its events: a script's notice watch is installed, and its process's code ended
#: (whether it saw a notice; :class:`costguard.integrations.notices.Watch`).
EVENT_WATCH = "watch"
EVENT_WATCH_END = "watch-end"
#: ``costguard run --fresh``: the script starts from step 0 whatever the store holds.
ENV_START_FRESH = "COSTGUARD_CHECKPOINT_START_FRESH"
#: The cloud whose metadata service ``costguard run`` polls for notices.
ENV_CLOUD = "COSTGUARD_CLOUD"
#: The reaper agent's folder of registered jobs (``costguard agent``).
ENV_JOBS_DIR = "COSTGUARD_JOBS_DIR"
#: The simulator's seconds between two polls of its notice file.
ENV_NOTICE_POLL_S = "COSTGUARD_NOTICE_POLL_S"
#: The simulated metadata service's address (``--provider local``).
ENV_AWS_METADATA_URL = "COSTGUARD_AWS_METADATA_URL"
#: The local launcher's state folder (``--provider local``).
ENV_LOCAL_DIR = "COSTGUARD_LOCAL_DIR"
#: The attempt's stop check (hex): what proves its stop requests (:mod:`costguard.proof`);
#: no secret, so an instance's user-data may carry it.
ENV_STOP_CHECK = "COSTGUARD_STOP_CHECK"
#: Where this user's key is, when not beside the config file.
ENV_JOB_KEY_FILE = "COSTGUARD_JOB_KEY_FILE"
#: What ``costguard run`` tells the script's Checkpointer: the store, how often to save,
#: how many to keep, the store's options.
ENV_URL = "COSTGUARD_CHECKPOINT_URL"
ENV_EVERY_STEPS = "COSTGUARD_CHECKPOINT_EVERY_STEPS"
ENV_EVERY_MINUTES = "COSTGUARD_CHECKPOINT_EVERY_MINUTES"
ENV_KEEP = "COSTGUARD_CHECKPOINT_KEEP"
ENV_STORAGE_OPTIONS = "COSTGUARD_STORAGE_OPTIONS"
#: How ``costguard run`` passes notices on: a pipe, a file of notices, the file a rank
#: marks when it saved on one, and ``costguard run``'s own process id.
ENV_NOTICE_FD = "COSTGUARD_NOTICE_FD"
ENV_NOTICE_FILE = "COSTGUARD_NOTICE_FILE"
ENV_PREEMPTED_FILE = "COSTGUARD_PREEMPTED_FILE"
ENV_RUN_PID = "COSTGUARD_RUN_PID"
#: ``costguard launch --array``: the task's index, as ``SLURM_ARRAY_TASK_ID`` on a cluster.
ENV_ARRAY_TASK_ID = "COSTGUARD_ARRAY_TASK_ID"
#: ``costguard launch --nodes N``: the node's rank in its gang (0..N-1); ``costguard run``
#: then writes the node's own exit record (:func:`exit_record_path`).
ENV_NODE_RANK = "COSTGUARD_NODE_RANK"

# -- exit codes -------------------------------------------------------------------------

#: Saved on a notice (a preemption, a stop request) and exited: run the same command to
#: resume (``EX_TEMPFAIL``). The Checkpointer, the integrations, ``costguard run`` and the
#: controller all mean this one.
EXIT_PREEMPTED = 75
#: ``costguard launch``: the job saved and stopped at its projection (resumable): the same.
EXIT_SAVED = EXIT_PREEMPTED

# -- where the records live -------------------------------------------------------------

JOB_FILE = "job/job.json"
#: The request that the running attempt save and stop (``--stop-at-projection``,
#: ``costguard jobs stop``).
STOP_FILE = "job/stop.json"
PACE_FILE = "job/pace.json"
#: ``costguard launch --array``: the array's record at its URL (each task's ``job.json`` is
#: under its own prefix, ``URL/task-<index>``), and the request that the whole array stop.
ARRAY_FILE = "job/array.json"
ARRAY_STOP_FILE = "job/array-stop.json"
#: The sweep's copy of its tasks' ``job.json`` (:data:`ROLLUP`), so ``jobs status`` of a
#: big array reads one object and a listing instead of one object per task.
ROLLUP_FILE = "job/array-rollup.json"
#: The most tasks of one array: SLURM's default MaxArraySize (1001: indexes 0-1000) less
#: one, so a sweep that runs as a SLURM array by default runs here, while every task's
#: ``job.json`` is still read once a poll by one controller (and listed by ``jobs status``).
MAX_ARRAY_TASKS = 1000
#: The largest task index: SLURM's largest MaxArraySize (slurm.conf(5)).
MAX_ARRAY_INDEX = 4_000_000
#: The one version of each record this costguard writes and reads.
VERSION = 1

#: The most bytes read of a record: ``job.json`` of 10,000 attempts is about 10 MiB; the
#: others are a few hundred bytes.
RECORD_BYTES = 64 * 1024
JOB_BYTES = 16 * 1024 * 1024
#: An array's record: :data:`MAX_ARRAY_TASKS` tasks, each with its prefix (at most 2,048
#: characters, as ``ARRAY_TASK`` bounds it) and index: about 2 MiB at most (1,000 tasks of
#: a 50-character URL are about 70 KiB, past :data:`RECORD_BYTES`).
ARRAY_BYTES = 4 * 1024 * 1024
#: The roll-up's bound: every task's job.json copied, of a few kilobytes each.
ROLLUP_BYTES = 64 * 1024 * 1024
#: One task's copied job.json in the roll-up.
ROLLUP_JOB_BYTES = 256 * 1024


def exit_record_path(attempt: int, node: int | None = None) -> str:
    """Where attempt ``attempt``'s exit record lives, relative to the store root; each
    node of a gang (``launch --nodes``) writes its own.

    >>> exit_record_path(3), exit_record_path(3, node=1)
    ('job/attempt-3.exit.json', 'job/attempt-3.node-1.exit.json')
    """
    if node is None:
        return f"job/attempt-{attempt}.exit.json"
    return f"job/attempt-{attempt}.node-{node}.exit.json"


def launched_attempt(env: Mapping[str, str]) -> tuple[str, int, int | None] | None:
    """The job id, attempt number and node (of a gang; ``None``: the attempt's one
    instance) that ``costguard launch`` gave this process: ``None`` when it runs outside
    a launched job, or (named in a warning) when the id is not a costguard job id or the
    node no node rank, so no record is written under a name the launcher never gave.

    >>> launched_attempt({ENV_JOB_ID: "cg-a-1", ENV_JOB_ATTEMPT: " 2 "}), launched_attempt({})
    (('cg-a-1', 2, None), None)
    >>> launched_attempt({ENV_JOB_ID: "cg-a-1", ENV_JOB_ATTEMPT: "2", ENV_NODE_RANK: "3"})
    ('cg-a-1', 2, 3)
    """
    job_id = env.get(ENV_JOB_ID, "")  # as the launcher set it: not stripped, checked
    attempt_text = env.get(ENV_JOB_ATTEMPT, "").strip()
    node_text = env.get(ENV_NODE_RANK, "").strip()
    if not job_id or not ATTEMPT_NUMBER.fullmatch(attempt_text):
        return None
    node = int(node_text) if _NODE_RANK.fullmatch(node_text) else None
    if node_text and (node is None or node >= MAX_NODES):
        logger.warning("costguard: %s is not a node rank; no record written", ENV_NODE_RANK)
        return None
    if not is_job_id(job_id):
        logger.warning("costguard: %s is not a costguard job id; no record written", ENV_JOB_ID)
        return None
    return job_id, int(attempt_text), node


#: A node rank as the launcher writes it (ASCII digits: ``int()`` takes others too).
_NODE_RANK = re.compile(r"[0-9]{1,4}", re.ASCII)


# -- the jobs folder --------------------------------------------------------------------

#: Where ``costguard run`` registers its jobs when ``$COSTGUARD_JOBS_DIR`` says nothing
#: (the agent's systemd unit creates it, writable by root only).
DEFAULT_JOBS_DIR = Path("/run/costguard/jobs")


def jobs_dir(env: Mapping[str, str]) -> Path:
    """Where ``costguard run`` registers its jobs: ``$COSTGUARD_JOBS_DIR`` or the default.

    >>> jobs_dir({}), jobs_dir({"COSTGUARD_JOBS_DIR": "/tmp/j"})
    (PosixPath('/run/costguard/jobs'), PosixPath('/tmp/j'))
    """
    return Path(env.get(ENV_JOBS_DIR) or DEFAULT_JOBS_DIR)


def job_file(directory: Path, pid: int) -> Path:
    """The file that says process ``pid`` is a running job: ``<pid>.pid``, whose text is
    that same process id.

    >>> job_file(Path("/run/costguard/jobs"), 4242)
    PosixPath('/run/costguard/jobs/4242.pid')
    """
    return directory / f"{pid}.pid"


@contextmanager
def registered_job(directory: Path, pid: int | None = None) -> Iterator[Path]:
    """Register a running job for the agent (the writer side of the jobs folder): its
    file is written atomically (a temporary file, renamed) and removed on exit::

        with registered_job(jobs_dir(os.environ), child.pid):
            child.wait()
    """
    import tempfile

    pid = os.getpid() if pid is None else pid
    directory.mkdir(parents=True, exist_ok=True)
    target = job_file(directory, pid)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".job-", suffix=".tmp")
    with os.fdopen(handle, "w") as stream:
        stream.write(f"{pid}\n")
    Path(temporary).replace(target)
    try:
        yield target
    finally:
        target.unlink(missing_ok=True)


# -- the schema language ----------------------------------------------------------------


class RecordError(InputError):
    """A record in a store is not one costguard wrote: too long, not JSON, or a field out
    of its schema (bad input: exit 2)."""


class _FieldError(Exception):
    """A field out of its schema (where, why); turned into :class:`RecordError`."""


def _fail(where: str, why: str) -> NoReturn:
    raise _FieldError(where, why)


#: Control characters (C0, DEL, C1): never in a record's strings (but ``\\t`` and ``\\n``
#: in the free texts that allow them, a command's arguments).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_SPACE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
#: A unix time: not negative, before 2242 (2^33 s).
UNIX_MAX = 2.0**33
#: Steps of one run: a trillion is beyond any training run.
STEPS_MAX = 10**12
#: Seconds of one measurement or stall: ten years.
SECONDS_MAX = 10.0 * 365 * 86400
#: Dollars per hour of one instance, and of a whole job.
USD_PER_HOUR_MAX = Decimal(100_000)
USD_MAX = Decimal(10**9)


class Field(Protocol):
    """One field's schema: ``check`` returns the value as costguard uses it, or raises
    :class:`_FieldError`; ``tidy`` (writing) shortens and cleans free text instead."""

    @property
    def optional(self) -> bool:
        """Whether ``null`` (or no value) is allowed."""

    def check(self, value: object, where: str, tidy: bool) -> Any: ...


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class Num:
    """A finite number in ``[low, high]``: a float, or with ``whole`` an int."""

    low: float
    high: float
    optional: bool = False
    whole: bool = False

    def check(self, value: object, where: str, tidy: bool) -> float:
        if self.whole:
            fits = type(value) is int
            kind = "whole number"
        else:
            fits = _is_number(value) and math.isfinite(value)  # type: ignore[arg-type]
            kind = "number"
        if not fits or not self.low <= value <= self.high:  # type: ignore[operator]
            _fail(where, f"not a {kind} in {self.low:g}..{self.high:g}")
        return value if self.whole else float(value)  # type: ignore[arg-type, return-value]


def whole(low: int, high: int, *, optional: bool = False) -> Num:
    """A whole number in ``[low, high]``."""
    return Num(low, high, optional=optional, whole=True)


_DECIMAL = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,12})?", re.ASCII)


@dataclass(frozen=True)
class Money:
    """Dollars: a decimal string (or a finite number) in ``[0, high]``, as a Decimal."""

    high: Decimal
    optional: bool = False

    def check(self, value: object, where: str, tidy: bool) -> Decimal:
        if isinstance(value, Decimal):
            value = str(value)
        if _is_number(value) and math.isfinite(value):  # type: ignore[arg-type]
            value = repr(value)
        text = value if isinstance(value, str) else ""
        try:
            number = Decimal(text) if _DECIMAL.fullmatch(text) else None
        except InvalidOperation:
            number = None
        if number is None or number > self.high:
            _fail(where, f"not an amount in 0..{self.high}")
        return number


@dataclass(frozen=True)
class Text:
    """A string of at most ``length`` characters without control characters (``lines``:
    tabs and newlines allowed) matching ``pattern`` when given (``what`` it then is)."""

    length: int = 200
    pattern: re.Pattern[str] | None = None
    lines: bool = False
    optional: bool = False
    what: str = "in the expected form"

    def check(self, value: object, where: str, tidy: bool) -> str:
        if not isinstance(value, str):
            _fail(where, "not a string" if self.pattern is None else f"not {self.what}")
        if self.pattern is not None:
            if len(value) > self.length or not self.pattern.fullmatch(value):
                _fail(where, f"not {self.what}")
            return value
        control = _CONTROL_BUT_SPACE if self.lines else _CONTROL
        if tidy:
            value = control.sub("\N{REPLACEMENT CHARACTER}", value)[: self.length]
        if len(value) > self.length:
            _fail(where, f"longer than {self.length} characters")
        if control.search(value):
            _fail(where, "holds control characters")
        return value


@dataclass(frozen=True)
class Flag:
    """``true`` or ``false``."""

    optional: bool = False

    def check(self, value: object, where: str, tidy: bool) -> bool:
        if not isinstance(value, bool):
            _fail(where, "not true or false")
        return value


@dataclass(frozen=True)
class Choice:
    """One of ``values``."""

    values: tuple[object, ...]
    optional: bool = False

    def check(self, value: object, where: str, tidy: bool) -> Any:
        if isinstance(value, bool) or value not in self.values:
            _fail(where, f"not one of {', '.join(map(str, self.values))}")
        return value


@dataclass(frozen=True)
class Time:
    """An ISO 8601 time with its offset (``2026-12-02T20:15:12+00:00``)."""

    optional: bool = False

    def check(self, value: object, where: str, tidy: bool) -> datetime:
        try:
            moment = datetime.fromisoformat(Text(40).check(value, where, False))
        except ValueError:
            _fail(where, "not an ISO 8601 time")
        if moment.tzinfo is None:
            _fail(where, "a time without its offset")
        return moment


@dataclass(frozen=True)
class Items:
    """A list of at most ``most`` items, each ``of`` (at least ``least``), as a tuple."""

    of: Field
    most: int
    least: int = 0
    optional: bool = False

    def check(self, value: object, where: str, tidy: bool) -> tuple[Any, ...]:
        if not isinstance(value, list) or not self.least <= len(value) <= self.most:
            _fail(where, f"not a list of {self.least}..{self.most} items")
        return tuple(self.of.check(v, f"{where}[{i}]", tidy) for i, v in enumerate(value))


@dataclass(frozen=True)
class Table:
    """A mapping of at most ``most`` string keys (each a short text) to ``of``."""

    of: Field
    most: int
    key: Text = Text(100)
    optional: bool = False

    def check(self, value: object, where: str, tidy: bool) -> dict[str, Any]:
        if not isinstance(value, dict) or len(value) > self.most:
            _fail(where, f"not a mapping of at most {self.most} entries")
        return {
            self.key.check(k, f"{where} key", False): self.of.check(v, f"{where}.{k}", tidy)
            for k, v in value.items()
        }


@dataclass(frozen=True)
class Record:
    """A JSON object: ``fields`` (absent or ``null`` allowed for an optional field, which
    then reads as ``defaults``' value or ``None``); keys it does not name are left out."""

    fields: Mapping[str, Field]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    optional: bool = False
    #: A check of the fields together, once each holds (``_fail`` on a problem).
    whole: Callable[[Mapping[str, Any], str], None] | None = None

    def check(self, value: object, where: str, tidy: bool) -> dict[str, Any]:
        if not isinstance(value, dict):
            _fail(where, "not an object")
        out: dict[str, Any] = {}
        for name, kind in self.fields.items():
            here = f"{where}.{name}" if where else name
            raw = value.get(name)
            if raw is None:
                if name in self.defaults:
                    out[name] = self.defaults[name]
                    continue
                if kind.optional:
                    out[name] = None
                    continue
                if isinstance(kind, Text) and kind.pattern is not None:
                    _fail(here, f"missing: not {kind.what}")
                _fail(here, "missing")
            out[name] = kind.check(raw, here, tidy)
        if self.whole is not None:
            self.whole(out, where)
        return out


def _optional(kind: Any) -> Any:
    """``kind`` that also accepts ``null`` (or no value)."""
    return type(kind)(**{**kind.__dict__, "optional": True})


# -- the schemas ------------------------------------------------------------------------

_NAME = Text(100, re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/+-]{0,99}", re.ASCII))
_JOB_ID = Text(48, JOB_ID, what="a costguard job id")
_UNIX = Num(0.0, UNIX_MAX)
_STEPS = whole(0, STEPS_MAX)
_SECONDS = Num(0.0, SECONDS_MAX)
_VERSION = Choice((VERSION,))
#: The most nodes of one gang (:data:`costguard.gang.MAX_NODES`, which this floor cannot
#: import: the same figure).
MAX_NODES = 1024

OFFER = Record(
    {
        "provider": _NAME,
        "region": _NAME,
        "zone": Text(100),
        "instance_type": _NAME,
        "market": Choice(("on-demand", "spot")),
        "usd_per_hour": Money(USD_PER_HOUR_MAX),
        "gpu": _NAME,
        "gpu_count": whole(0, 1024),
        "verified": Flag(),
    },
    defaults={"zone": "", "verified": True},  # job.json written before it had the key
)

#: What each launcher reads back from a handle's ``extra`` (the pattern its value must
#: match): a handle without it is refused here, rather than being a ``KeyError`` in a
#: controller that a forged job.json stops.
HANDLE_NEEDS = {
    "local": {"pid": re.compile(r"[0-9]{1,7}")},
    "gcp": {"project": re.compile(r".+")},
    "azure": {
        "subscription": re.compile(r".+"),
        "resource_group": re.compile(r".+"),
        "attempt": re.compile(r"[0-9]*"),
    },
}


def _handle_needs(handle: Mapping[str, Any], where: str) -> None:
    extra = handle["extra"]
    for key, pattern in HANDLE_NEEDS.get(handle["provider"], {}).items():
        value = extra.get(key)
        if value is None or not pattern.fullmatch(value):
            here = f"{where}.extra.{key}" if where else f"extra.{key}"
            _fail(here, f"missing or malformed: a {handle['provider']} handle needs it")


HANDLE = Record(
    {
        "provider": _NAME,
        "region": _NAME,
        "zone": Text(100),
        "instance_id": Text(300),
        "extra": Table(Text(2000), 32),
    },
    defaults={"zone": "", "extra": {}},
    whole=_handle_needs,
)

ATTEMPT = Record(
    {
        "number": whole(1, 999_999),
        "offer": OFFER,
        "handle": _optional(HANDLE),
        "launched_unix": _UNIX,
        "ended_unix": _optional(_UNIX),
        "outcome": Choice(
            ("succeeded", "failed", "preempted", "lost", "stopped", "launch-failed"),
            optional=True,
        ),
        "exit_code": whole(-255, 255, optional=True),
        "detail": Text(2000, lines=True),
        "resumed_step": _optional(_STEPS),
        "last_step": _optional(_STEPS),
        "lost_s": _SECONDS,
        "lost_steps": _optional(_STEPS),
        "token": Text(200),
        #: A gang's nodes (``launch --nodes``): how many it bills, and their handles in
        #: node-rank order once launched (``handle`` is node 0's); a record of one
        #: instance, or one written before gangs, holds none.
        "node_count": whole(1, MAX_NODES),
        "nodes": Items(HANDLE, MAX_NODES),
    },
    defaults={"detail": "", "lost_s": 0.0, "token": "", "node_count": 1, "nodes": ()},
)

SIMULATION = Record(
    {
        "every_s": _optional(_SECONDS),
        "at_s": Items(_SECONDS, 1000),
        "seed": whole(0, 2**63, optional=True),
        "notice_s": _optional(_SECONDS),
        "metadata_port": whole(0, 65535),
        "state_dir": Text(4096),
    },
    defaults={"at_s": (), "metadata_port": 0, "state_dir": ""},
)

SPEC = Record(
    {
        "job_id": _JOB_ID,
        "provider": _NAME,
        "gpu": _NAME,
        "gpu_count": whole(0, 1024),
        "regions": Items(_NAME, 100),
        "spot": Flag(),
        "checkpoint_url": Text(2048),
        "command": Items(Text(100_000, lines=True), 4096, least=1),
        "owner": Text(200),
        "created_unix": _UNIX,
        "expires_at": Time(),
        "max_usd_per_hour": Money(USD_PER_HOUR_MAX, optional=True),
        "max_total_usd": Money(USD_MAX, optional=True),
        "max_preemptions": whole(0, 100_000),
        "max_failures": whole(0, 100_000),
        "every_steps": whole(1, STEPS_MAX, optional=True),
        "every_minutes": Num(0.0, 10.0**7, optional=True),
        "idle_minutes": whole(0, 10**7),
        "hours": Money(Decimal(10**7), optional=True),
        "total_steps": whole(1, STEPS_MAX, optional=True),
        "stop_at_projection": Flag(),
        "pilot_steps": whole(1, STEPS_MAX, optional=True),
        "options": Table(Text(4096), 64),
        "sync_dir": Text(4096, optional=True),
        "simulation": _optional(SIMULATION),
        #: What ``costguard launch`` set in the job's environment (no secrets).
        "environment": Table(Text(100_000, lines=True), 1024),
        #: The launching user's keyed digest of the spec (:mod:`costguard.spot.proof`).
        "proof": Text(128),
        #: ``--nodes`` and ``--procs-per-node`` (absent: one instance).
        "nodes": whole(1, MAX_NODES),
        "procs_per_node": whole(1, 1024, optional=True),
    },
    defaults={
        "nodes": 1,
        "regions": (),
        "owner": "",
        "max_preemptions": 3,
        "max_failures": 0,
        "idle_minutes": 30,
        "stop_at_projection": False,
        "options": {},
        "environment": {},
        "proof": "",
    },
)

JOB = Record(
    {
        "version": _VERSION,
        "status": Choice(("running", "succeeded", "failed", "stopped")),
        "reason": Text(2000, lines=True),
        "updated_unix": _UNIX,
        "controller": Text(300),
        "heartbeat_unix": _UNIX,
        "strays_terminated": Items(Text(300), 10_000),
        "kept_stopped": Items(Text(2000, lines=True), 10_000),
        "stop_requested": Text(2000, lines=True),
        "stop_requested_unix": _UNIX,
        "spec": SPEC,
        "attempts": Items(ATTEMPT, 10_000),
    },
    defaults={
        "status": "running",
        "reason": "",
        "updated_unix": 0.0,
        "controller": "",
        "heartbeat_unix": 0.0,
        "strays_terminated": (),
        "kept_stopped": (),
        "stop_requested": "",
        "stop_requested_unix": 0.0,
        "attempts": (),
    },
)

EXIT = Record(
    {
        "attempt": whole(1, 999_999),
        "exit_code": whole(-255, 255),
        "last_step": _optional(_STEPS),
        "finished_unix": _UNIX,
        "host": Text(200),
        "job_id": Text(48),
        #: The node of a gang that wrote it (``None``: the attempt's one instance).
        "node": whole(0, MAX_NODES - 1, optional=True),
    },
    defaults={"host": "", "job_id": ""},
)

STOP = Record(
    {
        "job_id": _JOB_ID,
        "attempt": whole(1, 999_999),
        "reason": Text(500),
        "requested_unix": _UNIX,
        #: Who may stop the job proves it: a keyed digest (:mod:`costguard.spot.proof`).
        "proof": Text(128),
    },
    defaults={"proof": ""},
)

ARRAY_TASK = Record({"index": whole(0, MAX_ARRAY_INDEX), "prefix": Text(2048)})

ARRAY = Record(
    {
        "version": _VERSION,
        "array_id": _JOB_ID,
        #: The ``--array`` text as given (SLURM's syntax), and its ``%limit`` resolved.
        "array": Text(200),
        "concurrency": whole(1, MAX_ARRAY_TASKS),
        "max_total_usd": Money(USD_MAX, optional=True),
        "stop_at_projection": Flag(),
        "created_unix": _UNIX,
        "tasks": Items(ARRAY_TASK, MAX_ARRAY_TASKS, least=1),
    },
    defaults={"stop_at_projection": False},
)

#: The roll-up (``job/array-rollup.json``): each task's ``job.json`` as the sweep last
#: wrote it (and a running task's ``pace.json`` as it last read it), the text itself.
#: Untrusted like all the store holds: a reader uses a copy only when its MD5 equals the
#: one the store's listing gives for the task's own record (so it is that record, byte
#: for byte), and parses it as it would the record.
ROLLUP_TASK = Record(
    {
        "index": whole(0, MAX_ARRAY_INDEX),
        "job": Text(ROLLUP_JOB_BYTES, lines=True),
        #: Its ``pace.json`` as the sweep last read it ("": none), used the same way.
        "pace": Text(RECORD_BYTES, lines=True),
    },
    defaults={"pace": ""},
)

ROLLUP = Record(
    {
        "version": _VERSION,
        "array_id": _JOB_ID,
        "tasks": Items(ROLLUP_TASK, MAX_ARRAY_TASKS),
    }
)

PACE = Record(
    {
        "version": _VERSION,
        "steps_measured": _STEPS,
        "seconds_measured": _SECONDS,
        "steps_done": _STEPS,
        "updated_unix": _UNIX,
        "started_unix": _UNIX,
        "warmup_steps": _STEPS,
        "outlier_steps": _STEPS,
        "outlier_s": _SECONDS,
        "saves": _STEPS,
        "overhead_s": _SECONDS,
        "setup_s": _SECONDS,
        "total_steps": whole(1, STEPS_MAX, optional=True),
        "evaluations": _STEPS,
        "evaluation_s": _SECONDS,
        "steps_per_epoch": whole(1, STEPS_MAX, optional=True),
        "device": Text(200),
        "ranks": whole(1, 1_000_000),
        "host": Text(200),
        "job_id": Text(48),
        "attempt": whole(1, 999_999, optional=True),
        "pilot": Flag(),
    },
    defaults={
        "warmup_steps": 0,
        "outlier_steps": 0,
        "outlier_s": 0.0,
        "saves": 0,
        "overhead_s": 0.0,
        "setup_s": 0.0,
        "evaluations": 0,
        "evaluation_s": 0.0,
        "device": "cpu",
        "ranks": 1,
        "host": "",
        "job_id": "",
        "pilot": False,
    },
)


# -- reading and writing ----------------------------------------------------------------


def _no_constant(name: str) -> float:
    _fail("", f"{name} is not a number")


def _bounded_int(text: str) -> int:
    if len(text) > 20:
        _fail("", "a number of more than 20 digits")
    return int(text)


def _bounded_float(text: str) -> float:
    if len(text) > 40:
        _fail("", "a number of more than 40 characters")
    return float(text)  # 1e999 is inf: refused by the field's range


def parse(data: bytes, schema: Record, name: str) -> dict[str, Any]:
    """The record ``name`` in ``data``, checked against ``schema``; :class:`RecordError`
    naming the first field out of it."""
    try:
        doc = json.loads(
            data,
            parse_constant=_no_constant,
            parse_int=_bounded_int,
            parse_float=_bounded_float,
        )
        return schema.check(doc, "", tidy=False)
    except _FieldError as exc:
        where, why = exc.args
        msg = f"{name} is not a costguard record: {f'{where}: ' if where else ''}{why}"
    except (ValueError, RecursionError) as exc:
        msg = f"{name} is not a costguard record: not JSON ({type(exc).__name__})"
    raise RecordError(msg, hint="was it written by another costguard version, or by someone else?")


def checked(doc: object, schema: Record, name: str) -> dict[str, Any]:
    """Parsed JSON ``doc`` as the reader makes it (free text cleaned as the writer does);
    :class:`RecordError` naming the first field out of ``schema``."""
    try:
        return schema.check(doc, "", tidy=True)
    except _FieldError as exc:
        where, why = exc.args
        msg = f"{name} is not a costguard record: {where}: {why}"
    raise RecordError(msg, hint="a costguard bug: please report it")


def dump(doc: Mapping[str, Any], schema: Record, name: str) -> bytes:
    """``doc`` as the bytes of record ``name``, checked against ``schema`` first (free text
    cleaned and shortened), so costguard never writes what its reader would refuse."""

    def plain(value: Any) -> Any:
        if isinstance(value, Decimal):
            return str(value)
        if isinstance(value, datetime):
            return value.isoformat(timespec="seconds")
        raise TypeError(type(value).__name__)

    try:
        cleaned = schema.check(json.loads(json.dumps(doc, default=plain)), "", tidy=True)
    except _FieldError as exc:
        where, why = exc.args
        msg = f"not writing {name}: {where}: {why}"
        raise RecordError(msg, hint="a costguard bug: please report it") from None
    return json.dumps(cleaned, default=plain, indent=1, sort_keys=True).encode()


class Store(Protocol):
    """What the reader needs of a checkpoint store."""

    url: str

    def get(self, path: str, max_bytes: int | None = None) -> bytes: ...

    def put(self, path: str, data: bytes) -> None: ...


def read(
    store: Store, path: str, schema: Record, max_bytes: int = RECORD_BYTES
) -> dict[str, Any] | None:
    """Record ``path`` of ``store``: ``None`` when there is none; :class:`RecordError` when
    it is not one costguard wrote (more than ``max_bytes``, not JSON, out of ``schema``);
    :class:`StoreError` when the store cannot be read now."""
    name = f"{path} in {store.url}"
    try:
        data = store.get(path, max_bytes=max_bytes)
    except TooLargeError:
        msg = f"{name} is not a costguard record: more than {max_bytes:,} bytes"
        raise RecordError(msg, hint="see what else writes to the store") from None
    except NotAnObjectError:
        msg = f"{name} is not a costguard record: not a regular file (a FIFO, a folder)"
        raise RecordError(msg, hint="see what else writes to the store") from None
    except StoreError as exc:
        if isinstance(exc.__cause__, FileNotFoundError):
            return None
        raise
    return parse(data, schema, name)


def read_or_warn(
    store: Store,
    path: str,
    schema: Record,
    max_bytes: int = RECORD_BYTES,
    say: Callable[[str], None] | None = None,
) -> dict[str, Any] | None:
    """:func:`read`, with a record that is not costguard's named in a warning (``say``, by
    default the costguard logger) and read as none."""
    try:
        return read(store, path, schema, max_bytes)
    except RecordError as exc:
        warn(exc, say)
        return None


def write(store: Store, path: str, schema: Record, doc: Mapping[str, Any]) -> None:
    """Store ``doc`` as record ``path`` (one atomic write), checked by ``schema`` first."""
    store.put(path, dump(doc, schema, path))


def warn(exc: CostguardError, say: Callable[[str], None] | None = None) -> None:
    """Name a record left out: ``say`` it, by default on the costguard logger (stderr)."""
    message = f"warning: {exc.message}; left out"
    if say is None:
        logger.warning("costguard: %s", message)
    else:
        say(message)


def each_valid(items: Iterable[Any], check: Callable[[Any], Any]) -> list[Any]:
    """``check(item)`` of every item whose check passes; one that raises a
    :class:`CostguardError` is named in a warning and left out."""
    kept = []
    for item in items:
        try:
            kept.append(check(item))
        except CostguardError as exc:
            warn(exc)
    return kept
