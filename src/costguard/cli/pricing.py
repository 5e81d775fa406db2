"""``costguard pricing``: look inside the price tables, and refresh them.

Its four subcommands (``show``, ``gpus``, ``check``, ``refresh``) each parse, call one
feature function (:mod:`costguard.pricing.tables`, :mod:`costguard.pricing.check`,
:mod:`costguard.pricing.refresh`) and render the result.
"""

from __future__ import annotations

import atexit
import gc
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from costguard.cli import echo_prose, render
from costguard.cli.helpformat import HelpGroup
from costguard.cli.params import Name, table_or_json
from costguard.errors import EXIT_FAILURE
from costguard.money import format_usd
from costguard.pricing import TABLES
from costguard.pricing.catalog import (
    Catalog,
    InstancePrice,
    Market,
    Region,
    StorageRate,
    TransferRate,
    as_of_text,
    check_provider,
    prices_as_of,
    refresh_hint,
    rows_as_of,
    source_dates,
    table_rows,
    undated_prices,
)
from costguard.pricing.gpus import MODELS, canonical_gpu, gpu_model
from costguard.pricing.tables import load_interruptions, load_tables
from costguard.settings import Settings
from costguard.text import visible

if TYPE_CHECKING:
    from costguard.pricing.refresh.runner import Progress, RefreshPlan, RefreshReport


@click.group("pricing", cls=HelpGroup, short_help="Inspect the price tables, or refresh them.")
def pricing_group() -> None:
    """Inspect the price tables costguard estimates from, or refresh them.

    \b
    Examples:
      costguard pricing show
      costguard pricing show gpu_instances --gpu h100 --region us-central1
      costguard pricing gpus
      costguard pricing refresh --provider aws --region us-east-1
      costguard pricing check
    """


@pricing_group.command(
    "show",
    epilog="""\b
Examples:
  costguard pricing show
  costguard pricing show gpu_instances --gpu a100-80gb
  costguard pricing show storage --provider azure --format csv""",
)
@click.argument("table", required=False, type=click.Choice(TABLES))
@click.option(
    "--provider", "providers", type=Name(), multiple=True, help="aws, gcp or azure (repeatable)."
)
@click.option("--region", "regions", type=Name(), multiple=True, help="Region (repeatable).")
@click.option("--gpu", type=Name(), help="Only instances with this GPU (instance tables).")
@click.option("--unverified", is_flag=True, help="Only rows whose price is not verified.")
@table_or_json(case_sensitive=False, csv=True)
@click.pass_obj
def show_command(
    settings: Settings,
    table: str | None,
    providers: Sequence[str],
    regions: Sequence[str],
    gpu: str | None,
    unverified: bool,
    output_format: str,
) -> None:
    """Without TABLE: where each table comes from and how old it is. With TABLE: its rows."""
    catalog = load_tables(settings.pricing_dir, settings.pricing_cache_dir)
    output_format = output_format.lower()
    if table is None:
        _show_summary(catalog, output_format)
        return
    wanted_providers = {check_provider(p) for p in providers}
    wanted_regions = {catalog.find_region(r).name for r in regions}
    wanted_gpu = canonical_gpu(gpu, catalog.accelerators) if gpu else None
    rows = [
        row
        for row in table_rows(catalog, table)
        if (not wanted_providers or row["provider"] in wanted_providers)
        and (not wanted_regions or row.get("region", row.get("name")) in wanted_regions)
        and (wanted_gpu is None or row.get("accelerator") == wanted_gpu)
        and (not unverified or "unverified" in _statuses(row))
    ]
    columns = list(rows[0]) if rows else _columns(table)
    info = catalog.tables[table]
    as_of = rows_as_of(catalog, table, rows)  # the oldest listed, as estimate dates prices
    if output_format == "json":
        render.print_json(
            {
                "table": table,
                "as_of": as_of_text(as_of),
                "source": info.source,
                "origin": catalog.origin,
                "rows": rows,
            }
        )
    elif output_format == "csv":
        render.print_csv(columns, rows)
    else:
        _print_rows(f"{table} - as of {as_of_text(as_of)} ({catalog.origin})", columns, rows)
        render.print_prose(f"Source: {info.source}")
        click.echo(f"{len(rows)} row(s).")
    if table in ("gpu_instances", "cpu_instances"):
        named = [catalog.find_region(r) for r in regions]
        _say_uncovered(catalog, [r for r in named if (r.provider, r.name) not in catalog.covered])


