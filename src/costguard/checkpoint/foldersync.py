"""A trainer's own checkpoints kept in the store: ``costguard run --sync-dir out/``.

Hugging Face's ``Trainer`` writes ``checkpoint-N/`` folders, Accelerate's ``save_state``
writes a folder (``checkpoint_N/`` with automatic naming), Lightning writes ``.ckpt``
files. While the script runs, each one the trainer has *finished* is uploaded as a
costguard checkpoint: its files, their sha256, and the manifest last (format
:data:`~costguard.checkpoint.manifest.FOLDER_FORMAT_VERSION`, the files' paths in
``extra["folder"]``), then retention as for any save. Before the script starts, the newest
verified one is put back where the trainer looks, so its own resume
(``get_last_checkpoint``, ``ckpt_path="last"``, ``load_state``) finds it on a new machine.

Finished means what each trainer writes last is there
(:mod:`costguard.checkpoint.completion`, the rules per trainer), and nothing changing since:
while the trainer runs, an item must also have kept the same sizes and times for
``settle_s``; once it has exited, nothing is writing any more and the mark alone decides.
A folder left half written (a kill during the save) is never uploaded, and one found in
``out/`` before the script starts is moved aside (to ``.costguard-incomplete/``), not
deleted, so the trainer's resume cannot pick it.
"""

from __future__ import annotations

