"""Checkpoints as values: names, manifests, which one is the latest complete, what to delete. Pure.

A checkpoint is a folder ``ckpt-<step>-<id>/`` under the store's root holding payload
objects and ``manifest.json``. The manifest lists every payload object with its size and
sha256 and is written **last**, so a checkpoint without a readable manifest whose objects
are all present is never "latest", whatever its step number. Restore walks
:func:`restore_order` and verifies each object's sha256 before using it.

An incremental save also lists objects of the shared pool, ``blobs/<sha256>``, that
several checkpoints refer to; :func:`plan_pool_deletions` decides which of them no kept
checkpoint can need.

Every rule decided from a listing and the manifests alone lives here (what is complete,
which is latest, what is proven garbage, which pool objects no kept checkpoint needs),
pure, so the never-delete-on-doubt rules are read together.

>>> m = Manifest(name=checkpoint_name(200, "0a1b2c3d"), step=200, created_unix=1.0,
...              objects=(ObjectEntry("state.pt", 10, "ab" * 32),))
>>> m.name
'ckpt-000000000200-0a1b2c3d'
>>> latest_complete([m], {"ckpt-000000000200-0a1b2c3d/state.pt": 10}) == m
True
>>> latest_complete([m], {"ckpt-000000000200-0a1b2c3d/state.pt": 9}) is None
True
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from costguard.errors import CostguardError

MANIFEST_FILE = "manifest.json"
#: Written into a checkpoint's folder by the restore that proved it incomplete or corrupt
#: (an object missing, bytes that do not match): the verdict stands, so the checkpoint
#: does not come back when a later run writes a pool object of the same sha256 again.
CONDEMNED_FILE = "condemned.json"
FORMAT_VERSION = 1
#: The format of a manifest that refers to objects in the shared pool (incremental saves).
#: Only such manifests carry it, so a costguard that knows no pool skips them as written
#: by a newer costguard (kept, never called corrupt); every other manifest stays version 1.
POOL_FORMAT_VERSION = 2
#: The manifest of a sharded checkpoint (one object per rank, through torch's DCP; see
#: :mod:`costguard.checkpoint.sharded`). A costguard that reads only older formats takes
#: it for "written by a newer costguard": unreadable, skipped and kept, never corrupt.
SHARDED_FORMAT_VERSION = 3
#: The manifest of a trainer's own checkpoint folder or file kept by ``costguard run
#: --sync-dir`` (:mod:`costguard.checkpoint.foldersync`): its files, not a costguard state.
FOLDER_FORMAT_VERSION = 4
#: The newest format this costguard reads.
READ_FORMAT_VERSION = FOLDER_FORMAT_VERSION
#: The folder under the store's root holding content-addressed objects that several
#: checkpoints may share (``blobs/<sha256>``); not a checkpoint folder, so :func:`scan`
#: ignores it and only :func:`plan_pool_deletions` ever deletes in it.
POOL_FOLDER = "blobs"
#: A manifest lists a few objects: anything larger is not one of ours (and reading it
#: whole would cost memory). The cap is checked on the listed size before any read.
MAX_MANIFEST_BYTES = 4 * 2**20
#: How deep ``extra`` may nest (JSON written by a person, not a tree bomb).
MAX_EXTRA_DEPTH = 32
#: A folder without a manifest is a save in progress until nothing in it has changed for
#: this long; only then, and only when a newer checkpoint is committed, is it abandoned.
PARTIAL_GRACE_S = 900.0
# Matched whole (fullmatch: "$" would let a trailing newline through), ASCII digits only
# ("\d" is any Unicode digit).
_NAME = re.compile(r"ckpt-([0-9]{12})-([0-9a-f]{8})")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_OBJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class ManifestError(CostguardError):
    """Proof that a checkpoint is corrupt: its manifest does not parse or does not describe
    a checkpoint, or an object's bytes do not match it. Only such a checkpoint (and a
    folder that never got a manifest) may ever be deleted as garbage."""


class UnreadableError(CostguardError):
    """A checkpoint that could not be judged now: a read failed (network, timeout,
    permission), or a newer costguard wrote it. It is skipped, never deleted."""


@dataclass(frozen=True, order=True)
class ObjectEntry:
    """One payload object of a checkpoint: its file name, size and sha256.

    ``pool`` objects live in the shared pool (``blobs/<sha256>``, named by their sha256)
    rather than in the checkpoint's folder: an incremental save refers to the one an
    earlier checkpoint stored instead of storing the same bytes again.
    """

    name: str
    size_bytes: int
    sha256: str
    pool: bool = False


@dataclass(frozen=True)
class Manifest:
    """The commit record of one checkpoint (written after all its payload objects)."""

    #: The checkpoint's folder name, ``ckpt-<step:012d>-<8 hex>``.
    name: str
    #: Completed training steps: restore returns it as the step to start from.
    step: int
    created_unix: float
    objects: tuple[ObjectEntry, ...]
    epoch: int | None = None
    library_version: str = ""
    format_version: int = FORMAT_VERSION
    #: Why it was saved: ``schedule``, ``demand``, ``notice:<source>``.
    reason: str = "schedule"
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def sharded(self) -> bool:
        """Whether this is a sharded (DCP) checkpoint rather than one replicated payload."""
        return self.format_version == SHARDED_FORMAT_VERSION

    @property
    def folder(self) -> bool:
        """Whether this keeps a trainer's own checkpoint files (``--sync-dir``)."""
        return self.format_version == FOLDER_FORMAT_VERSION

    @property
    def size_bytes(self) -> int:
        """Total payload bytes."""
        return sum(o.size_bytes for o in self.objects)

    def object_path(self, obj: ObjectEntry | str) -> str:
        """The object's path relative to the store's root.

        >>> Manifest("ckpt-000000000001-00000000", 1, 0.0, ()).object_path("state.pt")
        'ckpt-000000000001-00000000/state.pt'
        """
        if isinstance(obj, ObjectEntry) and obj.pool:
            return pool_path(obj.sha256)
        return f"{self.name}/{obj if isinstance(obj, str) else obj.name}"

    @property
    def uses_pool(self) -> bool:
        """Whether an object lives in the shared pool (an incremental save)."""
        return any(o.pool for o in self.objects)

    @property
    def pool_digests(self) -> frozenset[str]:
        """The sha256 of every pool object this checkpoint needs."""
        return frozenset(o.sha256 for o in self.objects if o.pool)

    @property
    def manifest_path(self) -> str:
        """Where this manifest lives relative to the store's root."""
        return f"{self.name}/{MANIFEST_FILE}"

    def to_json(self) -> str:
        """The manifest as JSON text (stable key order, so equal manifests are equal bytes)."""
        return json.dumps(
            {
                "format_version": (
                    max(self.format_version, POOL_FORMAT_VERSION)
                    if self.uses_pool
                    else self.format_version
                ),
                "name": self.name,
                "step": self.step,
                "epoch": self.epoch,
                "created_unix": self.created_unix,
                "library_version": self.library_version,
                "reason": self.reason,
                "objects": [_entry_json(o) for o in self.objects],
                "extra": dict(self.extra),
            },
            sort_keys=True,
            indent=1,
        )


