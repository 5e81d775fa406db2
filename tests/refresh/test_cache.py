"""Writing the tables (atomically) and reading them back; choosing cache or bundled."""

from __future__ import annotations

import os
import shutil
import time
import tomllib
from dataclasses import replace
from datetime import UTC, date, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from costguard.errors import CostguardError, InputError
from costguard.pricing.catalog import (
    Market,
    Staleness,
    TablePart,
    bundled_tables_dir,
    load_catalog,
    load_tables,
    staleness,
)
from costguard.pricing.refresh import cache
from costguard.pricing.refresh.merge import MergedTables, TableMeta, merge_tables
from costguard.settings import Settings

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
    loaded = load_catalog(target, origin="cache")
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


def test_publish_replaces_the_folder_in_one_step(tmp_path: Path) -> None:
    target = tmp_path / "pricing"
    cache.publish(target, {"tables.toml": b"one", "a.csv": b"1"})
    cache.publish(target, {"tables.toml": b"two", "b.csv": b"2"})
    assert sorted(p.name for p in target.iterdir()) == ["b.csv", "tables.toml"]
    assert (target / "tables.toml").read_bytes() == b"two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pricing"]


def test_a_crash_before_the_rename_leaves_the_old_folder(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "pricing"
    cache.publish(target, {"tables.toml": b"old"})

    def crash(staging: Path, target: Path) -> None:
        assert (staging / "tables.toml").read_bytes() == b"new"  # fully written, not yet in place
        raise OSError("disk vanished")

    monkeypatch.setattr(cache, "_swap_into_place", crash)
    with pytest.raises(OSError, match="disk vanished"):
        cache.publish(target, {"tables.toml": b"new"})
    assert (target / "tables.toml").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pricing"]


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


def test_a_broken_cache_says_how_to_recover(tmp_path: Path) -> None:
    shutil.copytree(bundled_tables_dir(), tmp_path / "cache")
    (tmp_path / "cache" / "gpu_instances.csv").write_text("provider,region\naws,x,y\n")
    with pytest.raises(CostguardError) as info:
        load_tables(cache_dir=tmp_path / "cache")
    assert "cannot be used" in info.value.message
    assert "costguard pricing refresh" in (info.value.hint or "")


def test_staleness_uses_the_part_of_each_place() -> None:
    part = TablePart(date(2026, 12, 1), "API")
    gpu = replace(CATALOG.tables["gpu_instances"], parts={("aws", "us-east-1"): part})
    catalog = replace(CATALOG, tables={**CATALOG.tables, "gpu_instances": gpu})
    fresh_spot = ("gpu_instances", "aws", "us-east-1", Market.SPOT)
    old_spot = ("gpu_instances", "aws", "us-west-2", Market.SPOT)
    old_ondemand = ("gpu_instances", "aws", "us-west-2", Market.ON_DEMAND)
    assert staleness(catalog, [fresh_spot, old_spot, old_ondemand], date(2026, 12, 6)) is None
    spot = staleness(catalog, [fresh_spot, old_spot, old_ondemand], date(2026, 12, 8))
    assert spot == Staleness(date(2026, 11, 30), 8, spot_only=True)
    assert staleness(catalog, [fresh_spot, old_ondemand], date(2026, 12, 8)) is None
    month = staleness(catalog, [old_ondemand, old_spot], date(2027, 1, 5))
    assert month == Staleness(date(2026, 11, 30), 36, spot_only=False)


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