import contextlib
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
from costguard.checkpoint.completion import MAX_DEPTH, Item, item_at, items_in, mark_of
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
#: Restored items are assembled here, then renamed into place.
STAGING_PREFIX = ".costguard-restore-"
#: How long an item must stay unchanged, while the trainer runs, before it is uploaded.
SETTLE_S = 2.0
#: Files of one checkpoint read at once on a restore (each S3 object in
#: ``store.READ_STREAMS`` ranged GETs itself): a big trainer folder holds several large
#: files (weights, optimizer, shards), and one at a time leaves the network idle between
#: them and while each is hashed.
RESTORE_READS = 4
POLL_S = 1.0
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
    ):
        return {}
    return dict(files)


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
    #: Item path -> (its files' signature, when first seen so), for the settle wait.
    _watching: dict[str, tuple[tuple[tuple[str, int, int], ...], float]] = field(
        default_factory=dict
    )
    _restorer: Restorer | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self._restorer = Restorer(self.store)

    # --- before the script starts ---------------------------------------------------

    def prepare(self) -> list[Manifest]:
        """Move half-written items aside, then put the newest verified checkpoint back
        (every item of its step: Lightning's ``last.ckpt`` and its step file); the
        manifests restored."""
        self.root.mkdir(parents=True, exist_ok=True)
        for item in items_in(self.root):
            if not item.marked:
                self._set_aside(item, why=f"left half written (no {mark_of(item)})")
        assert self._restorer is not None
        survey = self._restorer.survey()
        manifests = folder_manifests(survey.manifests, survey.sizes)
        local = {i.path: i for i in items_in(self.root)}
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
            if mine is not None and (mine.step or 0) >= manifest.step:
                restored.append(manifest)  # the trainer's own, finished: kept as it is
                continue
            if mine is not None:  # older than the store's (last.ckpt from another machine)
                self._set_aside(mine, why="older than the store's")
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
        for manifest in restored:
            self.say(
                f"restored {manifest.extra['folder']['path']} (step {manifest.step}) "
                f"into {self.root} from {manifest.name}"
            )
        return restored

    def _set_aside(self, item: Item, *, why: str) -> None:
        """Move ``item`` out of the trainer's way, under ``ASIDE`` (never deleted)."""
        target = self.root / ASIDE / f"{item.path.replace('/', '__')}.{time.time_ns()}"
        target.parent.mkdir(parents=True, exist_ok=True)
        (self.root / item.path).rename(target)
        self.say(
            f"{item.path} was {why}; moved it to {target} so the trainer does not resume from it"
        )

    def _put_back(self, manifest: Manifest) -> None:
        """Download and verify every file into a staging folder (straight there, no
        temporary copy), ``restore_reads`` at a time, then rename the item into place:
        the trainer sees all of it or nothing."""
        files = _files_of(manifest)
        item = manifest.extra["folder"]["path"]
        staging = Path(self.root, f"{STAGING_PREFIX}{uuid.uuid4().hex[:8]}")

        def fetch(obj: ObjectEntry) -> None:
            target = staging / files[obj.name]
            target.parent.mkdir(parents=True, exist_ok=True)
            self.store.download(manifest.object_path(obj), target, obj.size_bytes, obj.sha256)

        try:
            _each_at_once(fetch, manifest.objects, self.restore_reads)
            final = self.root / item
            final.parent.mkdir(parents=True, exist_ok=True)
            (staging / item).rename(final)
            restored = item_at(self.root, item)
            if restored is not None:
                self.kept[item] = restored.files
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    # --- while the script runs ------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="costguard-sync", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        # Nicer than the trainer (Linux; the threads an upload starts inherit it), and
        # so is the thread that sends the store's calls.
        _lower_priority(DEFAULT_SAVE_NICENESS)
        _nicer_io(self.store, DEFAULT_SAVE_NICENESS)
        while not self._stop.wait(self.poll_s):
            self.sync(finished=False)

    def finish(self) -> None:
        """The script has exited: stop the thread, then upload what it finished last."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sync(finished=True)

    def sync(self, *, finished: bool) -> list[Manifest]:
        """One look: upload each finished item not uploaded yet, newest last."""
        done = []
        now = time.monotonic()
        for item in items_in(self.root):
            if not self._ready(item, now, finished=finished):
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

    def _ready(self, item: Item, now: float, *, finished: bool) -> bool:
        if not item.marked or item.step is None or item.step < self.newest_step:
            return False
        if self.kept.get(item.path) == item.files:
            return False
        if finished:
            return True
        signature, since = self._watching.get(item.path, (None, now))
        if signature != item.files:
            self._watching[item.path] = (item.files, now)
            return False
        return now - since >= self.settle_s

    def _upload(self, item: Item) -> Manifest | None:
        assert item.step is not None
        started = time.perf_counter()
        name = checkpoint_name(item.step, uuid.uuid4().hex[:8])
        names = object_names(path for path, _, _ in item.files)
        objects = []
        for obj, path in names.items():
            source = self.root / path

            def produce(upload: Any, source: Path = source) -> None:
                with source.open("rb") as file:
                    shutil.copyfileobj(file, upload, 4 * 2**20)

            try:
                size, digest = self.store.write_stream(f"{name}/{obj}", produce)
            except FileNotFoundError:  # the trainer's rotation removed it meanwhile
                return None
            objects.append(ObjectEntry(obj, size, digest))
        again = item_at(self.root, item.path)
        if again is None or again.files != item.files:
            # Rewritten while it went up: not committed (its objects are a partial folder
            # that retention removes); the next look uploads it again.
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
            extra={"folder": {"path": item.path, "kind": item.kind, "files": names}},
        )
        self.store.put(manifest.manifest_path, manifest.to_json().encode())
        assert self._restorer is not None
        self._restorer.remember(manifest)
        self.kept[item.path] = item.files
        self.newest_step = max(self.newest_step, item.step)
        self.say(
            f"kept {item.path} (step {item.step}, {manifest.size_bytes:,} bytes, "
            f"{time.perf_counter() - started:.1f} s) as {name}"
        )
        self._retain(name)
        return manifest

    def _retain(self, protect: str) -> None:
        """Delete what retention proves unneeded (as every save does); best effort."""
        assert self._restorer is not None
        try:
            survey = self._restorer.survey()
            for deletion in plan_retention(
                survey.listings,
                survey.committed,
                self.keep,
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