@pricing_group.command(
    "gpus",
    epilog="""\b
Examples:
  costguard pricing gpus
  costguard pricing gpus --provider gcp --format json""",
)
@click.option(
    "--provider", "providers", type=Name(), multiple=True, help="aws, gcp or azure (repeatable)."
)
@table_or_json(case_sensitive=False, csv=True)
@click.pass_obj
def gpus_command(settings: Settings, providers: Sequence[str], output_format: str) -> None:
    """The GPUs in the tables: names you can type, where they are, lowest $/GPU-hour."""
    catalog = load_tables(settings.pricing_dir, settings.pricing_cache_dir)
    wanted = {check_provider(p) for p in providers}
    listed = [
        i for i in catalog.instances if i.accelerator and (not wanted or i.provider in wanted)
    ]
    rows = list(_gpu_rows(listed))
    # Dated by the oldest price listed, as estimate dates what it shows.
    places = [
        ("gpu_instances", i.provider, i.region, Market.ON_DEMAND, i.instance_type)
        for i in listed
        if i.ondemand_usd_per_hour is not None
    ]
    as_of = as_of_text(prices_as_of(catalog, places))
    output_format = output_format.lower()
    if output_format == "json":
        render.print_json({"as_of": as_of, "gpus": rows})
    elif output_format == "csv":
        render.print_csv(list(rows[0]) if rows else ["gpu"], rows)
    else:
        _print_rows(
            f"GPUs in the tables - as of {as_of} ({catalog.origin})",
            list(rows[0]) if rows else ["gpu"],
            rows,
        )
        click.echo("Lowest $/GPU-hour over all instance sizes and regions listed.")
    _say_uncovered(catalog, [r for r in catalog.uncovered() if not wanted or r.provider in wanted])


def _say_uncovered(catalog: Catalog, uncovered: Sequence[Region]) -> None:
    """On stderr: the known regions the tables have no prices for, and the command that
    adds them."""
    by_provider: dict[str, list[str]] = {}
    for region in uncovered:
        by_provider.setdefault(region.provider, []).append(region.name)
    for provider, names in by_provider.items():
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        render.print_prose(
            f"Not covered by the {catalog.origin} tables: {provider} {shown}. "
            f"{refresh_hint(provider, names)}",
            indent="  ",
            first="",
            err=True,
        )


@pricing_group.command(
    "check",
    short_help="Flag suspect prices in the tables: outliers, $0 parts, old rows.",
    epilog="""\b
Examples:
  costguard pricing check
  costguard pricing check --pricing-dir ./lab-prices --format json""",
)
@click.option(
    "--pricing-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Check the tables in this folder (default: the tables in use).",
)
@table_or_json(case_sensitive=False, csv=True)
@click.pass_obj
def check_command(settings: Settings, pricing_dir: Path | None, output_format: str) -> None:
    """Flag suspect prices: spot not below on-demand or exactly a tenth of it, $0 parts, a
    price per GPU far from the same GPU's in other regions and sizes, sizes of a family
    that disagree per GPU, GPU counts that disagree with the name, rows older than a
    source their note cites.

    Exits 1 when a suspect row is still marked "listed" (rows already marked unverified
    or corrected, with a note, are shown as known: the estimate shows their note).
    """
    from costguard.pricing.check import check_catalog
    from costguard.pricing.tables import load_gpu_parts

    catalog = load_tables(pricing_dir or settings.pricing_dir, settings.pricing_cache_dir)
    findings = check_catalog(catalog, load_gpu_parts(catalog.directory))
    rows = [
        {
            "provider": f.provider,
            "region": f.region,
            "instance_type": f.instance_type,
            "market": str(f.market),
            "check": f.kind,
            "known": f.known,
            "finding": f.message,
        }
        for f in findings
    ]
    new = [f for f in findings if not f.known]
    output_format = output_format.lower()
    if output_format == "json":
        render.print_json({"tables": str(catalog.directory), "new": len(new), "findings": rows})
    elif output_format == "csv":
        render.print_csv(list(rows[0]) if rows else ["finding"], rows)
    else:
        if rows:
            _print_rows(f"Suspect prices in {catalog.directory}", list(rows[0]), rows)
        click.echo(
            f"{len(catalog.instances)} rows checked: {len(new)} new suspect price(s), "
            f"{len(findings) - len(new)} known (marked, with a note)."
        )
    if new:
        raise SystemExit(EXIT_FAILURE)


