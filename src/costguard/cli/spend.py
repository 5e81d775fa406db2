"""``costguard spend``: what was billed, per job, owner, project, day or service, from the
clouds' billing exports."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from costguard.billing.spend import (
    GROUPINGS,
    PLACES,
    JobWindow,
    Run,
    SpendReport,
    Tally,
    billed_hours,
    document,
    exact,
    group_label,
    parse_month,
    reconcile,
    report,
)
from costguard.cli import render
from costguard.cli.params import Name, StoreUrl, Usd, table_or_json
from costguard.errors import InputError
from costguard.money import format_usd
from costguard.settings import Settings
from costguard.tags import JOB_TAG
from costguard.text import visible

if TYPE_CHECKING:
    from costguard.spot.job import Job
    from costguard.spot.recovery import Attempt


class Month(Name):
    """A month written ``YYYY-MM``."""

    name = "month"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = super().convert(value, param, ctx)
        try:
            return parse_month(text)
        except InputError:
            self.refuse("is not a month written YYYY-MM", value, param, ctx)


@click.command(
    "spend",
    epilog="""\b
Examples:
  costguard spend focus-2026-11.csv.gz --by job
  costguard spend s3://my-bills/focus/2026-11/ --by owner --format json
  costguard spend 'exports/*.parquet' --by day --month 2026-11
  costguard spend gcp-billing.jsonl --by project --format csv
  costguard spend azure-focus.csv --by service --currency EUR
  costguard spend s3://my-bills/focus/ --job s3://my-bucket/run1
  costguard spend focus.csv.gz --month 2026-11 --plot nov.png --budget 200""",
    short_help="What was billed, per job, owner, project, day or service (billing exports).",
)
@click.argument("exports", nargs=-1, required=True, type=StoreUrl())
@click.option(
    "--by",
    type=click.Choice(GROUPINGS),
    help="Group by costguard's job or owner tag, the project (account, subscription), "
    "the day of the charge, or the service. Default: job (service with --job).",
)
@click.option("--month", type=Month(), help="Only this billing month (YYYY-MM).")
@click.option(
    "--currency",
    type=Name(8),
    help="Report the charges in this currency (needed when the export mixes currencies).",
)
@click.option(
    "--job",
    "job_url",
    type=StoreUrl(),
    help="A job started by costguard launch (its checkpoint URL): its estimate and its "
    "controller's running cost next to what was billed under its tag, and what the "
    "difference is made of. An array's URL (launch --array) sums every task.",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also draw what was billed to date, day by day, into this PNG (needs "
    "costguard[plot]), against --budget.",
)
@click.option(
    "--budget",
    type=Usd(0, minimum_open=True, maximum=10**9),
    help="The month's budget, drawn as a line by --plot (in the export's currency).",
)
@table_or_json(csv=True)
@click.pass_obj
def spend_command(settings: Settings, /, **options: Any) -> None:
    """Sum the billed and the amortised (effective) cost of billing exports by group.

    EXPORTS are FOCUS 1.0 exports (AWS Data Exports, the GCP FOCUS view, Azure Cost
    Management), AWS CUR 2.0 or the GCP BigQuery billing export saved as JSONL or Parquet:
    CSV, CSV.gz or Parquet files, globs or folders, local or s3://, gs://, az:// URLs read
    in place. Charges without costguard's tag are one line of their own. Exact sums, in
    the export's currency.
    """
    from costguard.billing.exports import for_a_command, read_spend  # pyarrow loads only now

    for_a_command()
    plot: Path | None = options["plot"]
    if plot is not None:
        from costguard.plots import check_target

        check_target(plot)
    elif options["budget"] is not None:
        msg = "--budget is the line --plot draws"
        raise InputError(msg, hint="add --plot spend.png, or drop --budget")
    job, tagged = _job(options["job_url"]) if options["job_url"] else (None, None)
    by = options["by"] or ("service" if job else "job")
    month, currency = options["month"], options["currency"]
    output = options["output_format"]
    if job is not None:
        spend = job_spend(settings, job, options["exports"], by, month, currency, output, tagged)
    else:
        spend = report(read_spend(options["exports"], by), by, month=month, currency=currency)
        _print_spend(spend, output)
    if plot is not None:
        from costguard.plots import draw_spend

        days = spend
        if by != "day":
            tally = read_spend(options["exports"], "day", job=tagged)
            days = report(tally, "day", month=options["month"], currency=spend.currency)
        click.echo(f"Picture: {draw_spend(plot, days, options['budget']).path}", err=True)


def _print_spend(spend: SpendReport, output: str) -> None:
    if output == "json":
        render.print_json(document(spend))
    elif output == "csv":
        render.print_csv(
            ("key", "billed_usd", "effective_usd"),
            (
                {
                    "key": g.key,
                    "billed_usd": exact(g.billed_usd),
                    "effective_usd": exact(g.effective_usd),
                }
                for g in spend.groups
            ),
        )
    else:
        _print(spend)


def job_spend(
    settings: Settings,
    job: Job,
    exports: Sequence[str],
    by: str,
    month: str | None,
    currency: str | None,
    output: str,
    tagged: tuple[str, ...] | None = None,
) -> SpendReport:
    """Print what ``exports`` billed under ``job``'s tag (grouped ``by``) next to its
    estimate and running cost, the difference named (``costguard spend --job``, ``jobs
    status --spend``); the report printed. ``tagged``: the job ids its charges carry
    (an array's tasks'), by default its own."""
    from costguard.billing.exports import read_spend

    tagged = tagged or (job.spec.job_id,)
    tally = read_spend(exports, by, job=tagged)
    if not tally.sums:
        msg = f"the export has no charges tagged {JOB_TAG}={tagged[0]}"
        if len(tagged) > 1:
            msg += f" or any other task of array {job.spec.job_id}"
        raise InputError(
            msg,
            hint="on AWS the tag counts once activated as a cost allocation tag; the export "
            "must cover the days the job ran",
        )
    spend = report(tally, by, month=month, currency=currency)
    kinds = read_spend(exports, "charge", job=tagged)
    bill = report(kinds, "charge", month=month, currency=spend.currency)
    _print_reconciliation(job, spend, bill, kinds, settings, output)
    return spend


def _job(url: str) -> tuple[Job, tuple[str, ...]]:
    """The job at ``url`` and the job ids its charges are tagged with; an array's (``launch
    --array``): its tasks as one job (:func:`~costguard.spot.sweep.as_one_job`) and every
    task's id."""
    from costguard.contract import RecordError
    from costguard.spot.array import read_record
    from costguard.spot.job import JobError, load_job
    from costguard.spot.prepare import normal_url, open_store
    from costguard.spot.sweep import as_one_job, load_tasks

    store = open_store(normal_url(url))
    try:
        record = read_record(store)
    except RecordError as exc:
        raise JobError(exc.message, hint=exc.hint) from None
    if record is None:
        job = load_job(store)
        return job, (job.spec.job_id,)
    tasks = load_tasks(record)
    return as_one_job(record, tasks), tuple(t.job.spec.job_id for t in tasks)


