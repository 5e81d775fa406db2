"""Writing the tables (atomically) and reading them back; choosing cache or bundled."""

from __future__ import annotations

import functools
import os
import shutil
import threading
import time
import tomllib
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from costguard.errors import CostguardError, InputError
from costguard.pricing import tables as tables_module
from costguard.pricing.catalog import (
    Catalog,
    InstancePrice,
    Market,
    PriceStatus,
    Staleness,
    TablePart,
    staleness,
)
from costguard.pricing.refresh import cache
from costguard.pricing.refresh.merge import MergedTables, TableMeta, merge_tables
from costguard.pricing.tables import bundled_tables_dir, cache_tables_dir, load_catalog, load_tables
from costguard.settings import Settings
from tests.helpers.waiting import wait_for

NOW = datetime(2026, 12, 1, 9, 30, 15, 123456, tzinfo=UTC)
CATALOG = load_catalog()


def merged_with_parts(parts: dict[tuple[str, str], TablePart]) -> MergedTables:
    merged = merge_tables(CATALOG, [], NOW)
    meta = tuple(
        TableMeta(m.name, m.file, m.as_of, m.source, NOW, parts) if m.name == "gpu_instances" else m
        for m in merged.meta
    )
    return MergedTables(merged.instances, meta, merged.stats)


def test_written_tables_load_back_identical(tmp_path: Path) -> None:
    target = tmp_path / "pricing"
    parts = {
        ("aws", "us-east-1"): TablePart(date(2026, 12, 1), "AWS API"),
        ("gcp", "us-central1"): TablePart(date(2026, 11, 30), "bundled"),
    }
    cache.write_tables(target, merged_with_parts(parts), CATALOG, NOW)
    version = cache_tables_dir(target)
    assert version is not None
    assert version.parent == (target / "versions").resolve()
    loaded = load_catalog(version, origin="cache")
    assert sorted(loaded.instances, key=repr) == sorted(CATALOG.instances, key=repr)
    assert loaded.storage == CATALOG.storage
    assert loaded.transfer == CATALOG.transfer
    assert loaded.regions == CATALOG.regions
    gpu = loaded.tables["gpu_instances"]
    assert gpu.refreshed_at == NOW.replace(microsecond=0)
    assert gpu.parts == parts
    assert gpu.part("aws", "us-east-1").as_of == date(2026, 12, 1)
    assert gpu.part("azure", "eastus") == TablePart(gpu.as_of, gpu.source)  # no part: the table's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pricing"]  # no staging left behind
    assert sorted(p.name for p in target.iterdir()) == [".lock", "current", "versions"]
    assert [p.name for p in (target / "versions").iterdir()] == [version.name]


text = st.text(st.characters(codec="utf-8"), max_size=40)  # any text a file can hold


@given(source=text, region=text.filter(bool))
def test_index_round_trips_any_text(source: str, region: str) -> None:
    meta = TableMeta(
        "gpu_instances",
        "gpu_instances.csv",
        date(2026, 11, 30),
        source,
        NOW,
        {("aws", region): TablePart(date(2026, 12, 1), source)},
    )
    index = tomllib.loads(cache.render_index([meta], NOW))
    entry = index["gpu_instances"]
    assert entry["source"] == source
    assert entry["parts"]["aws"][region] == {"as_of": date(2026, 12, 1), "source": source}
    assert entry["refreshed_at"] == NOW.replace(microsecond=0)


