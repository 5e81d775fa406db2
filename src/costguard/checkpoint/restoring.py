"""Which checkpoint to resume from, read without holding the state twice, and what it
proved about the others.

The newest checkpoint whose manifest parses and whose objects are all listed is tried
first; its payload is verified (size and sha256) on the way to a local file, and loaded by
mapping that file (``torch.load(mmap=True)``): restore memory is about what the live
objects need, not a second copy of the state.

Every checkpoint that does not work out ends in one of two sets, and the difference is the
whole point of this module:

* **corrupt** (:class:`~costguard.checkpoint.manifest.ManifestError`): proven bad, a
  manifest that does not parse, an object missing from the listing, bytes whose sha256 is
  not the manifest's. Retention may delete such a folder once a newer checkpoint exists.
* **doubtful** (anything else: a read that failed after its retries, a timeout, a 403, a
  manifest from a newer costguard, a payload this torch cannot load): skipped for this
  restore, and never deleted.

One rule for every restore path (replicated, incremental, sharded), :func:`fallback`: each
checkpoint skipped is named in a warning with why and how many steps it costs; when
checkpoints exist and none can be used, the restore raises
:class:`NoUsableCheckpointError` rather than start at step 0 (``start_fresh`` starts over
on purpose). A checkpoint proven incomplete or corrupt gets a marker object
(:data:`~costguard.checkpoint.manifest.CONDEMNED_FILE`): the verdict stands even if a
later run writes the missing pool object again.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from costguard.checkpoint import incremental
from costguard.checkpoint import state as state_mod
from costguard.checkpoint.manifest import (
    CONDEMNED_FILE,
    MANIFEST_FILE,
    MAX_MANIFEST_BYTES,
    Listing,
    Manifest,
    ManifestError,
    UnreadableError,
    missing_objects,
    parse_manifest,
    restore_order,
    scan,
)
from costguard.checkpoint.store import Progress, Store, TooLargeError
from costguard.errors import EXIT_BAD_INPUT, CostguardError
from costguard.logs import get_logger
from costguard.secrets import redact

logger = get_logger(__name__)

#: The one payload object of a replicated checkpoint.
PAYLOAD = "state.pt"
#: The most manifests one survey reads (newest folders first), each read no further than
#: ``MAX_MANIFEST_BYTES``: a budget per candidate, so that large forged manifests cannot
#: use up what a valid older checkpoint needs. Folders past it are reported unread and kept.
SURVEY_MANIFESTS = 64
#: The most manifest text a Restorer keeps parsed between surveys (oldest dropped first).
CACHED_MANIFEST_BYTES = 4 * 2**20
#: A restore (and an export) tries every checkpoint its survey read (at most
#: ``SURVEY_MANIFESTS``): a forger's newer checkpoints that verify but do not load cost a
#: few reads each, and cannot hide a valid older one behind a smaller budget.
RESTORE_TRIES = SURVEY_MANIFESTS


@dataclass
class Survey:
    """One look at a store: its folders, the manifests that could be read, and what the
    look proved."""

    sizes: dict[str, int]
    listings: list[Listing]
    manifests: list[Manifest]
    #: Folders proven bad (name -> why).
    corrupt: dict[str, str] = field(default_factory=dict)
    #: Folders that could not be judged now (name -> why): never deleted.
    doubtful: dict[str, str] = field(default_factory=dict)
    #: Manifests that were read but whose objects are not all listed (corrupt), with only
    #: their pool objects (what the pool's retention needs of them).
    incomplete: list[Manifest] = field(default_factory=list)
    #: Relative path -> when it was last written, for the objects whose store says.
    modified: dict[str, float] = field(default_factory=dict)
    #: Folders an earlier restore recorded as incomplete or corrupt (corrupt too).
    condemned: set[str] = field(default_factory=set)

    @property
    def committed(self) -> set[str]:
        """Folders with a readable manifest whose objects are all listed."""
        return {m.name for m in restore_order(self.manifests, self.sizes)} - set(self.corrupt)

    def skipped(self) -> list[Skipped]:
        """The checkpoints (folders with a manifest) a restore cannot use, as listed."""
        steps = {c.name: c.step for c in self.listings}
        return [
            *(
                Skipped(name, steps.get(name, 0), why, kept=False)
                for name, why in self.corrupt.items()
            ),
            *(
                Skipped(name, steps.get(name, 0), why, kept=True)
                for name, why in self.doubtful.items()
            ),
        ]


@dataclass(frozen=True)
class Skipped:
    """A checkpoint a restore did not use: why, and whether it is kept (could not be judged
    now) or proven incomplete or corrupt (recorded; retention may delete it)."""

    name: str
    step: int
    why: str
    kept: bool


#: How a checkpoint the objects cannot take is described (one path or sharded).
MISFIT = "does not fit the objects given to restore"


class MisfitError(UnreadableError):
    """A checkpoint that verifies and loads, but whose state the objects given to restore
    cannot take (another model's, or not a state at all): skipped and kept, never proof
    of corruption."""


class NoUsableCheckpointError(CostguardError):
    """Checkpoints exist but none can be restored: starting from step 0 instead would
    silently throw the run away (exit code 2)."""

    exit_code = EXIT_BAD_INPUT


#: What the refusal suggests (:func:`fallback`).
START_FRESH_HINT = (
    "costguard checkpoint verify URL says what is wrong with each; to start over from step 0 "
    "on purpose: costguard run --start-fresh, or Checkpointer(start_fresh=True)"
)


def fallback(
    skipped: list[Skipped], chosen: Manifest | None, url: str, *, start_fresh: bool
) -> NoUsableCheckpointError | None:
    """The one rule of every restore path: warn about each checkpoint newer than the one
    resumed from that was skipped (why, and the steps it costs), and return the error to
    raise when checkpoints exist but none can be used (``None`` with ``start_fresh``: the
    run starts from step 0 on purpose, with a warning)."""
    start = chosen.step if chosen is not None else 0
    passed = sorted(
        (s for s in skipped if s.step >= start and (chosen is None or s.name != chosen.name)),
        key=lambda s: (s.step, s.name),
        reverse=True,
    )
    for s in passed:
        logger.warning(
            "costguard: skipped checkpoint %s (step %d): %s. %s Resuming from step %d repeats "
            "%d steps.",
            s.name,
            s.step,
            s.why,
            "It is kept (it could not be judged now)."
            if s.kept
            else "It is recorded as incomplete or corrupt.",
            start,
            s.step - start,
        )
    if chosen is not None or not skipped:
        return None
    newest = max(skipped, key=lambda s: (s.step, s.name))
    msg = (
        f"{len(skipped)} checkpoint{'s' * (len(skipped) > 1)} in {url} and none can be "
        f"used (the newest, {newest.name} at step {newest.step}: {newest.why})"
    )
    if start_fresh:
        logger.warning("costguard: %s; starting from step 0, as start_fresh asks", msg)
        return None
    logger.error("costguard: %s. Not starting from step 0: %s", msg, START_FRESH_HINT)
    return NoUsableCheckpointError(msg, hint=START_FRESH_HINT)


class Restorer:
    """Reads manifests (cached: a manifest never changes) and payloads from one store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        #: Parsed manifests -> their text's size, within CACHED_MANIFEST_BYTES in all.
        self._manifests: dict[str, tuple[Manifest, int]] = {}
        self._cached_bytes = 0
        #: Proven corrupt in this process (a hash mismatch is not visible in a listing).
        self.corrupt: dict[str, str] = {}
        #: Of the last :meth:`load`: which tensors came from which verified pool object.
        self.pooled: dict[tuple[object, ...], incremental.Placed] = {}

    def remember(self, manifest: Manifest, size: int | None = None) -> None:
        """A manifest this process has just committed (or read: ``size``, its text's)."""
        cost = size if size is not None else 200 + 120 * len(manifest.objects)
        with self._lock:
            _, old = self._manifests.pop(manifest.name, (None, 0))
            self._manifests[manifest.name] = (manifest, cost)
            self._cached_bytes += cost - old
            while self._cached_bytes > CACHED_MANIFEST_BYTES and len(self._manifests) > 1:
                oldest = next(iter(self._manifests))  # in the order they were kept
                self._cached_bytes -= self._manifests.pop(oldest)[1]

    def _cached(self, name: str) -> Manifest | None:
        with self._lock:
            cached = self._manifests.get(name)
        return cached[0] if cached is not None else None

    def mark_corrupt(self, name: str, why: str) -> None:
        """A checkpoint proven corrupt when it was read (retention may delete it)."""
        with self._lock:
            self.corrupt[name] = why

    def condemn(self, skipped: list[Skipped]) -> None:
        """Record in the store each checkpoint a restore proved incomplete or corrupt (its
        :data:`CONDEMNED_FILE`), so the verdict outlives a later write of the same pool
        object. Best effort: a store this process may only read keeps the verdict here."""
        for s in skipped:
            if s.kept:
                continue
            self.mark_corrupt(s.name, s.why)
            record = {"why": s.why, "found_unix": time.time()}
            try:
                self.store.put(f"{s.name}/{CONDEMNED_FILE}", json.dumps(record).encode())
            except CostguardError as exc:
                logger.warning(
                    "costguard: could not record %s as corrupt: %s", s.name, redact(exc.message)
                )

    def forget(self, name: str) -> None:
        """A checkpoint that has been deleted."""
        with self._lock:
            self._cached_bytes -= self._manifests.pop(name, (None, 0))[1]
            self.corrupt.pop(name, None)

    def survey(self) -> Survey:
        """List the store and read every manifest not read before (doubtful ones again)."""
        sizes, modified = self.store.objects()
        listings = scan(sizes, modified)
        with self._lock:
            corrupt = {k: v for k, v in self.corrupt.items() if any(c.name == k for c in listings)}
        survey = Survey(sizes, listings, [], corrupt, modified=modified)
        examined = 0
        for listing in reversed(listings):  # newest first: the budget goes where resumes are
            if not listing.has_manifest or listing.name in survey.corrupt:
                continue
            if listing.condemned:
                survey.condemned.add(listing.name)
                survey.corrupt[listing.name] = (
                    f"an earlier restore found it incomplete or corrupt ({CONDEMNED_FILE})"
                )
                continue
            examined += 1
            if examined > SURVEY_MANIFESTS:
                survey.doubtful[listing.name] = (
                    f"not read: a survey reads the newest {SURVEY_MANIFESTS} manifests"
                )
                continue
            try:
                manifest = self._manifest(listing)
            except ManifestError as exc:
                survey.corrupt[listing.name] = exc.message
                logger.warning("costguard: checkpoint %s is corrupt: %s", listing.name, exc)
            except CostguardError as exc:
                survey.doubtful[listing.name] = redact(exc.message)
                logger.warning(
                    "costguard: could not read the manifest of %s now (%s); it is kept",
                    listing.name,
                    redact(exc.message),
                )
            else:
                missing = missing_objects(manifest, sizes)
                if not missing:
                    survey.manifests.append(manifest)
                else:
                    # Kept for what it may share from the pool, and no more: a forged
                    # manifest listing a million objects is not held in memory.
                    pooled = tuple(o for o in manifest.objects if o.pool)
                    survey.incomplete.append(replace(manifest, objects=pooled))
                    survey.corrupt[listing.name] = missing[0] + (
                        f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
                    )
        with self._lock:
            self.corrupt.update(survey.corrupt)
        return survey

    def _manifest(self, listing: Listing) -> Manifest:
        listed = listing.objects[MANIFEST_FILE]
        if listed > MAX_MANIFEST_BYTES:
            msg = f"its manifest is {listed} bytes (at most {MAX_MANIFEST_BYTES})"
            raise ManifestError(msg)
        return self.manifest(listing.name)

    def manifest(self, name: str) -> Manifest:
        """The manifest of checkpoint ``name`` (read if not cached); its text is read no
        further than ``MAX_MANIFEST_BYTES`` whatever its size."""
        cached = self._cached(name)
        if cached is not None:
            return cached
        path = f"{name}/{MANIFEST_FILE}"
        try:
            text = self.store.get(path, max_bytes=MAX_MANIFEST_BYTES)
        except TooLargeError:
            msg = f"its manifest is over {MAX_MANIFEST_BYTES} bytes"
            raise ManifestError(msg) from None
        manifest = parse_manifest(text, name)
        self.remember(manifest, len(text))
        return manifest

    @contextmanager
    def payload_file(self, manifest: Manifest, progress: Progress | None = None) -> Iterator[str]:
        """A local file with the checkpoint's verified payload (see
        :meth:`Store.verified_file`)."""
        if manifest.sharded:
            # Not proof of anything wrong: it needs the sharded model to load into.
            msg = (
                f"{manifest.name} is a sharded checkpoint (one object per rank); restore it "
                "into the sharded (FSDP2 / DTensor) model under torch.distributed"
            )
            raise UnreadableError(
                msg, hint="or get its whole weights: costguard checkpoint export URL --to FILE"
            )
        if manifest.folder:
            # A trainer's own files (costguard run --sync-dir): fine, but no costguard state.
            msg = f"{manifest.name} holds a trainer's own checkpoint files, not a costguard state"
            raise UnreadableError(
                msg, hint="costguard run --sync-dir puts them back for the trainer"
            )
        own = [o for o in manifest.objects if not o.pool]
        if len(own) != 1 or own[0].name != PAYLOAD:
            msg = f"unexpected objects {[o.name for o in manifest.objects][:10]}"
            raise ManifestError(msg)
        entry = own[0]
        with self.store.verified_file(
            manifest.object_path(entry), entry.size_bytes, entry.sha256, progress
        ) as path:
            yield path

    def load(self, manifest: Manifest) -> Any:
        """The checkpoint's state, verified, its tensors mapped from local files (the
        payload and, for an incremental save, each pool object it refers to)."""
        with (
            terminal_progress(f"restoring step {manifest.step}", manifest.size_bytes) as bar,
            ExitStack() as files,
        ):
            path = files.enter_context(self.payload_file(manifest, bar))
            pooled = {
                o.sha256: (
                    files.enter_context(
                        self.store.verified_file(manifest.object_path(o), o.size_bytes, o.sha256)
                    ),
                    o.size_bytes,
                )
                for o in manifest.objects
                if o.pool
            }
            try:
                state, self.pooled = incremental.assemble(state_mod.load_file(path), pooled)
                return state
            except UnreadableError:
                raise
            except Exception as exc:
                # Verified bytes this torch cannot read: a newer format, or a foreign file.
                # The bytes are what was written, so this is no proof of corruption.
                msg = f"{PAYLOAD} cannot be loaded: {type(exc).__name__}: {str(exc)[:200]}"
                raise UnreadableError(msg) from exc

    def choose(
        self, fits: Callable[[Manifest, Any], None] | None = None
    ) -> tuple[tuple[Manifest, Any] | None, list[Skipped]]:
        """The newest checkpoint that verifies, loads and (``fits``) is taken by the live
        objects, with its state (or ``None``), and every checkpoint that could not be used
        (see :func:`fallback`).

        A corrupt one is recorded (:meth:`condemn`) and the previous one tried; one that
        could not be read now, or that ``fits`` refuses (:class:`MisfitError`: a state
        these objects cannot take, as anyone who can write the store may leave), is
        skipped and kept.
        """
        survey = self.survey()
        skipped = survey.skipped()
        chosen: tuple[Manifest, Any] | None = None
        for tries, manifest in enumerate(restore_order(survey.manifests, survey.sizes)):
            if tries == RESTORE_TRIES:
                logger.warning(
                    "costguard: %d checkpoints in a row did not load; older ones are not tried",
                    tries,
                )
                break
            try:
                state = self.load(manifest)
                if fits is not None:
                    fits(manifest, state)
                chosen = manifest, state
                break
            except ManifestError as exc:
                skipped.append(Skipped(manifest.name, manifest.step, exc.message, kept=False))
            except UnreadableError as exc:
                skipped.append(Skipped(manifest.name, manifest.step, exc.message, kept=True))
            except Exception as exc:
                why = f"{type(exc).__name__}: {redact(str(exc))[:300]}"
                skipped.append(Skipped(manifest.name, manifest.step, why, kept=True))
        self.condemn([s for s in skipped if s.name not in survey.condemned])
        return chosen, skipped


#: Reads and writes shorter than this show no progress bar: they are over before one
#: would help.
PROGRESS_MIN_BYTES = 64 * 2**20


def stderr_is_terminal() -> bool:
    """Whether stderr is an interactive terminal (not a log file, a pipe, a batch job's
    output or a notebook's)."""
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


@contextmanager
def terminal_progress(description: str, size: int) -> Iterator[Progress | None]:
    """A progress bar on stderr for a long read or write, only when stderr is a terminal
    (:func:`stderr_is_terminal`) and ``size`` is at least :data:`PROGRESS_MIN_BYTES`."""
    if size < PROGRESS_MIN_BYTES or not stderr_is_terminal():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    columns = (TextColumn(f"costguard: {description}"), BarColumn(), DownloadColumn())
    with Progress(*columns, console=Console(file=sys.stderr), transient=True) as bar:
        task = bar.add_task(description, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)
