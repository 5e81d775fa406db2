"""The Checkpointer: save on schedule, in the background, and at once on a preemption notice.

The training loop calls :meth:`Checkpointer.step` after every step. When a save is due it
copies the state into warm CPU buffers (the only time the loop is blocked), and one
background thread serialises, checksums and uploads it, writes the manifest last, then
deletes what retention no longer keeps. A failed save is retried, then reported (logged,
and in :attr:`Checkpointer.results`); it never raises into the training loop and never
touches the previous checkpoint. :meth:`Checkpointer.restore` picks the newest complete
checkpoint, verifies its checksums, and falls back to the one before on any mismatch.

On an urgent notice (a cloud preemption notice, SIGTERM, SIGUSR1, a notice relayed by
``costguard run``) the next :meth:`~Checkpointer.step` saves, waits for durability and
raises :class:`Preempted` (a ``SystemExit`` with code 75, "try again"), so the script
ends cleanly and a wrapper can tell preemption from failure.

A notice that arrives while a step runs is acted on when the step ends. When a step is
long compared with the notice's deadline (GCP and Azure give about 30 s), the loop can
look at :attr:`~Checkpointer.preempting` and :meth:`~Checkpointer.time_left` between
micro-batches: :meth:`~Checkpointer.save_now` saves at once (between steps), and
:meth:`~Checkpointer.abandon_step` gives up the step in progress and exits, so the resume
starts from the newest durable checkpoint. A save still running at the deadline is cut
off with the machine; the manifest is written last, so the previous checkpoint stays the
latest valid one.

Under torch.distributed (torchrun) every rank makes a Checkpointer and calls the same
methods; see :mod:`costguard.checkpoint.distributed` for how the ranks agree.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass, field
from typing import Any, Literal

from costguard import __version__
from costguard.checkpoint import state as state_mod
from costguard.checkpoint.distributed import (
    ENV_NOTICE_FILE,
    ENV_PREEMPTED_FILE,
    Decision,
    Group,
    NoticeFileListener,
    earliest,
    mark_preempted,
    pipe_is_ours,
    propose_sync,
)
from costguard.checkpoint.manifest import (
    MANIFEST_FILE,
    Listing,
    Manifest,
    ManifestError,
    ObjectEntry,
    checkpoint_name,
    parse_manifest,
    plan_retention,
    restore_order,
    scan,
)
from costguard.checkpoint.notices import (
    ENV_NOTICE_FD,
    Notice,
    NoticeBoard,
    PipeListener,
    acknowledge,
    start_cloud_watcher,
)
from costguard.checkpoint.notices import signals as signals_mod
from costguard.checkpoint.schedule import Schedule
from costguard.checkpoint.state import Stateful
from costguard.checkpoint.store import RetryPolicy, Store
from costguard.errors import CostguardError, InputError

logger = logging.getLogger(__name__)

#: Exit code after a notice-triggered save: EX_TEMPFAIL, "temporary failure, run me again".
EXIT_PREEMPTED = 75
PAYLOAD = "state.pt"
DEFAULT_URL = "checkpoints/"
DEFAULT_KEEP_LAST = 3
#: How much nicer (Linux) the background save thread is than training. It changes nothing
#: on an idle machine (the save has a core of its own); when the cores are contended the
#: training thread gets them first: steps/s during a save went from 0.39x to 0.77x of the
#: steps/s without on a 2-core machine loaded by other work, while the save took longer.
DEFAULT_SAVE_NICENESS = 10

#: Environment variables ``costguard run`` sets for the script (see :meth:`from_env`).
ENV_URL = "COSTGUARD_CHECKPOINT_URL"
ENV_EVERY_STEPS = "COSTGUARD_CHECKPOINT_EVERY_STEPS"
ENV_EVERY_MINUTES = "COSTGUARD_CHECKPOINT_EVERY_MINUTES"
ENV_KEEP = "COSTGUARD_CHECKPOINT_KEEP"
ENV_STORAGE_OPTIONS = "COSTGUARD_STORAGE_OPTIONS"


class Preempted(SystemExit):
    """Raised by :meth:`Checkpointer.step` after the emergency save: exits with code 75."""

    def __init__(self, notice: Notice, result: SaveResult | None) -> None:
        super().__init__(EXIT_PREEMPTED)
        self.notice = notice
        self.result = result


class RestoreError(CostguardError):
    """A checkpoint was read and verified but does not fit the objects given to restore."""


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


class Checkpointer:
    """Saves and restores training state at ``url`` (a folder, s3://, gs://, az://).

    Example (a script that resumes where it stopped)::

        ckpt = Checkpointer.from_env(default="checkpoints/", every_steps=100)
        start = ckpt.restore(model=model, optimizer=opt, loader=loader)
        for step in range(start, total_steps):
            train_one_step(...)
            ckpt.step(step, model=model, optimizer=opt, loader=loader)
        ckpt.close()

    ``when_busy`` says what a scheduled save does while the previous one is still
    uploading: ``"wait"`` for it, or ``"skip"`` this one. The store is checked for write
    access on construction (``check=True``), so a bad URL fails before training starts.

    Under an initialised ``torch.distributed`` process group (found when the Checkpointer
    is first used) every rank calls :meth:`restore`, :meth:`step`, :meth:`save` and
    :meth:`save_now` alike: these are collective. Rank 0 writes; each rank's RNG and
    ``loader`` state is saved too. ``sync_every`` fixes how often (in steps) the ranks
    agree on notices and timed saves; by default about every 0.1 s of training.

    The background save thread runs ``save_niceness`` nicer than training (Linux; 0 keeps
    it equal), so a busy machine slows the save rather than the training loop.
    """

    def __init__(
        self,
        url: str | os.PathLike[str] = DEFAULT_URL,
        *,
        every_steps: int | None = None,
        every_minutes: float | None = None,
        keep_last: int = DEFAULT_KEEP_LAST,
        when_busy: Literal["wait", "skip"] = "wait",
        storage_options: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        notices: NoticeBoard | None = None,
        exit_on_notice: bool = True,
        rank: int = 0,
        sync_every: int | None = None,
        save_niceness: int = DEFAULT_SAVE_NICENESS,
        check: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if keep_last < 1:
            msg = f"keep_last must be at least 1, not {keep_last}"
            raise InputError(msg, hint="keep at least the newest checkpoint")
        if when_busy not in ("wait", "skip"):
            msg = f"when_busy must be 'wait' or 'skip', not {when_busy!r}"
            raise InputError(msg)
        if sync_every is not None and sync_every < 1:
            msg = f"sync_every must be at least 1, not {sync_every}"
            raise InputError(msg, hint="or leave it unset to agree about every 0.1 s")
        self.schedule = Schedule(every_steps, every_minutes)
        self.keep_last = keep_last
        self.when_busy = when_busy
        self.board = notices if notices is not None else NoticeBoard()
        self.exit_on_notice = exit_on_notice
        self.rank = rank
        self.store = Store.open(url, storage_options, retry=retry)
        if check and rank == 0:
            self.store.check_writable()
        self._clock = clock
        self._copier = state_mod.CpuCopier()
        self._executor = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="costguard-save",
            initializer=_lower_priority,
            initargs=(save_niceness,),
        )
        self._inflight: Future[SaveResult] | None = None
        self._lock = threading.Lock()  # guards results and the manifest cache
        self._manifests: dict[str, Manifest] = {}
        self._invalid: set[str] = set()
        self._last_steps_done = 0
        self._last_save_s = clock()
        self._saved_steps_done: int | None = None
        self._cleanups: list[Callable[[], None]] = []
        self._closed = False
        self.sync_every = sync_every
        self._group: Group | None = None
        self._until_sync = 0
        self._sync_started_s = clock()
        self._steps_since_sync = 0
        self._preempted_file: str | None = None
        #: Every save's outcome, oldest first.
        self.results: list[SaveResult] = []
        #: The manifest restored from, if any.
        self.restored: Manifest | None = None

    @classmethod
    def from_env(
        cls,
        default: str | os.PathLike[str] = DEFAULT_URL,
        *,
        env: Mapping[str, str] | None = None,
        watch: bool = True,
        **defaults: Any,
    ) -> Checkpointer:
        """A Checkpointer configured by ``costguard run`` (or ``default`` and ``defaults``).

        The environment wins over the arguments, which are defaults: ``costguard run
        --checkpoint URL --every-steps N`` sets ``COSTGUARD_CHECKPOINT_URL`` and
        ``COSTGUARD_CHECKPOINT_EVERY_STEPS``. With ``watch`` it also listens for notices:
        SIGTERM and SIGUSR1, the pipe from ``costguard run`` (``COSTGUARD_NOTICE_FD``), or,
        when not under ``costguard run``, this cloud's metadata service (none off-cloud).
        ``RANK`` (torchrun) makes non-zero ranks restore only until the process group is
        initialised; then the ranks act together.
        """
        env = os.environ if env is None else env
        options = dict(defaults)
        url = env.get(ENV_URL) or os.fspath(default)
        for key, name, kind in (
            ("every_steps", ENV_EVERY_STEPS, int),
            ("every_minutes", ENV_EVERY_MINUTES, float),
            ("keep_last", ENV_KEEP, int),
        ):
            text = env.get(name, "").strip()
            if text:
                try:
                    options[key] = kind(text)
                except ValueError:
                    msg = f"{name}={text!r} is not a valid number"
                    raise InputError(msg) from None
        text = env.get(ENV_STORAGE_OPTIONS, "").strip()
        if text:
            options["storage_options"] = _json_object(ENV_STORAGE_OPTIONS, text)
        if env.get("RANK", "").strip().isdigit():
            options.setdefault("rank", int(env["RANK"]))
        ckpt = cls(url, **options)
        if watch:
            ckpt.watch(env)
        return ckpt

    def watch(self, env: Mapping[str, str]) -> None:
        """Listen for notices: signals, plus what ``costguard run`` relays or the cloud's
        metadata.

        The direct child of ``costguard run`` reads its pipe; processes further down (the
        workers of torchrun, which get neither the pipe nor its signals) poll the relay
        file. Without ``costguard run`` the cloud's metadata service is polled, by local
        rank 0 only under torchrun (the ranks share what one of them sees).
        """
        self._cleanups.append(signals_mod.install(self.board))
        self._preempted_file = env.get(ENV_PREEMPTED_FILE, "").strip() or None
        fd_text = env.get(ENV_NOTICE_FD, "").strip()
        notice_file = env.get(ENV_NOTICE_FILE, "").strip()
        if fd_text.isdigit() and pipe_is_ours(env):
            PipeListener(int(fd_text), self.board).start()
        elif notice_file:
            listener = NoticeFileListener(notice_file, self.board)
            listener.start()
            self._cleanups.append(listener.stop)
        elif not fd_text and env.get("LOCAL_RANK", "0").strip() in ("", "0"):
            watcher = start_cloud_watcher(self.board, env)
            if watcher is not None:
                self._cleanups.append(watcher.stop)

    def _coordination(self) -> Group | None:
        """The process group to act with (``None`` alone); found on first use."""
        if self._group is None:
            self._group = Group.current()
            if self._group is None:
                return None
            self.rank = self._group.rank
        return self._group if self._group.world_size > 1 else None

    # -- preemption, for loops with long steps ---------------------------------------

    @property
    def preempting(self) -> Notice | None:
        """The urgent notice this process has received, if any (no collective call)."""
        return self.board.urgent()

    @property
    def deadline(self) -> float | None:
        """The unix time the machine goes away, when a notice said so."""
        notice = self.preempting
        return notice.deadline_unix if notice is not None else None

    def time_left(self, now_unix: float | None = None) -> float | None:
        """Seconds until the notice's deadline: ``None`` without a notice, ``inf`` when
        the notice gave no deadline (a signal), negative once it has passed."""
        notice = self.preempting
        if notice is None:
            return None
        if notice.deadline_unix is None:
            return math.inf
        return notice.deadline_unix - (time.time() if now_unix is None else now_unix)

    # -- restore ---------------------------------------------------------------------

    def restore(
        self,
        *,
        model: Stateful | None = None,
        optimizer: Stateful | None = None,
        scheduler: Stateful | None = None,
        scaler: Stateful | None = None,
        loader: Stateful | None = None,
        extra: MutableMapping[str, Any] | None = None,
    ) -> int:
        """Load the newest valid checkpoint into the objects given; the step to start from.

        Returns 0 (and changes nothing) when there is no checkpoint. Each candidate is
        verified (sizes and sha256); on a mismatch, a missing object or a corrupt manifest
        a warning is logged and the previous checkpoint is tried. ``extra`` is updated in
        place. Afterwards, partial folders left by a killed writer are deleted.

        Under a process group rank 0 chooses, every rank loads the checkpoint it chose (and
        verifies it), and each rank gets its own RNG and ``loader`` state back.
        """
        group = self._coordination()
        chosen = self._choose() if group is None or group.rank == 0 else None
        if group is not None:
            chosen = self._load_chosen(group, chosen)
        if chosen is not None:
            manifest, data = chosen
            try:
                state_mod.apply(
                    state_mod.for_rank(data, self.rank),
                    model=model,
                    optimizer=optimizer,
                    scheduler=scheduler,
                    scaler=scaler,
                    loader=loader,
                    extra=extra,
                )
            except (KeyError, RuntimeError, ValueError) as exc:
                msg = f"checkpoint {manifest.name} in {self.store.url} does not fit: {exc}"
                raise RestoreError(
                    msg,
                    hint="restore into the same model, optimizer and number of ranks it was "
                    "saved from",
                ) from exc
            self.restored = manifest
            self._last_steps_done = self._saved_steps_done = manifest.step
            self._last_save_s = self._clock()
            logger.info("costguard: resumed from %s (step %d)", manifest.name, manifest.step)
        if self.rank == 0:
            self._retain(protect=())
        return self.restored.step if self.restored else 0

    def _choose(self) -> tuple[Manifest, Any] | None:
        """The newest checkpoint that verifies, with its loaded payload."""
        listing = self.store.listing()
        for manifest in restore_order(self._read_manifests(scan(listing)), listing):
            try:
                return manifest, self._verified_payload(manifest)
            except (CostguardError, ValueError) as exc:
                logger.warning(
                    "costguard: checkpoint %s is not usable (%s); trying the previous one",
                    manifest.name,
                    exc,
                )
                self._invalid.add(manifest.name)
        return None

    def _load_chosen(
        self, group: Group, chosen: tuple[Manifest, Any] | None
    ) -> tuple[Manifest, Any] | None:
        """Rank 0's choice on every rank (collective): one answer to "which is latest"."""
        name = group.broadcast(chosen[0].name if chosen is not None else None)
        error = ""
        if name is not None and group.rank != 0:
            try:
                manifest = parse_manifest(self.store.get(f"{name}/{MANIFEST_FILE}"), name)
                chosen = manifest, self._verified_payload(manifest)
            except (CostguardError, ValueError) as exc:
                error = str(exc) or type(exc).__name__
        if group.any(bool(error)):
            msg = f"checkpoint {name} in {self.store.url}, chosen by rank 0, failed on a rank"
            if error:
                msg += f" (here, rank {group.rank}: {error})"
            raise RestoreError(
                msg, hint="every rank must reach the same store (a shared folder or a bucket)"
            )
        return chosen

    def _read_manifests(self, listings: list[Listing]) -> list[Manifest]:
        manifests = []
        for listing in listings:
            if not listing.has_manifest or listing.name in self._invalid:
                continue
            with self._lock:
                cached = self._manifests.get(listing.name)
            if cached is None:
                try:
                    text = self.store.get(f"{listing.name}/{MANIFEST_FILE}")
                    cached = parse_manifest(text, listing.name)
                except CostguardError as exc:
                    logger.warning("costguard: ignoring checkpoint %s: %s", listing.name, exc)
                    self._invalid.add(listing.name)
                    continue
                with self._lock:
                    self._manifests[listing.name] = cached
            manifests.append(cached)
        return manifests

    def _verified_payload(self, manifest: Manifest) -> Any:
        if len(manifest.objects) != 1 or manifest.objects[0].name != PAYLOAD:
            msg = f"unexpected objects {[o.name for o in manifest.objects]}"
            raise ManifestError(msg)
        entry = manifest.objects[0]
        data = self.store.get(manifest.object_path(entry))
        if len(data) != entry.size_bytes:
            msg = f"{entry.name} has {len(data)} bytes, the manifest says {entry.size_bytes}"
            raise ManifestError(msg)
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry.sha256:
            msg = f"{entry.name} sha256 {digest[:12]}... does not match {entry.sha256[:12]}..."
            raise ManifestError(msg)
        try:
            return state_mod.deserialise(data)
        except Exception as exc:  # verified bytes that torch cannot read: a foreign file
            msg = f"{entry.name} cannot be loaded: {type(exc).__name__}: {exc}"
            raise ManifestError(msg) from exc

    # -- saving ----------------------------------------------------------------------

    def step(
        self,
        step: int,
        *,
        epoch: int | None = None,
        model: Stateful | None = None,
        optimizer: Stateful | None = None,
        scheduler: Stateful | None = None,
        scaler: Stateful | None = None,
        loader: Stateful | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> bool:
        """Call after training step ``step`` (0-based) is done; saves when due.

        Returns ``True`` when an urgent notice has been handled and training should stop
        (only with ``exit_on_notice=False``; otherwise :class:`Preempted` is raised).
        """
        parts: dict[str, Any] = {
            "epoch": epoch,
            "model": model,
            "optimizer": optimizer,
            "scheduler": scheduler,
            "scaler": scaler,
            "loader": loader,
            "extra": extra,
        }
        group = self._coordination()
        if group is not None:
            return self._step_together(group, step, parts)
        urgent = self.board.urgent()
        if urgent is not None:
            return self._emergency(step, urgent, parts)
        advisory = self.board.take_advisory()
        if advisory:
            self.save(step, reason=f"notice:{advisory[0].source}-{advisory[0].kind}", **parts)
        elif self.schedule.due(
            steps_done=step + 1,
            now_s=self._clock(),
            last_steps_done=self._last_steps_done,
            last_save_s=self._last_save_s,
        ):
            self.save(step, reason="schedule", **parts)
        return False

    def _step_together(self, group: Group, step: int, parts: dict[str, Any]) -> bool:
        """:meth:`step` under a process group: every rank decides the same thing."""
        steps_done = step + 1
        self._steps_since_sync += 1
        self._until_sync -= 1
        if self._until_sync > 0:
            # Not a step to agree at: only the step-count schedule, the same on every rank.
            if self.schedule.due_by_steps(
                steps_done=steps_done, last_steps_done=self._last_steps_done
            ):
                self.save(step, reason="schedule", **parts)
            return False
        now = self._clock()
        step_s = (now - self._sync_started_s) / self._steps_since_sync
        self._sync_started_s, self._steps_since_sync = now, 0
        urgent = self.board.urgent()
        advisory = self.board.take_advisory()
        due = self.schedule.due(
            steps_done=steps_done,
            now_s=now,
            last_steps_done=self._last_steps_done,
            last_save_s=self._last_save_s,
        )
        local = Decision(
            emergency=urgent is not None,
            advisory=bool(advisory),
            scheduled=due,
            next_sync=propose_sync(step_s, self.sync_every),
        )
        decision = group.decide(local)
        self._until_sync = decision.next_sync
        if decision.emergency:
            return self._emergency_together(group, step, urgent, parts)
        if decision.advisory:
            kind = f"{advisory[0].source}-{advisory[0].kind}" if advisory else "peer-advisory"
            self.save(step, reason=f"notice:{kind}", **parts)
        elif decision.scheduled:
            self.save(step, reason="schedule", **parts)
        return False

    def save(
        self,
        step: int,
        *,
        reason: str = "demand",
        block: bool = False,
        **parts: Any,
    ) -> Future[SaveResult] | None:
        """Save the state after step ``step`` now; returns the background save's future.

        ``parts`` are :meth:`step`'s keyword arguments (``model=``, ``optimizer=``, ...).
        Blocks for the copy to CPU memory (and, with ``block``, until the save is durable).
        Returns ``None`` when ``when_busy="skip"`` and a save is still in flight, and on
        ranks other than 0 (under a process group every rank must call it: each sends its
        own RNG and loader state to rank 0).
        """
        if self._closed:
            msg = "this Checkpointer is closed"
            raise RuntimeError(msg)
        group = self._coordination()
        ranks: list[Any] | None = None
        if group is not None:
            ranks = group.gather(state_mod.capture_rank(parts.get("loader")))
            if group.rank != 0:
                self._last_steps_done = step + 1
                self._last_save_s = self._clock()
                return None
        elif self.rank != 0:
            return None
        steps_done = step + 1
        self._last_steps_done = steps_done
        self._last_save_s = self._clock()
        inflight = self._inflight
        if inflight is not None and not inflight.done():
            if self.when_busy == "skip" and reason == "schedule":
                logger.info("costguard: skipped the save of step %d: one is in flight", steps_done)
                return None
            inflight.result()
        started = time.perf_counter()
        snapshot = self._copier.copy(state_mod.capture(step=steps_done, **parts))
        if ranks is not None:
            snapshot["ranks"] = ranks  # already copies: they came through the gather
        stall_s = time.perf_counter() - started
        name = checkpoint_name(steps_done, secrets.token_hex(4))
        future = self._executor.submit(
            self._write, snapshot, name, steps_done, parts.get("epoch"), reason, stall_s
        )
        self._inflight = future
        if block:
            future.result()
        return future

    def _write(
        self,
        snapshot: Any,
        name: str,
        steps_done: int,
        epoch: int | None,
        reason: str,
        stall_s: float,
    ) -> SaveResult:
        started = time.perf_counter()
        try:
            size, digest = self._write_payload(snapshot, f"{name}/{PAYLOAD}")
            del snapshot  # the CPU buffers stay with the copier for the next save
            entry = ObjectEntry(PAYLOAD, size, digest)
            manifest = Manifest(
                name=name,
                step=steps_done,
                created_unix=time.time(),
                objects=(entry,),
                epoch=epoch,
                library_version=__version__,
                reason=reason,
            )
            # The commit: only now does the checkpoint exist for restore and retention.
            self.store.put(manifest.manifest_path, manifest.to_json().encode())
            with self._lock:
                self._manifests[name] = manifest
            self._saved_steps_done = steps_done
        except Exception as exc:
            result = SaveResult(
                name,
                steps_done,
                reason,
                ok=False,
                stall_s=stall_s,
                save_s=time.perf_counter() - started,
                error=f"{type(exc).__name__}: {exc}",
            )
            logger.error(
                "costguard: the save of step %d failed; training goes on and the previous "
                "checkpoints are intact: %s",
                steps_done,
                result.error,
            )
            self._record(result)
            return result
        deleted = self._retain(protect=(name,))
        result = SaveResult(
            name,
            steps_done,
            reason,
            ok=True,
            size_bytes=size,
            stall_s=stall_s,
            save_s=time.perf_counter() - started,
            deleted=deleted,
        )
        logger.info("costguard: saved %s (%d bytes) in %.2f s", name, size, result.save_s)
        self._record(result)
        return result

    def _write_payload(self, snapshot: Any, path: str) -> tuple[int, str]:
        """Serialise ``snapshot`` to ``path``; its size and sha256, hashed in the same pass.

        On S3 and in a local folder the bytes stream into the store as ``torch.save``
        produces them (S3: a multipart upload, each part retried alone; local: a temporary
        file, produced again on a retry), so no serialised copy of the whole state is held.
        On GCS and Azure they are serialised into memory first, with the GIL released for
        the bulk copies, and uploaded a block at a time with the store's retries.
        """
        if self.store.is_s3 or self.store.is_local:
            return self.store.write_stream(path, lambda file: state_mod.torch_save(snapshot, file))
        data = state_mod.serialise(snapshot)
        return len(data), self.store.put_hashed(path, data)

    def _record(self, result: SaveResult) -> None:
        with self._lock:
            self.results.append(result)

    def _retain(self, protect: tuple[str, ...]) -> tuple[str, ...]:
        """Delete checkpoints beyond ``keep_last`` and partial folders; best effort."""
        try:
            listing = self.store.listing()
            listings = scan(listing)
            committed = {
                m.name
                for m in restore_order(self._read_manifests(listings), listing)
                if m.name not in self._invalid
            }
            deleted = []
            for deletion in plan_retention(listings, committed, self.keep_last, protect=protect):
                self.store.delete(deletion.paths)
                with self._lock:
                    self._manifests.pop(deletion.name, None)
                deleted.append(deletion.name)
                logger.info("costguard: deleted %s (%s)", deletion.name, deletion.reason)
            # Multipart uploads a killed writer left behind bill for their parts until
            # aborted; only S3 has them (elsewhere this makes no call).
            self.store.abort_stale_uploads()
            return tuple(deleted)
        except CostguardError as exc:
            logger.warning("costguard: retention skipped this time: %s", exc)
            return ()

    def _emergency(self, step: int, notice: Notice, parts: dict[str, Any]) -> bool:
        logger.warning("costguard: %s: saving step %d now", notice.describe(), step + 1)
        result: SaveResult | None = None
        if self._saved_steps_done == step + 1:
            result = self.flush()
        elif self.rank == 0:
            self.save(step, reason=f"notice:{notice.source}-{notice.kind}", **parts)
            result = self.flush()
        return self._stop(notice, result)

    def _emergency_together(
        self, group: Group, step: int, local: Notice | None, parts: dict[str, Any]
    ) -> bool:
        """The coordinated emergency save: same step on every rank, rank 0 writes, every
        rank waits until it is durable, then all stop."""
        notice = earliest(group.all_gather(local)) or Notice("peer", "preempt", None)
        logger.warning("costguard: %s: saving step %d now", notice.describe(), step + 1)
        if self._last_steps_done != step + 1:  # the same on every rank: saves are collective
            self.save(step, reason=f"notice:{notice.source}-{notice.kind}", **parts)
        result = self.flush() if group.rank == 0 else None
        # Every rank waits here for rank 0's save: a rank that exited early would make a
        # launcher like torchrun kill the others, rank 0 included, before it is durable.
        outcome = group.broadcast(
            None if result is None else (result.name, result.step, result.reason, result.ok)
        )
        if result is None and outcome is not None:
            result = SaveResult(*outcome)
        return self._stop(notice, result)

    def _stop(self, notice: Notice, result: SaveResult | None) -> bool:
        """After an emergency save: report, tell ``costguard run``, exit (or return True)."""
        late = notice.deadline_unix is not None and time.time() > notice.deadline_unix
        if result is not None and result.ok:
            logger.warning(
                "costguard: emergency save of step %d is durable%s",
                result.step,
                " (after the notice's deadline)" if late else "",
            )
            # Azure may end the VM as soon as its event is acknowledged: only now.
            acknowledge(notice)
        else:
            logger.error("costguard: the emergency save did not complete: %s", result)
        if self._preempted_file:
            record = {
                "rank": self.rank,
                "notice": notice.to_json(),
                "ok": bool(result and result.ok),
            }
            record["step"] = result.step if result is not None else None
            mark_preempted(self._preempted_file, record)
        if self.exit_on_notice:
            self.close()
            raise Preempted(notice, result)
        return True

    def save_now(self, step: int, **parts: Any) -> bool:
        """Emergency save of the state after step ``step`` right now, then stop.

        For a loop that learns of a notice (:attr:`preempting`) between steps, e.g. in a
        long evaluation, rather than at :meth:`step`. Waits until the save is durable, then
        raises :class:`Preempted` (or returns ``True`` with ``exit_on_notice=False``).
        Without a notice it is a save-and-stop on demand. Under a process group every rank
        must call it at the same step.
        """
        notice = self.preempting or Notice("demand", "stop", None, "save_now")
        group = self._coordination()
        if group is not None:
            return self._emergency_together(group, step, notice, parts)
        return self._emergency(step, notice, parts)

    def abandon_step(self) -> bool:
        """Give up the step in progress and stop: the resume starts from the newest
        durable checkpoint, and the abandoned step is trained again.

        For a step that would overrun the notice's deadline (check :meth:`time_left`
        between micro-batches): stopping early beats being killed mid-save. A save already
        in flight is still waited for (it commits, or is cut off with the machine and the
        one before stays latest); the result says whether it was durable by the deadline.
        Raises :class:`Preempted` (or returns ``True`` with ``exit_on_notice=False``). Not
        collective: under a process group the other ranks learn of it when the launcher
        stops them.
        """
        notice = self.preempting or Notice("demand", "stop", None, "abandon_step")
        left = self.time_left()
        timeout_s = None if left is None or math.isinf(left) else max(0.0, left)
        logger.warning("costguard: %s: abandoning the step in progress", notice.describe())
        result = self.flush(timeout_s)
        return self._stop(notice, result)

    def flush(self, timeout_s: float | None = None) -> SaveResult | None:
        """Wait until the save in flight is durable; its result (``None`` if none ran).

        With a timeout that passes first, returns ``None`` and the save goes on.
        """
        inflight = self._inflight
        if inflight is None:
            return self.results[-1] if self.results else None
        try:
            return inflight.result(timeout=timeout_s)
        except FutureTimeoutError:
            return None

    def close(self) -> None:
        """Wait for the save in flight, stop listening for notices, release the thread."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._executor.shutdown(wait=True)
        for cleanup in reversed(self._cleanups):
            cleanup()
        self._cleanups.clear()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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


def _json_object(name: str, text: str) -> dict[str, Any]:
    import json

    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        msg = f"{name} must be a JSON object, e.g. '{{\"anon\": true}}'"
        raise InputError(msg)
    return value
