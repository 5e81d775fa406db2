"""One as-of date per price: `estimate`, `launch` (its estimate before the confirmation)
and `pricing gpus` date what they show by the table part (provider and region) each
price was read from, the oldest of those shown, in one format ("as of YYYY-MM-DD"). The
bundled tables mix parts of several dates, so a command that dated its prices by the
table's own date would disagree with the others about the same row."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from costguard.pricing.catalog import (
    Market,
    Place,
    as_of_text,
    prices_as_of,
    rows_as_of,
    table_rows,
)
from costguard.pricing.tables import load_catalog

CATALOG = load_catalog()
AS_OF = re.compile(r"as of (\d{4}-\d{2}-\d{2}|unknown)")


def dates(text: str) -> set[str]:
    return set(AS_OF.findall(text))


def text_date(places: list[Place]) -> str:
    """The date the CLI shows for prices at ``places``: the oldest of their own dates."""
    return as_of_text(prices_as_of(CATALOG, places))


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
    fallback = re.search(r"on-demand (\S+) in (\w+):(\S+) at", launch.stderr)
    kind, market, provider, region = picked.group(1, 2, 3, 4)
    places: list[Place] = [("gpu_instances", provider, region, Market(market), kind)]
    if fallback:
        fell, cloud, where = fallback.group(1, 2, 3)
        places.append(("gpu_instances", cloud, where, Market.ON_DEMAND, fell))
    assert dates(launch.stderr) == {text_date(places)}
    estimate = run_cli("estimate", "--gpu", gpu, "--hours", "1", "--provider", provider,
                       "--region", region, "--no-stale-warning")  # fmt: skip
    assert estimate.exit_code == 0, estimate.stderr
    document = run_cli("estimate", "--gpu", gpu, "--hours", "1", "--provider", provider,
                       "--region", region, "--format", "json").json()  # fmt: skip
    # The table is titled by the date most prices shown carry, and marks the others.
    own = {o["price_as_of"] for o in document["options"]}
    assert dates(estimate.stdout) <= own
    assert ("priced as of another date than the title's" in estimate.stdout) == (len(own) > 1)
    shown = [("gpu_instances", o["provider"], o["region"], Market(o["market"]),
              o["instance_type"]) for o in document["options"]]  # fmt: skip
    assert document["pricing_as_of"] == text_date(shown)


@pytest.mark.parametrize("providers", [(), ("aws",), ("gcp",), ("azure",)], ids=str)
def test_pricing_gpus_is_dated_by_the_rows_it_lists(
    run_cli: Callable[..., Any], providers: tuple[str, ...]
) -> None:
    listed = [
        i for i in CATALOG.instances if i.accelerator and (not providers or i.provider in providers)
    ]
    expected = text_date(
        [
            ("gpu_instances", i.provider, i.region, Market.ON_DEMAND, i.instance_type)
            for i in listed
            if i.ondemand_usd_per_hour is not None
        ]
    )
    rows = [
        r
        for r in table_rows(CATALOG, "gpu_instances")
        if not providers or r["provider"] in providers
    ]
    shown = as_of_text(rows_as_of(CATALOG, "gpu_instances", rows))
    flags = [word for p in providers for word in ("--provider", p)]
    table = run_cli("pricing", "gpus", *flags)
    assert table.exit_code == 0, table.stderr
    assert dates(table.stdout) == {expected}
    assert run_cli("pricing", "gpus", *flags, "--format", "json").json()["as_of"] == str(expected)
    show = run_cli("pricing", "show", "gpu_instances", *flags)
    assert dates(show.stdout) == {shown}
