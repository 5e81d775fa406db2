"""One as-of date per price: `estimate`, `launch` (its estimate before the confirmation)
and `pricing gpus` date what they show by the table part (provider and region) each
price was read from, the oldest of those shown, in one format ("as of YYYY-MM-DD"). The
bundled tables mix parts of several dates, so a command that dated its prices by the
table's own date would disagree with the others about the same row."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from costguard.pricing.catalog import Market, prices_as_of
from costguard.pricing.tables import load_catalog

CATALOG = load_catalog()
AS_OF = re.compile(r"as of (\d{4}-\d{2}-\d{2})")


def dates(text: str) -> set[date]:
    return {date.fromisoformat(found) for found in AS_OF.findall(text)}


def row_date(provider: str, region: str) -> date:
    return prices_as_of(CATALOG, [("gpu_instances", provider, region, Market.SPOT)])


def test_the_bundled_tables_date_their_parts_apart() -> None:
    """The premise: rows of one table with other dates than the table's."""
    table = CATALOG.tables["gpu_instances"]
    assert {part.as_of for part in table.parts.values()} - {table.as_of}


@pytest.mark.parametrize("gpu", ["a10g", "t4", "h100"])
def test_launch_and_estimate_date_the_same_row_alike(
    run_cli: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu: str
) -> None:
    monkeypatch.setenv("COSTGUARD_LOCAL_DIR", str(tmp_path / "local"))
    args = ("--provider", "local", "--gpu", gpu, "--checkpoint", str(tmp_path / "ckpt"))
    launch = run_cli("launch", *args, "--", "python", "train.py")  # no --yes: it stops
    assert "confirmation" in launch.stderr, launch.stderr
    picked = re.search(r"priced as (\S+) (spot|on-demand) in (\w+):(\S+)\)", launch.stderr)
    assert picked, launch.stderr
    fallback = re.search(r"on-demand \S+ in (\w+):(\S+) at", launch.stderr)
    places = [picked.group(3, 4), *([fallback.group(1, 2)] if fallback else [])]
    expected = min(row_date(provider, region) for provider, region in places)
    assert dates(launch.stderr) == {expected}
    provider, region = picked.group(3, 4)
    estimate = run_cli("estimate", "--gpu", gpu, "--hours", "1", "--provider", provider,
                       "--region", region, "--no-stale-warning")  # fmt: skip
    assert estimate.exit_code == 0, estimate.stderr
    assert row_date(provider, region) in dates(estimate.stdout)
    assert dates(estimate.stdout) == {row_date(provider, region)}


@pytest.mark.parametrize("providers", [(), ("aws",), ("gcp",), ("azure",)], ids=str)
def test_pricing_gpus_is_dated_by_the_rows_it_lists(
    run_cli: Callable[..., Any], providers: tuple[str, ...]
) -> None:
    listed = [
        i for i in CATALOG.instances if i.accelerator and (not providers or i.provider in providers)
    ]
    expected = min(row_date(i.provider, i.region) for i in listed)
    flags = [word for p in providers for word in ("--provider", p)]
    table = run_cli("pricing", "gpus", *flags)
    assert table.exit_code == 0, table.stderr
    assert dates(table.stdout) == {expected}
    assert run_cli("pricing", "gpus", *flags, "--format", "json").json()["as_of"] == str(expected)
    show = run_cli("pricing", "show", "gpu_instances", *flags)
    assert dates(show.stdout) == {expected}
