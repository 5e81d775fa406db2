"""``costguard reap``: stop or terminate idle GPU instances. A dry run unless ``--execute``."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import click

from costguard.cli import render
from costguard.cli.fleets import check_combinations, fleet_options, fleets
from costguard.cli.options import idle_options
from costguard.cli.params import DecimalRange, Text, WholeNumber, table_or_json
from costguard.errors import CostguardError
from costguard.money import format_usd
from costguard.pricing.tables import load_tables
from costguard.providers import adapter_class
from costguard.reaper.fleet import PriceBook, ReapReport, Sampling, reap
from costguard.reaper.policy import (
    DESTRUCTIVE,
    MAX_IDLE_MINUTES,
    Action,
    IdlePolicy,
    IdleVerdict,
    ReapLimits,
    format_timestamp,
    parse_protect_tag,
)
from costguard.settings import Settings
from costguard.text import visible

EXAMPLES = """
\b
Examples:
  costguard reap                              # dry run: what would stop, why
  costguard reap --idle-minutes 90 --execute  # stop GPUs idle for 90 min
  costguard reap --all-regions --action terminate --max-actions 3 --execute
  costguard reap --mark --execute             # tag now, act on a later run
  costguard reap --provider gcp --project my-lab --region us-central1
  costguard reap --provider azure --subscription SUB --resource-group ml \\
      --format json