def _entry_json(entry: ObjectEntry) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": entry.name,
        "size_bytes": entry.size_bytes,
        "sha256": entry.sha256,
    }
    if entry.pool:  # absent otherwise: a manifest without pool objects is as it always was
        data["pool"] = True
    return data


def pool_path(sha256: str) -> str:
    """Where the pool object with this sha256 lives, relative to the store's root.

    >>> pool_path("ab" * 32)[:12]
    'blobs/ababab'
    """
    return f"{POOL_FOLDER}/{sha256}"


def pool_object(path: str) -> str | None:
    """The sha256 named by a pool path (``blobs/<sha256>``), or ``None`` for any other
    path (a temporary file of a write in progress, another tool's file).

    >>> pool_object("blobs/" + "0" * 64) == "0" * 64, pool_object("blobs/.x.tmp-1")
    (True, None)
    """
    folder, _, rest = path.strip("/").partition("/")
    return rest if folder == POOL_FOLDER and _SHA256.fullmatch(rest) else None


def checkpoint_name(step: int, unique: str) -> str:
    """The folder name of the checkpoint of ``step``; ``unique`` is 8 hex digits.

    The unique part keeps a re-save of the same step (after a resume) from overwriting a
    complete checkpoint in place.

    >>> checkpoint_name(7, "deadbeef")
    'ckpt-000000000007-deadbeef'
    """
    if step < 0 or step >= 10**12:
        msg = f"step {step} is out of range (0 to 10**12 - 1)"
        raise ValueError(msg)
    if not re.fullmatch(r"[0-9a-f]{8}", unique):
        msg = f"unique part {unique!r} must be 8 lowercase hex digits"
        raise ValueError(msg)
    return f"ckpt-{step:012d}-{unique}"


