"""What a Checkpointer is told, in three parts, each a checked value of its own.

* :class:`SavePolicy`: when to save and what to keep (the schedule, how ranks agree on
  it, retention, incremental saves, the save thread's priority).
* :class:`StoreSettings`: how the store at the URL is reached (fsspec's
  ``storage_options``, the retry policy, the write check on construction).
* :class:`JobSettings`: what the job around the script says (the rank, ``costguard run``'s
  events file, ``--start-fresh``, the run's total and pilot steps); mostly set by
  ``costguard run`` through :meth:`~costguard.checkpoint.Checkpointer.from_env`.

A script may pass the parts (``Checkpointer(url, policy=SavePolicy(every_steps=100))``),
or their fields as keywords, as before the parts existed
(``Checkpointer(url, every_steps=100)``): :func:`assemble` routes each keyword to its part,
and a field given both ways is refused. Each part checks its values when made, so a bad
one fails before training starts, whichever way it came.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, NoReturn, TypedDict, TypeVar

from costguard.checkpoint.manifest import PARTIAL_GRACE_S
from costguard.checkpoint.schedule import Schedule
from costguard.errors import InputError
from costguard.retry import RetryPolicy

DEFAULT_KEEP_LAST = 3
#: How much nicer (Linux) the background save thread is than training. It changes nothing
#: on an idle machine (the save has a core of its own); when the cores are contended the
#: training thread gets them first: steps/s during a save went from 0.39x to 0.77x of the
#: steps/s without on a 2-core machine loaded by other work, while the save took longer.
DEFAULT_SAVE_NICENESS = 10


@dataclass(frozen=True)
class SavePolicy:
    """When to save and what to keep.

    Saves come every ``every_steps`` steps and/or ``every_minutes`` minutes (neither: on
    demand, on notice and at the end only). ``when_busy`` says what a scheduled save does
    while the previous one is still uploading: ``"wait"`` for it, or ``"skip"`` this one
    (a sharded save always waits). ``sync_every`` fixes how often (in steps) the ranks of
    a process group agree on notices and timed saves; by default about every 0.1 s of
    training. Retention keeps the ``keep_last`` newest checkpoints, and deletes a folder
    left without a manifest once it is ``partial_grace_s`` old (a writer that long silent
    is gone). ``incremental`` stores the large frozen tensors once, in a pool the
    checkpoints share. The save thread runs ``save_niceness`` nicer than training (Linux;
    0 keeps it equal).

    >>> SavePolicy(every_steps=100).schedule
    Schedule(every_steps=100, every_minutes=None)
    >>> SavePolicy(keep_last=0)
    Traceback (most recent call last):
    costguard.errors.InputError: keep_last must be at least 1, not 0
    """

    every_steps: int | None = None
    every_minutes: float | None = None
    keep_last: int = DEFAULT_KEEP_LAST
    when_busy: Literal["wait", "skip"] = "wait"
    sync_every: int | None = None
    incremental: bool = True
    save_niceness: int = DEFAULT_SAVE_NICENESS
    partial_grace_s: float = PARTIAL_GRACE_S

    def __post_init__(self) -> None:
        if self.keep_last < 1:
            msg = f"keep_last must be at least 1, not {self.keep_last}"
            raise InputError(msg, hint="keep at least the newest checkpoint")
        if self.when_busy not in ("wait", "skip"):
            msg = f"when_busy must be 'wait' or 'skip', not {self.when_busy!r}"
            raise InputError(msg)
        if self.sync_every is not None and self.sync_every < 1:
            msg = f"sync_every must be at least 1, not {self.sync_every}"
            raise InputError(msg, hint="or leave it unset to agree about every 0.1 s")
        self.schedule  # noqa: B018 - checks every_steps and every_minutes

    @property
    def schedule(self) -> Schedule:
        """The save schedule (:class:`~costguard.checkpoint.schedule.Schedule`)."""
        return Schedule(self.every_steps, self.every_minutes)


@dataclass(frozen=True)
class StoreSettings:
    """How the store is reached: fsspec's ``storage_options`` (credentials, endpoint),
    the ``retry`` policy of every store call, and whether the store is checked for write
    access on construction (``check``, by rank 0), so a bad URL fails before training
    starts."""

    storage_options: Mapping[str, Any] | None = None
    retry: RetryPolicy | None = None
    check: bool = True


@dataclass(frozen=True)
class JobSettings:
    """What the job around the script says.

    ``rank``: this process's rank before a process group is up (``None``: 0, or
    torchrun's ``RANK`` under :meth:`~costguard.checkpoint.Checkpointer.from_env`; once a
    group is up, its rank counts). ``events_file``: where ``costguard run`` reads each
    save's outcome. ``start_fresh``: start from step 0 when checkpoints exist but none can
    be used (``costguard run --start-fresh``). ``total_steps``: the whole run's steps, for
    the finish time and projected cost; ``pilot_steps``: stop the script (exit 0) after
    that many steps, once the pace is recorded (``costguard pilot``).

    >>> JobSettings(total_steps=1000)  # doctest: +NORMALIZE_WHITESPACE
    JobSettings(rank=None, events_file=None, start_fresh=False, total_steps=1000,
                pilot_steps=None)
    """

    rank: int | None = None
    events_file: str | None = None
    start_fresh: bool = False
    total_steps: int | None = None
    pilot_steps: int | None = None

    def __post_init__(self) -> None:
        for name in ("total_steps", "pilot_steps"):
            value = getattr(self, name)
            if value is not None and value < 1:
                msg = f"{name} must be at least 1, not {value}"
                raise InputError(msg, hint=f"or leave {name} unset")


class Keywords(TypedDict, total=False):
    """The parts' fields, as :class:`~costguard.checkpoint.Checkpointer` keywords (A-Z),
    for type checkers; a test keeps them the same as the parts' fields."""

    check: bool
    events_file: str | None
    every_minutes: float | None
    every_steps: int | None
    incremental: bool
    keep_last: int
    partial_grace_s: float
    pilot_steps: int | None
    rank: int | None
    retry: RetryPolicy | None
    save_niceness: int
    start_fresh: bool
    storage_options: Mapping[str, Any] | None
    sync_every: int | None
    total_steps: int | None
    when_busy: Literal["wait", "skip"]


