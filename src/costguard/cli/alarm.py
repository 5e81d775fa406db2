"""``costguard alarm``: a budget with alerts on day one, before the first instance."""

from __future__ import annotations

import json
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import click

from costguard.alarms.backend import Scope, alarm_backend
from costguard.alarms.plan import ApiCall, Plan
from costguard.alarms.spec import AlarmSpec, alarm_spec
from costguard.billing.spend import SpendReport, exact, report
from costguard.cli import echo_prose, render
from costguard.cli.helpformat import HelpGroup
from costguard.cli.params import AzureSubscription, Name, Url, option_group, table_or_json
from costguard.errors import InputError
from costguard.money import format_usd
from costguard.providers import providers
from costguard.settings import Settings
from costguard.text import visible

PROVIDERS = click.Choice(providers("alarm"), case_sensitive=False)

EXAMPLES = """
\b
Examples:
  costguard alarm --budget 200 --email me@uni.edu
  costguard alarm --budget 200 --email me@uni.edu --dry-run
  costguard alarm --budget 500 --thresholds 25,50,75,100 --name thesis \\
      --email me@uni.edu
  costguard alarm --provider gcp --billing-account 012345-6789AB-CDEF01 \\
      --project my-proj --budget 200 --email me@uni.edu
  costguard alarm --provider azure --subscription SUB --budget 200 \\
      --email me@uni.edu
  costguard alarm status
  costguard alarm delete --yes
"""


def _provider_options(command: Any) -> Any:
    options = [
        click.option(
            "--provider",
            type=PROVIDERS,
            default="aws",
            show_default=True,
            envvar="COSTGUARD_PROVIDER",
            help="Which cloud.",
        ),
        click.option(
            "--billing-account", type=Name(), help="GCP: billing account XXXXXX-XXXXXX-XXXXXX."
        ),
        click.option("--project", type=Name(), help="GCP: scope the budget to this project."),
        click.option("--subscription", type=AzureSubscription(), help="Azure: subscription id."),
        click.option(
            "--resource-group", type=Name(), help="Azure: scope the budget to a resource group."
        ),
        table_or_json("table for people, json for scripts.", case_sensitive=False),
    ]
    return option_group(*options)(command)


@click.group(
    "alarm",
    cls=HelpGroup,
    invoke_without_command=True,
    epilog=EXAMPLES,
    short_help="Set a monthly budget with alerts (run it on day one).",
)
@click.option("--budget", metavar="USD", type=Name(), help="Monthly budget in USD, e.g. 200.")
@click.option(
    "--email",
    "emails",
    metavar="ADDRESS",
    type=Name(),
    multiple=True,
    help="Who gets the alerts (repeatable).",
)
@click.option(
    "--thresholds",
    metavar="PERCENTS",
    type=Name(),
    default="50,80,100",
    show_default=True,
    help="Alert at these percentages of the budget (actual spend).",
)
@click.option(
    "--forecast/--no-forecast",
    default=True,
    show_default=True,
    help="Also alert when the month's forecast passes 100%.",
)
@click.option(
    "--name",
    type=Name(),
    default="monthly",
    show_default=True,
    help="Budget name (costguard- is prefixed).",
)
@click.option("--pubsub-topic", type=Name(), help="GCP: also publish alerts to this Pub/Sub topic.")
@click.option(
    "--hard-stop",
    is_flag=True,
    help="AWS: at 100% actual spend, deny ec2:RunInstances to --hard-stop-target.",
)
@click.option(
    "--hard-stop-role-arn",
    metavar="ARN",
    type=Name(),
    help="AWS: the role AWS Budgets assumes to apply it (infra/aws/budgets-action-*).",
)
@click.option(
    "--hard-stop-target",
    "hard_stop_targets",
    metavar="KIND/NAME",
    type=Name(),
    multiple=True,
    help="AWS: user/NAME, role/NAME or group/NAME denied launches (repeatable).",
)
@click.option(
    "--no-notify",
    is_flag=True,
    help="AWS: create the budget without --email (its alerts then reach only the SNS topic).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Say what a run would create and who it would tell, and call nothing "
    "(--format json: every API call with its parameters).",
)
@_provider_options
@click.pass_context
def alarm_group(ctx: click.Context, **options: Any) -> None:
    """Create or update a monthly cost budget with alerts, idempotently.

    AWS: an AWS Budgets budget (alerts at each threshold on actual spend, and on the
    forecast) to your emails and an SNS topic, plus a CloudWatch billing alarm as a second
    layer. GCP: a Cloud Billing budget. Azure: a consumption budget. A second run with the
    same arguments changes nothing; a new amount updates the budget in place.
    """
    if ctx.invoked_subcommand is not None:
        return
    settings: Settings = ctx.obj
    if options["budget"] is None:
        msg = "Missing option '--budget'."
        raise click.UsageError(msg, ctx)
    spec = alarm_spec(
        budget=options["budget"],
        provider=options["provider"],
        emails=options["emails"],
        thresholds=options["thresholds"],
        forecast=options["forecast"],
        name=options["name"],
        billing_account=options["billing_account"],
        project=options["project"],
        pubsub_topic=options["pubsub_topic"],
        subscription=options["subscription"],
        resource_group=options["resource_group"],
        hard_stop=options["hard_stop"],
        hard_stop_role_arn=options["hard_stop_role_arn"],
        hard_stop_targets=options["hard_stop_targets"],
    )
    cloud = alarm_backend(spec.provider, settings, _scope(spec))
    _check_someone_is_told(spec, no_notify=options["no_notify"])
    json_output = options["output_format"].lower() == "json"
    if options["dry_run"]:
        plan = cloud.dry_run_plan(spec)
        _report(spec, plan, list(plan.calls), json_output, dry_run=True)
        return
    plan = cloud.plan(spec)
    made = cloud.apply(spec, plan)
    _report(spec, plan, made, json_output, dry_run=False)


