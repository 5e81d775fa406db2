"""A trainer's own checkpoints kept in the store: ``costguard run --sync-dir out/``.

Hugging Face's ``Trainer`` writes ``checkpoint-N/`` folders, Accelerate's ``save_state``
writes a folder (``checkpoint_N/`` with automatic naming), Lightning writes ``.ckpt``
files. While the script runs, each one the trainer has *finished* is uploaded as a
costguard checkpoint: its files, their sha256, and the manifest last (format
:data:`~costguard.checkpoint.manifest.FOLDER_FORMAT_VERSION`, the files' paths in
``extra["folder"]``), then retention as for any save. Before the script starts, the newest
verified one is put back where the trainer looks, so its own resume
(``get_last_checkpoint``, ``ckpt_path="last"``, ``load_state``) finds it on a new machine.

Finished means what each trainer writes last is there and every file is whole
(:mod:`costguard.checkpoint.completion`, the rules per trainer), and nothing changing since:
while the trainer runs, an item must also have kept the same sizes and times for
``settle_s`` (a file a trainer writes after its mark, not begun yet); once it has exited,
nothing is writing any more and the checks alone decide.

The folder is watched by the file system's own events (watchdog: inotify on Linux), so a
save is seen as it is written, not at the next poll; a look every ``poll_s`` remains for
file systems whose events miss other machines' writes (NFS, Lustre). watchdog over
watchfiles: it brings no other package (watchfiles brings anyio), and its callback on
an event is what this thread needs (wake up and look), where watchfiles' generator would
own the thread. An upload reads from descriptors opened before it starts, so the
trainer's rotation deleting the folder meanwhile takes nothing from it.

Retention counts steps: Lightning's ``last.ckpt`` and its step file of one step are one
save, kept or dropped together.
A folder left half written (a kill during the save) is never uploaded, and one found in
``out/`` before the script starts is moved aside (to ``.costguard-incomplete/``), not
deleted, so the trainer's resume cannot pick it. A checkpoint put back from the store is
checked the same way before it is renamed into place: one that is not whole is skipped
(said in one line) and the previous one put back. One whole by every rule that the
trainer's own loader refuses shows when the script fails before writing anything right
after it was put back (:meth:`FolderSync.fall_back`): it is moved aside
(``.costguard-refused/``), the previous one put back and the script run once more; when the
trainer then goes on, the store records it (:data:`REFUSED_FILE`) and it is not put back
again.

Only this run's checkpoints go up: what costguard put back, what it uploaded before on this
machine (its ledger, :func:`ledger_path`, names the store) and what the trainer
writes from now on. Each one uploaded records its run (:mod:`costguard.checkpoint.lineage`),
which tells another run's checkpoints in the store apart for every trainer; before that
record, another run's Hugging Face checkpoints that an earlier costguard uploaded are told
apart by their trainer's history (``log_history``), which does not continue the run's first
checkpoint's. Either way: named, never put back, neither counted nor deleted by retention.
Anything else found in ``out/`` is named; one newer than the store's newest would take the
trainer's resume over, so it is moved aside (``.costguard-foreign/``, never deleted). A
link is never followed out of the folder, and a restore writes nothing through one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from costguard._version import __version__
from costguard.checkpoint.checkpointer import DEFAULT_SAVE_NICENESS
from costguard.checkpoint.completion import (
    HF_MARK,
    MAX_DEPTH,
    Item,
    inside,
    item_at,
    items_in,
)
from costguard.checkpoint.lineage import KEY as LINEAGE_KEY
from costguard.checkpoint.lineage import Lineage, lineage_of, others
from costguard.checkpoint.manifest import (
    FOLDER_FORMAT_VERSION,
    PARTIAL_GRACE_S,
    Manifest,
    ManifestError,
    ObjectEntry,
    UnreadableError,
    checkpoint_name,
    plan_retention,
    restore_order,
)
from costguard.checkpoint.restoring import Restorer
from costguard.checkpoint.saving import _lower_priority
from costguard.checkpoint.store import Store
from costguard.clouds import require
from costguard.errors import CostguardError, InputError
from costguard.logs import get_logger
from costguard.secrets import redact

logger = get_logger(__name__)

#: Where a half-written item found before the script starts is moved (never deleted).
ASIDE = ".costguard-incomplete"
#: Where a checkpoint that is not this run's, newer than its own, is moved (never deleted).
FOREIGN = ".costguard-foreign"
#: Where a checkpoint put back that the trainer's loader refused is moved (never deleted).
REFUSED = ".costguard-refused"
#: The record, in a checkpoint's folder in the store, that the trainer refused it: a
#: restore puts back the one before it (the checkpoint itself is kept).
REFUSED_FILE = "costguard-refused.json"
MAX_LEDGER_BYTES = 4 * 2**20
#: A ``trainer_state.json`` read for the run's progress (its log history grows with it).
MAX_STATE_BYTES = 16 * 2**20
#: Accelerate's files written after its mark: a save of this run lacking one an earlier
#: save of this run had is not finished.
_AFTER_MARK = re.compile(r"(custom_checkpoint|random_states)_[0-9]+\.pkl")
#: Restored items are assembled here, then renamed into place.
STAGING_PREFIX = ".costguard-restore-"
#: How long an item must stay unchanged, while the trainer runs, before it is uploaded
#: (a file written after the mark, such as Accelerate's registered objects, begins within
#: it; the files are also checked whole, and checked unchanged once uploaded).
SETTLE_S = 0.5
#: Files of one checkpoint read at once on a restore (each S3 object in
#: ``store.READ_STREAMS`` ranged GETs itself): a big trainer folder holds several large
#: files (weights, optimizer, shards), and one at a time leaves the network idle between
#: them and while each is hashed.
RESTORE_READS = 4
#: The look without an event (file systems whose events miss other machines' writes),
#: and the wait after an event before looking (the rest of a save's files come with it).
POLL_S = 1.0
EVENT_WAIT_S = 0.05
#: The watchdog events that are writes (opening or reading a folder is none).
_WRITES = frozenset({"created", "modified", "moved", "deleted", "closed"})
#: How often, while nothing appears in the folder, the workdir is looked at for
#: checkpoints written elsewhere (a wrong ``--sync-dir``).
ELSEWHERE_S = 30.0
_OBJECT_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
#: A Hugging Face or Accelerate folder's weights: one file, or the shards of one.
_WEIGHTS = re.compile(r"model(-[0-9]+-of-[0-9]+)?\.safetensors")

Say = Callable[[str], None]


def safe_relative(text: Any) -> bool:
    """Whether ``text`` (from a manifest: untrusted) is a plain relative path that stays
    inside the sync dir and is none of costguard's own folders there.

    >>> safe_relative("checkpoint-10/model.safetensors"), safe_relative("last.ckpt")
    (True, True)
    >>> [safe_relative(p) for p in ("../x", "/etc/passwd", "a/./b", "", ".costguard-x/y")]
    [False, False, False, False, False]
    """
    if not isinstance(text, str) or not text or len(text) > 1024 or "\\" in text or "\0" in text:
        return False
    parts = text.split("/")
    return (
        len(parts) <= MAX_DEPTH + 2
        and all(part not in ("", ".", "..") for part in parts)
        and not parts[0].startswith(".costguard")
    )


def object_names(paths: Iterable[str]) -> dict[str, str]:
    """A store object name for each file path (unique, as manifests allow them).

    >>> sorted(object_names(["checkpoint-10/model.safetensors", "epoch=0-step=10.ckpt"]))
    ['000-model.safetensors', '001-epoch_0-step_10.ckpt']
    """
    return {
        f"{index:03d}-{_OBJECT_UNSAFE.sub('_', PurePosixPath(path).name)}"[:128]: path
        for index, path in enumerate(paths)
    }


def _sizes(manifest: Manifest) -> tuple[tuple[str, int], ...]:
    files = manifest.extra["folder"]["files"]
    return tuple(sorted((files[o.name], o.size_bytes) for o in manifest.objects))


def folder_manifests(manifests: Iterable[Manifest], present: Mapping[str, int]) -> list[Manifest]:
    """The complete ``--sync-dir`` checkpoints whose file list is usable, best first."""
    return [m for m in restore_order(manifests, present) if m.folder and _files_of(m)]


def _files_of(manifest: Manifest) -> dict[str, str]:
    """Object name -> path under the sync dir, from ``extra["folder"]``; empty when the
    record is not one this costguard can place safely."""
    record = manifest.extra.get("folder")
    if not isinstance(record, dict):
        return {}
    item, files = record.get("path"), record.get("files")
    names = {o.name for o in manifest.objects}
    if (
        not safe_relative(item)
        or not isinstance(files, dict)
        or set(files) != names
        or not all(
            safe_relative(p) and (p == item or p.startswith(f"{item}/")) for p in files.values()
        )
        or _clash(files.values())
    ):
        return {}
    return dict(files)


def _before(history: list[Any], step: int) -> list[Any]:
    """The entries of a trainer's ``log_history`` logged at or before ``step``.

    >>> _before([{"step": 5, "loss": 1.0}, {"step": 10, "loss": 0.5}, "x"], 5)
    [{'step': 5, 'loss': 1.0}]
    """
    return [
        e
        for e in history
        if isinstance(e, dict) and isinstance(e.get("step"), int) and e["step"] <= step
    ]


def _clash(paths: Iterable[str]) -> bool:
    """Whether two paths are the same or one is a folder of another (a file and a folder
    of one name cannot both be placed).

    >>> _clash(["a/b", "a/c"]), _clash(["a/b", "a/b.x", "a/b/c"]), _clash(["a", "a"])
    (False, True, True)
    """
    files = list(paths)
    folders = {p.rsplit("/", i)[0] for p in files for i in range(1, p.count("/") + 1)}
    return len(set(files)) != len(files) or not folders.isdisjoint(files)


def folder_state(store: Store, manifest: Manifest) -> dict[str, Any]:
    """``{"model": weights}`` of a ``--sync-dir`` checkpoint, each file verified: the
    ``model*.safetensors`` of a Hugging Face or Accelerate folder, the ``state_dict`` of a
    Lightning ``.ckpt`` (read with ``weights_only``: nothing in it is executed)."""
    files = _files_of(manifest)
    by_name = {PurePosixPath(files[o.name]).name: o for o in manifest.objects if o.name in files}
    with contextlib.ExitStack() as stack:

        def local(obj: ObjectEntry) -> str:
            return stack.enter_context(
                store.verified_file(manifest.object_path(obj), obj.size_bytes, obj.sha256)
            )

        if manifest.extra["folder"].get("kind") == "lightning" and len(manifest.objects) == 1:
            torch = require("torch", "train")
            try:
                saved = torch.load(
                    local(manifest.objects[0]), map_location="cpu", weights_only=True
                )
            except Exception as exc:
                msg = f"{manifest.name}: the .ckpt cannot be read as plain tensors ({exc})"[:300]
                raise UnreadableError(msg, hint="load it with Lightning itself") from exc
            weights = saved.get("state_dict") if isinstance(saved, dict) else None
            if not isinstance(weights, dict):
                msg = f"{manifest.name}: the .ckpt holds no state_dict"
                raise InputError(msg, hint="load it with Lightning itself")
            return {"model": weights}
        shards = sorted(name for name in by_name if _WEIGHTS.fullmatch(name))
        if not shards:
            msg = f"{manifest.name} holds no model.safetensors (files: {sorted(by_name)[:8]})"
            raise InputError(msg, hint="save with safe_serialization (the default)")
        load_file = require("safetensors.torch", "transformers").load_file
        weights = {}
        for name in shards:
            weights.update(load_file(local(by_name[name])))
        return {"model": weights}


def _each_at_once(
    work: Callable[[ObjectEntry], None], objects: Iterable[ObjectEntry], most: int
) -> None:
    """``work(obj)`` for every object, at most ``most`` at a time; returns once none is
    running. On a failure the ones not started are not started; what is raised is a
    :class:`ManifestError` if any read proved an object bad (the caller marks the
    checkpoint corrupt), else the first failure."""
    from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

    with ThreadPoolExecutor(most, thread_name_prefix="costguard-restore") as pool:
        futures = [pool.submit(work, obj) for obj in objects]
        wait(futures, return_when=FIRST_EXCEPTION)
        for future in futures:
            future.cancel()  # those not started; the pool's exit waits for the others
    failures = [e for f in futures if not f.cancelled() and (e := f.exception()) is not None]
    if failures:
        raise next((e for e in failures if isinstance(e, ManifestError)), failures[0])


#: The event loops made nicer already (each once, however many syncs a process starts).
_NICER_LOOPS: weakref.WeakSet[Any] = weakref.WeakSet()


def _nicer_io(store: Store, niceness: int) -> None:
    """Make the thread of the event loop that carries ``store``'s calls ``niceness`` nicer,
    once per loop (a local store has none).

    fsspec runs that loop in a thread of its own, started by the first use of a store:
    here :meth:`FolderSync.prepare`, on the supervisor's main thread, at its priority. An
    upload's requests are signed (a sha256 of each part over plain http) and sent there,
    so a sync made nicer in its own thread only still took CPU from the trainer. Every
    call the supervisor makes once the script runs is background work, so the loop stays
    nicer after the sync stops.
    """
    loop = getattr(store.fs, "loop", None)
    if loop is None or loop in _NICER_LOOPS:
        return
    _NICER_LOOPS.add(loop)
    loop.call_soon_threadsafe(_lower_priority, niceness)


def ledger_path(root: Path, env: Mapping[str, str]) -> Path:
    """Where this machine records what it uploaded from ``root``: under
    ``$XDG_STATE_HOME/costguard/sync`` (``~/.local/state``), named by the folder's path.

    >>> ledger_path(Path("/w/out"), {"XDG_STATE_HOME": "/s"}).parent
    PosixPath('/s/costguard/sync')
    """
    base = Path(env["XDG_STATE_HOME"]) if env.get("XDG_STATE_HOME") else None
    base = base or Path.home() / ".local" / "state"
    name = hashlib.sha256(str(root).encode()).hexdigest()[:32]
    return base / "costguard" / "sync" / f"{name}.json"


class PlacementError(CostguardError):
    """A restored checkpoint could not be put in the folder without writing through a link
    or over something that is not a folder: that checkpoint is skipped."""


@dataclass(frozen=True)
class Kept:
    """The newest checkpoint in the store this sync knows of (put back or uploaded)."""

    step: int
    name: str
    path: str

    def describe(self) -> str:
        """The checkpoint as the exit line names it: its step, path and store name.

        >>> Kept(30, "ckpt-000000000030-ab", "checkpoint-30").describe()
        'step 30 (checkpoint-30 as ckpt-000000000030-ab)'
        """
        return f"step {self.step} ({self.path} as {self.name})"


@dataclass
class FolderSync:
    """Uploads the trainer's finished checkpoints from ``root`` to ``store`` (a thread),
    and puts the newest back before the script starts."""

    store: Store
    root: Path
    keep: int
    say: Say
    settle_s: float = SETTLE_S
    poll_s: float = POLL_S
    #: Files read at once on a restore (1: one after another).
    restore_reads: int = RESTORE_READS
    #: Item path -> its files as they were when last committed or restored.
    kept: dict[str, tuple[tuple[str, int, int], ...]] = field(default_factory=dict)
    #: Step of the newest committed checkpoint: older items are not uploaded again.
    newest_step: int = -1
    #: The newest checkpoint in the store (for the exit line), ``None`` before any.
    newest: Kept | None = None
    #: Item path -> its files when the script started, for items that are not this run's.
    foreign: dict[str, tuple[tuple[str, int, int], ...]] = field(default_factory=dict)
    #: Whether any checkpoint appeared in the folder while the script ran.
    seen_any: bool = False
    #: Store names of checkpoints the trainer refused in this run: not put back again.
    refused: set[str] = field(default_factory=set)
    #: Store names of checkpoints an earlier costguard uploaded from another run's folder
    #: (their trainer's history does not continue the run's): never put back, never
    #: counted by retention, never deleted.
    not_this_runs: set[str] = field(default_factory=set)
    #: This run's history in the store, recorded in each checkpoint uploaded
    #: (:mod:`costguard.checkpoint.lineage`); set by :meth:`prepare`.
    lineage: Lineage | None = None
    #: Where the script runs: checkpoints appearing under it, and none in ``root``, mean a
    #: wrong ``--sync-dir`` (said once).
    workdir: Path | None = None
    _started_ns: int = 0
    _looked_elsewhere: float = 0.0
    _created: bool = False
    #: Item path -> (its files' signature, when first seen so), for the settle wait.
    _watching: dict[str, tuple[tuple[tuple[str, int, int], ...], float]] = field(
        default_factory=dict
    )
    #: Accelerate's files after its mark that this run's last save had.
    _after_mark: frozenset[str] = frozenset()
    #: What was said already (links left out, checkpoints held back), said once each.
    _said: set[str] = field(default_factory=set)
    _restorer: Restorer | None = None
    #: Items costguard put back in place (not the trainer's writes).
    _put_back_paths: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    #: Set by a file system event under the folder (or by :meth:`finish`).
    _wake: threading.Event = field(default_factory=threading.Event)
    #: Whether the last look found an item waiting to settle.
    _settling: bool = False
    _thread: threading.Thread | None = None
    _observer: Any = None
    #: What this machine's costguard uploaded from the folder, and to which store (kept
    #: out of the folder: Accelerate's automatic naming reads every name in it).
    ledger: Path = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        self._restorer = Restorer(self.store)
        if self.ledger is None:
            self.ledger = ledger_path(self.root, os.environ)

    def _once(self, key: str, line: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self.say(line)

    def _say_links(self, item: Item) -> None:
        for path, why in item.links:
            line = f"warning: {path} is {why}; left out of {item.path} (kept without it)"
            self._once(f"link:{path}", line)

    # --- before the script starts ---------------------------------------------------

    def prepare(self) -> list[Manifest]:
        """Move half-written items aside, then put the newest verified checkpoint back
        (every item of its step: Lightning's ``last.ckpt`` and its step file); name what is
        not this run's (and move aside what would take the resume over); the manifests
        restored."""
        self._started_ns = time.time_ns()  # before the script starts
        self._created = not self.root.exists()
        self.root.mkdir(parents=True, exist_ok=True)
        for item in items_in(self.root):
            self._say_links(item)
            if not item.marked:
                self._set_aside(item, why=f"left half written ({item.problem})")
        assert self._restorer is not None
        survey = self._restorer.survey()
        manifests = folder_manifests(survey.manifests, survey.sizes)
        self._name_unusable(survey.manifests, survey.sizes, manifests)
        manifests = self._not_refused(manifests, survey.sizes)
        manifests = self._this_runs(manifests)
        local = {i.path: i for i in items_in(self.root)}
        ours = self._ledger()
        for manifest in manifests:  # finished here and in the store already: not again
            same = local.get(manifest.extra["folder"]["path"])
            if same is not None and same.sizes == _sizes(manifest):
                self.kept.setdefault(same.path, same.files)
        restored: list[Manifest] = []
        for manifest in manifests:
            if restored and manifest.step != restored[0].step:
                break
            path = manifest.extra["folder"]["path"]
            if any(m.extra["folder"]["path"] == path for m in restored):
                continue
            mine = local.get(path)
            if mine is not None and (
                self.kept.get(path) == mine.files
                or (ours.get(path) == mine.files and (mine.step or 0) >= manifest.step)
            ):
                restored.append(manifest)  # the trainer's own, finished: kept as it is
                continue
            if mine is not None:  # not the store's (last.ckpt from another machine or run)
                self._set_aside(mine, why="not the store's copy of it")
            try:
                self._put_back(manifest)
            except ManifestError as exc:
                self._restorer.mark_corrupt(manifest.name, exc.message)
                self.say(f"{manifest.name} is corrupt ({exc.message}); trying the previous one")
                continue
            except CostguardError as exc:
                self.say(
                    f"could not restore {manifest.name} now ({redact(exc.message)}); "
                    "trying the previous one"
                )
                continue
            restored.append(manifest)
        if manifests:
            self.newest_step = manifests[0].step
            top = manifests[0]
            self.newest = Kept(top.step, top.name, top.extra["folder"]["path"])
        if restored:
            top = restored[0]
            self.newest = Kept(top.step, top.name, top.extra["folder"]["path"])
        # The trainer resumes what was put back: its run goes on (a new one from nothing).
        self.lineage = (lineage_of(restored[0]) if restored else None) or Lineage.new(
            restored[0] if restored else None
        )
        for manifest in restored:
            self.say(
                f"restored {manifest.extra['folder']['path']} (step {manifest.step}) "
                f"into {self.root} from {manifest.name}"
            )
        self._find_foreign(ours, has_history=bool(manifests))
        return restored

    def _not_refused(self, manifests: list[Manifest], sizes: Mapping[str, int]) -> list[Manifest]:
        """``manifests`` less those the trainer refused (in this run, or recorded in the
        store by an earlier one), each named once."""
        usable = []
        for manifest in manifests:
            recorded = f"{manifest.name}/{REFUSED_FILE}" in sizes
            if manifest.name in self.refused or recorded:
                self._once(
                    f"refused:{manifest.name}",
                    f"{manifest.name} ({manifest.extra['folder']['path']}, step {manifest.step}) "
                    "was refused by the trainer's loader"
                    + (f" in an earlier run ({REFUSED_FILE}); " if recorded else "; ")
                    + "putting back the one before it",
                )
                continue
            usable.append(manifest)
        return usable

    def _this_runs(self, manifests: list[Manifest]) -> list[Manifest]:
        """``manifests`` less those that are not this run's, each named once. Where the
        store's checkpoints carry costguard's record of their run
        (:func:`costguard.checkpoint.lineage.others`), it decides, for every trainer; a
        run whose trainer started over is still this run.

        Before that record, the Hugging Face checkpoints that an earlier costguard uploaded
        from another run's folder (before ``.costguard-foreign/``) are told apart by their
        trainer's history (``trainer_state.json``'s ``log_history``), each one's continuing
        the one before; the run is the store's first committed checkpoint's. A history that
        cannot be read is no proof, and the checkpoint stays a candidate. Accelerate and
        Lightning write nothing that ties one save to an earlier one (weights, optimizer,
        scheduler, sampler and random states, a step counter; epoch, global_step, loop
        progress, callback states, hyperparameters): theirs cannot be told apart."""
        run, why = others(manifests)
        for manifest in manifests:
            if manifest.name in why:
                self.not_this_runs.add(manifest.name)
                self._once(
                    f"other run:{manifest.name}",
                    f"{manifest.name} ({manifest.extra['folder']['path']}, step "
                    f"{manifest.step}) is not this run's: {why[manifest.name]}; kept in the "
                    "store, never put back",
                )
        manifests = [m for m in manifests if m.name not in why]
        if run is not None:
            return manifests
        hf = [m for m in manifests if m.extra["folder"].get("kind") == "transformers"]
        if len(hf) < 2:
            return manifests
        origin = min(hf, key=lambda m: (m.created_unix, m.step))
        first = self._history(origin)
        if first is None:
            return manifests
        for manifest in hf:
            if manifest is origin or manifest.step <= origin.step:
                continue
            history = self._history(manifest)
            if history is None or _before(history, origin.step) == _before(first, origin.step):
                continue
            self.not_this_runs.add(manifest.name)
            self._once(
                f"other run:{manifest.name}",
                f"{manifest.name} ({manifest.extra['folder']['path']}, step {manifest.step}) "
                f"is not this run's: its trainer's history does not continue {origin.name} "
                f"(step {origin.step}), the run's first (an earlier costguard uploaded it from "
                "another run's folder); kept in the store, never put back",
            )
        return [m for m in manifests if m.name not in self.not_this_runs]

    def _history(self, manifest: Manifest) -> list[Any] | None:
        """The ``log_history`` of a Hugging Face checkpoint's ``trainer_state.json`` in the
        store (verified against its manifest), or ``None`` when it cannot be read."""
        files = _files_of(manifest)
        for obj in manifest.objects:
            if PurePosixPath(files.get(obj.name, "")).name != HF_MARK:
                continue
            if obj.size_bytes > MAX_STATE_BYTES:
                return None
            try:
                data = self.store.get(manifest.object_path(obj), max_bytes=MAX_STATE_BYTES)
            except CostguardError:
                return None
            if hashlib.sha256(data).hexdigest() != obj.sha256:
                return None
            try:
                history = json.loads(data).get("log_history")
            except (ValueError, AttributeError, RecursionError):
                return None
            return history if isinstance(history, list) else None
        return None

    def wrote_since(self, started_ns: int) -> bool:
        """Whether the trainer has written a checkpoint of this run in the folder since
        ``started_ns`` (a file of it as new; what costguard put back is not the trainer's)."""
        for item in items_in(self.root):
            if self.foreign.get(item.path) == item.files:
                continue
            if max((t for _, _, t in item.files), default=0) >= started_ns and not (
                self.kept.get(item.path) == item.files and item.path in self._put_back_paths
            ):
                return True
        return False

    def fall_back(self, restored: list[Manifest], code: int) -> list[Manifest]:
        """The script failed (``code``) before writing a checkpoint, right after
        ``restored`` was put back: its loader may refuse them (corrupt, partial, of another
        model). Move them aside (never deleted) and put back the complete checkpoint before
        them; what was put back (empty: there is none, which is said; else the caller says
        whether the script runs again from it)."""
        top = restored[0]
        self.say(
            f"the script failed (exit {code}) before writing a checkpoint, right after "
            f"costguard put back {top.extra['folder']['path']} (step {top.step}, {top.name}): "
            "the trainer's loader may refuse it (corrupt, partial or of another model)"
        )
        for manifest in restored:
            self.refused.add(manifest.name)
            path = manifest.extra["folder"]["path"]
            local = item_at(self.root, path)
            self.kept.pop(path, None)
            if local is not None:
                self._set_aside(local, why="refused by the trainer's loader", under=REFUSED)
        again = self.prepare()
        if not again:
            self.say(
                "no complete checkpoint before it to fall back to; not starting from step 0 "
                f"as if it were fine: fix or remove {top.name} (costguard checkpoint verify "
                f"{self.store.url})"
            )
        return again

    def judge_refused(
        self, refused: list[Manifest], restored: list[Manifest], *, proven: bool
    ) -> None:
        """After the second try: when the trainer went on from the checkpoint before
        (``proven``: it wrote one since), record in the store that it refused
        ``refused`` (a later run, on any machine, puts back the one before them); else
        say the failure was not theirs."""
        top = refused[0]
        if not proven:
            before = f"from {restored[0].name}" if restored else ""
            self.say(
                f"the script failed again {before}: the failure is not {top.name}'s; it stays "
                "the newest checkpoint in the store"
            )
            return
        record = json.dumps({"refused_unix": time.time(), "by": "the trainer's loader"})
        for manifest in refused:
            try:
                self.store.put(f"{manifest.name}/{REFUSED_FILE}", record.encode())
            except CostguardError as exc:
                self.say(f"could not record {manifest.name} as refused: {redact(exc.message)}")
        self.say(
            f"the trainer went on from {restored[0].name} (step {restored[0].step}): "
            f"{top.name} (step {top.step}) is recorded as refused and kept, not put back again"
        )

    def _name_unusable(
        self, manifests: list[Manifest], sizes: Mapping[str, int], usable: list[Manifest]
    ) -> None:
        """Say which of the store's sync checkpoints, newer than the one to restore, has a
        file list that cannot be placed safely (paths out of the folder, a file and a
        folder of one name): it is skipped, the previous one restored."""
        best = usable[0].step if usable else -1
        for manifest in restore_order(manifests, sizes):
            if manifest.folder and manifest.step > best and not _files_of(manifest):
                self.say(
                    f"{manifest.name} (step {manifest.step}) names files that cannot be put "
                    "in the folder safely; skipped it, trying the previous one"
                )

    def _find_foreign(self, ours: Mapping[str, Any], *, has_history: bool) -> None:
        """Name each checkpoint in the folder that is not this run's (neither put back nor
        uploaded from here to this store): never uploaded. One newer than the store's
        newest is moved aside, so the trainer resumes from the run's own."""
        for item in items_in(self.root):
            if self.kept.get(item.path) == item.files or ours.get(item.path) == item.files:
                continue
            newer = item.step is not None and item.step > self.newest_step
            if has_history and newer:
                self._set_aside(
                    item,
                    why=f"not this run's (step {item.step}, not in {self.store.url})",
                    under=FOREIGN,
                )
                continue
            self.foreign[item.path] = item.files
            self.say(
                f"{item.path} (step {item.step}) was in {self.root} before the script started "
                f"and is not in {self.store.url}: not this run's, never uploaded"
                + ("; the trainer may resume from it" if newer else "")
            )

    def _ledger(self) -> dict[str, Any]:
        """Item path -> files, of what this machine uploaded from the folder to this store
        (nothing if the ledger names another store or cannot be read)."""
        path = self.ledger
        try:
            if path.is_symlink() or path.stat().st_size > MAX_LEDGER_BYTES:
                return {}
            record = json.loads(path.read_bytes())
            if record.get("store") != self.store.url:
                return {}
            return {
                str(k): tuple((str(f), int(n), int(t)) for f, n, t in v)
                for k, v in record["items"].items()
            }
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return {}

    def _write_ledger(self, item: Item) -> None:
        items = {**self._ledger(), item.path: item.files}
        items = {k: v for k, v in items.items() if (self.root / k).exists()}
        record = {"store": self.store.url, "items": items}
        target = self.ledger
        temporary = target.with_name(f"{target.name}.{uuid.uuid4().hex[:8]}")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            temporary.write_text(json.dumps(record))
            temporary.replace(target)
        except OSError:
            temporary.unlink(missing_ok=True)

    def _set_aside(self, item: Item, *, why: str, under: str = ASIDE) -> None:
        """Move ``item`` out of the trainer's way, under ``under`` (never deleted)."""
        target = self.root / under / f"{item.path.replace('/', '__')}.{time.time_ns()}"
        target.parent.mkdir(parents=True, exist_ok=True)
        (self.root / item.path).rename(target)
        self.say(
            f"{item.path} was {why}; moved it to {target} so the trainer does not resume from it"
        )

    def _put_back(self, manifest: Manifest) -> None:
        """Download and verify every file into a staging folder (straight there, no
        temporary copy), ``restore_reads`` at a time, check the item is whole, then rename
        it into place: the trainer sees all of it or nothing, and nothing is written
        through a link."""
        files = _files_of(manifest)
        item = manifest.extra["folder"]["path"]
        staging = Path(self.root, f"{STAGING_PREFIX}{uuid.uuid4().hex[:8]}")

        def fetch(obj: ObjectEntry) -> None:
            target = staging / files[obj.name]
            target.parent.mkdir(parents=True, exist_ok=True)
            self.store.download(manifest.object_path(obj), target, obj.size_bytes, obj.sha256)

        try:
            _each_at_once(fetch, manifest.objects, self.restore_reads)
            staged = item_at(staging, item)
            if staged is None or not staged.marked:
                why = staged.problem if staged is not None else "nothing to put back"
                msg = f"{item} is not a whole checkpoint: {why}"
                raise ManifestError(msg[:300])
            final = self._folder_for(item)
            try:
                (staging / item).rename(final)
            except OSError as exc:
                msg = f"cannot put {item} in place ({exc.strerror or exc})"
                raise PlacementError(msg) from None
            restored = item_at(self.root, item)
            if restored is not None:
                self.kept[item] = restored.files
                self._put_back_paths.add(item)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _folder_for(self, item: str) -> Path:
        """Where ``item`` goes under the root, each folder above it made as a real folder:
        a link or a file on the way is a :class:`PlacementError`."""
        folder = self.root
        for part in PurePosixPath(item).parts[:-1]:
            folder = folder / part
            with contextlib.suppress(FileExistsError):
                folder.mkdir()
            if folder.is_symlink() or not folder.is_dir():
                what = "a link" if folder.is_symlink() else "not a folder"
                msg = f"{folder} is {what}: {item} is not put back through it"
                raise PlacementError(msg)
        final = folder / PurePosixPath(item).name
        if final.is_symlink():
            msg = f"{final} is a link: {item} is not put back over it"
            raise PlacementError(msg)
        return final

    # --- while the script runs ------------------------------------------------------

    def start(self) -> None:
        """Watch the folder (before the script starts: no save is missed), then look at
        it in a thread of its own."""
        self._looked_elsewhere = time.monotonic()
        self._stop.clear()  # a script run again (:meth:`fall_back`) is watched again
        self._observer = self._observe()
        self._thread = threading.Thread(target=self._loop, name="costguard-sync", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        # Nicer than the trainer (Linux; the threads an upload starts inherit it), and
        # so is the thread that sends the store's calls.
        _lower_priority(DEFAULT_SAVE_NICENESS)
        _nicer_io(self.store, DEFAULT_SAVE_NICENESS)
        wait_s = self.poll_s
        while not self._stop.is_set():
            if self._wake.wait(wait_s):
                time.sleep(EVENT_WAIT_S)
            self._wake.clear()
            if self._stop.is_set():
                break
            self._settling = False
            self.sync(finished=False)
            # An item waiting to settle is looked at again once it may have.
            wait_s = min(self.poll_s, self.settle_s) if self._settling else self.poll_s
            if time.monotonic() - self._looked_elsewhere >= ELSEWHERE_S:
                self._looked_elsewhere = time.monotonic()
                self.look_elsewhere()

    def _observe(self) -> Any:
        """A started watchdog observer whose events under the folder wake the loop; ``None``
        without watchdog, or where the system refuses a watch (the loop then looks every
        ``poll_s``). Only writes wake it: the loop's own looks open folders too."""
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError:
            return None
        wake = self._wake

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: Any) -> None:
                if event.event_type in _WRITES:
                    wake.set()

        observer = Observer()
        try:
            observer.schedule(Handler(), str(self.root), recursive=True)
            observer.start()
        except OSError as exc:  # inotify's watch limit, a file system without events
            logger.info("costguard: watching %s by polling only: %s", self.root, exc)
            return None
        return observer

    def finish(self, *, clean: bool = True) -> None:
        """The script has exited: stop the thread, then upload what it finished last.

        ``clean``: it exited by itself (0 or 75). Killed (a signal, a failure), the save
        it was writing in its last ``settle_s`` is proven only by a trainer whose mark is
        the last file it writes (Hugging Face); an Accelerate folder then is not kept,
        since its registered objects come after its mark."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None
        self.sync(finished=True, killed_at=None if clean else time.time_ns())
        self.look_elsewhere()
        if self._created and not self.seen_any:
            with contextlib.suppress(OSError):
                self.root.rmdir()  # made by costguard, still empty: not left behind

    def look_elsewhere(self) -> None:
        """While nothing appeared in the folder: when checkpoints were written elsewhere
        under the workdir since the script started, say so naming both (once)."""
        if self.seen_any or self.workdir is None or "elsewhere" in self._said:
            return
        found = [
            item
            for item in items_in(self.workdir)
            if not (self.workdir / item.path).is_relative_to(self.root)
            and ASIDE not in item.path
            and FOREIGN not in item.path
            and max((t for _, _, t in item.files), default=0) >= self._started_ns
        ]
        if found:
            where = (self.workdir / found[-1].path).parent
            self._once(
                "elsewhere",
                f"warning: nothing appeared in --sync-dir {self.root} while the script ran, "
                f"but {found[-1].path} did in {where}: nothing is kept; "
                f"did you mean --sync-dir {where}?",
            )

    def sync(self, *, finished: bool, killed_at: int | None = None) -> list[Manifest]:
        """One look: upload each finished item not uploaded yet, newest last."""
        done = []
        now = time.monotonic()
        items = items_in(self.root)
        for item in items:
            self._say_links(item)
            if item.path not in self.foreign or self.foreign[item.path] != item.files:
                self.seen_any = True
            self._say_behind(item)
            if not self._ready(item, now, finished=finished):
                continue
            if killed_at is not None and not self._proven_at_kill(item, items, killed_at):
                continue
            try:
                manifest = self._upload(item)
            except CostguardError as exc:
                self.say(
                    f"could not upload {item.path} (step {item.step}): "
                    f"{redact(exc.message)}; will try again"
                )
                continue
            if manifest is not None:
                done.append(manifest)
        return done

    def _say_behind(self, item: Item) -> None:
        """A checkpoint the trainer wrote in this run at a step below the one put back: it
        did not resume from it (its loader refused it and the script started over, or the
        script does not resume), which is said once, never passed over in silence."""
        if (
            self.newest is None
            or not item.marked
            or item.step is None
            or item.step >= self.newest.step
            or self.foreign.get(item.path) == item.files
            or self.kept.get(item.path) == item.files
            or max((t for _, _, t in item.files), default=0) < self._started_ns
        ):
            return
        if "behind" not in self._said:
            self.lineage = Lineage.new()  # the trainer started over: a new history
        self._once(
            "behind",
            f"warning: the trainer wrote {item.path} (step {item.step}) although "
            f"{self.newest.path} (step {self.newest.step}) was put back: it did not resume "
            "from it (its loader refused it, or the script does not resume: "
            "resume_from_checkpoint, ckpt_path='last', load_state); checkpoints below step "
            f"{self.newest.step} are not kept",
        )

    def kind(self) -> str:
        """Which trainer writes the folder (of this run's newest checkpoint), or ""."""
        mine = [i for i in items_in(self.root) if self.foreign.get(i.path) != i.files]
        return mine[-1].kind if mine else ""

    def written_ns(self) -> int:
        """When the trainer last wrote a checkpoint of this run in the folder (the newest
        file time, ns since the epoch; 0 for none)."""
        return max(
            (
                max((t for _, _, t in i.files), default=0)
                for i in items_in(self.root)
                if self.foreign.get(i.path) != i.files
            ),
            default=0,
        )

    def progress(self) -> tuple[int, int] | None:
        """(``global_step``, ``max_steps``) from the ``trainer_state.json`` of this run's
        newest Hugging Face checkpoint in the folder, or ``None``."""
        for item in reversed(items_in(self.root)):
            if item.kind != "transformers" or self.foreign.get(item.path) == item.files:
                continue
            state = self.root / item.path / HF_MARK
            try:
                if state.is_symlink() or state.stat().st_size > MAX_STATE_BYTES:
                    return None
                record = json.loads(state.read_bytes())
                done, total = record["global_step"], record["max_steps"]
            except (OSError, ValueError, KeyError, TypeError):
                return None
            if isinstance(done, int) and isinstance(total, int):
                return done, total
            return None
        return None

    def _proven_at_kill(self, item: Item, items: list[Item], killed_at: int) -> bool:
        if item.kind != "accelerate" or any(
            (i.step or -1) > (item.step or -1) for i in items if i.kind == item.kind
        ):
            return True
        written = max((mtime for _, _, mtime in item.files), default=0)
        if killed_at - written > self.settle_s * 1e9:
            return True
        self._once(
            f"killed:{item.path}",
            f"{item.path} (step {item.step}) was being written when the script was killed "
            "(Accelerate writes registered objects after its mark); not kept",
        )
        return False

    def _ready(self, item: Item, now: float, *, finished: bool) -> bool:
        if not item.marked or item.step is None or item.step < self.newest_step:
            return False
        if self.kept.get(item.path) == item.files:
            return False
        if self.foreign.get(item.path) == item.files:
            return False  # not this run's: there before the script, unchanged since
        if item.kind == "accelerate":
            missing = self._after_mark - {PurePosixPath(p).name for p, _, _ in item.files}
            if missing:
                if finished:
                    self._once(
                        f"missing:{item.path}",
                        f"{item.path} (step {item.step}) has no {sorted(missing)[0]}, which "
                        "this run's earlier saves had (a save cut off); not kept",
                    )
                return False
        if finished:
            return True
        signature, since = self._watching.get(item.path, (None, now))
        if signature != item.files:
            self._watching[item.path] = (item.files, now)
            self._settling = True
            return False
        if now - since < self.settle_s:
            self._settling = True
            return False
        return True

    def _upload(self, item: Item) -> Manifest | None:
        """Upload ``item``'s files from descriptors opened first (the trainer's rotation
        may delete the folder meanwhile: the bytes stay), and commit it when none of them
        was rewritten while it went up."""
        assert item.step is not None
        started = time.perf_counter()
        self._write_ledger(item)
        name = checkpoint_name(item.step, uuid.uuid4().hex[:8])
        names = object_names(path for path, _, _ in item.files)
        with contextlib.ExitStack() as stack:
            held = self._hold(item, stack)
            if held is None:
                return None
            objects = []
            for obj, path in names.items():

                def produce(upload: Any, fd: int = held[path]) -> None:
                    with os.fdopen(os.dup(fd), "rb") as file:
                        shutil.copyfileobj(file, upload, 4 * 2**20)

                size, digest = self.store.write_stream(f"{name}/{obj}", produce)
                objects.append(ObjectEntry(obj, size, digest))
            if not self._unchanged(item, held):
                # Rewritten while it went up: not committed (its objects are a partial
                # folder that retention removes); the next look uploads it again.
                self._watching.pop(item.path, None)
                return None
        manifest = Manifest(
            name=name,
            step=item.step,
            created_unix=time.time(),
            objects=tuple(objects),
            library_version=__version__,
            format_version=FOLDER_FORMAT_VERSION,
            reason=f"sync:{item.kind}",
            extra={
                "folder": {
                    "path": item.path,
                    "kind": item.kind,
                    "files": names,
                    LINEAGE_KEY: self._lineage().record(),
                }
            },
        )
        self.store.put(manifest.manifest_path, manifest.to_json().encode())
        assert self._restorer is not None
        self._restorer.remember(manifest)
        self.kept[item.path] = item.files
        if item.kind == "accelerate":
            self._after_mark = frozenset(
                n for p, _, _ in item.files if _AFTER_MARK.fullmatch(n := PurePosixPath(p).name)
            )
        if item.step >= self.newest_step:
            self.newest = Kept(item.step, name, item.path)
        self.newest_step = max(self.newest_step, item.step)
        self.say(
            f"kept {item.path} (step {item.step}, {manifest.size_bytes:,} bytes, "
            f"{time.perf_counter() - started:.1f} s) as {name}"
        )
        self._retain(name)
        return manifest

    def _lineage(self) -> Lineage:
        """This run's lineage (a sync that was not prepared starts one)."""
        if self.lineage is None:
            self.lineage = Lineage.new()
        return self.lineage

    def _hold(self, item: Item, stack: contextlib.ExitStack) -> dict[str, int] | None:
        """A descriptor of each of ``item``'s files, opened without following a link out of
        the folder, each still the file the look found; ``None`` if one is gone or changed."""
        held = {}
        for path, size, mtime in item.files:
            real = inside(self.root, self.root / path)
            try:
                if real is None:
                    return None
                fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            except OSError:  # the trainer's rotation removed it meanwhile
                return None
            stack.callback(os.close, fd)
            info = os.fstat(fd)
            if (info.st_size, info.st_mtime_ns) != (size, mtime):
                return None
            held[path] = fd
        return held

    def _unchanged(self, item: Item, held: Mapping[str, int]) -> bool:
        for path, size, mtime in item.files:
            info = os.fstat(held[path])
            if (info.st_size, info.st_mtime_ns) != (size, mtime):
                return False
        return True

    def _retain(self, protect: str) -> None:
        """Delete what retention proves unneeded (as every save does); best effort."""
        assert self._restorer is not None
        try:
            survey = self._restorer.survey()
            # A step's items are one save (last.ckpt and its step file): keep whole steps.
            # Another run's checkpoints are neither counted nor deleted: kept as they are.
            ours = survey.committed - self.not_this_runs
            committed = [c for c in survey.listings if c.name in ours]
            steps = sorted({c.step for c in committed}, reverse=True)[: self.keep]
            keep = max(1, sum(c.step in steps for c in committed))
            for deletion in plan_retention(
                survey.listings,
                ours,
                keep,
                corrupt=survey.corrupt,
                protect=(protect,),
                count=True,
                now_unix=time.time(),
                grace_s=PARTIAL_GRACE_S,
            ):
                self.store.delete(deletion.paths)
                self._restorer.forget(deletion.name)
            self.store.abort_stale_uploads()
        except CostguardError as exc:
            logger.warning("costguard: retention skipped this time: %s", redact(exc.message))