Part = TypeVar("Part", SavePolicy, StoreSettings, JobSettings)

#: Each part's keyword when given whole, and its type.
PARTS: dict[str, type[SavePolicy | StoreSettings | JobSettings]] = {
    "policy": SavePolicy,
    "storage": StoreSettings,
    "job": JobSettings,
}


def assemble(
    keywords: Mapping[str, Any],
    *,
    policy: SavePolicy | None = None,
    storage: StoreSettings | None = None,
    job: JobSettings | None = None,
) -> tuple[SavePolicy, StoreSettings, JobSettings]:
    """The three parts from the parts given and the fields given as ``keywords``.

    >>> policy, storage, job = assemble({"keep_last": 2, "check": False})
    >>> policy.keep_last, storage.check, job == JobSettings()
    (2, False, True)

    A keyword no part has is a ``TypeError``, as for any function; a field given both as
    a keyword and in its part is an :class:`~costguard.errors.InputError`.
    """
    for name in keywords:
        if not any(name in _names(kind) for kind in PARTS.values()):
            msg = f"Checkpointer() got an unexpected keyword argument {name!r}"
            raise TypeError(msg)

    def made(part: str, whole: Part | None, kind: type[Part]) -> Part:
        mine = {name: value for name, value in keywords.items() if name in _names(kind)}
        if whole is None:
            return kind(**mine)
        if mine:
            _twice(min(mine), part)
        return whole

    return (
        made("policy", policy, SavePolicy),
        made("storage", storage, StoreSettings),
        made("job", job, JobSettings),
    )


def flatten(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with each part given whole (``policy=``, ``storage=``, ``job=``) put as
    its fields, but those left ``None`` (unset): what
    :meth:`~costguard.checkpoint.Checkpointer.from_env` lays the environment over.

    >>> flatten({"job": JobSettings(total_steps=9), "keep_last": 2})
    {'keep_last': 2, 'start_fresh': False, 'total_steps': 9}
    """
    flat = {name: value for name, value in options.items() if name not in PARTS}
    for part in PARTS:
        whole = options.get(part)
        if whole is None:
            continue
        for name in _names(type(whole)):
            value = getattr(whole, name)
            if value is None:
                continue
            if name in flat:
                _twice(name, part)
            flat[name] = value
    return flat


def _names(kind: type[Any]) -> tuple[str, ...]:
    return tuple(f.name for f in fields(kind))


def _twice(name: str, part: str) -> NoReturn:
    msg = f"{name} is given twice: as a keyword and in {part}="
    raise InputError(msg, hint=f"give it in one place: {part}=... or {name}=...")