def _print_reconciliation(
    job: Job, spend: SpendReport, bill: SpendReport, kinds: Tally, settings: Settings, output: str
) -> None:
    from costguard.spot.controller import summarise
    from costguard.spot.prepare import offers_for

    try:
        offers = offers_for(settings, job.spec)
    except InputError:
        offers = []
    now = time.time()
    summary = summarise(job, offers, now)
    months = bill.period.split("/")
    window = job_window(job, now, kinds.covered_to, summary.spent_usd, _months(months))
    # Untagged charges count where the job's own charges are: its account, project or
    # subscription, not every account the export holds; in the bill's currency.
    untagged = sum(
        (
            usd
            for (day, account, currency), usd in kinds.untagged.items()
            if window.first_day <= day <= window.last_day
            and account in kinds.accounts
            and currency == bill.currency
        ),
        Decimal(0),
    )
    compute = [
        c
        for c in kinds.compute
        if months[0] <= c.month <= months[-1] and c.currency == bill.currency
    ]
    # One run per instance: a gang's attempt bills each of its nodes at the offer's price.
    runs = [
        Run(
            a.launched_unix, a.ended_unix if a.ended_unix is not None else now, a.offer.usd_per_hour
        )
        for a in job.attempts
        if a.hours(now)
        for _ in range(a.node_count)
    ]
    result = reconcile(
        bill,
        job.spec.job_id,
        estimate_usd=summary.estimate_usd,
        window=window,
        covered_to=kinds.covered_to,
        untagged_usd=untagged,
        hours=billed_hours(compute, runs),
        accounts=sorted(a for a in kinds.accounts if a is not None),
    )
    if output != "table":
        render.print_json(
            {
                **document(spend),
                "job_id": result.job_id,
                "estimate_usd": None if result.estimate_usd is None else exact(result.estimate_usd),
                "running_cost_usd": exact(result.running_usd),
                "gap_usd": exact(result.gap_usd),
                "gaps": [
                    {"kind": g.kind, "usd": exact(g.usd), "note": g.note} for g in result.gaps
                ],
            }
        )
        return
    _print(spend)
    click.echo(f"Job {visible(result.job_id)}:")
    if result.estimate_usd is not None:
        click.echo(f"  estimate before launch: {_money(result.estimate_usd, spend.currency)}")
    click.echo(f"  controller's running cost: {_money(result.running_usd, spend.currency)}")
    click.echo(f"  billed under its tag: {_money(result.billed_usd, spend.currency)}")
    render.print_notes(
        [f"{g.kind}: {_money(g.usd, spend.currency)}, {g.note}" for g in result.gaps],
        heading=f"Where the difference ({_money(result.gap_usd, spend.currency)}) is:",
    )