def _gpu_rows(listed: Sequence[InstancePrice]) -> Iterable[dict[str, Any]]:
    by_gpu: dict[str, list[InstancePrice]] = {}
    for inst in listed:
        if inst.accelerator:
            by_gpu.setdefault(inst.accelerator, []).append(inst)
    order = {m.name: i for i, m in enumerate(MODELS)}
    for name in sorted(by_gpu, key=lambda n: (order.get(n, len(order)), n)):
        instances = by_gpu[name]
        model = gpu_model(name)
        yield {
            "gpu": name,
            "aliases": ", ".join(model.aliases) if model else "",
            "memory_gb": model.memory_gb if model else None,
            "providers": ", ".join(sorted({i.provider for i in instances})),
            "regions": len({(i.provider, i.region) for i in instances}),
            "gpus_per_instance": ", ".join(
                str(c) for c in sorted({i.accelerator_count for i in instances})
            ),
            "ondemand_usd_per_gpu_hour": _lowest_per_gpu(instances, Market.ON_DEMAND),
            "spot_usd_per_gpu_hour": _lowest_per_gpu(instances, Market.SPOT),
        }


def _lowest_per_gpu(instances: Sequence[InstancePrice], market: Market) -> Decimal | None:
    per_gpu = [
        price / inst.accelerator_count
        for inst in instances
        if (price := inst.usd_per_hour(market)) is not None and inst.accelerator_count
    ]
    return min(per_gpu) if per_gpu else None


def _show_summary(catalog: Catalog, output_format: str) -> None:
    counts = {
        "gpu_instances": sum(1 for i in catalog.instances if i.accelerator),
        "cpu_instances": sum(1 for i in catalog.instances if not i.accelerator),
        "storage": len(catalog.storage),
        "transfer": len(catalog.transfer),
        "regions": len(catalog.regions),
    }
    # A price table is as old as its oldest price (an instance price of no known date:
    # unknown), never the day its file was written; regions is dated as a whole.
    rows = [
        {
            "table": name,
            "rows": counts[name],
            "as_of": as_of_text(rows_as_of(catalog, name, table_rows(catalog, name))),
            "refreshed_at": info.refreshed_at.isoformat() if info.refreshed_at else None,
            "source": info.source,
        }
        for name, info in catalog.tables.items()
    ]
    # The spot interruption bands (estimate --interruptions-per-day advisor), dated too.
    bands, band_rows = load_interruptions(catalog.directory)
    rows.append(
        {
            "table": bands.name,
            "rows": len(band_rows),
            "as_of": bands.as_of.isoformat(),
            "refreshed_at": None,
            "source": bands.source,
        }
    )
    uncovered = catalog.uncovered()
    today = datetime.now(UTC).date()
    dated = source_dates(catalog)
    undated = undated_prices(catalog)
    if output_format == "json":
        render.print_json(
            {
                "origin": catalog.origin,
                "directory": str(catalog.directory),
                "tables": rows,
                "instance_prices_by_cloud": {
                    p: {
                        "newest": new.isoformat(),
                        "newest_age_days": (today - new).days,
                        "oldest": old.isoformat(),
                        "oldest_age_days": (today - old).days,
                        "unknown_date": undated[p],
                    }
                    for p, (old, new) in dated.items()
                },
                "not_covered": [str(r) for r in uncovered],
            }
        )
    elif output_format == "csv":
        render.print_csv(list(rows[0]), rows)
    else:
        _print_rows(f"Price tables ({catalog.origin}: {catalog.directory})", list(rows[0]), rows)
        render.print_prose(
            "Instance prices per cloud: "
            + "; ".join(
                f"{p} newest {new} ({(today - new).days} days old), oldest {old} "
                f"({(today - old).days} days old)"
                + (f", {undated[p]} of unknown date" if undated[p] else "")
                for p, (old, new) in dated.items()
            )
        )
        _say_uncovered(catalog, uncovered)


