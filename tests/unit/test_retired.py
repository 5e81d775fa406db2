"""Sizes their provider has retired are never priced (issue 48): the bundled tables carry
no row of them, a table written before the retirement loses its rows when loaded, and
`estimate` asked for one by name or by its GPU says when and what replaces it (one
`Error:` and one `Hint:` line, exit 2), as the K80 precedent dropped Azure NC."""

from __future__ import annotations

import csv
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from costguard.pricing.retired import RETIRED, retired_carrying, retired_size
from costguard.pricing.tables import bundled_tables_dir, load_catalog

CATALOG = load_catalog()


def _bundled_rows() -> list[dict[str, str]]:
    with (bundled_tables_dir() / "gpu_instances.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_no_bundled_row_is_of_a_retired_size() -> None:
    # Read from the file, not the loaded catalog (which drops such rows on its own).
    priced = [
        (row["provider"], row["region"], row["instance_type"])
        for row in _bundled_rows()
        if retired_size(row["provider"], row["instance_type"]) is not None
    ]
    assert priced == []


def test_every_retirement_is_past_sourced_and_points_at_a_size_that_is_sold() -> None:
    for series in RETIRED:
        # Retired on or before the day the tables were put together, as a provider says.
        assert series.retired_on <= CATALOG.tables["gpu_instances"].as_of, series
        assert " @ " in series.source, series  # a file at a commit
        assert series.successors, series
        sold = [i for i in CATALOG.instances if i.instance_type == series.example]
        assert sold, series.example
        assert retired_size(series.provider, series.example) is None
        assert all(i.provider == series.provider for i in sold)


def _table_with_retired_rows(tmp_path: Path) -> Path:
    """The bundled tables plus rows of two retired sizes, as a table written before the
    retirement (a refresh cache, a --pricing-dir) has them."""
    folder = tmp_path / "tables"
    shutil.copytree(bundled_tables_dir(), folder)
    rows = _bundled_rows()
    model = next(
        r
        for r in rows
        if (r["region"], r["instance_type"]) == ("eastus", "Standard_NC24ads_A100_v4")
    )
    added = [
        {**model, "instance_type": "Standard_NC6s_v3", "accelerator": "V100", "vcpus": "6"},
        {**model, "instance_type": "standard_nv12s_v3", "accelerator": "M60", "vcpus": "12"},
    ]
    with (folder / "gpu_instances.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows([*rows, *added])
    return folder


def test_a_table_written_before_the_retirement_loses_its_rows(tmp_path: Path) -> None:
    folder = _table_with_retired_rows(tmp_path)
    parsed = tmp_path / "parsed.json"
    first = load_catalog(folder, parsed=parsed)
    again = load_catalog(folder, parsed=parsed)  # from the kept parse
    for catalog in (first, again):
        assert len(catalog.instances) == len(CATALOG.instances)
        assert not [i for i in catalog.instances if retired_size(i.provider, i.instance_type)]


NCV3 = "Azure retired NCv3 (V100) on 2025-09-30"
NVV3 = "Azure retired NVv3 (M60) on 2026-09-30"
NVV4 = "Azure retired NVv4 (Radeon MI25) on 2026-09-30"


@pytest.mark.parametrize(
    ("args", "said", "successor"),
    [
        (("--instance-type", "Standard_NC6s_v3"), NCV3, "NCadsH100_v5"),
        (("--instance-type", "Standard_NV12s_v3", "--provider", "azure"), NVV3, "NVadsA10_v5"),
        (("--instance-type", "standard_nv32as_v4"), NVV4, "NVads_V710_v5"),
        (("--gpu", "m60"), NVV3, "NVadsA10_v5"),
        (("--gpu", "mi25", "--region", "westeurope"), NVV4, "NVadsA10_v5"),
        (("--gpu", "k80"), "Azure retired NC (K80) on 2023-09-06", "NCasT4_v3"),
    ],
)
def test_asked_for_a_retired_size_or_gpu_the_estimate_says_so(
    run_cli: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    args: tuple[str, ...],
    said: str,
    successor: str,
) -> None:
    # Even from tables that still have the rows: the size cannot be bought.
    monkeypatch.setenv("COSTGUARD_PRICING_DIR", str(_table_with_retired_rows(tmp_path)))
    result = run_cli("estimate", *args, "--hours", "8")
    assert result.exit_code == 2, result.stdout
    assert result.stdout == ""
    error, hint = result.stderr.splitlines()
    assert error.startswith("Error: ")
    assert "can no longer be launched: " + said in error
    assert hint.startswith("Hint: ")
    assert successor in hint
    assert "--instance-type Standard_N" in hint


def test_a_gpu_still_sold_elsewhere_is_priced_there_and_its_retired_series_named(
    run_cli: Callable[..., Any],
) -> None:
    answer = run_cli("estimate", "--gpu", "v100", "--hours", "8", "--format", "json").json()
    providers = {o["provider"] for o in answer["options"]}
    assert providers == {"aws", "gcp"}  # Azure's V100 series, NCv3, is retired
    said = [n for n in answer["notes"] if NCV3 in n]
    assert len(said) == 1
    assert "NCadsH100_v5" in said[0]
    aws_only = ("estimate", "--gpu", "v100", "--hours", "8", "--region", "us-east-1")
    notes = run_cli(*aws_only, "--format", "json").json()["notes"]
    assert not [n for n in notes if "retired" in n]  # Azure was not asked about
    result = run_cli("estimate", "--gpu", "v100", "--provider", "azure", "--hours", "8")
    assert result.exit_code == 2
    error, hint = result.stderr.splitlines()
    assert error.endswith(NCV3)
    assert hint.startswith("Hint: it is offered in aws:")


def test_retired_series_are_found_by_gpu_and_provider() -> None:
    assert [s.series for s in retired_carrying("V100", ("azure",))] == ["NCv3"]
    assert retired_carrying("V100", ("aws", "gcp")) == []
    assert retired_size("azure", "Standard_NC40ads_H100_v5") is None
    assert retired_size(None, "STANDARD_NC24R") is not None
