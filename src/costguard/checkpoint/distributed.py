"""Many processes, one checkpoint: torch.distributed (torchrun) support for the Checkpointer.

Under an initialised process group the ranks act together at step boundaries:

* **One decision.** Each rank's local view (an urgent notice, an advisory notice, a
  scheduled save due, when to agree next) is packed into four small integers and combined
  with one ``all_reduce(MAX)``, so a notice seen by *any* rank makes *every* rank save at
  the same step (:mod:`~costguard.checkpoint.agreement` is the pure part). The ranks
  agree about every :data:`~costguard.checkpoint.agreement.SYNC_TARGET_S` of training (or
  every ``sync_every`` steps), not necessarily at every step: a tiny all-reduce costs
  about 2 ms with gloo on a busy 2-core machine.
* **One writer.** Replicated state (model and optimizer under DDP) is written by rank 0
  alone; the per-rank state that differs (RNG states, a sharded loader's position) is
  gathered to rank 0 and stored in the same payload, so a resume is exact on every rank.
* **Every rank restores.** Rank 0 picks the newest checkpoint that verifies and broadcasts
  its name; every rank loads that one (and verifies it), so no two ranks can disagree on
  which checkpoint is latest-valid.

Launchers such as torchrun start workers in new sessions and close inherited file
descriptors, so neither ``costguard run``'s pipe nor its process group reaches them.
``costguard run`` therefore also appends each notice, as one JSON line, to a file named in
``COSTGUARD_NOTICE_FILE``, which every rank polls (:class:`NoticeFileListener`); after a
notice-triggered save a rank writes ``COSTGUARD_PREEMPTED_FILE``, so ``costguard run`` can
report exit code 75 even when the launcher turns the workers' 75 into a failure of its own.

torch is imported only when a process group is already in use.

"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from costguard import contract
from costguard.checkpoint.agreement import Decision, decide
from costguard.checkpoint.notices import Notice, NoticeBoard
from costguard.logs import get_logger

logger = get_logger(__name__)

#: Set by ``costguard run``: a file of relayed notices (JSON lines) every rank polls.
ENV_NOTICE_FILE = contract.ENV_NOTICE_FILE
#: Set by ``costguard run``: written after a notice-triggered save, read after the child exits.
ENV_PREEMPTED_FILE = contract.ENV_PREEMPTED_FILE
#: Set by ``costguard run``: its pid; only its direct child may read the inherited pipe.
ENV_RUN_PID = contract.ENV_RUN_PID
#: How often a rank looks at the notice file (a ``stat`` call: cheap).
FILE_POLL_S = 0.2


class Group:
    """The collectives the Checkpointer needs, over the default process group (or ``pg``).

    All calls are collective: every rank must make them in the same order. Over the
    default group they run on the training thread only, so they cannot interleave with
    other collectives of the training loop; a background save uses a group of its own
    (:meth:`side`).
    """

    def __init__(self, dist: Any, pg: Any = None) -> None:
        self._dist = dist
        #: The process group (``None``: the default one).
        self.pg = pg
        self.rank = int(dist.get_rank(pg))
        self.world_size = int(dist.get_world_size(pg))
        torch = self._torch = sys.modules["torch"]
        device = "cpu"
        if "nccl" in str(dist.get_backend(pg)).lower():  # NCCL reduces GPU tensors only
            device = f"cuda:{torch.cuda.current_device()}"
        self._flags = torch.zeros(4, dtype=torch.int32, device=device)
        self._max = dist.ReduceOp.MAX

    @classmethod
    def current(cls) -> Group | None:
        """The initialised default process group, or ``None``; never imports torch.

        A script that never imported ``torch.distributed`` cannot have a process group.
        """
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        return cls(dist)

    def side(self) -> Group:
        """A new gloo group of the same ranks, for collectives off the training thread
        (a background sharded save); collective (every rank creates it at once)."""
        return Group(self._dist, self._dist.new_group(backend="gloo"))

    def decide(self, local: Decision) -> Decision:
        """One ``all_reduce(MAX)`` of four integers: the decision every rank shares."""
        self._flags.copy_(self._torch.tensor(local.flags(), dtype=self._torch.int32))
        self._dist.all_reduce(self._flags, op=self._max, group=self.pg)
        return decide([[int(v) for v in self._flags.tolist()]])

    def gather(self, value: Any) -> list[Any] | None:
        """Every rank's ``value`` on rank 0 (in rank order); ``None`` on the other ranks."""
        out: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        self._dist.gather_object(value, out, dst=0, group=self.pg)
        return out

    def all_gather(self, value: Any) -> list[Any]:
        """Every rank's ``value`` on every rank (in rank order)."""
        out: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(out, value, group=self.pg)
        return out

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank."""
        box = [value if self.rank == 0 else None]
        self._dist.broadcast_object_list(box, src=0, group=self.pg)
        return box[0]

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank."""
        return any(self.all_gather(bool(flag)))


