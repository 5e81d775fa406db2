"""``costguard launch --array``: what an array of spot jobs is, and the decisions of its
sweep, kept pure (no store, no provider, no clock of their own).

- :func:`parse`: the ``--array`` text in SLURM's syntax (checked by
  :func:`costguard.slurm.batch.parse_array`, the one parser of it), expanded to the tasks'
  indexes and the concurrency, with the bounds an array on the cloud adds (at most
  :data:`~costguard.contract.MAX_ARRAY_TASKS` tasks, each index once);
- :class:`ArrayRecord`: the array's record at its URL (``job/array.json``): its id, the
  tasks' indexes and prefixes (``URL/task-<index>``), the concurrency and the one budget,
  written and read through the contract's bounded, validating reader;
- :func:`to_start` and :func:`committed_usd`: which pending tasks start now, given the
  concurrency and ``--max-total`` counted over every task (what each spent, and the
  projection of each running one).

The loop that acts on these decisions is :mod:`costguard.spot.sweep`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from costguard import contract
from costguard.errors import InputError
from costguard.money import format_usd

#: A task's state in the roll-up: ``pending`` (not started yet), ``running``, or its job's
#: final status (``succeeded``, ``failed``, ``stopped``).
PENDING = "pending"
RUNNING = "running"
_HINT = "SLURM's forms: 0-9, 1,3,5, 0-99:10, 0-9%4 (at most 4 at once)"


@dataclass(frozen=True)
class ArraySpec:
    """An ``--array`` value: its text, the tasks' indexes in order, how many run at once."""

    text: str
    indexes: tuple[int, ...]
    concurrency: int


def parse(text: str) -> ArraySpec:
    """The ``--array`` value ``text`` (SLURM's syntax), or an :class:`InputError`.

    >>> parse("0-9%4")
    ArraySpec(text='0-9%4', indexes=(0, 1, 2, 3, 4, 5, 6, 7, 8, 9), concurrency=4)
    >>> parse("1,3,10-14:2").indexes, parse("1,3,10-14:2").concurrency
    ((1, 3, 10, 12, 14), 5)
    >>> parse("0-3,2")
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: --array '0-3,2' names task 2 twice
    """
    from costguard.slurm.batch import parse_array

    value = parse_array(text)
    ranges, _, limit = value.partition("%")
    spans = []
    for part in ranges.split(","):
        span, _, step = part.partition(":")
        first, _, last = span.partition("-")
        spans.append(range(int(first), int(last or first) + 1, int(step or 1)))
    count = sum(len(span) for span in spans)  # counted before any list is made
    if count > contract.MAX_ARRAY_TASKS:
        msg = f"--array {text.strip()!r} has {count:,} tasks; an array has at most "
        msg += f"{contract.MAX_ARRAY_TASKS:,}"
        raise InputError(
            msg, hint="split the sweep into several arrays, or give each task more work"
        )
    seen: set[int] = set()
    for index in (i for span in spans for i in span):
        if index in seen:
            msg = f"--array {text.strip()!r} names task {index} twice"
            raise InputError(msg, hint=f"each index once; {_HINT}")
        seen.add(index)
    indexes = tuple(i for span in spans for i in span)
    concurrency = min(int(limit), count) if limit else count
    return ArraySpec(value, indexes, concurrency)


def task_name(index: int) -> str:
    """Task ``index``'s folder under the array's URL.

    >>> task_name(3)
    'task-3'
    """
    return f"task-{index}"


def task_url(url: str, index: int) -> str:
    """Task ``index``'s checkpoint prefix under the array's URL.

    >>> task_url("s3://b/sweep/", 3), task_url("/data/sweep", 0)
    ('s3://b/sweep/task-3', '/data/sweep/task-0')
    """
    return f"{url.rstrip('/')}/{task_name(index)}"


def task_job_id(array_id: str, index: int) -> str:
    """Task ``index``'s job id: the array's with ``-t<index>`` (a job id of at most 48
    characters: the array's id is at most 38, an index at most 7 digits).

    >>> task_job_id("cg-me-20260101-000000-abc123", 7)
    'cg-me-20260101-000000-abc123-t7'
    """
    return f"{array_id}-t{index}"


_TASK_JOB_ID = re.compile(r"(.+)-t(0|[1-9][0-9]{0,6})", re.ASCII)


