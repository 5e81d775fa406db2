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

The Checkpointer is the one object a training loop talks to, and it decides *when*: the
schedule, notices and their deadlines, the ranks' agreement, the final save at close. *How*
a save is written and retained is :mod:`~costguard.checkpoint.saving`; *which* checkpoint a
restore uses, and what counts as corrupt or only unreadable, is
:mod:`~costguard.checkpoint.restoring`.
"""

from __future__ import annotations

import math
import os
import secrets
import time
from collections.abc import Callable, Mapping, MutableMapping
from concurrent.futures import Future
from typing import Any, Unpack

from costguard import contract
from costguard.checkpoint import sharded as sharded_mod
from costguard.checkpoint import state as state_mod
from costguard.checkpoint.agreement import Decision, earliest, propose_sync
from costguard.checkpoint.distributed import (
    ENV_NOTICE_FILE,
    ENV_PREEMPTED_FILE,
    Alone,
    Group,
    NoticeFileListener,
    mark_preempted,
    node_ranks,
    pipe_is_ours,
)
from costguard.checkpoint.manifest import (
    MANIFEST_FILE,
    MAX_MANIFEST_BYTES,
    Manifest,
    checkpoint_name,
    parse_manifest,
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
from costguard.checkpoint.pace import ENV_PILOT_STEPS, ENV_TOTAL_STEPS, Pace, PaceRecorder
from costguard.checkpoint.restoring import (
    MISFIT,
    PAYLOAD,
    MisfitError,
    NoUsableCheckpointError,
    Restorer,
    fallback,
)
from costguard.checkpoint.saving import ENV_EVENTS_FILE, Saver, SaveResult
from costguard.checkpoint.settings import (
    DEFAULT_KEEP_LAST,
    DEFAULT_SAVE_NICENESS,
    JobSettings,
    Keywords,
    SavePolicy,
    StoreSettings,
    assemble,
    flatten,
)
from costguard.checkpoint.shard_pool import ShardPool
from costguard.checkpoint.sharded import ShardedStateError
from costguard.checkpoint.state import Stateful, TrainState
from costguard.checkpoint.store import (
    ENV_STORAGE_OPTIONS,
    Store,
    storage_options_from_env,
)
from costguard.checkpoint.writers import Order, Replicated, Sharded, Writer
from costguard.errors import CostguardError, InputError
from costguard.logs import get_logger
from costguard.secrets import redact

logger = get_logger(__name__)

#: Exit code after a notice-triggered save: EX_TEMPFAIL, "temporary failure, run me again".
EXIT_PREEMPTED = contract.EXIT_PREEMPTED
DEFAULT_URL = "checkpoints/"

#: Environment variables ``costguard run`` sets for the script (see :meth:`from_env`).
ENV_URL = contract.ENV_URL
ENV_EVERY_STEPS = contract.ENV_EVERY_STEPS
ENV_EVERY_MINUTES = contract.ENV_EVERY_MINUTES
ENV_KEEP = contract.ENV_KEEP
#: ``costguard run --start-fresh``: start from step 0 when no checkpoint can be used.
ENV_START_FRESH = contract.ENV_START_FRESH
#: Seconds an emergency save keeps in hand before the notice's deadline to say how it went.
REPORT_MARGIN_S = 2.0
__all__ = [
    "DEFAULT_KEEP_LAST",
    "DEFAULT_SAVE_NICENESS",
    "ENV_STORAGE_OPTIONS",
    "EXIT_PREEMPTED",
    "PAYLOAD",
    "Checkpointer",
    "JobSettings",
    "NoUsableCheckpointError",
    "Preempted",
    "RestoreError",
    "SavePolicy",
    "SaveResult",
    "ShardedStateError",
    "StoreSettings",
]


class Preempted(SystemExit):
    """Raised by :meth:`Checkpointer.step` after the emergency save: exits with code 75."""

    def __init__(self, notice: Notice, result: SaveResult | None) -> None:
        super().__init__(EXIT_PREEMPTED)
        self.notice = notice
        self.result = result


class PilotDone(SystemExit):
    """Raised by :meth:`Checkpointer.step` under ``costguard pilot`` once the pilot's steps
    ran and the pace is recorded: the script exits 0 (it was only measured)."""

    def __init__(self, steps: int) -> None:
        super().__init__(0)
        self.steps = steps


class RestoreError(CostguardError):
    """A checkpoint was read and verified but does not fit the objects given to restore."""


FIT_HINT = (
    "restore into the same model, optimizer and number of ranks it was saved from; to start "
    "over from step 0 on purpose: costguard run --start-fresh, or Checkpointer(start_fresh=True)"
)


class Checkpointer:
    """Saves and restores training state at ``url`` (a folder, s3://, gs://, az://).

    Example (a script that resumes where it stopped)::

        ckpt = Checkpointer.from_env(default="checkpoints/", every_steps=100)
        start = ckpt.restore(model=model, optimizer=opt, loader=loader)
        for step in range(start, total_steps):
            train_one_step(...)
            ckpt.step(step, model=model, optimizer=opt, loader=loader)
        ckpt.close()

    What it is told comes in three parts, each a checked value
    (:mod:`~costguard.checkpoint.settings`): ``policy``, a :class:`SavePolicy` (when to
    save and what to keep: ``every_steps``, ``every_minutes``, ``keep_last``,
    ``when_busy``, ``sync_every``, ``incremental``, ``save_niceness``,
    ``partial_grace_s``); ``storage``, a :class:`StoreSettings` (``storage_options``,
    ``retry``, ``check``); and ``job``, a :class:`JobSettings` (``rank``, ``events_file``,
    ``start_fresh``, ``total_steps``, ``pilot_steps``). Each field may be given as a
    keyword instead (``Checkpointer(url, every_steps=100, keep_last=2)``), but not both
    ways. ``notices`` is the board notices are posted to (one of its own by default);
    ``exit_on_notice=False`` makes :meth:`step` return ``True`` after an emergency save
    rather than raise :class:`Preempted`.

    ``when_busy`` says what a scheduled save does while the previous one is still
    uploading: ``"wait"`` for it, or ``"skip"`` this one. The store is checked for write
    access on construction (``check=True``), so a bad URL fails before training starts.

    Under an initialised ``torch.distributed`` process group (found when the Checkpointer
    is first used) every rank calls :meth:`restore`, :meth:`step`, :meth:`save` and
    :meth:`save_now` alike: these are collective. Rank 0 writes replicated state (DDP);
    a sharded model and optimizer (FSDP2, DTensor) are written by every rank at once and
    restored on any number of ranks (:mod:`~costguard.checkpoint.sharded`, on the training
    thread). Each rank's RNG and ``loader`` state is saved too. ``sync_every`` fixes how
    often (in steps) the ranks agree on notices and timed saves; by default about every
    0.1 s of training.

    The background save thread runs ``save_niceness`` nicer than training (Linux; 0 keeps
    it equal), so a busy machine slows the save rather than the training loop.

    With ``incremental`` (the default) the model's large frozen tensors (``requires_grad``
    off, buffers no step touches) are stored once, in a pool the checkpoints share, and
    not copied or uploaded again while they stay unchanged: a LoRA fine-tune saves the
    adapter and the optimizer, not the base model, at every save (see
    :mod:`~costguard.checkpoint.incremental`; for a sharded state, each rank's frozen
    shards: :mod:`~costguard.checkpoint.shard_pool`). The restored state is the same
    either way.

    When checkpoints exist but none can be used (each proven corrupt or unreadable now),
    :meth:`restore` raises :class:`NoUsableCheckpointError` rather than start from step 0;
    ``start_fresh`` makes it start from step 0 then, on purpose (a usable checkpoint is
    still resumed from).

    The training between :meth:`step` calls is timed (:mod:`~costguard.checkpoint.pace`),
    and rank 0 records the pace in the store (``job/pace.json``) after each save: with
    ``total_steps`` (the whole run's steps) ``costguard jobs status`` shows the finish time
    and the projected cost. ``pilot_steps`` stops the script (:class:`PilotDone`, exit 0)
    after that many steps, once the pace is recorded (``costguard pilot`` sets it).
    """

    def __init__(
        self,
        url: str | os.PathLike[str] = DEFAULT_URL,
        *,
        policy: SavePolicy | None = None,
        storage: StoreSettings | None = None,
        job: JobSettings | None = None,
        notices: NoticeBoard | None = None,
        exit_on_notice: bool = True,
        clock: Callable[[], float] = time.monotonic,
        **keywords: Unpack[Keywords],
    ) -> None:
        policy, storage, job = assemble(keywords, policy=policy, storage=storage, job=job)
        #: When to save and what to keep; the store's settings; what the job says.
        self.policy, self.storage, self.job = policy, storage, job
        self.schedule = policy.schedule
        self.keep_last = policy.keep_last
        self.when_busy = policy.when_busy
        self.start_fresh = job.start_fresh
        self.board = notices if notices is not None else NoticeBoard()
        self.exit_on_notice = exit_on_notice
        self.rank = job.rank or 0
        self.store = Store.open(url, storage.storage_options, retry=storage.retry)
        if storage.check and self.rank == 0:
            self.store.check_writable()
        self._clock = clock
        self._restorer = Restorer(self.store)
        self._saver = Saver(
            self.store,
            self._restorer,
            keep_last=policy.keep_last,
            save_niceness=policy.save_niceness,
            partial_grace_s=policy.partial_grace_s,
            events_file=job.events_file,
            incremental=policy.incremental,
        )
        self._last_steps_done = 0
        self._last_save_s = clock()
        #: The step and state last passed to :meth:`step`: what :meth:`close` commits.
        self._last_step: tuple[int, TrainState] | None = None
        self._cleanups: list[Callable[[], None]] = []
        self._closed = False
        self.sync_every = policy.sync_every
        self._group: Group | None = None
        self._until_sync = 0
        self._sync_started_s = clock()
        self._steps_since_sync = 0
        self._preempted_file: str | None = None
        #: Whether the state is sharded (saved through DCP); known at the first use.
        self._sharded: bool | None = None
        #: A sharded state's frozen chunks, stored once in the pool (this rank's).
        self._shard_pool = ShardPool(enabled=policy.incremental)
        #: Who writes a save: rank 0 a replicated state; every rank a sharded one, by
        #: the writer made when the state is first seen sharded (see :meth:`_writer`).
        self._replicated = Replicated(self._saver)
        self._sharded_writer: Sharded | None = None
        #: The manifest restored from, if any.
        self.restored: Manifest | None = None
        #: The training's pace between step() calls, and its records (rank 0's).
        self.pace_records = PaceRecorder(
            self.store,
            self._saver,
            clock=clock,
            total_steps=job.total_steps,
            pilot_steps=job.pilot_steps,
        )
        #: Whether this process has started a save from step(): the first is a set-up.
        self._saved_once = False

    @property
    def results(self) -> list[SaveResult]:
        """Every save's outcome, oldest first."""
        return self._saver.results

    @property
    def last_durable(self) -> SaveResult | None:
        """The newest save of this process that is durable, if any."""
        return next((r for r in reversed(self._saver.results) if r.ok), None)

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

        The environment wins over the arguments, which are defaults (keywords, or the
        parts ``policy=``, ``storage=``, ``job=``, whose unset fields the environment may
        fill): ``costguard run --checkpoint URL --every-steps N`` sets
        ``COSTGUARD_CHECKPOINT_URL`` and ``COSTGUARD_CHECKPOINT_EVERY_STEPS``. With
        ``watch`` it also listens for notices: SIGTERM and SIGUSR1, the pipe from
        ``costguard run`` (``COSTGUARD_NOTICE_FD``), or, when not under ``costguard
        run``, this cloud's metadata service (none off-cloud).
        ``RANK`` (torchrun) makes non-zero ranks restore only until the process group is
        initialised; then the ranks act together.
        """
        env = os.environ if env is None else env
        options = flatten(defaults)
        url = env.get(ENV_URL) or os.fspath(default)
        for key, name, kind in (
            ("total_steps", ENV_TOTAL_STEPS, int),
            ("pilot_steps", ENV_PILOT_STEPS, int),
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
        storage_options = storage_options_from_env(env)
        if storage_options is not None:
            options["storage_options"] = storage_options
        if env.get(ENV_EVENTS_FILE, "").strip():
            options.setdefault("events_file", env[ENV_EVENTS_FILE].strip())
        if env.get("RANK", "").strip().isdigit():
            options.setdefault("rank", int(env["RANK"]))
        if env.get(ENV_START_FRESH, "").strip() == "1":
            options["start_fresh"] = True
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
        verified (sizes and sha256); on a mismatch, a missing object, a corrupt manifest or
        a state the objects given cannot take (whatever is in it: a store may hold a
        forger's) a warning names it, says why and how many steps it costs, and the
        previous checkpoint is tried. When checkpoints exist and none can be used, raises
        :class:`NoUsableCheckpointError` (:class:`RestoreError` when none fits the objects)
        unless ``start_fresh``. ``extra`` is updated in place. Afterwards, partial folders
        left by a killed writer are deleted.

        Under a process group rank 0 chooses, every rank loads the checkpoint it chose (and
        verifies it), and each rank gets its own RNG and ``loader`` state back.
        """
        train = TrainState(
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            scaler=scaler,
            loader=loader,
            extra=extra,
        )
        if self._is_sharded(train):  # before training starts
            self._restore_sharded(train)
            return self._restored()
        group = self._agreeing()
        chosen: tuple[Manifest, Any] | None = None
        refusal: NoUsableCheckpointError | RestoreError | None = None
        if group.rank == 0:
            chosen, skipped = self._restorer.choose(
                fits=lambda manifest, data: self._apply(manifest, data, train)
            )
            picked = chosen[0] if chosen is not None else None
            refusal = fallback(skipped, picked, self.store.url, start_fresh=self.start_fresh)
            misfits = [s for s in skipped if s.why.startswith(MISFIT)]
            if refusal is not None and misfits:
                # None verifies and fits: say so as the error of a restore into other
                # objects than the checkpoints were saved from.
                newest = max(misfits, key=lambda s: (s.step, s.name))
                msg = f"checkpoint {newest.name} in {self.store.url} {newest.why}"
                refusal = RestoreError(msg, hint=FIT_HINT)
        self._refuse(group, refusal)
        chosen = self._load_chosen(group, chosen, train)
        if chosen is not None:
            manifest = chosen[0]
            del chosen  # the mapped payload: only the live objects keep its bytes
            if model is not None and self.rank == 0:
                # The frozen tensors just loaded are the pool's bytes: unchanged for the
                # first save after the resume too.
                self._saver.pool.adopt(model.state_dict(), self._restorer.pooled)
            self.restored = manifest
        return self._restored()

    def _apply(self, manifest: Manifest, data: Any, train: TrainState) -> None:
        """Load a checkpoint's state into the live objects, or :class:`MisfitError`: a
        state they cannot take (read from the store: anything may be there), whatever
        torch or the objects raise about it."""
        try:
            if not isinstance(data, Mapping):
                msg = f"holds a {type(data).__name__}, not a training state"
                raise TypeError(msg)
            state_mod.apply(state_mod.for_rank(data, self.rank), train)
        except Exception as exc:
            why = f"{MISFIT}: {type(exc).__name__}: {redact(str(exc))}"[:300]
            logger.debug("costguard: %s %s", manifest.name, why)
            raise MisfitError(why) from exc

    def _refuse(
        self, group: Group | Alone, refusal: NoUsableCheckpointError | RestoreError | None
    ) -> None:
        """Raise rank 0's refusal to start from step 0 on every rank (collective), after
        telling ``costguard run`` (which then exits 2 with its message and hint)."""
        said = None
        if refusal is not None:
            said = (refusal.message, refusal.hint, isinstance(refusal, RestoreError))
        said = group.broadcast(said)
        if said is None:
            return
        if self.rank == 0:
            self._saver.note({"event": "restore", "refused": said[0], "hint": said[1]})
        if said[2]:
            raise RestoreError(said[0], hint=said[1])
        raise NoUsableCheckpointError(said[0], hint=said[1])

    def _restored(self) -> int:
        """After a restore (of :attr:`restored`, if any): the step to start from."""
        if self.restored is not None:
            manifest = self.restored
            self._last_steps_done = manifest.step
            self._saver.saved_steps_done = manifest.step
            self._last_save_s = self._clock()
            logger.info("costguard: resumed from %s (step %d)", manifest.name, manifest.step)
        if self.rank == 0:
            restored = self.restored
            self._saver.note(
                {
                    "event": "restore",
                    "name": restored.name if restored else None,
                    "step": restored.step if restored else 0,
                }
            )
            # Only abandoned partial and proven corrupt folders: a restore never counts.
            self._saver.retain(count=False)
        return self.restored.step if self.restored else 0

    def _is_sharded(self, parts: TrainState) -> bool:
        """Whether the state is sharded, decided once, when objects are first given (see
        :func:`~costguard.checkpoint.sharded.detect`: an unsaveable one is refused)."""
        if self._sharded is None and (parts.stateful() or parts.extra is not None):
            self._sharded = sharded_mod.detect(parts)
        return bool(self._sharded)

    def _restore_sharded(self, train: TrainState) -> None:
        """:meth:`restore` of a sharded state: every rank verifies and loads its part."""
        self._saver.wait()  # a save in flight still reads the pool's records
        group = Group.current()
        if group is None:  # pragma: no cover - detect() found a process group
            msg = "no process group"
            raise RuntimeError(msg)
        self._group, self.rank = group, group.rank
        try:
            self.restored, skipped = sharded_mod.restore(
                self.store, self._restorer, group, train, self._shard_pool
            )
        except (KeyError, RuntimeError, ValueError) as exc:
            msg = f"a sharded checkpoint in {self.store.url} does not fit: {exc}"
            raise RestoreError(
                msg,
                hint="restore into the same model and optimizer it was saved from (the "
                "number of ranks may differ)",
            ) from exc
        refusal: NoUsableCheckpointError | RestoreError | None = None
        if group.rank == 0:
            refusal = fallback(skipped, self.restored, self.store.url, start_fresh=self.start_fresh)
            misfits = [s for s in skipped if s.why.startswith(MISFIT)]
            if refusal is not None and misfits:
                newest = max(misfits, key=lambda s: (s.step, s.name))
                msg = f"checkpoint {newest.name} in {self.store.url} {newest.why}"
                refusal = RestoreError(msg, hint=FIT_HINT)
        self._refuse(group, refusal)

    def _load_chosen(
        self, group: Group | Alone, chosen: tuple[Manifest, Any] | None, train: TrainState
    ) -> tuple[Manifest, Any] | None:
        """Rank 0's choice on every rank (collective): one answer to "which is latest",
        loaded into this rank's objects (rank 0's are, by its choice)."""
        name = group.broadcast(chosen[0].name if chosen is not None else None)
        error = ""
        if name is not None and group.rank != 0:
            try:
                # Read again here, bounded as rank 0's read was: it may have changed since.
                text = self.store.get(f"{name}/{MANIFEST_FILE}", max_bytes=MAX_MANIFEST_BYTES)
                manifest = parse_manifest(text, name)
                self._apply(manifest, self._restorer.load(manifest), train)
                chosen = manifest, None
            except (CostguardError, ValueError) as exc:
                error = redact(str(exc)) or type(exc).__name__
        if group.any(bool(error)):
            msg = f"checkpoint {name} in {self.store.url}, chosen by rank 0, failed on a rank"
            if error:
                msg += f" (here, rank {group.rank}: {error})"
            raise RestoreError(
                msg, hint="every rank must reach the same store (a shared folder or a bucket)"
            )
        return chosen

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
        parts = TrainState(model, optimizer, scheduler, scaler, loader, extra, epoch)
        self._last_step = (step, parts)
        saved = self._last_steps_done
        meter = self.pace_records.meter
        meter.lap(self._clock(), step + 1)
        try:
            stop = self._step(step, parts)
        finally:
            first_save = self._last_steps_done != saved and not self._saved_once
            self._saved_once = self._saved_once or self._last_steps_done != saved
            meter.resume(self._clock(), setup=first_save)
        if not self._closed:
            self._after_step(step)
        return stop

    def _after_step(self, step: int) -> None:
        """Record the pace (rank 0; see :class:`~costguard.checkpoint.pace.PaceRecorder`);
        at the end of a pilot, stop the script once it is recorded."""
        if self.pace_records.pilot_done:
            self.publish_pace(step + 1, block=True)
            self.close(final=False)
            raise PilotDone(self.pace_records.meter.laps)
        if self.rank == 0:
            self.pace_records.after_step(step + 1, self._last_steps_done, ranks=self._ranks)

    @property
    def _ranks(self) -> int:
        return self._group.world_size if self._group is not None else 1

    def pace(self, steps_done: int) -> Pace:
        """The pace measured so far, as :meth:`publish_pace` records it."""
        return self.pace_records.pace(steps_done, ranks=self._ranks)

    def publish_pace(self, steps_done: int, *, block: bool = False) -> None:
        """Write the pace to ``job/pace.json`` (rank 0) on the background thread, after
        what is queued there (so an older record never lands last); with ``block``, wait
        for it. Never raises: a record that cannot be written is logged."""
        if self.rank == 0:
            self.pace_records.publish(steps_done, ranks=self._ranks, block=block)

    def _agreeing(self) -> Group | Alone:
        """Who this process decides with: its process group, or a world of one (whose
        rank 0 it is; ``rank`` still says whether it writes)."""
        return self._coordination() or Alone()

    def _step(self, step: int, parts: TrainState) -> bool:
        """:meth:`step` after the pace is measured: save when due, act on notices; under a
        process group every rank decides the same thing (alone, at every step)."""
        group = self._agreeing()
        steps_done = step + 1
        self._steps_since_sync += 1
        self._until_sync -= 1
        if self._until_sync > 0:
            # Not a step to agree at: only the step-count schedule, the same on every rank.
            if self.schedule.due_by_steps(
                steps_done=steps_done, last_steps_done=self._last_steps_done
            ):
                self.save(step, reason="schedule", parts=parts)
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
            return self._emergency(group, step, urgent, parts)
        if decision.advisory:
            kind = f"{advisory[0].source}-{advisory[0].kind}" if advisory else "peer-advisory"
            self.save(step, reason=f"notice:{kind}", parts=parts)
        elif decision.scheduled:
            self.save(step, reason="schedule", parts=parts)
        return False

    def save(
        self,
        step: int,
        *,
        reason: str = "demand",
        block: bool = False,
        parts: TrainState | None = None,
        **objects: Any,
    ) -> Future[SaveResult] | None:
        """Save the state after step ``step`` now; returns the background save's future.

        ``objects`` are :meth:`step`'s keyword arguments (``model=``, ``optimizer=``, ...),
        or ``parts`` the same as one :class:`~costguard.checkpoint.state.TrainState`.
        Blocks for the copy to CPU memory (and, with ``block``, until the save is durable);
        a sharded state copies what changed when that is at most a quarter of each rank's
        state (a LoRA fine-tune after its first save), and otherwise blocks until its shards
        are written and committed (see :mod:`~costguard.checkpoint.sharded`); a sharded save
        always waits for the one before it. Returns ``None`` when ``when_busy="skip"`` and a
        save is still in flight, and on ranks other than 0 (under a process group every
        rank must call it: each sends its own RNG and loader state to rank 0).
        """
        if parts is None:
            parts = TrainState(**objects)
        return self._save(step, reason, parts, block=block, hurry=block)

    def _save(
        self, step: int, reason: str, parts: TrainState, *, block: bool = False, hurry: bool
    ) -> Future[SaveResult] | None:
        """:meth:`save`, in either layout (:meth:`_writer`); ``hurry`` when training waits
        for it (block, final, emergency): it may then use a second core (see
        :attr:`~costguard.checkpoint.incremental.Snapshot.hurry`)."""
        if self._closed:
            msg = "this Checkpointer is closed"
            raise RuntimeError(msg)
        writer = self._writer(parts)
        group = self._agreeing()
        if group.world_size == 1 and self.rank != 0:
            return None  # a worker whose process group is not up yet: it takes no part
        steps_done = step + 1
        self._last_steps_done = steps_done
        self._last_save_s = self._clock()
        order = Order(
            checkpoint_name(steps_done, secrets.token_hex(4)),
            steps_done,
            reason,
            parts,
            hurry=hurry,
            skip_if_busy=self.when_busy == "skip" and reason == "schedule",
        )
        future = writer.write(group, order)
        if block and future is not None:
            self._saver.result(future)  # retention too
        return future if self.rank == 0 else None

    def _writer(self, parts: TrainState) -> Writer:
        """Who writes this save: rank 0 a replicated state, every rank a sharded one.

        Every rank of a sharded model gets here with its shards: all decide alike, at the
        first save or restore given objects (sharding does not change during a run)."""
        if not self._is_sharded(parts):
            return self._replicated
        if self._sharded_writer is None:
            group = Group.current()
            if group is None:  # pragma: no cover - detect() found a process group
                msg = "no process group"
                raise RuntimeError(msg)
            self._sharded_writer = Sharded(self._saver, group, self._shard_pool)
        return self._sharded_writer

    def _arm_deadline(self, notice: Notice) -> None:
        """From now on no store retry may outlive the notice (see :attr:`Store.deadline_unix`)."""
        if notice.deadline_unix is not None:
            self.store.deadline_unix = notice.deadline_unix - REPORT_MARGIN_S

    @staticmethod
    def _wait_s(notice: Notice) -> float | None:
        """How long to wait for the emergency save: until shortly before the deadline.

        A deadline already past (a clock that is off, a notice read late) gives no useful
        limit: the machine is still here, so the save is waited for (its store calls are
        no longer retried).
        """
        if notice.deadline_unix is None:
            return None
        left = notice.deadline_unix - REPORT_MARGIN_S - time.time()
        return left if left > 0 else None

    def _emergency(
        self, group: Group | Alone, step: int, local: Notice | None, parts: TrainState
    ) -> bool:
        """The emergency save: the same step on every rank (alone: this one), rank 0
        writes (unless a save of that step has started), every rank waits until it is
        durable, then all stop."""
        notice = earliest(group.all_gather(local)) or Notice("peer", "preempt", None)
        logger.warning("costguard: %s: saving step %d now", notice.describe(), step + 1)
        self._arm_deadline(notice)
        if self._last_steps_done != step + 1:  # the same on every rank: saves are collective
            self._save(step, f"notice:{notice.source}-{notice.kind}", parts, hurry=True)
        # Every rank waits for its own part of the save (written in the background).
        result = self.flush(self._wait_s(notice))
        if group.rank != 0:
            result = None
        # Every rank waits here for rank 0's save: a rank that exited early would make a
        # launcher like torchrun kill the others, rank 0 included, before it is durable.
        outcome = group.broadcast(
            None if result is None else (result.name, result.step, result.reason, result.ok)
        )
        if result is None and outcome is not None:
            result = SaveResult(*outcome)
        return self._stop(notice, result, step + 1)

    def _stop(self, notice: Notice, result: SaveResult | None, steps_done: int | None) -> bool:
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
            durable = self.last_durable
            fallback = (
                f"{durable.name} (step {durable.step})"
                if durable is not None
                else f"{self.restored.name} (step {self.restored.step})"
                if self.restored is not None
                else "none: the next run starts fresh"
            )
            why = (
                "it was still running when the notice's deadline came near"
                if result is None and notice.deadline_unix is not None
                else result.error
                if result is not None
                else "nothing was saved"
            )
            logger.error(
                "costguard: the emergency save%s did not commit: %s. The newest durable "
                "checkpoint is %s.",
                f" of step {steps_done}" if steps_done else "",
                why,
                fallback,
            )
        if self._preempted_file:
            record = {
                "rank": self.rank,
                "notice": notice.to_json(),
                "ok": bool(result and result.ok),
            }
            record["step"] = result.step if result is not None else None
            mark_preempted(self._preempted_file, record)
        if self.exit_on_notice:
            self.close(final=False, timeout_s=self._wait_s(notice))
            raise Preempted(notice, result)
        return True

    def save_now(self, step: int, **objects: Any) -> bool:
        """Emergency save of the state after step ``step`` right now, then stop.

        For a loop that learns of a notice (:attr:`preempting`) between steps, e.g. in a
        long evaluation, rather than at :meth:`step`. Waits until the save is durable, then
        raises :class:`Preempted` (or returns ``True`` with ``exit_on_notice=False``).
        Without a notice it is a save-and-stop on demand. Under a process group every rank
        must call it at the same step.
        """
        notice = self.preempting or Notice("demand", "stop", None, "save_now")
        return self._emergency(self._agreeing(), step, notice, TrainState(**objects))

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
        return self._stop(notice, result, None)

    def flush(self, timeout_s: float | None = None) -> SaveResult | None:
        """Wait until the save in flight is durable, and the pace record queued after it
        is written; the save's result (``None`` if none ran).

        With a timeout that passes first, returns ``None`` and the save goes on.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        result = self._saver.flush(timeout_s)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        return result if self.pace_records.wait(left) else None

    def close(self, *, final: bool = True, timeout_s: float | None = None) -> None:
        """Commit the final state, wait for the save in flight, stop listening for notices.

        With ``final`` (a plain ``close()`` after the loop), the state last passed to
        :meth:`step` is saved (reason ``final``) when it is newer than the newest save, so
        the store holds the result of a finished run, not the last scheduled save. Under a
        process group every rank must call it, as every rank calls :meth:`step`.
        ``timeout_s`` bounds the wait for a save in flight (it then goes on alone).
        """
        if self._closed:
            return
        result = self.flush(timeout_s)
        if final and self._last_step is not None:
            step, parts = self._last_step
            group = self._agreeing()
            # Under a group every rank must decide alike: by the saves they all started;
            # alone, by the last durable one (a failed save is tried again here).
            together = group.world_size > 1
            saved = self._last_steps_done if together else self._saver.saved_steps_done
            if step + 1 > (saved or 0):
                self._save(step, "final", parts, hurry=True)
                result = self.flush(timeout_s)
            durable = self.last_durable
            committed = durable is not None and durable.step == step + 1
            self.publish_pace(step + 1, block=True)
            # Rank 0 knows; every rank waits for its word, so no rank's close() returns
            # before the final checkpoint is durable.
            committed = bool(group.broadcast(committed))
            # Tell costguard run this rank is done: a crash after this (a process-group
            # teardown that aborts) does not undo a finished job.
            self._saver.note(
                {
                    "event": "closed",
                    "rank": self.rank,
                    "world": group.world_size,
                    "node_ranks": node_ranks(group.world_size),
                    "step": step + 1,
                    "committed": committed,
                }
            )
        self._last_step = None
        if final and result is not None and result.reason == "final" and not result.ok:
            logger.error(
                "costguard: the final save of step %d failed: %s", result.step, result.error
            )
        self._closed = True
        self._saver.shutdown(wait=timeout_s is None)
        for cleanup in reversed(self._cleanups):
            cleanup()
        self._cleanups.clear()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # After an error in the loop the state may be half updated: no final save.
        self.close(final=exc_type is None)
