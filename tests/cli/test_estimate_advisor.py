"""`costguard estimate --interruptions-per-day advisor`: each AWS spot row's preemptions
from the AWS Spot Instance Advisor's band (pricing/interruptions.csv)."""

from __future__ import annotations

import math
import shutil
from decimal import Decimal
from pathlib import Path

import pytest

from costguard.money import usd_str
from costguard.pricing import interruptions as preemption
from costguard.pricing.question import Question, answer
from costguard.pricing.tables import bundled_tables_dir, load_catalog
from tests.helpers.output import WIDTHS, assert_fits

# g4dn.xlarge in us-east-1 is in the 15-20% band (tests/refresh/recorded/, spotinfo @ 5eedf20a)
T4 = ("estimate", "--gpu", "t4", "--hours", "10", "--spot")
PLACES = ("--region", "us-east-1", "--region", "us-central1", "--region", "eastus")
ADVISOR = ("--interruptions-per-day", "advisor")


def test_json_aws_rows_get_their_band_rate_and_the_models_figures(run_cli) -> None:
    result = run_cli(*T4, *PLACES, *ADVISOR, "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert doc["query"]["interruptions"]["preemptions_per_day"] == "advisor"
    assert doc["interruptions"]["advisor_as_of"] == "2025-06-28"
    assert "alexei-led/spotinfo" in doc["interruptions"]["advisor_source"]
    by_provider = {o["provider"]: o for o in doc["options"] if o["market"] == "spot"}
    aws = by_provider["aws"]
    assert aws["instance_type"] == "g4dn.xlarge"
    assert aws["interruption_band"] == "15-20%"
    assert aws["interruption_band_lower_bound"] is False
    rate = Decimal(aws["preemptions_per_day"])
    assert rate == Decimal("0.006412")
    assert float(rate) == pytest.approx(-math.log(1 - 0.175) / 30, abs=1e-6)
    model = preemption.expected(
        Decimal(10), preemption.Checkpointing(Decimal(30), Decimal(60), Decimal(5), rate)
    )
    # JSON writes Decimals as usd_str does
    assert aws["expected_preemptions"] == usd_str(model.expected_preemptions)
    assert aws["expected_preemptions"] == "0.002761"
    assert aws["effective_hours"] == usd_str(model.effective_hours)
    question = Question(hours=Decimal(10), gpus=("t4",), regions=("us-east-1",), spot=True)
    (option,) = answer(question, load_catalog())[0].options
    assert aws["effective_total_usd"] == usd_str(preemption.effective_total_usd(option, model))
    for cloud in ("gcp", "azure"):
        row = by_provider[cloud]
        assert row["preemptions_per_day"] is None
        assert row["interruption_band"] is None
        assert "publishes no interruption frequency" in row["no_preemption_figure"]
        assert "effective_total_usd" not in row
    said = " ".join(doc["assumptions"])
    assert "-ln(1 - p) / 30" in said
    assert "as of 2025-06-28" in said
    assert "aws us-east-1 g4dn.xlarge: band 15-20% -> 0.006412 preemptions a day" in said


def test_over_20_percent_is_read_as_20_and_said_to_be_a_lower_bound(run_cli) -> None:
    args = ("estimate", "--instance-type", "g5.xlarge", "--region", "us-east-1", "--hours", "10")
    doc = run_cli(*args, *ADVISOR, "--format", "json").json()
    (spot,) = [o for o in doc["options"] if o["market"] == "spot"]
    assert spot["interruption_band"] == ">20%"
    assert spot["interruption_band_lower_bound"] is True
    assert Decimal(spot["preemptions_per_day"]) == Decimal("0.007438")  # -ln(0.8)/30
    assert any(">20% -> 0.007438 preemptions a day, a lower bound" in a for a in doc["assumptions"])


@pytest.mark.parametrize("width", WIDTHS)
def test_table_says_why_a_row_has_no_figure_and_fits(run_cli, terminal, width: int) -> None:
    terminal(width)
    result = run_cli(*T4, *PLACES, *ADVISOR)
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "n/a" in out
    assert "Azure publishes no interruption frequency" in " ".join(out.split())
    assert "GCP publishes no interruption frequency" in " ".join(out.split())
    assert_fits(out, width, ["g4dn.xlarge", "$2.18", "15-20%"])


def test_csv_states_the_bands(run_cli) -> None:
    result = run_cli(*T4, *PLACES, *ADVISOR, "--format", "csv")
    assert result.exit_code == 0, result.stderr
    assert "band 15-20% -> 0.006412 preemptions a day" in result.stderr


@pytest.mark.parametrize("word", ["advice", "aws", "often"])
def test_a_bad_word_exits_2_with_error_and_hint(run_cli, word: str) -> None:
    result = run_cli(*T4, "--interruptions-per-day", word)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("Error: ")
    assert lines[-1].startswith("Hint: ")
    assert "nor the word advisor" in result.stderr


def test_only_the_advisor_reads_the_table(run_cli, tmp_path: Path, monkeypatch) -> None:
    tables = tmp_path / "pricing"
    shutil.copytree(bundled_tables_dir(), tables)
    (tables / "interruptions.csv").write_text("provider,region\naws,us-east-1\n")
    monkeypatch.setenv("COSTGUARD_PRICING_DIR", str(tables))
    plain = run_cli(*T4, "--interruptions-per-day", "1")
    assert plain.exit_code == 0, plain.stderr
    advised = run_cli(*T4, *ADVISOR)
    assert advised.exit_code != 0
    assert "interruptions.csv" in advised.stderr