def _check_someone_is_told(spec: AlarmSpec, *, no_notify: bool) -> None:
    """An AWS budget without --email tells nobody (the SNS topic has no subscriber yet).

    GCP budgets also mail the billing account's administrators, and Azure ones need
    --email already, so only AWS asks for --email or an explicit --no-notify.
    """
    if spec.provider != "aws" or spec.emails or no_notify:
        return
    msg = "this budget would tell nobody: no --email was given"
    raise InputError(
        msg,
        hint="add --email you@example.org (repeatable), or --no-notify to create it anyway "
        "(alerts then reach only the SNS topic costguard-budget-alerts, for you to subscribe)",
    )


def _call_record(call: ApiCall) -> dict[str, Any]:
    return {
        "call": str(call),
        "reason": call.reason,
        "read_only": call.read_only,
        "params": render.to_jsonable(dict(call.params)),
    }


def _report(
    spec: AlarmSpec, plan: Plan, calls: list[ApiCall], json_output: bool, *, dry_run: bool
) -> None:
    if json_output:
        render.print_json(
            {
                "provider": spec.provider,
                "budget": spec.name,
                "budget_usd": spec.budget_usd,
                "alerts": [str(n) for n in spec.notifications],
                "emails": list(spec.emails),
                "dry_run": dry_run,
                "changed": bool([c for c in calls if not c.read_only]) and not dry_run,
                "calls": [_call_record(c) for c in calls],
                "notes": list(plan.notes),
            }
        )
        return
    alerts = ", ".join(str(n) for n in spec.notifications)
    summary = f"{spec.provider} budget {spec.name}: {format_usd(spec.budget_usd)} a month; {alerts}"
    if dry_run:
        _print_dry_run(spec, summary, calls)
    elif not calls:
        echo_prose("No changes: ", f"{summary} already in place.")
    else:
        echo_prose("Done: ", f"{summary}.")
        for call in calls:
            render.print_prose(f"{call}  # {call.reason}", first="  ", indent="      ")
    render.print_notes(plan.notes, heading="Notes:")


def _print_dry_run(spec: AlarmSpec, summary: str, calls: Sequence[ApiCall]) -> None:
    """The plan in a few lines: what would exist, who is told, and the next step."""
    render.print_prose(f"Dry run - no call is made. A run would set up {summary}.")
    told = [f"{e} (email)" for e in spec.emails]
    if spec.provider == "aws":
        told.append("the SNS topic costguard-budget-alerts (subscribe more endpoints to it)")
    if spec.provider == "gcp":
        told.append("the billing account's administrators (GCP's default)")
    if spec.pubsub_topic:
        told.append(f"the Pub/Sub topic {spec.pubsub_topic}")
    render.print_notes(told or ["nobody (--no-notify)"], heading="Who is told:")
    writes = [c for c in calls if not c.read_only]
    render.print_notes(
        [f"{c.reason} ({c})" for c in writes] or ["nothing: reads only"],
        heading=f"What it would create or change ({len(calls) - len(writes)} reads first):",
    )
    click.echo("Every call with its parameters: the same command with --format json.")
    click.echo("Next: the same command without --dry-run.")