def test_publish_switches_current_and_keeps_only_the_previous_version(tmp_path: Path) -> None:
    target = tmp_path / "pricing"
    first = cache.publish(target, {"tables.toml": b"one", "a.csv": b"1"})
    second = cache.publish(target, {"tables.toml": b"two", "b.csv": b"2"})
    assert cache_tables_dir(target) == second.resolve()
    assert sorted(p.name for p in second.iterdir()) == ["b.csv", "tables.toml"]
    assert (target / "current" / "tables.toml").read_bytes() == b"two"
    assert (target / "current").readlink() == Path("versions") / second.name  # relative
    assert first.is_dir()  # a reader may still be reading it
    third = cache.publish(target, {"tables.toml": b"three"})
    assert sorted(p.name for p in (target / "versions").iterdir()) == [second.name, third.name]
    assert not first.exists()
    assert sorted(p.name for p in target.iterdir()) == [".lock", "current", "versions"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pricing"]


def test_a_crash_before_the_switch_leaves_the_old_version_in_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "pricing"
    old = cache.publish(target, {"tables.toml": b"old"})

    def crash(target: Path, version: Path) -> None:
        assert (version / "tables.toml").read_bytes() == b"new"  # fully written, not in use
        raise OSError("disk vanished")

    monkeypatch.setattr(cache, "_switch_current", crash)
    with pytest.raises(OSError, match="disk vanished"):
        cache.publish(target, {"tables.toml": b"new"})
    assert (target / "current" / "tables.toml").read_bytes() == b"old"
    assert [p.name for p in (target / "versions").iterdir()] == [old.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pricing"]


def test_no_symbolic_links_is_a_clear_error_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "pricing"
    old = cache.publish(target, {"tables.toml": b"old"})

    def refuse(self: Path, *args: object, **kwargs: object) -> None:
        raise OSError(1314, "A required privilege is not held by the client")  # Windows

    monkeypatch.setattr(Path, "symlink_to", refuse)
    with pytest.raises(CostguardError, match="cannot make a symbolic link") as info:
        cache.publish(target, {"tables.toml": b"new"})
    assert "Developer Mode" in (info.value.hint or "")
    assert cache_tables_dir(target) == old.resolve()
    assert [p.name for p in (target / "versions").iterdir()] == [old.name]
    assert sorted(p.name for p in target.iterdir()) == [".lock", "current", "versions"]


def test_tidy_clears_what_a_crashed_refresh_left(tmp_path: Path) -> None:
    target = tmp_path / "pricing"
    first = cache.publish(target, {"tables.toml": b"1"})
    second = cache.publish(target, {"tables.toml": b"2"})
    current = cache.publish(target, {"tables.toml": b"3"})
    versions = target / "versions"
    (versions / ".tmp-crashed").mkdir()  # staging, half written
    orphan = versions / "99991231T000000000000Z-deadbeef"  # written, never made current
    orphan.mkdir()
    (target / ".current.tmp-crashed").symlink_to(Path("versions") / orphan.name)
    (target / "tables.toml").write_text("an earlier release's layout")
    (target / "gpu_instances.csv").write_text("x")
    assert not first.exists()
    cache.tidy(target)
    assert sorted(p.name for p in versions.iterdir()) == [second.name, current.name]
    assert sorted(p.name for p in target.iterdir()) == [".lock", "current", "versions"]
    assert (target / "current" / "tables.toml").read_bytes() == b"3"


def test_tidy_restores_tables_moved_aside_and_clears_old_staging(tmp_path: Path) -> None:
    target = tmp_path / "pricing"
    aside = tmp_path / ".pricing.old-abc"
    aside.mkdir()
    (aside / "tables.toml").write_text("x")
    young = tmp_path / ".pricing.tmp-young"
    old = tmp_path / ".pricing.tmp-old"
    young.mkdir()
    old.mkdir()
    hours_ago = time.time() - 2 * cache.STALE_STAGING_S
    os.utime(old, (hours_ago, hours_ago))
    cache.tidy(target)
    assert (target / "tables.toml").read_text() == "x"
    assert not aside.exists()
    assert not old.exists()
    assert young.exists()  # may belong to a refresh running right now


def test_check_target_refuses_foreign_folders(tmp_path: Path) -> None:
    cache.check_target(tmp_path / "new")
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="not a folder"):
        cache.check_target(tmp_path / "file")
    tables = tmp_path / "tables"
    shutil.copytree(bundled_tables_dir(), tables)
    with pytest.raises(InputError, match=r"README\.md"):
        cache.check_target(tables)
    (tables / "README.md").unlink()
    cache.check_target(tables)  # an earlier release's layout: the next refresh replaces it
    cache.publish(tables, {"tables.toml": b"x"})
    cache.check_target(tables)  # what a refresh writes
    (tables / "versions" / "notes.txt").write_text("mine")  # inside versions/: ours to manage
    cache.check_target(tables)
    (tables / "current-backup").symlink_to("versions")
    with pytest.raises(InputError, match="current-backup"):
        cache.check_target(tables)


def test_load_tables_prefers_the_fresher(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    assert load_tables(cache_dir=cache_dir).origin == "bundled"
    shutil.copytree(bundled_tables_dir(), cache_dir)
    assert load_tables(cache_dir=cache_dir).origin == "cache"  # a tie goes to the cache
    index = cache_dir / "tables.toml"
    index.write_text(index.read_text().replace('as_of = "2026-11-30"', 'as_of = "2026-01-01"'))
    assert load_tables(cache_dir=cache_dir).origin == "bundled"
    assert load_tables(pricing_dir=cache_dir, cache_dir=cache_dir).origin == "directory"


def write_refreshed_cache(cache_dir: Path, refreshed_on: date, oldest: date) -> None:
    """A cache as a partial refresh leaves it: one region fresh, the rest as old as ``oldest``."""
    merged = merge_tables(CATALOG, [], NOW)
    meta = tuple(
        TableMeta(
            m.name,
            m.file,
            oldest,
            m.source,
            datetime(refreshed_on.year, refreshed_on.month, refreshed_on.day, 8, tzinfo=UTC),
            {
                ("aws", "us-east-1"): TablePart(refreshed_on, "AWS API"),
                ("aws", "us-west-2"): TablePart(oldest, "kept"),
            },
        )
        if m.name in ("gpu_instances", "cpu_instances")
        else m
        for m in merged.meta
    )
    cache.write_tables(cache_dir, MergedTables(merged.instances, meta, merged.stats), CATALOG, NOW)


def test_a_newer_bundled_release_does_not_replace_a_partial_refresh(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    bundled = CATALOG.as_of  # 2026-11-30
    # Refreshed (one region) after the bundled tables were made; other regions older.
    write_refreshed_cache(cache_dir, bundled + timedelta(days=3), bundled - timedelta(days=60))
    catalog = load_tables(cache_dir=cache_dir)
    assert catalog.origin == "cache"  # the oldest cache date is older, but not all of it
    assert catalog.tables["gpu_instances"].part("aws", "us-east-1").as_of == date(2026, 12, 3)
    # Refreshed before the bundled tables were made: everything bundled is newer.
    write_refreshed_cache(cache_dir, bundled - timedelta(days=1), bundled - timedelta(days=60))
    assert load_tables(cache_dir=cache_dir).origin == "bundled"


def test_a_broken_cache_says_how_to_recover(tmp_path: Path) -> None:
    shutil.copytree(bundled_tables_dir(), tmp_path / "cache")
    (tmp_path / "cache" / "gpu_instances.csv").write_text("provider,region\naws,x,y\n")
    with pytest.raises(CostguardError) as info:
        load_tables(cache_dir=tmp_path / "cache")
    assert "cannot be used" in info.value.message
    assert "costguard pricing refresh" in (info.value.hint or "")


def test_staleness_uses_the_part_of_each_place() -> None:
    part = TablePart(date(2026, 12, 1), "API")
    gpu = CATALOG.tables["gpu_instances"]._replace(parts={("aws", "us-east-1"): part})
    catalog = replace(CATALOG, tables={**CATALOG.tables, "gpu_instances": gpu})
    fresh_spot = ("gpu_instances", "aws", "us-east-1", Market.SPOT)
    old_spot = ("gpu_instances", "aws", "us-west-2", Market.SPOT)
    old_ondemand = ("gpu_instances", "aws", "us-west-2", Market.ON_DEMAND)
    assert staleness(catalog, [fresh_spot, old_spot, old_ondemand], date(2026, 12, 6)) is None
    spot = staleness(catalog, [fresh_spot, old_spot, old_ondemand], date(2026, 12, 8))
    assert spot == Staleness(1, 3, date(2026, 11, 30), date(2026, 11, 30), 0, spot_only=True)
    assert staleness(catalog, [fresh_spot, old_ondemand], date(2026, 12, 8)) is None
    month = staleness(catalog, [old_ondemand, old_spot], date(2027, 1, 5))
    assert month == Staleness(2, 2, date(2026, 11, 30), date(2026, 11, 30), 0, spot_only=False)


def test_settings_cache_dir(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path / "none")}
    assert (
        Settings.load(env=env).pricing_cache_dir == Path("~/.cache/costguard/pricing").expanduser()
    )
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    assert Settings.load(env=env).pricing_cache_dir == tmp_path / "xdg" / "costguard" / "pricing"
    env["COSTGUARD_CACHE_DIR"] = str(tmp_path / "mine")
    env["COSTGUARD_STALE_WARNING"] = "off"
    settings = Settings.load(env=env)
    assert settings.pricing_cache_dir == tmp_path / "mine"
    assert settings.stale_warning is False


# --- Readers and writers at once --------------------------------------------------------

HEADERS = {
    name: (bundled_tables_dir() / f"{name}.csv").read_text().splitlines()[0]
    for name in ("storage", "transfer", "regions")
}


def tiny_version(number: int) -> dict[str, bytes]:
    """Small, valid tables whose index and every CSV row say which version they are."""
    tag = f"v{number}"
    row = InstancePrice(
        "aws", "us-east-1", "g5.xlarge", "A10G", 1, Decimal(4), Decimal(16),
        Decimal(number + 1), None, PriceStatus.LISTED, None, tag,
    )  # fmt: skip
    cpu = row._replace(instance_type="m5.large", accelerator=None, accelerator_count=0)
    files = {
        "gpu_instances.csv": cache.render_instances([row]),
        "cpu_instances.csv": cache.render_instances([cpu]),
        **{f"{name}.csv": (header + "\n").encode() for name, header in HEADERS.items()},
    }
    meta = [
        TableMeta(name, f"{name}.csv", date(2099, 1, 1), tag)
        for name in ("gpu_instances", "cpu_instances", "storage", "transfer", "regions")
    ]
    files["tables.toml"] = cache.render_index(meta, NOW).encode()
    return files


def version_of(catalog: Catalog) -> str:
    """The version a catalog was read from; fails when its parts disagree."""
    tags = {info.source for info in catalog.tables.values()}
    tags |= {row.note for row in catalog.instances}
    assert len(tags) == 1, f"a read mixed versions: {sorted(tags)}"
    return tags.pop()


def test_reads_during_publishes_always_see_one_whole_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What readers see is the point here, not durability: skip the (slow) fsyncs.
    monkeypatch.setattr(cache, "_write_synced", Path.write_bytes)
    monkeypatch.setattr(cache, "fsync_dir", lambda path: None)
    target = tmp_path / "pricing"
    cache.publish(target, tiny_version(0))
    publishes = 30
    done = threading.Event()
    errors: list[BaseException] = []
    seen: list[str] = []
    read_one = threading.Condition()

    def read() -> None:
        while not done.is_set():
            try:
                catalog = load_tables(cache_dir=target)
                assert catalog.origin == "cache"
                with read_one:
                    seen.append(version_of(catalog))
                    read_one.notify_all()
            except BaseException as exc:  # every failure counts
                errors.append(exc)

    readers = [threading.Thread(target=read) for _ in range(2)]
    for reader in readers:
        reader.start()
    try:
        for number in range(1, publishes + 1):
            # Each publish waits for a read that finished after the last one, so reads
            # overlap the publishes however busy the machine is (bounded by count).
            with read_one:
                read_since = functools.partial(lambda n: len(seen) > n or bool(errors), len(seen))
                assert read_one.wait_for(read_since, 60)
            cache.publish(target, tiny_version(number))
    finally:
        done.set()
        for reader in readers:
            reader.join()
    assert errors == []
    assert len(seen) >= publishes  # the reads really overlapped the publishes
    assert len(set(seen)) > 1
    assert version_of(load_tables(cache_dir=target)) == f"v{publishes}"


def test_a_read_that_loses_its_version_reads_the_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "pricing"
    cache.publish(target, tiny_version(1))
    real_load = tables_module.load_catalog
    calls: list[Path] = []

    def load_meanwhile(directory: Path | None = None, **kwargs: Any) -> Catalog:
        calls.append(directory)  # type: ignore[arg-type]
        if len(calls) == 1:  # two refreshes land while the first read is under way
            cache.publish(target, tiny_version(2))
            cache.publish(target, tiny_version(3))
            assert directory is not None
            assert not directory.exists()
        return real_load(directory, **kwargs)

    monkeypatch.setattr(tables_module, "load_catalog", load_meanwhile)
    assert version_of(load_tables(cache_dir=target)) == "v3"
    assert len(calls) == 2


def blocked_on(lock: Path) -> int:
    """How many requests for the flock of file ``lock`` the kernel holds waiting (the
    ``->`` lines of /proc/locks)."""
    inode = f":{lock.stat().st_ino} "
    lines = Path("/proc/locks").read_text().splitlines()
    return sum(1 for line in lines if " -> " in line and inode in line)


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="the kernel's lock table: Linux")
def test_refreshes_take_turns(tmp_path: Path) -> None:
    target = tmp_path / "pricing"
    order: list[str] = []
    inside = threading.Event()

    def second() -> None:
        inside.wait()
        with cache.locked(target):
            order.append("second")

    other = threading.Thread(target=second)
    other.start()
    with cache.locked(target):
        inside.set()
        lock = target / cache.LOCK_FILE
        wait_for(lambda: blocked_on(lock), "the second refresh waiting for the lock")
        with cache.locked(target):  # re-entrant in one thread: publish runs under it
            pass
        assert blocked_on(lock) == 1, "the inner block let the lock go"
        order.append("first")
    other.join()
    assert order == ["first", "second"]