def task_of(job_id: str, checkpoint_url: str) -> tuple[str, int, str] | None:
    """The array's id, the task's index and the array's URL of a task's job, read from
    its id (:func:`task_job_id`) and its prefix (:func:`task_url`), which must agree;
    ``None`` for a single job.

    >>> task_of("cg-me-20260101-000000-abc123-t7", "s3://b/sweep/task-7")
    ('cg-me-20260101-000000-abc123', 7, 's3://b/sweep')
    >>> task_of("cg-me-20260101-000000-abc123", "s3://b/run"), task_of("x-t7", "s3://b/task-8")
    (None, None)
    """
    found = _TASK_JOB_ID.fullmatch(job_id)
    if found is None:
        return None
    index = int(found[2])
    suffix = f"/task-{index}"
    if not checkpoint_url.endswith(suffix) or len(checkpoint_url) == len(suffix):
        return None
    return found[1], index, checkpoint_url.removesuffix(suffix)


@dataclass(frozen=True)
class ArrayRecord:
    """The array's record (``job/array.json`` at its URL)."""

    array_id: str
    url: str
    array: str
    indexes: tuple[int, ...]
    concurrency: int
    created_unix: float
    max_total_usd: Decimal | None = None
    stop_at_projection: bool = False

    def document(self) -> dict[str, Any]:
        """The record as the contract's :data:`~costguard.contract.ARRAY` schema has it."""
        return {
            "version": contract.VERSION,
            "array_id": self.array_id,
            "array": self.array,
            "concurrency": self.concurrency,
            "max_total_usd": self.max_total_usd,
            "stop_at_projection": self.stop_at_projection,
            "created_unix": self.created_unix,
            "tasks": [{"index": i, "prefix": task_url(self.url, i)} for i in self.indexes],
        }


def record_from(doc: dict[str, Any], url: str) -> ArrayRecord:
    """The record in ``doc`` (already checked against the schema) read at ``url``: each
    task's prefix must be ``url/task-<index>`` and each index must come once, so a record
    someone else wrote cannot point a task at another job's checkpoints."""
    name = f"{contract.ARRAY_FILE} in {url}"
    indexes = tuple(task["index"] for task in doc["tasks"])
    if len(set(indexes)) != len(indexes):
        msg = f"{name} is not a costguard record: a task index comes twice"
        raise contract.RecordError(msg, hint="see what else writes to the store")
    for task in doc["tasks"]:
        if task["prefix"] != task_url(url, task["index"]):
            msg = f"{name} is not a costguard record: task {task['index']}'s prefix is not "
            msg += "under the array's URL"
            raise contract.RecordError(msg, hint="see what else writes to the store")
    if doc["concurrency"] > len(indexes):
        msg = f"{name} is not a costguard record: concurrency above its task count"
        raise contract.RecordError(msg, hint="see what else writes to the store")
    return ArrayRecord(
        array_id=doc["array_id"],
        url=url,
        array=doc["array"],
        indexes=indexes,
        concurrency=doc["concurrency"],
        created_unix=doc["created_unix"],
        max_total_usd=doc["max_total_usd"],
        stop_at_projection=doc["stop_at_projection"],
    )


def write_record(store: contract.Store, record: ArrayRecord) -> None:
    """Store the array's record (checked by the schema first)."""
    contract.write(store, contract.ARRAY_FILE, contract.ARRAY, record.document())


def read_record(store: contract.Store) -> ArrayRecord | None:
    """The array's record at ``store``, ``None`` when it holds none; a
    :class:`~costguard.contract.RecordError` when it is not one costguard wrote."""
    doc = contract.read(store, contract.ARRAY_FILE, contract.ARRAY, contract.ARRAY_BYTES)
    return None if doc is None else record_from(doc, store.url)


# -- the sweep's decisions -------------------------------------------------------------

#: The least seconds between two launches of an array's tasks, per provider: two a second,
#: the rate at which EC2 refills an account's RunInstances request tokens (and below
#: Compute Engine's and Azure Resource Manager's write limits); none on this machine.
LAUNCH_INTERVAL_S = {"aws": 0.5, "gcp": 0.5, "azure": 0.5, "local": 0.0}


#: How many polls of their notices an array's simulated tasks send in all, a second: the
#: controller's process answers every one (100 tasks polling 4 times a second took a
#: quarter of a core).
TASK_NOTICE_POLLS_PER_S = 20.0


