"""The pure decisions: manifests, "latest complete", retention."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from costguard.checkpoint.manifest import (
    MANIFEST_FILE,
    Manifest,
    ManifestError,
    ObjectEntry,
    checkpoint_name,
    latest_complete,
    parse_manifest,
    parse_name,
    plan_retention,
    pool_object,
    restore_order,
    scan,
)

SHA = "a" * 64


def manifest(step: int, unique: str = "00000000", created: float = 0.0, size: int = 10) -> Manifest:
    return Manifest(
        checkpoint_name(step, unique), step, created, (ObjectEntry("state.pt", size, SHA),)
    )


def test_manifest_round_trips_through_json() -> None:
    m = manifest(12, "0123abcd", created=5.5)
    assert parse_manifest(m.to_json(), m.name) == m


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda d: d.update(step=13), "does not match"),
        (lambda d: d.update(name="ckpt-000000000001-00000000"), "names"),
        (lambda d: d.update(format_version=0), "format_version"),
        (lambda d: d.update(format_version="2"), "format_version"),
        (lambda d: d["objects"][0].update(sha256="xyz"), "sha256"),
        (lambda d: d["objects"][0].update(size_bytes=-1), "size"),
        (lambda d: d["objects"][0].update(name="../evil"), "object name"),
        (lambda d: d["objects"][0].update(name=MANIFEST_FILE), "object name"),
        (lambda d: d["objects"][0].update(name="state.pt\n"), "object name"),
        (lambda d: d["objects"][0].update(sha256=SHA + "\n"), "sha256"),
        (lambda d: d.update(objects=[]), "no objects"),
        (lambda d: d.pop("objects"), "objects"),
    ],
)
def test_a_bad_manifest_is_rejected_with_a_reason(mutate, problem) -> None:
    m = manifest(12, "0123abcd")
    data = json.loads(m.to_json())
    mutate(data)
    with pytest.raises(ManifestError, match=problem):
        parse_manifest(json.dumps(data), m.name)


def test_truncated_manifest_is_not_json() -> None:
    text = manifest(3).to_json()
    for cut in range(len(text)):
        with pytest.raises(ManifestError):
            parse_manifest(text[:cut], manifest(3).name)


@pytest.mark.parametrize(
    "name",
    [
        "ckpt-000000000042-0123abcd\n",
        "ckpt-\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0664\u0662-0123abcd",
        "ckpt-\uff10\uff10\uff10\uff10\uff10\uff10\uff10\uff10\uff10\uff10\uff14\uff12-0123abcd",
    ],
)
def test_a_name_with_a_newline_or_non_ascii_digits_is_no_checkpoint(name: str) -> None:
    """Names and digests are matched whole and in ASCII digits (issue 28): a listing that
    shows such a folder holds no checkpoint of step 42, and a pool path no blob."""
    assert parse_name(name) is None
    assert scan({f"{name}/{MANIFEST_FILE}": 10}, {}) == []
    assert pool_object("blobs/" + SHA + "\n") is None
    assert pool_object("blobs/" + SHA) == SHA


def test_checkpoint_name_validates() -> None:
    with pytest.raises(ValueError, match="out of range"):
        checkpoint_name(-1, "00000000")
    with pytest.raises(ValueError, match="hex"):
        checkpoint_name(1, "XYZ")


def present_for(*manifests: Manifest) -> dict[str, int]:
    return {m.object_path(o): o.size_bytes for m in manifests for o in m.objects}


def test_latest_skips_a_newer_checkpoint_with_a_missing_or_short_object() -> None:
    old, new = manifest(10), manifest(20)
    assert latest_complete([old, new], present_for(old)) == old
    short = present_for(old, new) | {new.object_path("state.pt"): 9}
    assert latest_complete([old, new], short) == old
    assert latest_complete([], {}) is None


def test_same_step_prefers_the_newer_save() -> None:
    a, b = manifest(10, "0000000a", created=1.0), manifest(10, "0000000b", created=2.0)
    assert restore_order([a, b], present_for(a, b)) == [b, a]


# A checkpoint in a random state: (step, has manifest, payload fully present).
folders = st.lists(
    st.tuples(st.integers(0, 50), st.booleans(), st.booleans()),
    max_size=12,
    unique_by=lambda t: t[0],
)


@given(folders)
def test_latest_complete_never_returns_a_partial_checkpoint(
    spec: list[tuple[int, bool, bool]],
) -> None:
    manifests, present = [], {}
    for step, has_manifest, full in spec:
        m = manifest(step, size=100)
        if has_manifest:
            manifests.append(m)
            present[m.manifest_path] = 50
        present[m.object_path("state.pt")] = 100 if full else 37
    latest = latest_complete(manifests, present)
    complete = [s for s, has_manifest, full in spec if has_manifest and full]
    if not complete:
        assert latest is None
    else:
        assert latest is not None
        assert latest.step == max(complete)


@given(
    folders,
    st.integers(1, 5),
    st.lists(st.one_of(st.none(), st.floats(0, 2000)), min_size=12, max_size=12),
    st.booleans(),
)
def test_retention_keeps_the_newest_n_and_removes_only_abandoned_partials(
    spec: list[tuple[int, bool, bool]], keep: int, ages: list[float | None], count: bool
) -> None:
    now, grace = 10_000.0, 900.0
    listing, modified = {}, {}
    for (step, has_manifest, _), age in zip(spec, ages, strict=False):
        name = checkpoint_name(step, "00000000")
        listing[f"{name}/state.pt"] = 10
        if age is not None:
            modified[f"{name}/state.pt"] = now - age
        if has_manifest:
            listing[f"{name}/{MANIFEST_FILE}"] = 5
    folders_ = scan(listing, modified)
    committed = {f.name for f in folders_ if f.has_manifest}
    deletions = plan_retention(folders_, committed, keep, count=count, now_unix=now, grace_s=grace)
    deleted = {d.name for d in deletions}
    kept_complete = sorted(
        f.step for f in folders_ if f.name in committed and f.name not in deleted
    )
    every = sorted(f.step for f in folders_ if f.name in committed)
    assert kept_complete == (every[-keep:] if count else every)
    newest = max(every, default=None)
    for f in folders_:
        if f.name in committed:
            continue
        abandoned = (
            newest is not None
            and f.step <= newest
            and f.modified_unix is not None
            and now - f.modified_unix >= grace
        )
        assert (f.name in deleted) == abandoned, f
    for d in deletions:
        if any(p.endswith(MANIFEST_FILE) for p in d.paths):
            assert d.paths[0].endswith(MANIFEST_FILE)


def test_retention_protects_the_save_in_flight() -> None:
    listing = {"ckpt-000000000009-00000000/state.pt": 3}
    assert plan_retention(scan(listing), set(), 1, protect={"ckpt-000000000009-00000000"}) == []
    with pytest.raises(ValueError, match="at least 1"):
        plan_retention([], set(), 0)


def test_scan_ignores_foreign_files() -> None:
    assert scan({"notes.txt": 1, "ckpt-x/state.pt": 1, "ckpt-000000000001-00000000": 4}) == []
