"""``costguard burn``: what is running now, what it costs per hour, where the month ends."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import click

from costguard.alarms.burn import BurnReport, burn_report, price_instances
from costguard.cli import render
from costguard.cli.params import DecimalRange
from costguard.clouds import READ_TIMEOUT_S
from costguard.errors import CostguardError, InputError
from costguard.money import format_usd
from costguard.pricing.catalog import load_tables
from costguard.settings import Settings

EXIT_OVER_BUDGET = 1


@click.command(
    "burn",
    epilog="""\b
Examples:
  costguard burn --budget 200
  costguard burn --region us-east-1 --region us-west-2 --format json
  costguard burn --budget 200 --webhook https://hooks.example.org/T0/B0   # for cron
\b
In cron every 10 minutes (infra/cron/costguard-burn has the line):
  */10 * * * * costguard burn --budget 200 --format json >> ~/.cache/costguard/burn.log""",
    short_help="Live burn rate of running instances and the month's projection.",
)
@click.option(
    "--budget",
    type=DecimalRange(0, minimum_open=True, maximum=10**9),
    help="Monthly budget in USD (default: the costguard-monthly budget's amount).",
)
@click.option(
    "--provider",
    type=click.Choice(["aws"]),
    default="aws",
    show_default=True,
    help="Which cloud to list (GCP and Azure listing: planned).",
)
@click.option(
    "--region",
    "regions",
    multiple=True,
    help="Region (repeatable). Default: every region in the price tables.",
)
@click.option("--webhook", help="POST a JSON alert to this URL when over budget.")
@click.option(
    "--notify/--no-notify",
    default=True,
    show_default=True,
    help="Alert through the alarm's SNS topic and --webhook when over budget.",
)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
)
@click.pass_obj
def burn_command(
    settings: Settings,
    budget: Decimal | None,
    provider: str,
    regions: Sequence[str],
    webhook: str | None,
    notify: bool,
    output_format: str,
) -> None:
    """List running instances, price them, and project the month.

    Burn rate = the list price of every running instance, per hour. The projection
    assumes they keep running to the end of the month. Exit 1 (and alert) when the
    projection passes the budget. Provider billing lags hours; this is live.
    """
    if webhook and not webhook.startswith(("https://", "http://")):
        msg = f"--webhook must be an http(s) URL, not {webhook!r}"
        raise InputError(msg, hint="e.g. --webhook https://hooks.slack.com/services/...")
    catalog = load_tables(settings.pricing_dir, settings.pricing_cache_dir)
    known = sorted({r.name for r in catalog.regions if r.provider == provider})
    wanted = [catalog.region(provider, r).name for r in regions] or known
    from costguard.alarms import aws as aws_alarms  # the SDK loads only now

    if budget is None:
        budget = next(
            (
                b.amount_usd
                for b in aws_alarms.AwsAlarms().status()
                if b.name == "costguard-monthly"
            ),
            None,
        )
    running = aws_alarms.running_instances(wanted)
    report = burn_report(price_instances(running, catalog), datetime.now(UTC), budget)
    if output_format == "json":
        render.print_json(_document(report, wanted))
    else:
        _print(report, wanted)
    if not report.over_budget:
        return
    message = _alert_text(report)
    if notify:
        if aws_alarms.publish_alert("costguard: projected spend over budget", message):
            click.echo("Alert published to the costguard-budget-alerts topic.", err=True)
        if webhook:
            _post(webhook, _document(report, wanted))
            click.echo(f"Alert posted to {webhook.split('?')[0]}.", err=True)
    raise CostguardError(
        message,
        hint="costguard reap finds idle GPUs; stop what you don't need, or raise the budget",
    )


def _document(report: BurnReport, regions: Sequence[str]) -> dict[str, Any]:
    return {
        "as_of": report.now.isoformat(timespec="seconds"),
        "regions": list(regions),
        "usd_per_hour": report.usd_per_hour,
        "spent_this_month_usd": report.spent_usd,
        "projected_month_usd": report.projected_usd,
        "budget_usd": report.budget_usd,
        "over_budget": report.over_budget,
        "instances": [
            {
                "provider": p.instance.provider,
                "region": p.instance.region,
                "instance_id": p.instance.instance_id,
                "instance_type": p.instance.instance_type,
                "market": str(p.instance.market),
                "launched_at": p.instance.launched_at.isoformat(timespec="seconds"),
                "usd_per_hour": p.usd_per_hour,
                "note": p.note,
            }
            for p in report.instances
        ],
        "assumptions": [
            "list prices from the price tables (no discounts, no taxes)",
            "only the instances listed: disks, storage, transfer and other services are not "
            "included - the provider budget covers the whole bill, hours later",
            "the projection assumes the instances keep running until the month ends (UTC)",
        ],
    }


def _alert_text(report: BurnReport) -> str:
    assert report.budget_usd is not None  # only called when over budget
    return (
        f"projected spend this month is {format_usd(report.projected_usd)}, over the budget "
        f"of {format_usd(report.budget_usd)} (burning {format_usd(report.usd_per_hour)}/h on "
        f"{len(report.instances)} running instance(s))"
    )


def _print(report: BurnReport, regions: Sequence[str]) -> None:
    if report.instances:
        from rich.table import Table  # only the table view needs rich

        table = Table(
            title=f"Running instances - {report.now:%Y-%m-%d %H:%M} UTC", title_justify="left"
        )
        for name in ("Region", "Instance", "Type", "Market", "Since", "$/h"):
            table.add_column(name, justify="right" if name == "$/h" else "left")
        for p in report.instances:
            table.add_row(
                p.instance.region,
                p.instance.instance_id,
                p.instance.instance_type,
                str(p.instance.market),
                f"{p.instance.launched_at:%Y-%m-%d %H:%M}",
                format_usd(p.usd_per_hour, rate=True) if p.usd_per_hour is not None else "?",
            )
        render.console().print(table)
    else:
        click.echo(f"No running instance in {len(regions)} region(s).")
    click.echo(f"Burn rate:            {format_usd(report.usd_per_hour)}/h")
    click.echo(f"Spent this month:     {format_usd(report.spent_usd)} (instances seen)")
    click.echo(f"Projected this month: {format_usd(report.projected_usd)}")
    if report.budget_usd is not None:
        click.echo(
            f"Budget:               {format_usd(report.budget_usd)}"
            + ("  OVER" if report.over_budget else "")
        )
    notes = [p.instance.instance_id + ": " + p.note for p in report.instances if p.note]
    render.print_notes(notes, heading="Notes:")


def _post(url: str, document: dict[str, Any]) -> None:
    # The scheme was checked to be http(s) before any call (S310).
    data = json.dumps(render.to_jsonable(document)).encode()
    request = urllib.request.Request(  # noqa: S310
        url, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=READ_TIMEOUT_S):  # noqa: S310
            pass
    except (urllib.error.URLError, OSError) as exc:
        msg = f"could not post the alert to the webhook: {exc}"
        raise CostguardError(msg, hint="check the --webhook URL") from None