class Alone:
    """The collectives of :class:`Group` in a world of one process (no process group), as
    DCP's ``_DistWrapper`` works without ``torch.distributed``: each gives back this
    process's own value, and agreeing costs nothing, so it happens at every step.

    The Checkpointer acts through one of the two, so a process alone takes the same path
    as the ranks of a job (one decision, one emergency save) with no twin of its own.

    >>> alone = Alone()
    >>> alone.decide(Decision(scheduled=True, next_sync=40))
    Decision(emergency=False, advisory=False, scheduled=True, next_sync=1)
    >>> alone.all_gather("mine"), alone.broadcast(3), alone.world_size
    (['mine'], 3, 1)
    """

    rank = 0
    world_size = 1

    def decide(self, local: Decision) -> Decision:
        """This process's own decision, to be taken again at the next step."""
        return Decision(local.emergency, local.advisory, local.scheduled, next_sync=1)

    def gather(self, value: Any) -> list[Any]:
        """This process's ``value``, as the only rank's (this is rank 0)."""
        return [value]

    def all_gather(self, value: Any) -> list[Any]:
        """This process's ``value``, as the only rank's."""
        return [value]

    def broadcast(self, value: Any) -> Any:
        """This process's own ``value``."""
        return value

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true here."""
        return bool(flag)


def pipe_is_ours(env: Mapping[str, str]) -> bool:
    """Whether this process is the direct child of ``costguard run`` (the pipe's reader).

    Workers started by a launcher inherit the environment but not the descriptor; the
    number may even name another file of theirs, so they must not touch it.

    >>> pipe_is_ours({}), pipe_is_ours({ENV_RUN_PID: str(os.getppid())})
    (True, True)
    >>> pipe_is_ours({ENV_RUN_PID: "1", "X": ""}) == (os.getppid() == 1)
    True
    """
    text = env.get(ENV_RUN_PID, "").strip()
    return not text.isdigit() or int(text) == os.getppid()


def node_ranks(world: int, env: Mapping[str, str] = os.environ) -> int:
    """How many of the ``world`` ranks run on this machine, under its ``costguard run``:
    torchrun's ``LOCAL_WORLD_SIZE`` (a job of several nodes), else all of them.

    >>> node_ranks(4, {"LOCAL_WORLD_SIZE": "2"}), node_ranks(4, {})
    (2, 4)
    >>> node_ranks(1, {"LOCAL_WORLD_SIZE": "9"})
    1
    """
    text = env.get("LOCAL_WORLD_SIZE", "").strip()
    return int(text) if text.isdigit() and 0 < int(text) <= world else world


def append_notice(path: str | os.PathLike[str], notice: Notice) -> None:
    """Append one notice to the relay file (``costguard run``'s side).

    One ``write`` of one line on a file opened for appending: a reader sees whole lines.
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (notice.to_json() + "\n").encode())
    finally:
        os.close(fd)


def read_notices(path: str | os.PathLike[str], offset: int) -> tuple[list[Notice], int]:
    """The whole notice lines after ``offset`` in the relay file, and the new offset.

    A line still being written (no newline yet) is left for the next call; a bad line is
    logged and skipped.
    """
    try:
        with Path(path).open("rb") as stream:
            stream.seek(offset)
            data = stream.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    notices = []
    for line in data[:end].decode("utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            notices.append(Notice.from_json(line))
        except (ValueError, KeyError) as exc:
            logger.warning("costguard: ignored a bad relayed notice: %s", exc)
    return notices, offset + end


class NoticeFileListener(threading.Thread):
    """Posts the notices ``costguard run`` appends to the relay file (every rank runs one)."""

    def __init__(
        self, path: str | os.PathLike[str], board: NoticeBoard, interval_s: float = FILE_POLL_S
    ) -> None:
        super().__init__(name="costguard-notice-file", daemon=True)
        self._path = Path(path)
        self._board = board
        self._interval_s = interval_s
        self._stop_event = threading.Event()
        self._offset = 0
        self._size = -1
        #: How many polls :meth:`run` has made (a test waits on it, not on the clock).
        self.polls = 0

    def poll(self) -> list[Notice]:
        """Read what is new (only when the file grew: one ``stat`` otherwise)."""
        try:
            size = self._path.stat().st_size
        except OSError:
            return []
        if size == self._size:
            return []
        self._size = size
        notices, self._offset = read_notices(self._path, self._offset)
        for notice in notices:
            logger.warning("costguard: relayed %s", notice.describe())
            self._board.post(notice)
        return notices

    def run(self) -> None:
        """Poll until :meth:`stop`."""
        while not self._stop_event.is_set():
            self.poll()
            self.polls += 1
            self._stop_event.wait(self._interval_s)

    def stop(self) -> None:
        """End the thread after the current poll."""
        self._stop_event.set()


def mark_preempted(path: str | os.PathLike[str], record: Mapping[str, Any]) -> None:
    """Write the "saved on a notice" record for ``costguard run`` (atomically, best effort)."""
    target = Path(path)
    temporary = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        temporary.write_text(json.dumps(dict(record), sort_keys=True), encoding="utf-8")
        temporary.replace(target)
    except OSError as exc:
        logger.warning("costguard: could not write %s: %s", target, exc)
