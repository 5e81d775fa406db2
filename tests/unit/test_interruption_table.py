"""The bundled spot interruption table (pricing/interruptions.csv) and how a band reads
as a rate."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from costguard.errors import CostguardError
from costguard.pricing.advisor import parse_band, rate_per_day, rows_from_advisor
from costguard.pricing.tables import bundled_tables_dir, load_interruptions

RECORDED = Path(__file__).parents[1] / "refresh" / "recorded"
EXCERPT = RECORDED / "aws-spot-advisor-excerpt-2025-06.json"


def aws_gpu_types() -> set[str]:
    with (bundled_tables_dir() / "gpu_instances.csv").open(encoding="utf-8") as handle:
        return {r["instance_type"] for r in csv.DictReader(handle) if r["provider"] == "aws"}


def test_bundled_rows_each_name_an_aws_gpu_type_and_are_dated() -> None:
    info, rows = load_interruptions(bundled_tables_dir())
    assert info.as_of.isoformat() == "2025-06-28"
    assert "alexei-led/spotinfo" in info.source
    assert "5eedf20a" in info.source
    types = aws_gpu_types()
    assert len(rows) > 500
    assert {r.provider for r in rows} == {"aws"}
    assert all(r.instance_type in types for r in rows)
    assert len({(r.region, r.instance_type) for r in rows}) == len(rows)
    # the recorded excerpt's figures are the bundled ones
    by_place = {(r.region, r.instance_type): r for r in rows}
    assert by_place["us-east-1", "g5.xlarge"].band.label == ">20%"
    assert by_place["us-east-1", "p4d.24xlarge"].band.label == "10-15%"
    assert by_place["eu-west-1", "g5.xlarge"].savings_pct == 56


def test_a_band_reads_as_a_constant_hazard_over_30_days() -> None:
    for label, share in (("<5%", 0.025), ("5-10%", 0.075), ("15-20%", 0.175), (">20%", 0.20)):
        band = parse_band(label)
        expected = -math.log(1 - share) / 30
        assert float(rate_per_day(band)) == pytest.approx(expected, abs=1e-6)
    assert parse_band(">20%").lower_bound
    assert not parse_band("10-15%").lower_bound


def test_rows_from_the_recorded_file_keep_only_gpu_types() -> None:
    data = json.loads(EXCERPT.read_text(encoding="utf-8"))
    rows = rows_from_advisor(data, aws_gpu_types())
    assert [(r.region, r.instance_type, r.band.label) for r in rows] == [
        ("eu-west-1", "g4dn.xlarge", "5-10%"),
        ("eu-west-1", "g5.xlarge", "10-15%"),
        ("us-east-1", "g4dn.xlarge", "15-20%"),
        ("us-east-1", "g5.xlarge", ">20%"),
        ("us-east-1", "p4d.24xlarge", "10-15%"),
    ]


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"spot_advisor": {}},
        {"ranges": [{"index": 0, "label": "often"}], "spot_advisor": {"x": {}}},
        {"ranges": [{"index": 0, "label": "<5%"}], "spot_advisor": {"us-east-1": []}},
        {
            "ranges": [{"index": 0, "label": "<5%"}],
            "spot_advisor": {"us-east-1": {"Linux": {"g5.xlarge": {"s": 50, "r": 7}}}},
        },
        {
            "ranges": [{"index": 0, "label": "<5%"}],
            "spot_advisor": {"us-east-1": {"Linux": {"m5.large": {"s": 50, "r": 0}}}},
        },
    ],
)
def test_a_file_of_another_shape_is_refused(data: object) -> None:
    with pytest.raises(CostguardError, match="not the Spot Instance Advisor's data"):
        rows_from_advisor(data, aws_gpu_types())


def test_pricing_show_dates_and_sources_the_table(run_cli) -> None:
    result = run_cli("pricing", "show", "--format", "json")
    assert result.exit_code == 0, result.stderr
    (entry,) = [t for t in result.json()["tables"] if t["table"] == "interruptions"]
    assert entry["as_of"] == "2025-06-28"
    assert entry["rows"] > 500
    assert "Spot Instance Advisor" in entry["source"]