def _columns(table: str) -> list[str]:
    kinds: dict[str, tuple[str, ...]] = {
        "gpu_instances": InstancePrice._fields,
        "cpu_instances": InstancePrice._fields,
        "storage": StorageRate._fields,
        "transfer": TransferRate._fields,
        "regions": Region._fields,
    }
    return list(kinds[table])


def _statuses(row: dict[str, Any]) -> set[str]:
    return {str(row.get(k)) for k in ("ondemand_status", "spot_status", "status")}


# Column labels for people (the JSON and CSV keep the field names), which columns a
# narrow terminal loses first (higher first), and which hold free text that may wrap.
_LABELS = {
    "instance_type": "instance",
    "accelerator": "GPU",
    "accelerator_count": "GPUs",
    "gpus_per_instance": "GPUs per\ninstance",
    "memory_gib": "memory\nGiB",
    "memory_gb": "memory\nGB",
    "ondemand_usd_per_hour": "on-demand\n$/h",
    "spot_usd_per_hour": "spot\n$/h",
    "ondemand_usd_per_gpu_hour": "on-demand\n$/GPU-h",
    "spot_usd_per_gpu_hour": "spot\n$/GPU-h",
    "ondemand_status": "on-demand\nstatus",
    "spot_status": "spot\nstatus",
    "refreshed_at": "refreshed at",
    "as_of": "as of",
}
_DROP = {
    "vcpus": 6,
    "memory_gib": 5,
    "memory_gb": 5,
    "aliases": 4,
    "refreshed_at": 4,
    "ondemand_status": 3,
    "spot_status": 3,
    "gpus_per_instance": 2,
    "accelerator_count": 2,
    "regions": 1,
    "records": 1,
}
_PROSE = {"note", "source", "aliases", "providers", "regions", "gpus_per_instance"}


