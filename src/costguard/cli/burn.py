"""``costguard burn``: what is running now, what it costs per hour, where the month ends."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from costguard.alarms.burn import BurnReport, burn_report, price_running
from costguard.cli import render
from costguard.cli.fleets import fleet_options, fleets
from costguard.cli.params import StoreUrl, Url, Usd, table_or_json
from costguard.clouds import READ_TIMEOUT_S
from costguard.errors import CostguardError, InputError
from costguard.money import format_usd
from costguard.pricing.tables import load_tables
from costguard.reaper.fleet import PriceBook, across
from costguard.reaper.policy import Instance, tag_values
from costguard.settings import Settings
from costguard.tags import JOB_TAG
from costguard.text import visible

if TYPE_CHECKING:
    from costguard.spot.report import JobBurn

EXIT_OVER_BUDGET = 1


@click.command(
    "burn",
    epilog="""\b
Examples:
  costguard burn --budget 200
  costguard burn --region us-east-1 --region us-west-2 --format json
  costguard burn --provider gcp --project my-lab --budget 300
  costguard burn --provider azure --subscription SUB --budget 300
  costguard burn --budget 200 --webhook https://hooks.example.org/T0/B0
  costguard burn --job s3://my-bucket/run1 --job s3://my-bucket/run2

\b
In cron every 10 minutes (infra/cron/costguard-burn, with how to install it):
  */10 * * * * costguard burn --budget 200 --format json >> ~/burn.log 2>&1""",
    short_help="Live burn rate of running instances and the month's projection.",
)
@click.option(
    "--budget",
    type=Usd(0, minimum_open=True, maximum=10**9),
    help="Monthly budget in USD (AWS and Azure default: the costguard-monthly budget).",
)
@fleet_options("Region (repeatable). Default: every region in the price tables (AWS); all.")
@click.option("--webhook", type=Url(), help="POST a JSON alert to this URL when over budget.")
@click.option(
    "--job",
    "jobs",
    type=StoreUrl(),
    multiple=True,
    help="A job started by costguard launch, by its --checkpoint URL (repeatable): its "
    "projected total and the spend still to come, as jobs status projects them.",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also draw month-to-date spend, the projection and the budget line into this PNG "
    "(needs costguard[plot]).",
)
@click.option(
    "--notify/--no-notify",
    default=True,
    show_default=True,
    help="Alert through the alarm's SNS topic (AWS) and --webhook when over budget.",
)
@table_or_json()
@click.pass_obj
def burn_command(settings: Settings, /, **options: Any) -> None:
    """List running instances, price them, and project the month.

    Burn rate = the list price of every running instance, per hour. The projection
    assumes they keep running to the end of the month. Exit 1 (and alert) when the
    projection passes the budget. Provider billing lags hours; this is live.

    With --job, each job's projected total and the spend it still has to come (its steps
    left at its measured pace, at its instance's price) are listed too; a job whose
    store cannot be read is named, and the rest goes on.
    """
    webhook: str | None = options["webhook"]
    if webhook and not webhook.startswith(("https://", "http://")):
        msg = f"--webhook must be an http(s) URL, not {webhook!r}"
        raise InputError(msg, hint="e.g. --webhook https://hooks.slack.com/services/...")
    plot: Path | None = options["plot"]
    if plot is not None:
        from costguard.plots import check_target

        check_target(plot)
    provider = options["provider"].lower()
    catalog = load_tables(settings.pricing_dir, settings.pricing_cache_dir)
    prices = PriceBook(catalog)
    in_tables = sorted({r.name for r in catalog.regions if r.provider == provider})
    chosen = fleets(provider, options, prices, settings, aws_default_regions=in_tables)
    budget: Decimal | None = options["budget"]
    if budget is None:
        budget = _alarm_budget(provider, options, settings)
    seen = [vm for listed in across(chosen, lambda fleet: fleet.instances()) for vm in listed]

    def on_demand(vm: Instance) -> Decimal | None:
        return prices.usd_per_hour(vm.provider, vm.region, vm.instance_type, spot=False)

    report = burn_report(price_running(seen, on_demand), datetime.now(UTC), budget)
    jobs = _jobs(options["jobs"], report.now)
    if options["output_format"] == "json":
        render.print_json(_document(report, jobs))
    else:
        _print(report, jobs)
    if plot is not None:
        from costguard.plots import draw_burn

        click.echo(f"Picture: {draw_burn(plot, report).path}", err=True)
    if not report.over_budget:
        return
    message = _alert_text(report)
    if options["notify"]:
        if provider == "aws":
            from costguard.alarms import aws as aws_alarms  # the SDK loads only now

            if aws_alarms.publish_alert("costguard: projected spend over budget", message):
                click.echo("Alert published to the costguard-budget-alerts topic.", err=True)
        if webhook:
            _post(webhook, _document(report, jobs))
            click.echo(f"Alert posted to {webhook.split('?')[0]}.", err=True)
    raise CostguardError(
        message,
        hint="costguard reap finds idle GPUs; stop what you don't need, or raise the budget",
    )


def _alarm_budget(provider: str, options: dict[str, Any], settings: Settings) -> Decimal | None:
    """The amount of the costguard-monthly budget, where it can be read without more flags."""
    if provider == "gcp":
        return None  # GCP budgets sit on a billing account, not the project: use --budget
    from costguard.alarms.backend import Scope, alarm_backend  # the SDK loads only now

    # The subscription's own budget: `costguard alarm` sets it at subscription scope.
    scope = Scope(subscription=options["subscription"])
    statuses = alarm_backend(provider, settings, scope).status()
    return next((s.amount_usd for s in statuses if s.name == "costguard-monthly"), None)


def _jobs(urls: tuple[str, ...], now: datetime) -> list[JobBurn]:
    """The jobs named with --job, read a few at a time (each is two small reads)."""
    if not urls:
        return []
    from costguard.spot.report import job_burn

    return across(urls, lambda url: job_burn(url, now.timestamp()))


def _job_of(instance: Instance) -> str | None:
    """The costguard job that launched ``instance`` (its ``costguard:job`` tag), if any."""
    return next(iter(tag_values(instance.tags, JOB_TAG)), None)


def _jobs_remaining(jobs: list[JobBurn]) -> Decimal:
    return sum((j.remaining_usd for j in jobs if j.remaining_usd is not None), Decimal(0))


def _document(report: BurnReport, jobs: list[JobBurn]) -> dict[str, Any]:
    from costguard.spot.report import job_burn_document

    return {
        "as_of": report.now.isoformat(timespec="seconds"),
        "regions": sorted({p.instance.region for p in report.instances}),
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
                "market": "spot" if p.instance.spot else "on-demand",
                "launched_at": p.instance.launched_at.isoformat(timespec="seconds")
                if p.instance.launched_at
                else None,
                "usd_per_hour": p.usd_per_hour,
                "note": p.note,
                "job": _job_of(p.instance),
            }
            for p in report.instances
        ],
        "jobs": [job_burn_document(j) for j in jobs],
        "jobs_remaining_usd": _jobs_remaining(jobs),
        "assumptions": [
            "list prices from the price tables (no discounts, no taxes)",
            "only the instances listed: disks, storage, transfer and other services are not "
            "included - the provider budget covers the whole bill, hours later",
            "the projection assumes the instances keep running until the month ends (UTC)",
            "a job's remaining spend: its steps left at its measured pace, at its running "
            "attempt's price (relaunches after preemptions not included)",
        ],
    }


def _alert_text(report: BurnReport) -> str:
    assert report.budget_usd is not None  # only called when over budget
    return (
        f"projected spend this month is {format_usd(report.projected_usd)}, over the budget "
        f"of {format_usd(report.budget_usd)} (burning {format_usd(report.usd_per_hour)}/h on "
        f"{len(report.instances)} running instance(s))"
    )


def _print(report: BurnReport, jobs: list[JobBurn]) -> None:
    if report.instances:
        columns = (
            render.Column("Region"),
            render.Column("Instance"),
            render.Column("Type"),
            render.Column("Market", drop=1),
            render.Column("Since", drop=2),
            render.Column("$/h", "right"),
        )
        rows = [
            [  # from the cloud's API
                visible(p.instance.region),
                visible(p.instance.instance_id),
                visible(p.instance.instance_type),
                "spot" if p.instance.spot else "on-demand",
                f"{p.instance.launched_at:%Y-%m-%d %H:%M}" if p.instance.launched_at else "?",
                format_usd(p.usd_per_hour, rate=True) if p.usd_per_hour is not None else "?",
            ]
            for p in report.instances
        ]
        render.print_table(f"Running instances - {report.now:%Y-%m-%d %H:%M} UTC", columns, rows)
    else:
        click.echo("No running instance seen.")
    click.echo(f"Burn rate:            {format_usd(report.usd_per_hour)}/h")
    click.echo(f"Spent this month:     {format_usd(report.spent_usd)} (instances seen)")
    click.echo(f"Projected this month: {format_usd(report.projected_usd)}")
    if report.budget_usd is not None:
        click.echo(
            f"Budget:               {format_usd(report.budget_usd)}"
            + ("  OVER" if report.over_budget else "")
        )
    if jobs:
        _print_jobs(jobs)
    notes = [p.instance.instance_id + ": " + p.note for p in report.instances if p.note]
    given = {j.job.spec.job_id for j in jobs if j.job is not None}
    for p in report.instances:
        job = _job_of(p.instance)
        if job is not None and job not in given:
            notes.append(
                f"{p.instance.instance_id}: costguard job {job}; burn --job URL (its "
                "--checkpoint URL) adds its projection"
            )
    notes += [f"{j.url}: {j.error}" for j in jobs if j.error]
    notes += [f"{j.job.spec.job_id}: {j.note}" for j in jobs if j.job is not None and j.note]
    render.print_notes(notes, heading="Notes:")


def _print_jobs(jobs: list[JobBurn]) -> None:
    """The jobs' table and what they still have to spend."""
    from costguard.money import duration
    from costguard.spot.report import usd

    columns = (
        render.Column("Job"),
        render.Column("Status", drop=1),
        render.Column("Steps", "right", drop=2),
        render.Column("Finish in", "right", drop=3),
        render.Column("Spent", "right"),
        render.Column("Projected", "right"),
        render.Column("Still to spend", "right"),
    )
    rows = []
    for j in jobs:
        p = j.projection
        rows.append(
            [
                visible(j.job.spec.job_id) if j.job is not None else "?",
                visible(j.job.status) if j.job is not None else "unreadable",
                f"{p.steps_done}/{p.total_steps}" if p is not None else "?",
                duration(p.left_s) if p is not None else "?",
                usd(j.spent_usd) if j.spent_usd is not None else "?",
                usd(p.projected_total_usd) if p and p.projected_total_usd is not None else "?",
                usd(j.remaining_usd) if j.remaining_usd is not None else "?",
            ]
        )
    render.print_table("Jobs (costguard launch)", columns, rows)
    unknown = sum(1 for j in jobs if j.remaining_usd is None)
    click.echo(
        f"Jobs still to spend:  {format_usd(_jobs_remaining(jobs))} (to their last step"
        + (f"; {unknown} job(s) without a projection" if unknown else "")
        + ")"
    )


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