def notice_poll_max_s(concurrency: int) -> float:
    """The longest a simulated task waits between two polls of its notices when
    ``concurrency`` tasks run at once (the launcher keeps it within 1/24 of the warning,
    and polls at least every 0.25 s whatever this says).

    >>> notice_poll_max_s(2), notice_poll_max_s(100)
    (0.1, 5.0)
    """
    return concurrency / TASK_NOTICE_POLLS_PER_S


def launch_wait_s(last_unix: float | None, now_unix: float, interval_s: float) -> float:
    """How long to wait before the next launch: until ``interval_s`` has passed since the
    last one (``None``: none yet).

    >>> launch_wait_s(None, 10.0, 0.5), launch_wait_s(10.0, 10.25, 0.5)
    (0.0, 0.25)
    >>> launch_wait_s(9.0, 10.0, 0.5)
    0.0
    """
    if last_unix is None:
        return 0.0
    return max(0.0, last_unix + interval_s - now_unix)


@dataclass(frozen=True)
class TaskView:
    """What the sweep knows of one task at a poll: its state, what it spent, and (running,
    with a pace and ``--total-steps``) its projected total."""

    index: int
    state: str
    spent_usd: Decimal = Decimal(0)
    projected_usd: Decimal | None = None


def committed_usd(tasks: Sequence[TaskView]) -> Decimal:
    """What the array has spent, with each running task counted at its projected total
    where it has one (a task without a pace counts what it spent so far).

    >>> committed_usd([TaskView(0, "succeeded", Decimal(2)),
    ...                TaskView(1, "running", Decimal(1), Decimal(3)),
    ...                TaskView(2, "running", Decimal(1))])
    Decimal('6')
    """
    total = Decimal(0)
    for task in tasks:
        projected = task.projected_usd if task.state == RUNNING else None
        total += max(task.spent_usd, projected) if projected is not None else task.spent_usd
    return total


def spent_total(tasks: Sequence[TaskView]) -> Decimal:
    """What every task has spent."""
    return sum((t.spent_usd for t in tasks), Decimal(0))


@dataclass(frozen=True)
class Starts:
    """The pending tasks to start now, and why the others wait (``""``: room only)."""

    indexes: tuple[int, ...]
    held: str = ""


def to_start(
    tasks: Sequence[TaskView],
    concurrency: int,
    max_total_usd: Decimal | None,
    task_estimate_usd: Decimal,
) -> Starts:
    """Which pending tasks start now, in index order: as many as the concurrency leaves
    room for, and with ``--max-total`` only while what the array committed
    (:func:`committed_usd`) plus each new task's estimate (``task_estimate_usd``: its
    price for ``--hours``, or one hour) stays within the cap.

    >>> views = [TaskView(0, "running", Decimal(1)), TaskView(1, "pending"),
    ...          TaskView(2, "pending"), TaskView(3, "pending")]
    >>> to_start(views, 3, None, Decimal(1)).indexes
    (1, 2)
    >>> held = to_start(views, 3, Decimal("2.5"), Decimal(1))
    >>> held.indexes, held.held.split(":")[0]
    ((1,), 'task 2 would pass --max-total $2.50')
    """
    running = sum(1 for t in tasks if t.state == RUNNING)
    room = max(0, concurrency - running)
    pending = [t.index for t in tasks if t.state == PENDING]
    committed = committed_usd(tasks)
    chosen: list[int] = []
    for index in pending[:room]:
        if max_total_usd is not None and committed + task_estimate_usd > max_total_usd:
            held = (
                f"task {index} would pass --max-total {format_usd(max_total_usd)}: "
                f"{format_usd(committed)} committed (spent, and projected for the running "
                f"tasks) plus its {format_usd(task_estimate_usd)}"
            )
            return Starts(tuple(chosen), held)
        committed += task_estimate_usd
        chosen.append(index)
    return Starts(tuple(chosen))


def remaining_usd(
    tasks: Sequence[TaskView], index: int, max_total_usd: Decimal | None
) -> Decimal | None:
    """Task ``index``'s share of ``--max-total``: the cap less what every other task spent
    (its own recovery rules stop it, or refuse its relaunch, at that), ``None`` without a
    cap.

    >>> remaining_usd([TaskView(0, "running", Decimal(1)), TaskView(1, "running", Decimal(2))],
    ...               0, Decimal(5))
    Decimal('3')
    """
    if max_total_usd is None:
        return None
    others = spent_total([t for t in tasks if t.index != index])
    return max(Decimal(0), max_total_usd - others)
