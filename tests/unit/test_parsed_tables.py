"""The parsed-tables cache (pricing/parsed.py): a hit gives the very values a parse gives,
a changed table is parsed again, and what the cache file holds is checked as it is read
(a price that no table would pass never reaches an estimate)."""

from __future__ import annotations

import json
import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from costguard.pricing import parsed
from costguard.pricing.catalog import Catalog
from costguard.pricing.tables import bundled_tables_dir, load_catalog, load_tables
from costguard.settings import Settings


def _same(one: Catalog, other: Catalog) -> None:
    assert one.instances == other.instances
    assert one.storage == other.storage
    assert one.transfer == other.transfer
    assert one.regions == other.regions
    assert one.tables == other.tables
    assert (one.directory, one.origin) == (other.directory, other.origin)


@pytest.fixture
def tables(tmp_path: Path) -> Path:
    """A folder of tables (a copy of the bundled ones) and a refresh cache beside it."""
    folder = tmp_path / "tables"
    shutil.copytree(bundled_tables_dir(), folder, ignore=shutil.ignore_patterns("*.md"))
    return folder


def _load(tables: Path) -> Catalog:
    cache = tables.parent / "cache"
    return load_tables(tables, cache / "pricing", parsed=cache / "pricing.parsed")


def _entry(tables: Path) -> Any:
    return json.loads((tables.parent / "cache" / "pricing.parsed").read_bytes())


def _values(entry: Any, column: int) -> list[Any]:
    """Every row's value of one instance column, as the entry keeps it."""
    distinct, indices = entry["instances"][column]
    return [distinct[index] for index in indices]


def _rewrite(tables: Path, entry: Any) -> None:
    (tables.parent / "cache" / "pricing.parsed").write_text(json.dumps(entry))


def test_a_hit_gives_what_a_parse_gives(tables: Path) -> None:
    first = _load(tables)
    assert (tables.parent / "cache" / "pricing.parsed").is_file()
    second = _load(tables)
    _same(second, first)
    _same(second, load_catalog(tables, origin="directory"))
    _rewrite(tables, _entry(tables))  # as the tests below write it, but unchanged: a hit
    assert parsed.read(tables.parent / "cache" / "pricing.parsed", tables) is not None


def test_the_bundled_tables_are_kept_where_the_settings_say(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path / "pricing")
    first = load_tables(cache_dir=settings.pricing_cache_dir, parsed=settings.parsed_tables)
    assert parsed.read(tmp_path / "pricing.parsed", bundled_tables_dir()) is not None
    _same(load_tables(cache_dir=tmp_path / "pricing", parsed=settings.parsed_tables), first)


def test_a_refresh_reads_its_tables_without_writing_beside_them(tmp_path: Path) -> None:
    from costguard.pricing.refresh.runner import current_tables

    current_tables(tmp_path / "out")
    assert [p.name for p in tmp_path.iterdir() if p.name != "out"] == []


def test_a_changed_table_is_parsed_again_even_at_the_same_size(tables: Path) -> None:
    before = _load(tables).row("aws", "us-east-1", "g5.xlarge")
    assert before is not None
    assert before.ondemand_usd_per_hour is not None
    path = tables / "gpu_instances.csv"
    lines = path.read_text().splitlines(keepends=True)
    at = next(n for n, line in enumerate(lines) if line.startswith("aws,us-east-1,g5.xlarge,"))
    fields = lines[at].split(",")
    price = fields[7]  # ondemand_usd_per_hour, a digit changed: the same size
    fields[7] = price[:-1] + ("1" if price[-1] != "1" else "2")
    lines[at] = ",".join(fields)
    path.write_text("".join(lines))
    after = _load(tables).row("aws", "us-east-1", "g5.xlarge")
    assert after is not None
    assert after.ondemand_usd_per_hour == Decimal(fields[7]) != before.ondemand_usd_per_hour


@pytest.mark.parametrize(
    ("column", "value"),
    [
        (7, "-1.00"),  # a negative on-demand price
        (8, "NaN"),  # a spot price that is no number
        (8, "1e9999"),  # far above on-demand
        (9, "trusted"),  # a status costguard does not know
        (0, "oracle"),  # a provider costguard does not know
        (4, -2),  # a negative GPU count
        (12, "2026-01-01"),  # a date that is not a day's ordinal
    ],
)
def test_a_cache_file_with_a_value_no_table_would_pass_is_not_used(
    tables: Path, column: int, value: Any
) -> None:
    truth = _load(tables)
    entry = _entry(tables)
    ondemand, spot = _values(entry, 7), _values(entry, 8)
    row = next(n for n, prices in enumerate(zip(ondemand, spot, strict=True)) if all(prices))
    distinct, indices = entry["instances"][column]
    distinct[indices[row]] = value
    _rewrite(tables, entry)
    assert parsed.read(tables.parent / "cache" / "pricing.parsed", tables) is None
    _same(_load(tables), truth)  # parsed again from the tables, and the entry rewritten
    assert _values(_entry(tables), column)[row] != value


@pytest.mark.parametrize(
    "damage",
    [
        lambda entry: entry.update(instances=entry["instances"][:-1]),  # a column short
        lambda entry: entry["instances"][2][1].pop(),  # a row short in one column
        lambda entry: entry["instances"][2][1].__setitem__(0, 10**6),  # no such value
        lambda entry: entry["instances"][2][1].__setitem__(0, -1),  # counted from the end
        lambda entry: entry["storage"][6][0].append(None),  # no price where one is needed
        lambda entry: entry["tables"][0].__setitem__(1, "../elsewhere.csv"),
        lambda entry: entry["files"][0].__setitem__(0, "/dev/zero"),
        lambda entry: entry.update(magic="something else"),
        lambda entry: entry.update(directory="/another/folder"),
    ],
)
def test_a_cache_file_of_another_shape_or_folder_is_not_used(tables: Path, damage: Any) -> None:
    truth = _load(tables)
    entry = _entry(tables)
    damage(entry)
    _rewrite(tables, entry)
    assert parsed.read(tables.parent / "cache" / "pricing.parsed", tables) is None
    _same(_load(tables), truth)


@pytest.mark.parametrize("content", [b"", b"{", b"[" * 100_000, b"\xff\xfe", b"null"])
def test_a_cache_file_that_is_not_json_of_ours_is_not_used(tables: Path, content: bytes) -> None:
    truth = _load(tables)
    (tables.parent / "cache" / "pricing.parsed").write_bytes(content)
    _same(_load(tables), truth)


def test_a_cache_that_cannot_be_written_changes_nothing(tables: Path) -> None:
    blocked = tables.parent / "cache"
    blocked.write_text("a file where the cache's folder would be")
    _same(_load(tables), load_catalog(tables, origin="directory"))
    assert blocked.read_text() == "a file where the cache's folder would be"
