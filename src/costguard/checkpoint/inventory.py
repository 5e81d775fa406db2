"""What a checkpoint store holds, and whether it is intact (``costguard checkpoint ls/verify``).

Needs no torch: verification streams each object through sha256 and compares it with the
manifest. The checkpoint marked ``latest`` is the one a resume would use: the newest whose
objects verify, exactly as :class:`~costguard.checkpoint.restoring.Restorer` chooses, so a
checkpoint ``verify`` calls bad is never the one marked. One unreadable or odd checkpoint is
reported on its own line; it never stops the report on the others.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from costguard.checkpoint.completion import whole
from costguard.checkpoint.manifest import Manifest, ManifestError, restore_order
from costguard.checkpoint.restoring import Restorer
from costguard.checkpoint.store import Store
from costguard.errors import CostguardError
from costguard.secrets import redact


@dataclass(frozen=True)
class Entry:
    """One checkpoint folder as ``costguard checkpoint ls`` shows it."""

    name: str
    step: int
    #: complete | partial (no manifest) | corrupt (bad manifest or bytes) |
    #: unreadable (could not be read now, or a newer format: kept) | unchecked
    status: str
    size_bytes: int
    created_unix: float | None = None
    reason: str = ""
    latest: bool = False
    problem: str = ""


def check(store: Store, manifest: Manifest) -> tuple[str, str]:
    """Read every object of ``manifest`` and check its size and sha256 (and, for a
    ``--sync-dir`` checkpoint, that each trainer file is whole by its format): ``("complete",
    "")``, or ``("corrupt" | "unreadable", why)``."""
    files = manifest.extra.get("folder", {}).get("files", {}) if manifest.folder else {}
    try:
        for obj in manifest.objects:
            with store.verified_file(
                manifest.object_path(obj), obj.size_bytes, obj.sha256
            ) as local:
                name = files.get(obj.name) if isinstance(files, dict) else None
                problem = whole(Path(local), str(name).rsplit("/", 1)[-1]) if name else ""
                if problem:  # a trainer's file cut short when it was kept (--sync-dir)
                    return "corrupt", f"{name}: {problem}"
    except ManifestError as exc:
        return "corrupt", exc.message
    except CostguardError as exc:
        return "unreadable", redact(exc.message)
    except Exception as exc:  # an odd store error: reported on this line, never a crash
        return "unreadable", f"{type(exc).__name__}: {redact(str(exc))[:300]}"
    return "complete", ""


def inventory(store: Store, *, verify_latest: bool = True) -> list[Entry]:
    """Every checkpoint folder in ``store``, newest first, the one a resume starts from
    marked (found by verifying the newest candidates in turn, with ``verify_latest``)."""
    survey = Restorer(store).survey()
    manifests = {m.name: m for m in survey.manifests}
    checked: dict[str, tuple[str, str]] = {}
    latest: str | None = None
    for candidate in restore_order(survey.manifests, survey.sizes):
        if not verify_latest:
            latest = candidate.name
            break
        checked[candidate.name] = check(store, candidate)
        if checked[candidate.name][0] == "complete":
            latest = candidate.name
            break
    entries = []
    for folder in reversed(survey.listings):
        manifest = manifests.get(folder.name)
        if folder.name in survey.corrupt:
            status, problem = "corrupt", survey.corrupt[folder.name]
        elif folder.name in survey.doubtful:
            status, problem = "unreadable", survey.doubtful[folder.name]
        elif manifest is None:
            status, problem = "partial", "no manifest (a save in progress, or one cut off)"
        else:
            status, problem = checked.get(folder.name, ("complete", ""))
        entries.append(
            Entry(
                name=folder.name,
                step=folder.step,
                status=status,
                size_bytes=folder.size_bytes,
                created_unix=manifest.created_unix if manifest else None,
                reason=manifest.reason if manifest else "",
                latest=folder.name == latest,
                problem=problem,
            )
        )
    return entries


def latest(store: Store) -> Entry | None:
    """The checkpoint a resume starts from, as its manifest says (``None``: none yet).

    Reading every byte of a big payload again is :func:`verify`'s job, not this one's.
    """
    return next((e for e in inventory(store, verify_latest=False) if e.latest), None)


@dataclass(frozen=True)
class Verification:
    """The outcome of checking one checkpoint's objects against its manifest."""

    name: str
    step: int
    ok: bool
    problem: str = ""


def verify(store: Store, *, latest_only: bool = False) -> list[Verification]:
    """Read every checkpoint with a manifest (or only the latest), newest first, and check
    sizes and sha256."""
    entries = [e for e in inventory(store) if e.status != "partial"]
    if latest_only:
        entries = [e for e in entries if e.latest]
    restorer = Restorer(store)
    results = []
    for entry in entries:
        if entry.status != "complete":
            results.append(Verification(entry.name, entry.step, False, entry.problem))
            continue
        if not entry.latest:  # the latest was verified by inventory already
            try:
                status, problem = check(store, restorer.manifest(entry.name))
            except CostguardError as exc:
                status, problem = "unreadable", redact(exc.message)
            if status != "complete":
                results.append(Verification(entry.name, entry.step, False, problem))
                continue
        results.append(Verification(entry.name, entry.step, True))
    return results


#: The folders ``costguard slurm script --array`` gives its tasks: ``task-<index>``.
_TASK = re.compile(r"task-([0-9]+)")


@dataclass(frozen=True)
class TaskLatest:
    """One array task's folder: its checkpoints' count and the one a resume would use."""

    task: str
    index: int
    checkpoints: int
    latest: Entry | None


def task_folders(store: Store) -> list[str]:
    """The ``task-<index>`` folders of a job array's parent folder, by index; empty when
    the store holds checkpoints of its own (then it is one run, not a sweep's parent)."""
    tasks: set[str] = set()
    for path in store.listing():
        top = path.split("/", 1)[0]
        if "/" in path and top.startswith("ckpt-"):
            return []
        if "/" in path and _TASK.fullmatch(top):
            tasks.add(top)
    return sorted(tasks, key=lambda name: int(name.split("-", 1)[1]))


def task_inventory(store: Store, *, verify_latest: bool = True) -> list[TaskLatest]:
    """Each array task's latest checkpoint (verified as a resume would, with
    ``verify_latest``), for a parent folder that holds ``task-*`` folders and no
    checkpoints itself; empty otherwise."""
    found = []
    for name in task_folders(store):
        task = Store(
            store.fs, store.full(name), f"{store.url.rstrip('/')}/{name}", retry=store.retry
        )
        entries = inventory(task, verify_latest=verify_latest)
        latest = next((e for e in entries if e.latest), None)
        index = int(name.split("-", 1)[1])
        found.append(TaskLatest(name, index, len(entries), latest))
    return found