@alarm_group.command(
    "status",
    epilog="""\b
Examples:
  costguard alarm status
  costguard alarm status --provider gcp \\
      --billing-account 012345-6789AB-CDEF01 --format json
  costguard alarm status --export s3://my-bills/focus/BILLING_PERIOD=2026-11/""",
)
@_provider_options
@click.option(
    "--export",
    "exports",
    multiple=True,
    type=Url(),
    help="A billing export (as costguard spend reads it, repeatable): the billed total of "
    "its latest month next to the budget.",
)
@click.pass_obj
def status_command(settings: Settings, **options: Any) -> None:
    """List the budgets costguard manages, with amounts, spend and alerts."""
    billed = _billed(options["exports"]) if options["exports"] else None
    cloud = alarm_backend(options["provider"], settings, Scope.of(options))
    statuses = cloud.status()
    # The export is set against costguard's monthly budget, else the first one listed.
    chosen = next((s for s in statuses if s.name == "costguard-monthly"), None)
    chosen = chosen or (statuses[0] if statuses else None)
    budget_usd = chosen.amount_usd if chosen else None
    if options["output_format"].lower() == "json":
        render.print_json(
            {
                **({"export": _export_doc(billed, budget_usd)} if billed else {}),
                "budgets": [
                    {
                        "provider": s.provider,
                        "name": s.name,
                        "amount_usd": s.amount_usd,
                        "actual_usd": s.actual_usd,
                        "forecast_usd": s.forecast_usd,
                        "alerts": list(s.alerts),
                        "extra": s.extra,
                    }
                    for s in statuses
                ],
            }
        )
        return
    if not statuses:
        click.echo(f"No costguard budget on {options['provider']}.")
        click.echo("Hint: `costguard alarm --budget 200 --email me@uni.edu`")
        return
    columns = (
        render.Column("Name"),
        render.Column("Budget", "right"),
        render.Column("Spent", "right"),
        render.Column("Forecast", "right"),
        render.Column("Alerts", prose=True),
        render.Column("Also", drop=1, prose=True),
    )
    rows = [
        [
            visible(s.name),
            format_usd(s.amount_usd),
            format_usd(s.actual_usd) if s.actual_usd is not None else "-",
            format_usd(s.forecast_usd) if s.forecast_usd is not None else "-",
            "\n".join(visible(a) for a in s.alerts),
            visible(s.extra),
        ]
        for s in statuses
    ]
    render.print_table(f"costguard budgets on {options['provider']}", columns, rows)
    if billed is not None:
        render.print_prose(_export_line(billed, budget_usd))
    click.echo("Provider billing data lags hours; `costguard burn` shows the live rate.")


def _billed(exports: tuple[str, ...]) -> tuple[SpendReport, int]:
    """The billed total of the exports' latest billing month, and how many charges the
    exports hold in all (read before any cloud call)."""
    from costguard.billing.exports import read_spend  # pyarrow loads only now

    tally = read_spend(exports, "project")
    latest = report(tally, "project", month=max(month for (_, _, month) in tally.sums))
    return latest, sum(tally.counts.values())


def _export_doc(read: tuple[SpendReport, int], budget_usd: Decimal | None) -> dict[str, Any]:
    billed, charges = read
    return {
        "period": billed.period,
        "currency": billed.currency,
        "billed_usd": exact(billed.total_billed_usd),
        "budget_usd": budget_usd,
        "percent_of_budget": None
        if not budget_usd
        else round(100 * billed.total_billed_usd / budget_usd, 1),
        "charges_to": billed.last_day,
        "charges": billed.rows,
        "charges_in_export": charges,
    }


def _export_line(read: tuple[SpendReport, int], budget_usd: Decimal | None) -> str:
    """What the export's latest month billed, and what part of the export that month is:
    a month holding 1 of its 1,000 charges is not the export's bill."""
    billed, charges = read
    amount = format_usd(billed.total_billed_usd)
    held = "all" if billed.rows == charges else f"{billed.rows:,}"
    line = (
        f"Billed in {billed.period}, the export's latest month ({held} of its {charges:,} "
        f"charges, to {billed.last_day}): {amount}"
    )
    if budget_usd:
        share = 100 * billed.total_billed_usd / budget_usd
        line += f", {share:.0f}% of the {format_usd(budget_usd)} budget"
    return line


@alarm_group.command(
    "delete",
    epilog="""\b
Examples:
  costguard alarm delete            # shows what would be deleted
  costguard alarm delete --yes
  costguard alarm delete --name thesis --yes""",
)
@click.option(
    "--name", "names", type=Name(), multiple=True, help="Only these budgets (default: all of ours)."
)
@click.option("--yes", is_flag=True, help="Really delete (without it: a dry run).")
@_provider_options
@click.pass_obj
def delete_command(settings: Settings, names: Sequence[str], yes: bool, **options: Any) -> None:
    """Remove costguard's budgets and alerts - only ours (named costguard-*)."""
    cloud = alarm_backend(options["provider"], settings, Scope.of(options))
    wanted = [n if n.startswith("costguard-") else f"costguard-{n}" for n in names] or None
    plan = cloud.plan_delete(wanted)
    made = cloud.delete(plan) if yes else []
    if options["output_format"].lower() == "json":
        render.print_json(
            {
                "dry_run": not yes,
                "calls": [_call_record(c) for c in plan.calls],
                "deleted": bool(made),
            }
        )
        return
    if not plan.calls:
        click.echo("Nothing to delete: no costguard budget found.")
        return
    click.echo("Deleted:" if yes else "Would delete (dry run; --yes deletes):")
    terminal = render.console().is_terminal
    for call in plan.calls:
        params = render.to_jsonable(dict(call.params))
        if terminal:  # the call and why, wrapped; its parameters whole on a line of their own
            render.print_prose(f"{call}  # {call.reason}:", first="  ", indent="      ")
            click.echo("      " + visible(json.dumps(params, separators=(",", ":"))))
        else:
            click.echo(visible(f"  {call}  # {call.reason}: {json.dumps(params)}"))


def _scope(spec: AlarmSpec) -> Scope:
    return Scope(spec.billing_account, spec.project, spec.subscription, spec.resource_group)
