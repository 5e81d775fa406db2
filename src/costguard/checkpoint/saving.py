"""The background half of a save: serialise, checksum, upload, commit, then retention.

A save is written in one of two layouts (:mod:`~costguard.checkpoint.writers` picks one
per run): replicated, one payload that rank 0 writes (:meth:`Saver.replicated`, from the
copy the training thread made into warm CPU buffers, :meth:`Saver.snapshot`), or sharded,
every rank's shards through DCP (:func:`~costguard.checkpoint.sharded.write`). Either way
the objects are written first and the manifest last (:func:`commit`, one for both), on
the one background thread of :meth:`Saver.submit`, which then finishes every save alike:
it deletes what retention allows, which is only ever what
:func:`~costguard.checkpoint.manifest.plan_retention` proves is no longer needed, logs,
and records the result. A failed save is reported (logged, in :attr:`Saver.results`, in
the events file of ``costguard run``), never raised into training, and never touches an
earlier checkpoint.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from costguard import contract
from costguard._version import __version__
from costguard.checkpoint import state as state_mod
from costguard.checkpoint.incremental import Pool, Snapshot
from costguard.checkpoint.manifest import (
    FORMAT_VERSION,
    PARTIAL_GRACE_S,
    Manifest,
    ObjectEntry,
    plan_pool_deletions,
    plan_retention,
    pool_object,
)
from costguard.checkpoint.restoring import (
    PAYLOAD,
    Restorer,
    stderr_is_terminal,
    terminal_progress,
)
from costguard.checkpoint.store import Progress, Store
from costguard.checkpoint.uploads import Upload
from costguard.errors import CostguardError
from costguard.logs import get_logger
from costguard.secrets import redact

logger = get_logger(__name__)

#: Set by ``costguard run``: a file of JSON lines, one per durable save, that it reports.
ENV_EVENTS_FILE = contract.ENV_EVENTS_FILE


@dataclass(frozen=True)
class SaveResult:
    """What became of one save."""

    name: str
    step: int
    reason: str
    ok: bool
    size_bytes: int = 0
    #: How long the training loop was blocked (the copy to CPU memory).
    stall_s: float = 0.0
    #: Serialise + upload + manifest, in the background.
    save_s: float = 0.0
    error: str | None = None
    deleted: tuple[str, ...] = field(default_factory=tuple)
    #: Bytes written to the store by this save (less than ``size_bytes`` when it refers
    #: to pool objects an earlier save stored: an incremental save).
    uploaded_bytes: int = 0


#: What writing one save gives: its result, and the manifest it committed (``None``: it
#: failed, and the result says why).
Written = tuple[SaveResult, Manifest | None]


def commit(
    store: Store,
    name: str,
    steps_done: int,
    objects: tuple[ObjectEntry, ...],
    *,
    epoch: int | None,
    reason: str,
    format_version: int = FORMAT_VERSION,
    extra: Mapping[str, Any] | None = None,
) -> Manifest:
    """The commit of checkpoint ``name``, the same for every layout: its manifest, listing
    ``objects`` (each already durable), written last. Only now does the checkpoint exist
    for restore and retention; a save cut off before it leaves a partial folder.

    ``format_version`` and ``extra`` say the layout (a sharded one's, see
    :mod:`~costguard.checkpoint.sharded`).
    """
    manifest = Manifest(
        name=name,
        step=steps_done,
        created_unix=time.time(),
        objects=objects,
        epoch=epoch,
        library_version=__version__,
        format_version=format_version,
        reason=reason,
        extra=dict(extra or {}),
    )
    store.put(manifest.manifest_path, manifest.to_json().encode())
    return manifest


#: How often a thread waiting for a save redraws its progress line.
PROGRESS_TICK_S = 0.2


@dataclass
class Writing:
    """The payload being written, as a thread that waits for it shows it: the save's
    step, about the bytes it writes, and its upload once it has started (its bytes
    stored so far)."""

    step: int
    expected: int
    upload: Upload | None = None


class Saver:
    """One background writer for one store."""

    def __init__(
        self,
        store: Store,
        restorer: Restorer,
        *,
        keep_last: int,
        save_niceness: int,
        partial_grace_s: float = PARTIAL_GRACE_S,
        events_file: str | None = None,
        incremental: bool = True,
    ) -> None:
        self.store = store
        #: Frozen tensors stored once, in the pool (see :mod:`~costguard.checkpoint.incremental`).
        self.pool = Pool(store, enabled=incremental)
        self.restorer = restorer
        self.keep_last = keep_last
        self.partial_grace_s = partial_grace_s
        self.events_file = events_file
        self._copier = state_mod.CpuCopier()
        self._executor = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="costguard-save",
            initializer=_lower_priority,
            initargs=(save_niceness,),
        )
        self._inflight: Future[SaveResult] | None = None
        self._lock = threading.Lock()
        #: Every save's outcome, oldest first.
        self.results: list[SaveResult] = []
        #: Steps done in the newest durable save of this process.
        self.saved_steps_done: int | None = None
        #: The payload being written now, if any (:meth:`result` shows its progress).
        self.writing: Writing | None = None

    @property
    def durable_saves(self) -> int:
        """How many saves of this process were durable."""
        return sum(1 for result in self.results if result.ok)

    @property
    def busy(self) -> bool:
        """Whether a save is still in flight."""
        return self._inflight is not None and not self._inflight.done()

    def wait(self) -> None:
        """Wait for the save in flight (if any)."""
        if self._inflight is not None:
            self.result(self._inflight)

    def result(self, future: Future[Any], timeout_s: float | None = None) -> Any:
        """``future.result(timeout_s)``, for a thread that waits for a save: on a terminal,
        with a progress line on stderr while a big payload's upload runs (the bytes the
        store holds, out of about its size: :func:`terminal_progress`), so that the wait
        for a long save to S3 is not silent. Never in a log, a pipe or a notebook."""
        if not stderr_is_terminal():
            return future.result(timeout=timeout_s)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with ExitStack() as shown:
            bar: Progress | None = None
            drawn: Writing | None = None
            while True:
                tick = PROGRESS_TICK_S
                if deadline is not None:
                    tick = max(0.0, min(tick, deadline - time.monotonic()))
                try:
                    return future.result(timeout=tick)
                except FutureTimeoutError:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise
                writing = self.writing
                if writing is None or writing.upload is None:
                    continue
                if drawn is None:
                    drawn = writing
                    description = f"saving step {writing.step}"
                    bar = shown.enter_context(terminal_progress(description, writing.expected))
                if bar is not None and writing is drawn:
                    bar(writing.upload.stored, writing.expected)

    def snapshot(
        self, state: Any, trainable: set[int] | None = None, *, hurry: bool = False
    ) -> Snapshot:
        """Copy ``state`` into the warm CPU buffers (the part that blocks training), all
        but the frozen tensors unchanged since the last save (``trainable``: the storages
        of the parameters that train, see :meth:`Pool.split`). ``hurry``: training will
        wait for this save (:attr:`Snapshot.hurry`)."""
        rest, items = self.pool.split(state, trainable)
        changed = {"/".join(map(str, i.path)): i.live for i in items if i.sha256 is None}
        copied = self._copier.copy({"state": rest, "pooled": changed})
        for item in items:
            item.copy = copied["pooled"].get("/".join(map(str, item.path)))
        snapshot = Snapshot(copied["state"], items, hurry=hurry)
        # Buffers no longer needed are freed by the background thread, not training's.
        snapshot.released, self._copier.released = self._copier.released, []
        return snapshot

    def submit(
        self, write: Callable[[], Written], *, coordinator: bool = True, here: bool = False
    ) -> Future[SaveResult]:
        """Run one save's ``write`` (its layout's objects and commit: :meth:`replicated`,
        or every rank's part of a sharded save), then finish it as every save is finished:
        on the ``coordinator`` (the rank that commits) the commit is remembered, retention
        runs, and the outcome is logged and recorded (:meth:`_finished`).

        The write runs on the background thread, or ``here`` (on the caller's thread,
        which waits for it: a sharded state that was not copied); what follows the commit
        always runs on the background thread. The save's future resolves to its result.
        """

        def committed() -> Written:
            result, manifest = write()
            if coordinator and manifest is not None:
                self.restorer.remember(manifest)
                self.saved_steps_done = result.step
            return result, manifest

        def finished(written: Written) -> SaveResult:
            return self._finished(*written) if coordinator else written[0]

        if here:
            written = committed()
            future = self._executor.submit(finished, written)
        else:
            future = self._executor.submit(lambda: finished(committed()))
        self._inflight = future
        return future

    def background(self, work: Callable[[], None]) -> Future[None]:
        """Run ``work`` on the background thread after what was queued before it."""
        return self._executor.submit(work)

    def _finished(self, result: SaveResult, manifest: Manifest | None) -> SaveResult:
        """After a save of either layout, on the background thread: retention (after a
        commit only), the log line, the record."""
        if manifest is None:
            logger.error(
                "costguard: the save of step %d failed; training goes on and the previous "
                "checkpoints are intact: %s",
                result.step,
                result.error,
            )
            self._record(result)
            return result
        # A newer checkpoint is committed: now, and only now, retention may count.
        done = replace(result, deleted=self.retain(count=True, protect=(manifest.name,)))
        logger.info(
            "costguard: saved step %d as %s (%s, %s written, %.1f s)",
            done.step,
            done.name,
            human_size(done.size_bytes),
            human_size(done.uploaded_bytes),
            done.save_s,
        )
        self._record(done)
        return done

    def replicated(
        self,
        snapshot: Snapshot,
        name: str,
        steps_done: int,
        epoch: int | None,
        reason: str,
        stall_s: float,
    ) -> Written:
        """Write ``snapshot`` (:meth:`snapshot`) as checkpoint ``name``, the replicated
        layout: its changed frozen tensors to the pool, the rest as one payload
        (:data:`~costguard.checkpoint.restoring.PAYLOAD`), then the commit (:func:`commit`).
        For :meth:`submit`; errors are reported in the result, never raised."""
        started = time.perf_counter()
        try:
            snapshot.released.clear()
            pooled = self.pool.store_objects(snapshot)
            self.writing = Writing(steps_done, state_mod.saved_bytes(snapshot.state))
            try:
                size, digest = self._write_payload(
                    snapshot.state, f"{name}/{PAYLOAD}", hash_aside=snapshot.hurry
                )
            finally:
                self.writing = None
            snapshot.state = None  # the CPU buffers stay with the copier for the next save
            objects = (ObjectEntry(PAYLOAD, size, digest), *pooled)
            manifest = commit(self.store, name, steps_done, objects, epoch=epoch, reason=reason)
            self.pool.committed(snapshot)
        except Exception as exc:
            error = f"{type(exc).__name__}: {redact(str(exc))[:500]}"
            save_s = time.perf_counter() - started
            failed = SaveResult(
                name, steps_done, reason, ok=False, stall_s=stall_s, save_s=save_s, error=error
            )
            return failed, None
        result = SaveResult(
            name,
            steps_done,
            reason,
            ok=True,
            size_bytes=manifest.size_bytes,
            stall_s=stall_s,
            save_s=time.perf_counter() - started,
            uploaded_bytes=size + snapshot.uploaded_bytes,
        )
        return result, manifest

    def _write_payload(self, snapshot: Any, path: str, *, hash_aside: bool) -> tuple[int, str]:
        """Serialise ``snapshot`` to ``path``; its size and sha256, hashed in the same pass.

        On S3 and in a local folder the bytes stream into the store as ``torch.save``
        produces them (S3: a multipart upload, each part retried alone; local: a temporary
        file, produced again on a retry), so no serialised copy of the whole state is held.
        On GCS and Azure they are serialised into memory first, with the GIL released for
        the bulk copies, and uploaded a block at a time with the store's retries.
        """
        if self.store.is_s3 or self.store.is_local:

            def produce(file: Upload) -> None:
                if self.writing is not None:
                    self.writing.upload = file
                state_mod.torch_save(snapshot, file)

            return self.store.write_stream(path, produce, hash_aside=hash_aside)
        data = state_mod.serialise(snapshot)
        return len(data), self.store.put_hashed(path, data)

    def _record(self, result: SaveResult) -> None:
        with self._lock:
            self.results.append(result)
        self.note({"event": "save", **asdict(result), "deleted": list(result.deleted)})

    def note(self, event: dict[str, Any]) -> None:
        """Tell ``costguard run`` (its events file, when there is one) what happened."""
        if not self.events_file:
            return
        try:
            with Path(self.events_file).open("a", encoding="utf-8") as file:
                file.write(json.dumps(event) + "\n")
        except OSError as exc:
            logger.debug("costguard: could not tell costguard run: %s", exc)

    def retain(self, *, count: bool, protect: tuple[str, ...] = ()) -> tuple[str, ...]:
        """Delete what retention allows (see :func:`plan_retention`); best effort.

        ``count`` only right after a newer checkpoint committed: a restore, or a save that
        failed, never deletes a committed checkpoint.
        """
        try:
            survey = self.restorer.survey()
            deleted = []
            for deletion in plan_retention(
                survey.listings,
                survey.committed,
                self.keep_last,
                corrupt=survey.corrupt,
                protect=protect,
                count=count,
                now_unix=time.time(),
                grace_s=self.partial_grace_s,
            ):
                self.store.delete(deletion.paths)
                self.restorer.forget(deletion.name)
                deleted.append(deletion.name)
                logger.info("costguard: deleted %s (%s)", deletion.name, deletion.reason)
            if count:
                self._retain_pool(survey, deleted)
            # Multipart uploads a killed writer left behind bill for their parts until
            # aborted; only S3 has them (elsewhere this makes no call).
            self.store.abort_stale_uploads()
            return tuple(deleted)
        except CostguardError as exc:
            logger.warning("costguard: retention skipped this time: %s", redact(exc.message))
            return ()

    def _retain_pool(self, survey: Any, deleted: list[str]) -> None:
        """Delete the pool objects no kept checkpoint refers to (see
        :func:`plan_pool_deletions`): after the folders, so a failure on the way deletes
        none."""
        doomed = plan_pool_deletions(
            survey.sizes,
            survey.listings,
            [*survey.manifests, *survey.incomplete],
            deleting=deleted,
            corrupt=survey.corrupt,
            modified=survey.modified,
            now_unix=time.time(),
            grace_s=self.partial_grace_s,
        )
        if doomed:
            self.pool.forget(d for d in (pool_object(p) for p in doomed) if d is not None)
            self.store.delete(doomed)
            logger.info("costguard: deleted %d pool objects no checkpoint needs", len(doomed))

    def flush(self, timeout_s: float | None = None) -> SaveResult | None:
        """Wait until the save in flight is durable; its result (``None`` if none ran).

        With a timeout that passes first, returns ``None`` and the save goes on.
        """
        inflight = self._inflight
        if inflight is None:
            return self.results[-1] if self.results else None
        try:
            result: SaveResult = self.result(inflight, timeout_s)
        except FutureTimeoutError:
            return None
        return result

    def shutdown(self, *, wait: bool) -> None:
        """Release the thread (after the save in flight, with ``wait``)."""
        self._executor.shutdown(wait=wait)


def human_size(n: int) -> str:
    """A byte count for people.

    >>> human_size(512), human_size(3 * 2**20), human_size(5 * 2**30)
    ('512 B', '3.0 MiB', '5.0 GiB')
    """
    if n < 1024:
        return f"{n} B"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _lower_priority(niceness: int) -> None:
    """Make the calling thread ``niceness`` nicer (Linux: threads have their own nice value).

    Best effort: elsewhere ``setpriority`` would change the whole process, so it is left.
    """
    if niceness <= 0 or not sys.platform.startswith("linux"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(
            os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + niceness)
        )
    except OSError as exc:
        logger.debug("costguard: could not lower the save thread's priority: %s", exc)