def parse_name(name: str) -> int | None:
    """The step encoded in a checkpoint folder name, or ``None`` if it is not one.

    >>> parse_name("ckpt-000000000042-0123abcd"), parse_name("notes.txt")
    (42, None)
    """
    match = _NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def parse_manifest(text: str | bytes, name: str) -> Manifest:
    """Parse and validate the manifest of checkpoint ``name``.

    Raises :class:`ManifestError` when it is proven bad (too large, not JSON, nested too
    deep, a value out of range or of the wrong type) and :class:`UnreadableError` when a
    newer costguard wrote it (a newer reader may restore it: it is not garbage).

    >>> try:
    ...     parse_manifest("{", "ckpt-000000000001-00000000")
    ... except ManifestError as exc:
    ...     print(exc)
    manifest of ckpt-000000000001-00000000 is not valid JSON
    """
    if len(text) > MAX_MANIFEST_BYTES:
        msg = f"manifest of {name} is {len(text)} bytes (at most {MAX_MANIFEST_BYTES})"
        raise ManifestError(msg)
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError):
        msg = f"manifest of {name} is not valid JSON"
        raise ManifestError(msg) from None
    version = data.get("format_version") if isinstance(data, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > READ_FORMAT_VERSION:
        msg = (
            f"manifest of {name} has format_version {version}, written by a newer costguard "
            f"(this one reads up to {READ_FORMAT_VERSION})"
        )
        raise UnreadableError(msg, hint="upgrade costguard to restore it")
    try:
        return _from_dict(data, name)
    except (KeyError, TypeError, ValueError, OverflowError, RecursionError) as exc:
        msg = f"manifest of {name} is malformed: {type(exc).__name__}: {str(exc)[:200]}"
        raise ManifestError(msg) from None


def _integer(value: Any, what: str, *, low: int = 0, high: int = 2**63) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value < high:
        msg = f"{what} {str(value)[:40]!r}"
        raise ValueError(msg)
    return value


def _depth(value: Any) -> int:
    """How deep ``value`` nests (iterative: a deep value cannot exhaust the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if deepest > MAX_EXTRA_DEPTH:
            break
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
    return deepest


def _from_dict(data: Any, name: str) -> Manifest:
    if not isinstance(data, dict):
        msg = "not a JSON object"
        raise TypeError(msg)
    version = data["format_version"]
    if isinstance(version, bool) or version not in (
        FORMAT_VERSION,
        POOL_FORMAT_VERSION,
        SHARDED_FORMAT_VERSION,
        FOLDER_FORMAT_VERSION,
    ):
        msg = f"format_version {str(version)[:40]!r}"
        raise ValueError(msg)
    if data["name"] != name:
        msg = f"it names {str(data['name'])[:80]!r}"
        raise ValueError(msg)
    step = data["step"]
    if not isinstance(step, int) or isinstance(step, bool) or parse_name(name) != step:
        msg = f"step {str(step)[:40]!r} does not match the folder name"
        raise ValueError(msg)
    raw_objects = data["objects"]
    if not isinstance(raw_objects, list) or len(raw_objects) > 100_000:
        msg = "objects is not a list of at most 100,000 entries"
        raise ValueError(msg)
    objects = []
    for raw in raw_objects:
        if not isinstance(raw, dict):
            msg = "an object entry is not a JSON object"
            raise TypeError(msg)
        size = _integer(raw["size_bytes"], "object size", high=2**62)
        digest, object_name = raw["sha256"], raw["name"]
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            msg = f"object sha256 {str(digest)[:80]!r}"
            raise ValueError(msg)
        if (
            not isinstance(object_name, str)
            or not _OBJECT.fullmatch(object_name)
            or object_name in (MANIFEST_FILE, CONDEMNED_FILE)
        ):
            # Also what keeps a manifest from naming an object outside its folder.
            msg = f"object name {str(object_name)[:80]!r}"
            raise ValueError(msg)
        pool = raw.get("pool", False)
        if pool is not False and (pool is not True or version < POOL_FORMAT_VERSION):
            msg = f"pool {str(pool)[:40]!r} (in format_version {version})"
            raise ValueError(msg)
        if pool and object_name != digest:
            msg = f"pool object {object_name[:80]!r} is not named by its sha256"
            raise ValueError(msg)
        objects.append(ObjectEntry(object_name, size, digest, pool))
    if not objects or len({o.name for o in objects}) != len(objects):
        msg = "no objects, or an object listed twice"
        raise ValueError(msg)
    epoch = data.get("epoch")
    created = data["created_unix"]
    if isinstance(created, bool) or not isinstance(created, int | float):
        msg = f"created_unix {str(created)[:40]!r}"
        raise TypeError(msg)
    created_unix = float(created)  # OverflowError for a 400-digit integer
    if not math.isfinite(created_unix):
        msg = f"created_unix {created_unix!r}"
        raise ValueError(msg)
    extra = data.get("extra", {})
    if not isinstance(extra, dict):
        msg = "extra is not an object"
        raise TypeError(msg)
    if _depth(extra) > MAX_EXTRA_DEPTH:
        msg = f"extra nests deeper than {MAX_EXTRA_DEPTH} levels"
        raise ValueError(msg)
    library_version, reason = data.get("library_version", ""), data.get("reason", "schedule")
    if not isinstance(library_version, str) or not isinstance(reason, str):
        msg = "library_version and reason must be strings"
        raise TypeError(msg)
    return Manifest(
        name=name,
        step=step,
        created_unix=created_unix,
        objects=tuple(objects),
        epoch=None if epoch is None else _integer(epoch, "epoch"),
        library_version=library_version[:100],
        format_version=version,
        reason=reason[:200],
        extra=extra,
    )


@dataclass(frozen=True)
class Listing:
    """What a store's listing says about one checkpoint folder."""

    name: str
    step: int
    #: Object file name -> size in bytes, as listed (the manifest included).
    objects: Mapping[str, int]
    #: When anything in the folder was last written (unix time), if the store says.
    modified_unix: float | None = None

    @property
    def has_manifest(self) -> bool:
        """Whether a manifest object is present (it may still be unreadable)."""
        return MANIFEST_FILE in self.objects

    @property
    def condemned(self) -> bool:
        """Whether a restore proved it incomplete or corrupt (:data:`CONDEMNED_FILE`)."""
        return CONDEMNED_FILE in self.objects

    @property
    def size_bytes(self) -> int:
        """Bytes this folder holds in the store."""
        return sum(self.objects.values())


def scan(paths: Mapping[str, int], modified: Mapping[str, float] | None = None) -> list[Listing]:
    """Group a store listing (relative path -> size) into checkpoint folders, oldest first.

    ``modified`` (relative path -> unix time of the last write) dates each folder by its
    newest object. Paths outside a checkpoint folder (another tool's files, probe objects)
    are ignored.

    >>> [(c.name, c.has_manifest) for c in scan({
    ...     "ckpt-000000000002-00000000/state.pt": 5,
    ...     "ckpt-000000000002-00000000/manifest.json": 1,
    ...     "ckpt-000000000003-00000001/state.pt": 2,
    ...     "README": 3})]
    [('ckpt-000000000002-00000000', True), ('ckpt-000000000003-00000001', False)]
    """
    folders: dict[str, dict[str, int]] = {}
    newest: dict[str, float] = {}
    for path, size in paths.items():
        folder, _, rest = path.strip("/").partition("/")
        if rest and parse_name(folder) is not None:
            folders.setdefault(folder, {})[rest] = size
            when = (modified or {}).get(path)
            if when is not None:
                newest[folder] = max(when, newest.get(folder, when))
    return sorted(
        (
            Listing(name, parse_name(name) or 0, objects, newest.get(name))
            for name, objects in folders.items()
        ),
        key=lambda c: (c.step, c.name),
    )


def is_complete(manifest: Manifest, present: Mapping[str, int]) -> bool:
    """Whether every object the manifest lists is present with the listed size.

    ``present`` maps relative paths to sizes (a store listing). Sizes catch truncation
    cheaply; the sha256 is checked when the checkpoint is read.
    """
    return all(present.get(manifest.object_path(o)) == o.size_bytes for o in manifest.objects)


def missing_objects(manifest: Manifest, present: Mapping[str, int]) -> list[str]:
    """What keeps a checkpoint from being complete: each object not listed in ``present``
    or listed with another size, in words (empty when it is complete).

    >>> m = Manifest("ckpt-000000000001-00000000", 1, 0.0, (ObjectEntry("s", 4, "0" * 64),))
    >>> missing_objects(m, {"ckpt-000000000001-00000000/s": 3})
    ['ckpt-000000000001-00000000/s has 3 bytes, not 4']
    >>> missing_objects(m, {})
    ['ckpt-000000000001-00000000/s is missing']
    """
    found = []
    for o in manifest.objects:
        size = present.get(manifest.object_path(o))
        if size is None:
            found.append(f"{manifest.object_path(o)} is missing")
        elif size != o.size_bytes:
            found.append(f"{manifest.object_path(o)} has {size} bytes, not {o.size_bytes}")
    return found


def restore_order(manifests: Iterable[Manifest], present: Mapping[str, int]) -> list[Manifest]:
    """Complete checkpoints, the one to try first first (highest step, then newest).

    >>> a = Manifest("ckpt-000000000001-00000000", 1, 5.0, (ObjectEntry("s", 1, "0" * 64),))
    >>> b = Manifest("ckpt-000000000002-00000000", 2, 1.0, (ObjectEntry("s", 1, "0" * 64),))
    >>> [m.step for m in restore_order([a, b], {a.object_path("s"): 1, b.object_path("s"): 1})]
    [2, 1]
    """
    complete = [m for m in manifests if is_complete(m, present)]
    return sorted(complete, key=lambda m: (m.step, m.created_unix, m.name), reverse=True)


def latest_complete(manifests: Iterable[Manifest], present: Mapping[str, int]) -> Manifest | None:
    """The checkpoint to resume from: the first of :func:`restore_order`, or ``None``."""
    order = restore_order(manifests, present)
    return order[0] if order else None


@dataclass(frozen=True)
class Deletion:
    """Delete one checkpoint folder: its manifest first (so it stops being complete)."""

    name: str
    paths: tuple[str, ...]
    reason: str  # "retention", "partial" or "corrupt"


def plan_retention(
    listings: Iterable[Listing],
    committed: Collection[str],
    keep_last: int,
    *,
    corrupt: Collection[str] = (),
    protect: Collection[str] = (),
    count: bool = True,
    now_unix: float | None = None,
    grace_s: float = PARTIAL_GRACE_S,
) -> list[Deletion]:
    """What may be deleted: never a checkpoint that could still be good.

    ``committed`` names the folders whose manifest was read and found complete;
    ``corrupt`` those proven bad (a manifest that does not parse, bytes that do not match
    it). Any other folder with a manifest could not be judged (a read failed, a newer
    costguard wrote it) and is kept. ``protect`` names folders never to touch (a save in
    flight). Deleted are:

    * with ``count`` (only right after a newer checkpoint committed), committed
      checkpoints beyond the newest ``keep_last`` that are older than the protected one
      (the save that just committed);
    * folders without a manifest, and proven corrupt ones, whose step is not newer than
      the newest committed checkpoint's and that have not changed for ``grace_s`` (a live
      writer may still be uploading into a folder without a manifest; a folder with no
      date is kept). ``now_unix`` ``None`` skips the grace, for a caller that knows no
      other writer is live.

    Each deletion lists the manifest first: deleting it makes the folder partial, never a
    "latest" with missing objects.

    >>> ls = scan({f"ckpt-00000000000{s}-00000000/{f}": 1
    ...            for s in (1, 2, 3) for f in ("state.pt", "manifest.json")})
    >>> [(d.name, d.reason) for d in plan_retention(ls, [c.name for c in ls], keep_last=2)]
    [('ckpt-000000000001-00000000', 'retention')]
    >>> plan_retention(ls, [c.name for c in ls], keep_last=2, count=False)
    []
    """
    if keep_last < 1:
        msg = f"keep_last must be at least 1, not {keep_last}"
        raise ValueError(msg)
    listings = list(listings)
    complete = sorted(
        (c for c in listings if c.name in committed), key=lambda c: (c.step, c.name), reverse=True
    )
    deletions = []
    if count:
        # Only what is older than the checkpoint that just committed (the protected one):
        # a resume that fell back past checkpoints it could not read must not delete them.
        newest_protected = max((c.step for c in listings if c.name in protect), default=None)
        for c in complete[keep_last:]:
            if c.name not in protect and (newest_protected is None or c.step < newest_protected):
                deletions.append(Deletion(c.name, _paths_manifest_first(c), "retention"))
    if not complete:
        return deletions
    newest_step = complete[0].step
    for c in listings:
        garbage = "corrupt" if c.name in corrupt else "partial" if not c.has_manifest else None
        if (
            garbage is not None
            and c.name not in committed
            and c.name not in protect
            and c.step <= newest_step
            and c.modified_unix is not None
            and (now_unix is None or now_unix - c.modified_unix >= grace_s)
        ):
            deletions.append(Deletion(c.name, _paths_manifest_first(c), garbage))
    return deletions


def _paths_manifest_first(listing: Listing) -> tuple[str, ...]:
    names = sorted(listing.objects, key=lambda n: (n != MANIFEST_FILE, n))
    return tuple(f"{listing.name}/{n}" for n in names)


def plan_pool_deletions(
    paths: Mapping[str, int],
    listings: Iterable[Listing],
    manifests: Iterable[Manifest],
    *,
    deleting: Collection[str] = (),
    corrupt: Collection[str] = (),
    modified: Mapping[str, float] | None = None,
    now_unix: float | None = None,
    grace_s: float = PARTIAL_GRACE_S,
) -> list[str]:
    """The pool objects (``blobs/<sha256>``) no checkpoint can need any more.

    ``paths`` is the store listing, ``listings`` its checkpoint folders (:func:`scan`),
    ``manifests`` every manifest that was read, ``deleting`` the folders about to be
    deleted (their manifests first) and ``corrupt`` those proven bad. A pool object is
    deleted only when all of these hold:

    * every folder that keeps a manifest had it read, or was proven corrupt: a manifest
      that could not be read now (a failed read, a newer costguard) might refer to any
      pool object, so then nothing in the pool is deleted;
    * no folder without a manifest is a save that may still be in progress (one written
      to within ``grace_s``, or with no date): it has no manifest yet to say what it uses;
    * no manifest of a folder that stays refers to it;
    * it was written more than ``grace_s`` ago (a save uploads its pool objects before its
      folder has anything in it) and its date is known.

    ``now_unix`` ``None`` skips both waits, for a caller that knows no other writer is
    live. Run it only right after a newer checkpoint committed (the retention of a save).

    >>> blob = ObjectEntry("1" * 64, 4, "1" * 64, pool=True)
    >>> a = Manifest("ckpt-000000000001-00000000", 1, 0.0,
    ...              (ObjectEntry("state.pt", 1, "0" * 64), blob))
    >>> store = {a.manifest_path: 1, a.object_path(a.objects[0]): 1,
    ...          pool_path("1" * 64): 4, pool_path("2" * 64): 4}
    >>> dated = dict.fromkeys(store, 0.0)
    >>> plan_pool_deletions(store, scan(store), [a], modified=dated) == [pool_path("2" * 64)]
    True
    >>> len(plan_pool_deletions(store, scan(store), [a], deleting=[a.name], modified=dated))
    2
    >>> plan_pool_deletions(store, scan(store), [], modified=dated)  # an unread manifest
    []
    """
    modified = modified or {}
    leaving, bad = set(deleting), set(corrupt)
    read = {m.name: m for m in manifests}
    needed: set[str] = set()
    for listing in listings:
        if listing.name in leaving:
            continue
        if not listing.has_manifest:
            if listing.modified_unix is None or (
                now_unix is not None and now_unix - listing.modified_unix < grace_s
            ):
                return []  # a save that may still be writing: what it uses is not known
            continue
        manifest = read.get(listing.name)
        if manifest is None:
            if listing.name in bad:
                continue  # proven corrupt: it will never be restored
            return []  # could not be judged now: it may need anything
        needed |= manifest.pool_digests
    doomed = []
    for path in sorted(paths):
        digest = pool_object(path)
        if digest is None or digest in needed:
            continue
        when = modified.get(path)
        if when is not None and (now_unix is None or now_unix - when >= grace_s):
            doomed.append(path)
    return doomed
