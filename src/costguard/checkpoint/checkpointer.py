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
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass, field
from typing import Any, Literal

from costguard import __version__
from costguard.checkpoint import state as state_mod
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
        check: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if keep_last < 1:
            msg = f"keep_last must be at least 1, not {keep_last}"
            raise InputError(msg, hint="keep at least the newest checkpoint")
        if when_busy not in ("wait", "skip"):
            msg = f"when_busy must be 'wait' or 'skip', not {when_busy!r}"
            raise InputError(msg)
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
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="costguard-save")
        self._inflight: Future[SaveResult] | None = None
        self._lock = threading.Lock()  # guards results and the manifest cache
        self._manifests: dict[str, Manifest] = {}
        self._invalid: set[str] = set()
        self._last_steps_done = 0
        self._last_save_s = clock()
        self._saved_steps_done: int | None = None
        self._cleanups: list[Callable[[], None]] = []
        self._closed = False
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
        ``RANK`` (torchrun) makes non-zero ranks restore only.
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
        """Listen for notices: signals, plus the relay pipe or the cloud's metadata."""
        self._cleanups.append(signals_mod.install(self.board))
        fd_text = env.get(ENV_NOTICE_FD, "").strip()
        if fd_text.isdigit():
            PipeListener(int(fd_text), self.board).start()
        else:
            watcher = start_cloud_watcher(self.board, env)
            if watcher is not None:
                self._cleanups.append(watcher.stop)

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
        """
        listing = self.store.listing()
        for manifest in restore_order(self._read_manifests(scan(listing)), listing):
            try:
                data = self._verified_payload(manifest)
            except (CostguardError, ValueError) as exc:
                logger.warning(
                    "costguard: checkpoint %s is not usable (%s); trying the previous one",
                    manifest.name,
                    exc,
                )
                self._invalid.add(manifest.name)
                continue
            try:
                state_mod.apply(
                    data,
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
                    msg, hint="restore into the same model and optimizer setup it was saved from"
                ) from exc
            self.restored = manifest
            self._last_steps_done = self._saved_steps_done = manifest.step
            self._last_save_s = self._clock()
            logger.info("costguard: resumed from %s (step %d)", manifest.name, manifest.step)
            break
        if self.rank == 0:
            self._retain(protect=())
        return self.restored.step if self.restored else 0

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
        Returns ``None`` when ``when_busy="skip"`` and a save is still in flight.
        """
        if self.rank != 0:
            return None
        if self._closed:
            msg = "this Checkpointer is closed"
            raise RuntimeError(msg)
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
            data = state_mod.serialise(snapshot)
            del snapshot  # the CPU buffers stay with the copier for the next save
            entry = ObjectEntry(PAYLOAD, len(data), hashlib.sha256(data).hexdigest())
            manifest = Manifest(
                name=name,
                step=steps_done,
                created_unix=time.time(),
                objects=(entry,),
                epoch=epoch,
                library_version=__version__,
                reason=reason,
            )
            self.store.put(manifest.object_path(entry), data)
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
            size_bytes=len(data),
            stall_s=stall_s,
            save_s=time.perf_counter() - started,
            deleted=deleted,
        )
        logger.info("costguard: saved %s (%d bytes) in %.2f s", name, len(data), result.save_s)
        self._record(result)
        return result

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
            return tuple(deleted)
        except CostguardError as exc:
            logger.warning("costguard: retention skipped this time: %s", exc)
            return ()

    def _emergency(self, step: int, notice: Notice, parts: dict[str, Any]) -> bool:
        logger.warning("costguard: %s: saving step %d now", notice.describe(), step + 1)
        timeout_s = None
        if notice.deadline_unix is not None:
            timeout_s = max(0.0, notice.deadline_unix - time.time())
        result: SaveResult | None = None
        if self._saved_steps_done == step + 1:
            result = self.flush(timeout_s)
        elif self.rank == 0:
            self.save(step, reason=f"notice:{notice.source}-{notice.kind}", **parts)
            result = self.flush(timeout_s)
        if result is not None and result.ok:
            logger.warning("costguard: emergency save of step %d is durable", result.step)
        else:
            logger.error("costguard: the emergency save did not complete: %s", result)
        if self.exit_on_notice:
            self.close()
            raise Preempted(notice, result)
        return True

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
