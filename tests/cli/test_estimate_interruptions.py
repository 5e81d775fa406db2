"""`costguard estimate --interruptions-per-day`: spot with its preemptions priced in."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest

from costguard.money import format_usd
from tests.helpers.output import WIDTHS, assert_fits

T4 = ("estimate", "--gpu", "t4", "--hours", "10")
RATE = ("--interruptions-per-day", "2")


def test_without_the_flags_nothing_changes(run_cli) -> None:
    table = run_cli(*T4)
    assert table.exit_code == 0, table.stderr
    assert "Preempt." not in table.stdout
    assert "Preemptions:" not in table.stdout
    doc = run_cli(*T4, "--format", "json").json()
    assert "interruptions" not in doc
    assert "interruptions" not in doc["query"]
    assert all("effective_total_usd" not in o for o in doc["options"])


def test_table_shows_preemptions_effective_cost_and_the_interval(run_cli) -> None:
    result = run_cli(*T4, *RATE)
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "Preempt." in out
    assert "Effective" in out
    assert "Preemptions:" in out
    # Young/Daly: sqrt(2 x 60 s x 12 h) = 0.632 h = 38 min
    assert "Checkpoint every 38 min" in out
    assert "--every-minutes 30 is assumed" in out
    assert "2 preemptions a day (Poisson)" in out  # stated in the assumptions


def test_json_spot_options_carry_expected_preemptions_and_effective_cost(run_cli) -> None:
    result = run_cli(
        *T4, *RATE, "--every-minutes", "20", "--save-seconds", "30", "--format", "json"
    )
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert doc["query"]["interruptions"] == {
        "preemptions_per_day": "2",
        "every_minutes": "20",
        "save_seconds": "30",
        "restart_minutes": "5",
    }
    summary = doc["interruptions"]
    # 30 s saves every 20 min: 10 h of work run 10.25 h plus lost work, about 2/day
    per_hour = Decimal(2) / 24
    expected = Decimal(summary["expected_preemptions"])
    assert expected > per_hour * Decimal("10.25")
    assert expected < per_hour * 11
    low, high = (Decimal(h) for h in summary["effective_hours_90"])
    assert low <= Decimal(summary["effective_hours"]) <= high
    minutes = Decimal(summary["suggested_every_minutes"])
    assert float(minutes) == pytest.approx(math.sqrt(2 * (30 / 3600) * 12) * 60)
    spot = [o for o in doc["options"] if o["market"] == "spot"]
    assert spot
    for option in spot:
        assert Decimal(option["effective_total_usd"]) > Decimal(option["total_usd"])
        assert option["expected_preemptions"] == summary["expected_preemptions"]
    assert all("effective_total_usd" not in o for o in doc["options"] if o["market"] != "spot")
    assert any("preemptions a day" in a for a in doc["assumptions"])


def test_says_where_on_demand_is_cheaper_for_this_job(run_cli) -> None:
    # a preemption an hour, saves every 2 h, 30 min restarts: spot loses more than it saves
    args = (*T4, "--interruptions-per-day", "24", "--every-minutes", "90")
    harsh = (*args, "--restart-minutes", "30", "--save-seconds", "300")
    doc = run_cli(*harsh, "--format", "json", "--top", "0").json()
    cheaper = doc["interruptions"]["on_demand_cheaper"]
    assert cheaper
    by_place: dict[tuple[str, str], dict[str, dict]] = {}
    for option in doc["options"]:
        by_place.setdefault((option["provider"], option["region"]), {})[option["market"]] = option
    for place in cheaper:
        pair = by_place[(place["provider"], place["region"])]
        on_demand = Decimal(pair["on-demand"]["total_usd"])
        assert on_demand < Decimal(pair["spot"]["effective_total_usd"])
        assert on_demand > Decimal(pair["spot"]["total_usd"])  # spot looked cheaper
    table = run_cli(*harsh)
    assert "On-demand is cheaper than spot for this job in" in table.stdout
    mild = run_cli(*T4, "--interruptions-per-day", "0.1")
    assert "Spot stays cheaper than on-demand wherever both are shown" in mild.stdout


@pytest.mark.parametrize("width", WIDTHS)
def test_the_wider_table_still_fits_the_terminal(run_cli, terminal, width: int) -> None:
    doc = run_cli(*T4, *RATE, "--format", "json").json()
    cells = [format_usd(Decimal(o["total_usd"])) for o in doc["options"]]
    cells += [
        format_usd(Decimal(o["effective_total_usd"]))
        for o in doc["options"][:10]
        if o["market"] == "spot"
    ]
    terminal(width)
    result = run_cli(*T4, *RATE)
    assert result.exit_code == 0, result.stderr
    assert_fits(result.stdout, width, cells)


def test_csv_states_the_assumptions(run_cli) -> None:
    result = run_cli(*T4, *RATE, "--format", "csv")
    assert result.exit_code == 0, result.stderr
    assert "2 preemptions a day" in result.stderr


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (("--interruptions-per-day", "-1"), "--interruptions-per-day"),
        (("--interruptions-per-day", "lots"), "--interruptions-per-day"),
        (("--interruptions-per-day", "49"), "--interruptions-per-day"),
        (("--interruptions-per-day", "nan"), "--interruptions-per-day"),
        ((*RATE, "--every-minutes", "0"), "--every-minutes"),
        ((*RATE, "--save-seconds", "-3"), "--save-seconds"),
        ((*RATE, "--restart-minutes", "x"), "--restart-minutes"),
        (("--every-minutes", "30"), "--interruptions-per-day"),
        (("--restart-minutes", "3"), "--interruptions-per-day"),
        ((*RATE, "--on-demand"), "--on-demand"),
        (("--interruptions-per-day", "48", "--every-minutes", "120"), "loses more work"),
    ],
)
def test_bad_values_exit_2_with_error_and_hint(run_cli, extra, needle) -> None:
    result = run_cli(*T4, *extra)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("Error: ")
    assert lines[-1].startswith("Hint: ")
    assert needle in result.stderr
    assert "Traceback" not in result.stderr