def _print_rows(title: str, columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> None:
    render.print_table(
        title,
        [
            render.Column(
                _LABELS.get(name, name.replace("_", " ")),
                "right" if _money(name) else "left",
                drop=_DROP.get(name, 0),
                prose=name in _PROSE,
            )
            for name in columns
        ],
        [[_cell(name, row.get(name)) for name in columns] for row in rows],
    )


def _money(name: str) -> bool:
    return name.endswith(("usd_per_hour", "usd_per_gpu_hour")) or name == "usd"


def _cell(name: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, Decimal) and "usd" in name:
        return format_usd(value, rate=True)
    return str(value)


REFRESH_EPILOG = """\b
Examples:
  costguard pricing refresh
  costguard pricing refresh --provider aws --region us-east-1 \\
      --region us-west-2
  costguard pricing refresh --from /media/usb/price-responses
  costguard pricing refresh --output /shared/costguard-pricing --format json

\b
Sources (estimate and pricing show never reach the network; refresh does):
  aws    Price List Query API (GetProducts) and EC2 DescribeSpotPriceHistory,
         through boto3 and your AWS credentials; AWS_ENDPOINT_URL_PRICING
         overrides the endpoint.
  gcp    Cloud Billing Catalog API (Compute Engine SKUs) over gRPC,
         Application Default Credentials; COSTGUARD_GCP_ENDPOINT overrides
         the endpoint (https://HOST[:PORT], TLS; or http://127.0.0.1:PORT,
         a local server).
  azure  Retail Prices API, no account; COSTGUARD_AZURE_PRICES_ENDPOINT
         overrides it.

\b
--from DIR reads responses downloaded earlier (air-gapped sites), one a page:
  DIR/aws/pricing-*.json   GetProducts responses, or a region's offer file
  DIR/aws/spot-*.json      DescribeSpotPriceHistory responses (optional)
  DIR/gcp/skus-*.json      services.skus.list responses
  DIR/azure/prices-*.json  Retail Prices responses
  DIR/spot-advisor-data.json  the AWS Spot Instance Advisor's file (optional:
                           rewrites interruptions.csv, its spot interruption
                           bands)
  DIR/fetched.json         {"fetched_at": "2026-11-30T12:00:00Z"}: when they
                           were downloaded (else: the records' own dates, or
                           the files')

A region the tables do not cover yet is added with the instance types the API
lists there.
"""


@pricing_group.command("refresh", epilog=REFRESH_EPILOG)
@click.option(
    "--provider",
    "providers",
    type=Name(),
    multiple=True,
    help="aws, gcp or azure (repeatable). Default: all (with --from: those in DIR).",
)
@click.option(
    "--region",
    "regions",
    type=Name(),
    multiple=True,
    help="Only these regions (repeatable). Default: every region in the tables "
    "(with --from: those DIR holds prices for).",
)
@click.option(
    "--from",
    "mirror_dir",
    metavar="DIR",
    type=click.Path(file_okay=False, path_type=Path),
    help="Read API responses downloaded earlier from DIR; nothing is fetched.",
)
@click.option(
    "--output",
    metavar="DIR",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write the tables to this folder. Default: the user cache (COSTGUARD_CACHE_DIR).",
)
@table_or_json(case_sensitive=False)
@click.pass_context
def refresh_command(
    ctx: click.Context,
    providers: Sequence[str],
    regions: Sequence[str],
    mirror_dir: Path | None,
    output: Path | None,
    output_format: str,
) -> None:
    """Rebuild the instance price tables from the providers' official price APIs.

    On-demand and spot prices of the instance types in the tables are read again and
    written, with the date and the API of every part, to the user cache, which
    `costguard estimate` then uses (when it is fresher than the bundled tables). Rows
    of other providers and regions are carried over from the tables already there. A
    provider that fails keeps its old prices; the others are refreshed all the same,
    and the command exits 1 naming what failed.
    """
    from costguard.pricing.refresh.runner import current_tables, plan_refresh, refresh_tables

    _skip_the_last_collections()
    settings: Settings = ctx.obj
    target = output or settings.pricing_cache_dir
    catalog = current_tables(target)
    plan = plan_refresh(catalog, providers, regions, output=target, mirror_dir=mirror_dir)
    with _progress_bar(plan) as progress:
        report = refresh_tables(plan, catalog, settings, progress=progress)
    if output_format.lower() == "json":
        render.print_json(_refresh_document(report))
    else:
        _print_refresh(report)
    if settings.pricing_dir is not None and report.written and output is None:
        echo_prose(
            "Note: ",
            f"--pricing-dir/COSTGUARD_PRICING_DIR is set, so estimates keep using "
            f"{settings.pricing_dir}, not the refreshed cache.",
            err=True,
        )
    for done in report.providers:
        if done.ok and done.missing:
            echo_prose(
                "Warning: ",
                f"{done.provider}: no prices came back for {', '.join(done.missing)}: "
                "kept as they were, with their date",
                err=True,
            )
        if done.ok and done.partial:
            echo_prose(
                "Warning: ",
                f"{done.provider}: the answer for {', '.join(done.partial)} is "
                "incomplete (a page names a next page that is not there): the rows it prices "
                "are updated, no other row is marked not listed, the region keeps its date",
                err=True,
            )
    for failure in report.failed:
        assert failure.error is not None
        echo_prose(
            "Error: ",
            visible(f"{failure.provider}: {failure.error.message}"),
            err=True,
            fg="red",
        )
        if failure.error.hint:
            echo_prose("Hint: ", visible(failure.error.hint), err=True)
    if report.failed:
        ctx.exit(EXIT_FAILURE)


def _skip_the_last_collections() -> None:
    """Freeze the heap when the interpreter exits, so that its last garbage collections
    skip it.

    A refresh imports the cloud SDKs (gRPC, protobuf, google-auth: hundreds of thousands
    of objects), and the collections the interpreter runs on its way out then cost more
    than reading a provider's prices (measured: ~0.5 s of a ~3 s refresh). The process
    is ending and the system frees its memory; the caches are written and synced before
    this. Registered once, however many refreshes a process runs (tests run many).
    """
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)


