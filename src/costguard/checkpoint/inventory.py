"""What a checkpoint store holds, and whether it is intact (``costguard checkpoint ls/verify``).

Needs no torch: verification reads each object and compares its size and sha256 with the
manifest.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from costguard.checkpoint.manifest import (
    Manifest,
    ManifestError,
    latest_complete,
    parse_manifest,
    scan,
)
from costguard.checkpoint.store import Store, StoreError


@dataclass(frozen=True)
class Entry:
    """One checkpoint folder as ``costguard checkpoint ls`` shows it."""

    name: str
    step: int
    #: complete | partial (no manifest) | corrupt (bad manifest) | incomplete (object missing)
    status: str
    size_bytes: int
    created_unix: float | None = None
    reason: str = ""
    latest: bool = False
    problem: str = ""


def inventory(store: Store) -> list[Entry]:
    """Every checkpoint folder in ``store``, oldest first; the latest complete one marked."""
    listing = store.listing()
    manifests: dict[str, Manifest] = {}
    problems: dict[str, str] = {}
    folders = scan(listing)
    for folder in folders:
        if folder.has_manifest:
            try:
                text = store.get(f"{folder.name}/manifest.json")
                manifests[folder.name] = parse_manifest(text, folder.name)
            except (ManifestError, StoreError) as exc:
                problems[folder.name] = exc.message
    latest = latest_complete(manifests.values(), listing)
    entries = []
    for folder in folders:
        manifest = manifests.get(folder.name)
        if manifest is None:
            status = "corrupt" if folder.name in problems else "partial"
        elif latest_complete([manifest], listing) is None:
            status = "incomplete"
        else:
            status = "complete"
        entries.append(
            Entry(
                name=folder.name,
                step=folder.step,
                status=status,
                size_bytes=folder.size_bytes,
                created_unix=manifest.created_unix if manifest else None,
                reason=manifest.reason if manifest else "",
                latest=latest is not None and latest.name == folder.name,
                problem=problems.get(folder.name, ""),
            )
        )
    return entries


@dataclass(frozen=True)
class Verification:
    """The outcome of checking one checkpoint's objects against its manifest."""

    name: str
    step: int
    ok: bool
    problem: str = ""


def verify(store: Store, *, latest_only: bool = False) -> list[Verification]:
    """Read every complete checkpoint (or only the latest) and check sizes and sha256."""
    results = []
    entries = [e for e in inventory(store) if e.status != "partial"]
    if latest_only:
        entries = [e for e in entries if e.latest]
    for entry in reversed(entries):
        if entry.status != "complete":
            results.append(
                Verification(entry.name, entry.step, False, entry.problem or entry.status)
            )
            continue
        try:
            manifest = parse_manifest(store.get(f"{entry.name}/manifest.json"), entry.name)
            for obj in manifest.objects:
                data = store.get(manifest.object_path(obj))
                digest = hashlib.sha256(data).hexdigest()
                if len(data) != obj.size_bytes or digest != obj.sha256:
                    msg = f"{obj.name}: sha256 or size does not match the manifest"
                    raise ManifestError(msg)
        except (ManifestError, StoreError) as exc:
            results.append(Verification(entry.name, entry.step, False, exc.message))
            continue
        results.append(Verification(entry.name, entry.step, True))
    return results