Never touched: instances tagged costguard:keep (any value but false/no/0/off) or with a
--protect-tag, with termination protection, younger than --grace-minutes, with a future
costguard:expires-at, or with any busy sample in the window. Cron and systemd units are in infra/.
"""

_PERCENT = DecimalRange(0, maximum=100)
_PAST = {Action.STOP: "stopped", Action.TERMINATE: "terminated"}


@click.command(
    "reap",
    epilog=EXAMPLES,
    short_help="Stop or terminate idle GPU instances (dry run unless --execute).",
)
@fleet_options("Region (repeatable). Default: AWS's default region; all for GCP/Azure.")
@idle_options(
    idle="How long every sample must have been below every threshold.",
    gpu="GPU utilisation (%) at or above which a sample is busy.",
    cpu="CPU utilisation (%) at or above which a sample is busy.",
    network="Network in + out (Mbit/s) at or above which a sample is busy.",
)
@click.option(
    "--grace-minutes",
    type=WholeNumber(0, MAX_IDLE_MINUTES),
    default=30,
    show_default=True,
    help="Leave instances started less than this long ago alone.",
)
@click.option(
    "--action",
    type=click.Choice(["stop", "terminate"], case_sensitive=False),
    default="stop",
    show_default=True,
    help="stop keeps the disks (Azure: deallocate; GCP: Local SSD contents are discarded, "
    "as a stop must say); terminate deletes the instance.",
)
@click.option(
    "--max-actions",
    type=WholeNumber(0, 100_000),
    default=10,
    show_default=True,
    help="Act on none if more than this many instances are selected.",
)
@click.option(
    "--max-percent",
    type=_PERCENT,
    default=Decimal(100),
    show_default=True,
    help="Act on none if more than this share of the running GPU instances is selected.",
)
@click.option(
    "--protect-tag",
    "protect_tags",
    type=Text(),
    multiple=True,
    metavar="KEY[=VALUE]",
    help="More tags that protect an instance (repeatable); costguard:keep always does "
    "(unless false, no, 0 or off).",
)
@click.option(
    "--gpu-missing-ok",
    is_flag=True,
    help="Judge instances without GPU metrics by CPU and network alone.",
)
@click.option(
    "--mark",
    "two_phase",
    is_flag=True,
    help="Two-phase: tag idle instances; act once they stay idle a whole window after.",
)
@click.option("--execute", is_flag=True, help="Act. Without it nothing is changed.")
@table_or_json(case_sensitive=False)
@click.pass_context
def reap_command(ctx: click.Context, /, **options: Any) -> None:
    """Find GPU instances idle for a window and stop or terminate them.

    Idle means every GPU, CPU and network sample in the last --idle-minutes is below its
    threshold and the samples cover the whole window. Without GPU metrics an instance is
    not idle (unless --gpu-missing-ok). The report lists every instance seen, its verdict,
    the reason and its list price per hour. Exits 1 when the safety limit stops the run.
    """
    settings = ctx.find_object(Settings) or Settings.load()
    provider = options["provider"].lower()
    check_combinations(provider, options)
    policy = _policy(provider, options)
    limits = ReapLimits(options["max_actions"], float(options["max_percent"]))
    prices = PriceBook(load_tables(settings.pricing_dir, settings.pricing_cache_dir))
    chosen = fleets(provider, options, prices, settings)
    with render.progress(f"Scanning {provider}", len(chosen)) as advance:
        report = reap(
            chosen,
            policy,
            limits,
            datetime.now(UTC),
            execute=options["execute"],
            on_judged=lambda fleet: advance(str(getattr(fleet, "region", "") or provider)),
        )
    if options["output_format"].lower() == "json":
        render.print_json(to_document(report, provider))
    else:
        print_table(report)
    if report.plan.breach:
        raise report.plan.breach.error()
    if report.failures:
        msg = f"{len(report.failures)} of {len(report.outcomes)} actions failed"
        raise CostguardError(msg, hint="the report says which and why; a rerun retries them")


def _policy(provider: str, options: dict[str, Any]) -> IdlePolicy:
    sampling: Sampling = adapter_class("fleet", provider).sampling
    return sampling.policy(
        idle_minutes=options["idle_minutes"],
        gpu_threshold_percent=float(options["gpu_threshold"]),
        cpu_threshold_percent=float(options["cpu_threshold"]),
        network_threshold_mbps=float(options["network_threshold_mbps"]),
        grace_minutes=options["grace_minutes"],
        action=Action(options["action"].lower()),
        gpu_missing_ok=options["gpu_missing_ok"],
        protect_tags=tuple(parse_protect_tag(t) for t in options["protect_tags"]),
        two_phase=options["two_phase"],
    )


def _rate(verdict: IdleVerdict) -> str:
    price = verdict.instance.usd_per_hour
    return format_usd(price, rate=True) if price is not None else "-"


def _done(report: ReapReport) -> dict[tuple[str, str, str], str]:
    """Per instance: what happened to its action ("done" or the error)."""
    return {
        (o.instance.provider, o.instance.region, o.instance.instance_id): (
            "done" if o.ok else f"failed: {o.message}"
        )
        for o in report.outcomes
    }


def _status(verdict: IdleVerdict, report: ReapReport, done: dict[tuple[str, str, str], str]) -> str:
    if verdict.action is Action.KEEP:
        return "keep"
    key = (verdict.instance.provider, verdict.instance.region, verdict.instance.instance_id)
    if key in done:
        return f"{verdict.action} ({done[key]})"
    if report.plan.breach:
        return f"{verdict.action} (refused: over the limit)"
    return f"would {verdict.action}"


def to_document(report: ReapReport, provider: str) -> dict[str, Any]:
    """The ``--format json`` document: the rule, every instance seen, the summary."""
    plan = report.plan
    policy = report.policy
    done = _done(report)
    instances = []
    for verdict in plan.verdicts:
        instance = verdict.instance
        key = (instance.provider, instance.region, instance.instance_id)
        instances.append(
            {
                "provider": instance.provider,
                "region": instance.region,
                "zone": instance.zone,
                "instance_id": instance.instance_id,
                "name": instance.name,
                "instance_type": instance.instance_type,
                "state": instance.state,
                "accelerator": instance.accelerator,
                "gpu_count": instance.gpu_count,
                "spot": instance.spot,
                "usd_per_hour": instance.usd_per_hour,
                "action": str(verdict.action),
                "code": str(verdict.code),
                "reason": verdict.reason,
                "peaks": {str(k): v for k, v in verdict.peaks.items()},
                "outcome": done.get(key),
            }
        )
    breach = plan.breach
    return {
        "provider": provider,
        "now": format_timestamp(report.now),
        "executed": report.executed,
        "policy": {
            "idle_minutes": policy.idle_minutes,
            "gpu_threshold_percent": policy.gpu_threshold_percent,
            "cpu_threshold_percent": policy.cpu_threshold_percent,
            "network_threshold_mbps": policy.network_threshold_mbps,
            "grace_minutes": policy.grace_minutes,
            "action": str(policy.action),
            "gpu_missing_ok": policy.gpu_missing_ok,
            "two_phase": policy.two_phase,
            "protect_tags": [f"{k}={v}" if v is not None else k for k, v in policy.protect_tags],
            "max_actions": report.limits.max_actions,
            "max_percent": report.limits.max_percent,
        },
        "summary": {
            "instances_seen": len(plan.verdicts),
            "gpu_instances_running": plan.population,
            "selected": len(plan.selected),
            "acted": sum(1 for o in report.outcomes if o.ok and o.action in DESTRUCTIVE),
            "failed": len(report.failures),
            "usd_per_hour_selected": plan.usd_per_hour,
            "usd_per_hour_saved": report.usd_per_hour_saved,
            "unpriced": [v.instance.instance_id for v in plan.unpriced],
        },
        "refused": None
        if breach is None
        else {
            "limit_type": breach.limit_type,
            "limit": breach.limit,
            "selection_count": breach.selection_count,
            "population_count": breach.population_count,
        },
        "instances": instances,
    }


def print_table(report: ReapReport) -> None:
    """One row per instance seen, then what the run did or would do."""
    plan = report.plan
    done = _done(report)
    mode = "executed" if report.executed else "dry run"
    columns = (
        render.Column("Instance"),
        render.Column("Name", drop=2),
        render.Column("Type", drop=1),
        render.Column("Where"),
        render.Column("$/h", "right"),
        render.Column("Verdict"),
        render.Column("Reason", prose=True),
    )
    rows = [
        [  # names, types, places and reasons come from the cloud's API (tags included)
            visible(verdict.instance.instance_id),
            visible(verdict.instance.name),
            visible(verdict.instance.instance_type),
            visible(verdict.instance.zone or verdict.instance.region),
            _rate(verdict),
            visible(_status(verdict, report, done)),
            visible(verdict.reason),
        ]
        for verdict in plan.verdicts
    ]
    render.print_table(f"costguard reap - {mode} at {format_timestamp(report.now)}", columns, rows)
    verb = _PAST[report.policy.action]
    selected = format_usd(plan.usd_per_hour, rate=True)
    lines = [
        f"{len(plan.verdicts)} instance(s) seen, {plan.population} running with GPUs; "
        f"{len(plan.selected)} idle and selected ({selected}/h at list prices)."
    ]
    if plan.unpriced:
        lines.append(f"{len(plan.unpriced)} selected instance(s) have no price in the tables.")
    if plan.breach:
        lines.append("Nothing was done: over the safety limit (see the error below).")
    elif not report.executed:
        lines.append("Dry run: nothing was changed. Add --execute to act.")
    else:
        acted = sum(1 for o in report.outcomes if o.ok and o.action in DESTRUCTIVE)
        saved = format_usd(report.usd_per_hour_saved, rate=True)
        lines.append(f"Done: {acted} instance(s) {verb}, {saved}/h saved.")
    render.print_notes(lines, heading="Summary:")
