"""Who writes a save, and what the training thread does for it: one of two layouts per run.

The Checkpointer decides *when* to save and names the checkpoint; a :class:`Writer`
takes that save on the training thread and hands the background half to the one
:class:`~costguard.checkpoint.saving.Saver`, which writes the objects, commits the
manifest last (:func:`~costguard.checkpoint.saving.commit`) and then finishes every save
alike (retention, log line, result, event). The Checkpointer picks the writer once, when
it first sees the state (:func:`~costguard.checkpoint.sharded.detect`):

* :class:`Replicated`: the state is the same on every rank (one process, DDP). Rank 0
  copies it into warm CPU buffers and writes it as one payload; the other ranks only send
  rank 0 their own RNG and loader state, stored in the same payload.
* :class:`Sharded`: each rank holds its own shards (FSDP2, DTensor). Every rank stages
  its part and writes it through DCP (:mod:`~costguard.checkpoint.sharded`), over a
  process group of the save's own; rank 0 commits once every rank's objects are durable.

So the two layouts differ only in what they write, never in how a save is committed,
retained, reported or waited for.
"""

from __future__ import annotations

import functools
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

from costguard.checkpoint import incremental as incremental_mod
from costguard.checkpoint import sharded as sharded_mod
from costguard.checkpoint import state as state_mod
from costguard.checkpoint.distributed import Alone, Group
from costguard.checkpoint.saving import Saver, SaveResult
from costguard.checkpoint.shard_pool import ShardPool
from costguard.checkpoint.state import TrainState
from costguard.logs import get_logger

logger = get_logger(__name__)


@dataclass(frozen=True)
class Order:
    """One save the Checkpointer decided on, the same on every rank."""

    #: The checkpoint's folder name (rank 0's counts).
    name: str
    #: The training steps done: what the checkpoint resumes from.
    steps_done: int
    #: Why (``schedule``, ``demand``, ``final``, ``notice:<source>-<kind>``).
    reason: str
    parts: TrainState
    #: Training waits for this save: it may use a second core (see
    #: :attr:`~costguard.checkpoint.incremental.Snapshot.hurry`).
    hurry: bool = False
    #: Skip it when the save before is still in flight (``when_busy="skip"``).
    skip_if_busy: bool = False


class Writer(Protocol):
    """The training thread's half of one save, in one layout."""

    def write(self, group: Group | Alone, order: Order) -> Future[SaveResult] | None:
        """Start the save ``order`` says; collective under ``group``. The future of this
        rank's part of it (``None`` when this rank has nothing to wait for, or the save
        was skipped: :attr:`Order.skip_if_busy` and the one before still in flight)."""
        ...


class Replicated:
    """Rank 0 writes the whole state as one payload (:meth:`Saver.replicated`); the others
    send it their RNG and loader state. Only the copy into CPU memory blocks training."""

    def __init__(self, saver: Saver) -> None:
        self.saver = saver

    def write(self, group: Group | Alone, order: Order) -> Future[SaveResult] | None:
        """See :meth:`Writer.write`; rank 0 decides alone whether to skip."""
        ranks = None
        if group.world_size > 1:
            # Every rank's own state goes into rank 0's payload (alone: none, as ever).
            ranks = group.gather(state_mod.capture_rank(order.parts.loader))
            if group.rank != 0:
                return None
        if self.saver.busy:
            if order.skip_if_busy:
                logger.info(
                    "costguard: skipped the save of step %d: one is in flight", order.steps_done
                )
                return None
            self.saver.wait()
        started = time.perf_counter()
        parts = order.parts
        captured = state_mod.capture(order.steps_done, parts)
        if ranks is not None:
            captured["ranks"] = ranks
        trainable = (
            incremental_mod.trainable_storages(parts.model, parts.optimizer)
            if self.saver.pool.enabled
            else None
        )
        snapshot = self.saver.snapshot(captured, trainable, hurry=order.hurry)
        stall_s = time.perf_counter() - started
        return self.saver.submit(
            functools.partial(
                self.saver.replicated,
                snapshot,
                order.name,
                order.steps_done,
                parts.epoch,
                order.reason,
                stall_s,
            )
        )


class Sharded:
    """Every rank writes its shards through DCP (:mod:`~costguard.checkpoint.sharded`);
    a save always waits for the one before it, on every rank."""

    def __init__(self, saver: Saver, group: Group, pool: ShardPool) -> None:
        self.saver = saver
        #: The training's process group: the ranks stage together.
        self.group = group
        #: A sharded state's frozen chunks, stored once in the pool (this rank's).
        self.pool = pool
        #: The warm buffers a save copies its state into (see sharded.stage).
        self.copier = state_mod.CpuCopier()
        #: The process group the shards are written over (made at the first save).
        self._side: Group | None = None

    def write(self, group: Group | Alone, order: Order) -> Future[SaveResult] | None:
        """See :meth:`Writer.write`. The state is staged on this thread
        (:func:`~costguard.checkpoint.sharded.stage`); when it was copied, the shards are
        written on the background thread, over a process group of the save's own (DCP's
        collectives never meet training's), and training goes on; otherwise they are
        written here before training resumes. ``group``, ``hurry`` and ``skip_if_busy``
        change nothing: every rank saves, over :attr:`group`, after the save before."""
        self.saver.wait()  # the previous save, written (and on rank 0 retained)
        if self._side is None:
            self._side = self.group.side()
        coordinator = self.group.rank == 0
        staged = sharded_mod.stage(
            order.parts,
            order.steps_done,
            order.reason,
            self.pool,
            self.copier,
            coordinator=coordinator,
        )
        job = functools.partial(
            sharded_mod.write, self.saver.store, self._side, order.name, staged, self.pool
        )
        return self.saver.submit(job, coordinator=coordinator, here=not staged.copied)
