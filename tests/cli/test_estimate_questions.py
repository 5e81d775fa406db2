"""The questions a new user asks of `costguard estimate`: several GPUs, a continent, a
budget, which is cheapest, why spot is a bigger instance, and flags that do not fit."""

from __future__ import annotations

import re
from decimal import Decimal

from costguard.pricing.catalog import Market
from costguard.pricing.tables import load_catalog

CATALOG = load_catalog()
EUROPE = {r.name for r in CATALOG.regions if r.continent == "europe"}


def options(run_cli, *args: str) -> list[dict]:
    result = run_cli("estimate", *args, "--format", "json", "--top", "0")
    assert result.exit_code == 0, result.stderr
    return result.json()["options"]


def test_several_gpus_in_one_question(run_cli) -> None:
    comma = options(run_cli, "--gpu", "l4,t4", "--hours", "10")
    repeated = options(run_cli, "--gpu", "l4", "--gpu", "t4", "--hours", "10")
    assert {o["accelerator"] for o in comma} == {"L4", "T4"}
    assert {o["accelerator"] for o in repeated} == {"L4", "T4"}
    totals = [Decimal(o["total_usd"]) for o in comma]
    assert totals == sorted(totals)  # one list, cheapest first
    table = run_cli("estimate", "--gpu", "l4,t4", "--hours", "10")
    assert table.exit_code == 0, table.stderr
    assert "L4 x 1 per instance" in table.stdout
    assert "T4 x 1 per instance" in table.stdout
    assert table.stdout.count("Assumptions:") == 1


def test_a_continent_stands_for_its_regions(run_cli) -> None:
    found = options(run_cli, "--gpu", "t4", "--hours", "1", "--region", "europe")
    assert found
    assert {o["region"] for o in found} <= EUROPE
    assert {o["provider"] for o in found} >= {"aws", "gcp"}
    us = options(run_cli, "--gpu", "t4", "--hours", "1", "--region", "us", "--provider", "gcp")
    assert {o["provider"] for o in us} == {"gcp"}
    assert all(CATALOG.find_region(o["region"]).continent == "north-america" for o in us)


def test_a_budget_gets_a_verdict_and_hours_per_option(run_cli) -> None:
    args = ("--gpu", "a10g", "--hours", "10", "--region", "us-east-1", "--budget", "8")
    found = options(run_cli, *args)
    by_market = {o["market"]: o for o in found}
    spot, steady = by_market["spot"], by_market["on-demand"]
    assert spot["within_budget"] is True
    assert steady["within_budget"] is False  # g5.xlarge: $10.06 of compute alone
    # $8 buys 7.8 h of on-demand g5.xlarge + its 100 GB disk.
    per_hour = (Decimal(steady["compute_usd"]) + Decimal(steady["block_storage_usd"])) / 10
    assert Decimal(steady["hours_within_budget"]) == (Decimal(8) / per_hour).quantize(
        Decimal("0.1"), rounding="ROUND_FLOOR"
    )
    table = run_cli("estimate", *args)
    assert table.exit_code == 0, table.stderr  # the cheapest fits
    assert "Budget $8.00:" in table.stdout
    assert "fits: aws us-east-1" in table.stdout
    assert "over: aws us-east-1 g5.xlarge (A10G) on-demand" in table.stdout
    assert "buys 7.8 h" in table.stdout


def test_the_cheapest_line_and_the_bigger_spot_instance(run_cli) -> None:
    result = run_cli("estimate", "--gpu", "a10g", "--hours", "8", "--region", "us-west-2")
    assert result.exit_code == 0, result.stderr
    assert "Cheapest: aws us-west-2" in result.stdout
    assert "the spot pick g5.2xlarge (8 vCPUs) is bigger than the on-demand g5.xlarge" in (
        " ".join(result.stdout.split())
    )


def test_flags_that_disagree_and_names_that_are_close(run_cli) -> None:
    clash = run_cli("estimate", "--gpu", "a10g", "--instance-type", "p5.48xlarge", "--hours", "1")
    assert clash.exit_code == 2
    assert "disagree: p5.48xlarge carries 8 x H100" in clash.stderr
    typo = run_cli("estimate", "--instance-type", "g5.xlarg", "--hours", "1")
    assert typo.exit_code == 2
    assert "did you mean g5.xlarge" in typo.stderr
    hours = run_cli("estimate", "--gpu", "a10g", "--hours", "1e9")
    assert hours.exit_code == 2
    assert "87840 hours" in hours.stderr
    where = run_cli(
        "estimate",
        "--gpu",
        "h100",
        "--gpus-per-instance",
        "3",
        "--hours",
        "1",
        "--region",
        "us-east-1",
    )
    assert where.exit_code == 2
    assert "3 x H100 per instance in us-east-1" in where.stderr


def test_on_demand_only_drops_the_spot_assumption(run_cli) -> None:
    result = run_cli("estimate", "--gpu", "a10g", "--hours", "1", "--on-demand")
    assert result.exit_code == 0, result.stderr
    assert "Spot prices move" not in result.stdout
    assert "Egress: data sent out to the internet" in result.stdout
    both = run_cli("estimate", "--gpu", "a10g", "--hours", "1")
    assert "Spot prices move" in both.stdout
    assert Market.SPOT  # both markets by default


def test_the_bigger_spot_note_is_said_once_for_the_places_shown(run_cli) -> None:
    """Issue 49 item 5: the quickstart repeated the note four times, once for eu-central-1,
    a region its table did not show."""
    result = run_cli("estimate", "--gpu", "a10g", "--hours", "8", "--count", "4")
    assert result.exit_code == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert text.count("spot prices are set per size by spare capacity") == 1
    table = result.stdout.split("Assumptions:", 1)[0]
    shown = {line.split()[1] for line in table.splitlines() if line.startswith("aws ")}
    note = text.split("Answers:", 1)[1].split("spot prices are set per size", 1)[0]
    named = set(re.findall(r"\b[a-z]{2}-[a-z]+-\d\b", note))
    assert named, note
    assert named <= shown, named - shown
    everywhere = run_cli("estimate", "--gpu", "a10g", "--hours", "8", "--count", "4", "--top", "0")
    assert "eu-central-1" in everywhere.stdout.split("Answers:", 1)[1]


def test_a_gpu_one_letter_short_of_another_names_it_with_the_command(run_cli) -> None:
    """Issue 49 item 4: `--gpu a10` priced Azure's A10 only (from $3.20/h), never saying
    that AWS's A10G, which most people typing `a10` mean, is another GPU."""
    result = run_cli("estimate", "--gpu", "a10", "--hours", "8", "--count", "2")
    assert result.exit_code == 0, result.stderr
    text = " ".join(result.stdout.split())
    (command,) = re.findall(r"`(costguard estimate --gpu a10g [^`]*)`", text)
    assert command == "costguard estimate --gpu a10g --hours 8 --count 2"
    assert "A10G (aws) is another GPU" in text
    named = run_cli(*command.split()[1:], "--format", "json").json()
    assert {o["accelerator"] for o in named["options"]} == {"A10G"}
    document = run_cli("estimate", "--gpu", "a10", "--hours", "8", "--format", "json").json()
    assert any("A10G" in note for note in document["notes"])
    # Not where the provider was chosen, nor where the shorter name's GPU is everywhere
    azure = run_cli("estimate", "--gpu", "a10", "--hours", "8", "--provider", "azure")
    assert "A10G" not in azure.stdout
    t4 = run_cli("estimate", "--gpu", "t4", "--hours", "8")
    assert "T4g" not in t4.stdout