def job_window(
    job: Job,
    now: float,
    covered_to: str | None,
    running_usd: Decimal,
    period: tuple[float, float] | None = None,
) -> JobWindow:
    """The days ``job`` ran (UTC), what its controller counted after ``covered_to`` (the
    export's last day) and outside ``period`` (the billing months reported, Unix times),
    and the hours it ran in between, from its attempts as ``costguard jobs status``
    counts them."""
    ran = [a for a in job.attempts if a.hours(now)]
    starts = [a.launched_unix for a in ran] or [job.spec.created_unix]
    ends = [a.ended_unix if a.ended_unix is not None else now for a in ran] or starts
    low, high = period or (-math.inf, math.inf)
    cutoff = math.inf
    if covered_to is not None:
        cutoff = datetime.fromisoformat(covered_to).replace(tzinfo=UTC).timestamp() + 86400
    whole, _ = _counted(ran, ends, now, -math.inf, math.inf)
    in_period, _ = _counted(ran, ends, now, low, high)
    exported, hours_run = _counted(ran, ends, now, low, min(high, cutoff))
    return JobWindow(
        running_usd=running_usd,
        first_day=_utc_day(min(starts)),
        last_day=_utc_day(max(ends)),
        unexported_usd=in_period - exported,
        hours_run=hours_run,
        other_months_usd=whole - in_period,
    )


def _counted(
    ran: Sequence[Attempt], ends: Sequence[float], now: float, low: float, high: float
) -> tuple[Decimal, Decimal]:
    """What the controller counted of the attempts ``ran`` (ending at ``ends``) between
    ``low`` and ``high``: cost and instance-hours."""
    usd = hours = Decimal(0)
    for attempt, end in zip(ran, ends, strict=True):
        first = max(attempt.launched_unix, low)
        part = replace(attempt, launched_unix=first, ended_unix=max(first, min(end, high)))
        usd += part.cost_usd(now)
        hours += part.hours(now) * part.node_count  # a gang's attempt: each node's hours
    return usd, hours


def _months(months: Sequence[str]) -> tuple[float, float]:
    """From the first of ``months[0]`` to the first of the month after ``months[-1]``
    (``YYYY-MM``), UTC, as Unix times."""
    first = datetime.fromisoformat(f"{months[0]}-01").replace(tzinfo=UTC)
    last = datetime.fromisoformat(f"{months[-1]}-01").replace(tzinfo=UTC)
    after = last.replace(year=last.year + last.month // 12, month=last.month % 12 + 1)
    return first.timestamp(), after.timestamp()


def _utc_day(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).date().isoformat()


def _money(amount: Decimal, currency: str) -> str:
    """An amount for people, a credit's minus sign first: ``-$20.75``, ``2.75 EUR``."""
    if currency != "USD":
        return f"{amount:,.2f} {visible(currency)}"
    return f"-{format_usd(-amount)}" if amount < 0 else format_usd(amount)


def _print(spend: SpendReport) -> None:
    columns = (
        render.Column(spend.by.capitalize()),
        render.Column("Billed", "right"),
        render.Column("Effective", "right", drop=1),
    )
    rows = [
        [
            visible(group_label(g.key, spend.by)),
            _money(g.billed_usd, spend.currency),
            _money(g.effective_usd, spend.currency),
        ]
        for g in spend.groups
    ]
    rows.append(
        [
            "Total",
            _money(spend.total_billed_usd, spend.currency),
            _money(spend.total_effective_usd, spend.currency),
        ]
    )
    span = f", charges {spend.first_day} to {spend.last_day}" if spend.first_day else ""
    render.print_table(f"Billed in {spend.period} ({spend.currency}{span})", columns, rows)
    notes = [
        f"{spend.rows} charges from {len(spend.files)} file(s); exact sums: --format json",
        "Effective = amortised: commitments (savings plans, reservations) spread over the "
        "usage they cover; billed = what the invoice counts",
    ]
    if spend.rounded:
        notes.append(
            f"{spend.rounded} amount(s) had more than {PLACES} decimal places (a double's "
            f"digits): rounded half to even at the {PLACES}th"
        )
    if spend.by in ("job", "owner"):
        notes.append(
            f"(untagged): charges without costguard's {spend.by} tag (support, tax, shared "
            "services, resources costguard did not create)"
        )
    render.print_notes(notes, heading="Notes:")
