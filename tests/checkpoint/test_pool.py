"""The pool of incremental saves as values: manifests that refer to pool objects, and which
pool objects retention may delete (pure; see manifest.plan_pool_deletions)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costguard.checkpoint.manifest import (
    FORMAT_VERSION,
    MANIFEST_FILE,
    Manifest,
    ManifestError,
    ObjectEntry,
    UnreadableError,
    checkpoint_name,
    parse_manifest,
    plan_pool_deletions,
    pool_path,
    scan,
)

GRACE = 100.0
NOW = 10_000.0
DIGESTS = [f"{i:x}" * 64 for i in range(1, 7)]


def manifest(step: int, pooled: list[str], unique: str = "00000000") -> Manifest:
    objects = [ObjectEntry("state.pt", 10, "a" * 64)]
    objects += [ObjectEntry(d, 4, d, pool=True) for d in sorted(set(pooled))]
    return Manifest(checkpoint_name(step, unique), step, 1.0, tuple(objects))


def test_a_manifest_without_pool_objects_is_written_as_before() -> None:
    m = manifest(3, [])
    data = json.loads(m.to_json())
    assert data["format_version"] == FORMAT_VERSION == 1
    assert data["objects"] == [{"name": "state.pt", "sha256": "a" * 64, "size_bytes": 10}]


def test_a_manifest_with_pool_objects_round_trips_and_an_older_reader_skips_it() -> None:
    m = manifest(3, [DIGESTS[0]])
    data = json.loads(m.to_json())
    # costguard before pools raised UnreadableError for any format_version above 1 (skip
    # and keep, never corrupt): a pool manifest must carry a higher one.
    assert data["format_version"] > FORMAT_VERSION
    assert data["objects"][1] == {
        "name": DIGESTS[0],
        "pool": True,
        "sha256": DIGESTS[0],
        "size_bytes": 4,
    }
    parsed = parse_manifest(m.to_json(), m.name)
    assert parsed.objects == m.objects
    assert parsed.object_path(parsed.objects[1]) == f"blobs/{DIGESTS[0]}"
    assert parse_manifest(parsed.to_json(), m.name).to_json() == m.to_json()


def _mutated(mutate: Any) -> str:
    data = json.loads(manifest(3, [DIGESTS[0]]).to_json())
    mutate(data)
    return json.dumps(data)


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda d: d.update(format_version=1), id="pool in a version-1 manifest"),
        pytest.param(lambda d: d["objects"][1].update(pool="yes"), id="pool not a boolean"),
        pytest.param(lambda d: d["objects"][1].update(name="x.pt"), id="pool name not its hash"),
    ],
)
def test_odd_pool_entries_are_corrupt(mutate: Any) -> None:
    with pytest.raises(ManifestError):
        parse_manifest(_mutated(mutate), checkpoint_name(3, "00000000"))


def test_a_newer_format_is_still_only_unreadable() -> None:
    with pytest.raises(UnreadableError):
        parse_manifest(
            _mutated(lambda d: d.update(format_version=99)), "ckpt-000000000003-00000000"
        )


def store_of(manifests: list[Manifest], extra: dict[str, int]) -> dict[str, int]:
    paths = dict(extra)
    for m in manifests:
        paths[m.manifest_path] = 1
        for o in m.objects:
            paths[m.object_path(o)] = o.size_bytes
    return paths


def test_only_unneeded_quiet_pool_objects_go() -> None:
    kept = manifest(2, [DIGESTS[0]])
    paths = store_of([kept], {pool_path(d): 4 for d in DIGESTS[:3]} | {"blobs/.x.tmp-1": 4})
    dates = dict.fromkeys(paths, NOW - 2 * GRACE) | {pool_path(DIGESTS[2]): NOW - 1}
    plan = plan_pool_deletions(
        paths, scan(paths, dates), [kept], modified=dates, now_unix=NOW, grace_s=GRACE
    )
    # 0 is needed, 2 was written within the grace (a save may be about to refer to it),
    # the temporary file is no pool object: only 1 goes.
    assert plan == [pool_path(DIGESTS[1])]


def test_a_manifest_that_could_not_be_read_keeps_the_whole_pool() -> None:
    kept, unread = manifest(2, [DIGESTS[0]]), manifest(3, [DIGESTS[1]])
    paths = store_of([kept, unread], {pool_path(d): 4 for d in DIGESTS})
    dates = dict.fromkeys(paths, 0.0)
    assert plan_pool_deletions(paths, scan(paths, dates), [kept], modified=dates) == []
    # ... unless that folder is proven corrupt (its manifest will never be restored).
    plan = plan_pool_deletions(
        paths, scan(paths, dates), [kept], corrupt=[unread.name], modified=dates
    )
    assert plan == [pool_path(d) for d in DIGESTS[1:]]


def test_a_save_in_progress_keeps_the_whole_pool_until_its_grace_is_over() -> None:
    kept = manifest(2, [DIGESTS[0]])
    partial = checkpoint_name(3, "00000001")
    paths = store_of([kept], {pool_path(DIGESTS[1]): 4, f"{partial}/state.pt": 3})
    dates = dict.fromkeys(paths, NOW - 2 * GRACE)
    fresh = {**dates, f"{partial}/state.pt": NOW - 1}
    options: dict[str, Any] = {"now_unix": NOW, "grace_s": GRACE}
    assert plan_pool_deletions(paths, scan(paths, fresh), [kept], modified=fresh, **options) == []
    assert plan_pool_deletions(paths, scan(paths), [kept], modified=dates, **options) == []
    stale = plan_pool_deletions(paths, scan(paths, dates), [kept], modified=dates, **options)
    assert stale == [pool_path(DIGESTS[1])]


FOLDER_KINDS = st.sampled_from(["read", "unread", "corrupt", "partial-old", "partial-new"])


@settings(max_examples=300, deadline=None)
@given(
    folders=st.lists(
        st.tuples(FOLDER_KINDS, st.lists(st.sampled_from(DIGESTS), max_size=4), st.booleans()),
        max_size=6,
    ),
    pooled=st.dictionaries(
        st.sampled_from(DIGESTS), st.one_of(st.none(), st.floats(0.0, NOW)), max_size=6
    ),
)
def test_no_pool_object_a_kept_checkpoint_may_need_is_ever_deleted(
    folders: list[tuple[str, list[str], bool]], pooled: dict[str, float | None]
) -> None:
    paths: dict[str, int] = {pool_path(d): 4 for d in pooled}
    dates = {pool_path(d): when for d, when in pooled.items() if when is not None}
    read, corrupt, deleting = [], [], []
    needed: set[str] = set()
    blocked = False
    for i, (kind, digests, delete) in enumerate(folders):
        m = manifest(i + 1, digests, f"{i:08x}")
        if kind.startswith("partial"):
            paths[m.object_path("state.pt")] = 10
            dates[m.object_path("state.pt")] = NOW - 1 if kind == "partial-new" else 0.0
            blocked |= kind == "partial-new" and not delete
        else:
            own = {m.manifest_path: 1, m.object_path("state.pt"): 10}  # its pool objects: above
            paths.update(own)
            dates.update(dict.fromkeys(own, 0.0))
            if kind == "read":
                read.append(m)
            if kind == "corrupt":
                corrupt.append(m.name)
            blocked |= kind == "unread" and not delete
        if delete:
            deleting.append(m.name)
        elif kind == "read":
            needed |= m.pool_digests
    plan = plan_pool_deletions(
        paths,
        scan(paths, dates),
        read,
        deleting=deleting,
        corrupt=corrupt,
        modified=dates,
        now_unix=NOW,
        grace_s=GRACE,
    )
    assert all(p.startswith("blobs/") for p in plan)
    assert not {p.removeprefix("blobs/") for p in plan} & needed
    assert all(NOW - dates[p] >= GRACE for p in plan)
    if blocked:
        assert plan == []
    else:  # and it is not over-careful: every unneeded quiet pool object goes
        assert set(plan) == {
            pool_path(d)
            for d, when in pooled.items()
            if d not in needed and when is not None and NOW - when >= GRACE
        }
    assert MANIFEST_FILE not in "".join(plan)