@contextmanager
def _progress_bar(plan: RefreshPlan) -> Iterator[Progress | None]:
    """A spinner per provider with the records read so far, on a terminal only."""
    if not render.is_terminal(sys.stderr):
        yield None
        return
    from rich.progress import Progress as Bar
    from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.completed:,} records"),
        TimeElapsedColumn(),
    )
    with Bar(*columns, console=render.console(stderr=True), transient=True) as bar:
        tasks = {
            t.provider: bar.add_task(f"{t.provider} ({len(t.regions)} region(s))", total=None)
            for t in plan.targets
        }
        yield lambda provider, records: bar.update(tasks[provider], completed=records)


def _refresh_document(report: RefreshReport) -> dict[str, Any]:
    return {
        "output": str(report.output),
        "written": report.written,
        "refreshed_at": report.refreshed_at.isoformat(),
        "providers": [
            {
                "provider": p.provider,
                "status": "refreshed" if p.ok else "failed",
                "regions": list(p.regions),
                "regions_without_prices": list(p.missing),
                "regions_incomplete": list(p.partial),
                "records": p.records,
                "rows_updated": p.stats.updated if p.stats else 0,
                "rows_not_found": p.stats.not_found if p.stats else 0,
                "rows_kept": p.stats.kept if p.stats else 0,
                "seconds": round(p.seconds, 3),
                "source": p.source or None,
                "error": p.error.message if p.error else None,
                "hint": p.error.hint if p.error else None,
            }
            for p in report.providers
        ],
        "tables": [
            {"table": t.name, "as_of": t.as_of.isoformat(), "source": t.source}
            for t in report.tables
        ],
        "interruptions": None
        if report.interruptions is None
        else {
            "rows": len(report.interruptions.rows),
            "as_of": report.interruptions.as_of.isoformat(),
            "source": report.interruptions.source,
        },
    }


def _print_refresh(report: RefreshReport) -> None:
    rows = [
        {
            "provider": p.provider,
            "status": "refreshed" if p.ok else "FAILED",
            "regions": ", ".join(p.regions),
            "records": p.records,
            "updated": p.stats.updated if p.stats else "-",
            "not found": p.stats.not_found if p.stats else "-",
            "kept": p.stats.kept if p.stats else "-",
            "source": p.source or (p.error.message if p.error else ""),
        }
        for p in report.providers
    ]
    title = (
        f"Price tables refreshed into {report.output}"
        if report.written
        else f"Nothing written: {report.output} is as it was"
    )
    if rows:
        _print_rows(title, list(rows[0]), rows)
    else:
        click.echo(title)
    if report.interruptions is not None:
        table = report.interruptions
        click.echo(
            f"Spot interruption bands: {len(table.rows)} rows as of {table.as_of} "
            "(interruptions.csv, from the Spot Instance Advisor's file)"
        )
    if not report.written or not report.providers:
        return
    render.print_notes(
        [
            "updated: rows with a price read just now; kept: rows that API does not price "
            "(TPUs), left as they were",
            "not found: rows the API did not list; their old price is kept and flagged "
            "unverified (`costguard pricing show gpu_instances --unverified`)",
            "storage, transfer and regions: kept as they were (refresh updates instance "
            "prices only); providers and regions not refreshed (regions: those refreshed, "
            "with prices read) keep their rows and dates",
        ],
        heading="Notes:",
    )
