"""``costguard estimate``: what a run will cost, before you run it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import click

from costguard.cli import render
from costguard.cli.params import FORMAT, DecimalRange, Name, Url, WholeNumber
from costguard.errors import BudgetExceededError, InputError
from costguard.money import format_usd
from costguard.pricing.advice import (
    budget_lines,
    budget_verdict,
    cheapest_line,
    expand_regions,
    split_names,
    spot_size_notes,
)
from costguard.pricing.catalog import (
    Catalog,
    Market,
    PriceStatus,
    Staleness,
    check_provider,
    prices_as_of,
    staleness,
)
from costguard.pricing.estimate import (
    DEFAULT_DISK_GB,
    CostOption,
    Estimate,
    EstimateRequest,
    estimate,
    limit_places,
)
from costguard.pricing.gpus import canonical_gpu
from costguard.pricing.locate import locate
from costguard.pricing.slurm import (
    SLURM,
    SlurmOption,
    SlurmRate,
    format_su,
    slurm_assumptions,
    slurm_comparison,
    slurm_option,
)
from costguard.pricing.tables import load_tables
from costguard.settings import Settings

MAX_HOURS = 24 * 366 * 10
MAX_COUNT = 100_000
MAX_GB = 10**9

OPTION_FIELDS = (
    "provider",
    "region",
    "instance_type",
    "accelerator",
    "gpus_per_instance",
    "market",
    "usd_per_hour",
    "price_status",
    "compute_usd",
    "block_storage_usd",
    "object_storage_usd",
    "storage_usd",
    "internet_egress_usd",
    "data_transfer_usd",
    "egress_usd",
    "total_usd",
    "notes",
)

EXAMPLES = """
\b
Examples:
  costguard estimate --gpu a10g --hours 8 --count 4
  costguard estimate --gpu h100 --gpus-per-instance 8 --hours 24 --spot --format json
  costguard estimate --gpu l4 --hours 10 --data-region us-east-1 --data-gb 500
  costguard estimate --instance-type g5.xlarge --region us-east-1 --hours 8 --budget 50
  costguard estimate --gpu a100 --hours 24 --provider slurm --su-per-gpu-hour 64 \\
      --su-budget 50000            # an ACCESS allocation next to every cloud
  costguard estimate --gpu a100 --hours 24 --provider slurm --provider aws \\
      --su-per-gpu-hour 64 --usd-per-su 0.02
  costguard estimate --gpu a100 --gpus-per-instance 4 --count 10 --hours 2 \\
      --provider slurm --su-per-gpu-hour 64   # a 10-task array, 4 GPUs each
"""

SLURM_FIELDS = ("service_units", "su_per_gpu_hour", "usd_per_su", "gpu_hours")


@click.command(
    "estimate",
    epilog=EXAMPLES,
    short_help="Estimate what a GPU run costs, across providers, regions and markets.",
)
@click.option(
    "--gpu",
    "gpus",
    multiple=True,
    type=Name(),
    help="GPU model: a10g, l4, t4, a100, a100-80gb, h100, h200, l40s, b200... Several: "
    "--gpu l4,t4 (or --gpu repeated) prices each.",
)
@click.option(
    "--hours",
    required=True,
    type=DecimalRange(0, minimum_open=True, maximum=MAX_HOURS, unit="hours (10 years)"),
    help="Hours each instance runs.",
)
@click.option(
    "--count",
    default=1,
    show_default=True,
    type=WholeNumber(1, MAX_COUNT),
    help="Number of instances; with --provider slurm, nodes (slurm script --nodes) or "
    "the runs of a sweep (slurm script --array 0-9: --count 10), each --hours long.",
)
@click.option(
    "--gpus-per-instance",
    default=1,
    show_default=True,
    type=WholeNumber(1, 64),
    help="Only instances with this many GPUs.",
)
@click.option(
    "--provider",
    "providers",
    type=Name(),
    multiple=True,
    help="aws, gcp, azure or slurm (repeatable). Default: all clouds. slurm (with "
    "--su-per-gpu-hour) adds a SLURM allocation next to the clouds named, or all of them.",
)
@click.option(
    "--region",
    "regions",
    type=Name(),
    multiple=True,
    help="Region (repeatable), e.g. us-east-1, us-central1, eastus, or a group: europe, "
    "us, asia (every region of the tables there). Default: all.",
)
@click.option(
    "--instance-type",
    type=Name(),
    help="One instance type, e.g. g5.xlarge (then --gpu is optional).",
)
@click.option(
    "--spot/--on-demand",
    "spot",
    default=None,
    help="Only spot, or only on-demand. Default: both, side by side.",
)
@click.option(
    "--disk-gb",
    type=DecimalRange(0, maximum=MAX_GB),
    default=DEFAULT_DISK_GB,
    show_default=True,
    help="Block storage per instance, in GB.",
)
@click.option(
    "--storage-gb",
    type=DecimalRange(0, maximum=MAX_GB),
    default=Decimal(0),
    help="Object storage (bucket) next to the compute, in GB.",
)
@click.option(
    "--storage-months",
    type=DecimalRange(0, maximum=1200),
    default=Decimal(1),
    show_default=True,
    help="How long the object storage is kept.",
)
@click.option(
    "--egress-gb",
    type=DecimalRange(0, maximum=MAX_GB),
    default=Decimal(0),
    help="Data sent out to the internet, in GB (in total).",
)
@click.option(
    "--data",
    "data_url",
    type=Url(),
    help="Your input data's URL (s3://, gs://, az:// or https): its region is looked up "
    "(S3 answers in seconds; well-known public datasets offline) to price moving it.",
)
@click.option(
    "--data-region",
    type=Name(),
    help="Where your input data is stored, e.g. us-east-1 or gcp:us-central1.",
)
@click.option(
    "--data-gb",
    type=DecimalRange(0, maximum=MAX_GB),
    default=Decimal(0),
    help="GB read from --data-region, in total over all instances.",
)
@click.option(
    "--budget",
    type=DecimalRange(0, minimum_open=True, maximum=10**9),
    help="USD: says for each option whether it fits and how many hours it buys; "
    "exit 1 if even the cheapest option costs more.",
)
@click.option(
    "--su-per-gpu-hour",
    type=DecimalRange(0, minimum_open=True, maximum=10**9),
    help="With --provider slurm: service units your cluster charges per GPU-hour.",
)
@click.option(
    "--su-budget",
    type=DecimalRange(0, minimum_open=True, maximum=10**15),
    help="With --provider slurm: SUs left in the allocation; exit 1 if the run needs more.",
)
@click.option(
    "--usd-per-su",
    type=DecimalRange(0, maximum=10**6),
    help="With --provider slurm: what one SU is worth in USD (else: not billed).",
)
@click.option(
    "--top",
    default=10,
    show_default=True,
    type=WholeNumber(0, 10_000),
    help="Show the N cheapest provider/regions (0: all).",
)
@click.option(
    "--format",
    "output_format",
    type=FORMAT,
    default="table",
    show_default=True,
    help="table for people, json or csv for scripts.",
)
@click.option(
    "--no-stale-warning",
    is_flag=True,
    help="Do not warn when the prices used are old (COSTGUARD_STALE_WARNING=0 for always).",
)
@click.pass_obj
def estimate_command(settings: Settings, /, **options: Any) -> None:
    """Estimate a GPU run: price x hours x count + storage + egress, cheapest first.

    Works offline, from the fresher of the tables bundled with costguard and those
    `costguard pricing refresh` wrote, and says which. On-demand and spot are shown side
    by side for the cheapest instance in each provider and region, and every figure
    says what it assumes. Prices older than 30 days (spot: 7) draw a warning.
    """
    rate = slurm_rate(options)
    catalog = load_tables(settings.pricing_dir, settings.pricing_cache_dir)
    results = estimates(catalog, options)
    result = combine(results)
    request = result.request
    slurm = slurm_option(request, rate) if rate is not None else None
    shown = limit_places(result.options, options["top"])
    budget: Decimal | None = options["budget"]
    stale = staleness(catalog, places(shown), datetime.now(UTC).date())
    output_format = options["output_format"].lower()
    if output_format == "json":
        document = to_document(result, shown, catalog, budget, options["top"])
        document["query"]["gpus"] = [r.request.gpu for r in results if r.request.gpu]
        document["cheapest"] = cheapest_line(result.options)
        document["pricing_source"]["stale_warning"] = stale_text(stale, catalog)
        document["query"]["slurm"] = slurm_query(rate)
        document["slurm"] = slurm_document(slurm, result.cheapest)
        if slurm is not None:
            document["assumptions"].extend(slurm_assumptions(slurm))
        render.print_json(document)
    elif output_format == "csv":
        columns = (*OPTION_FIELDS, "pricing_as_of", *(SLURM_FIELDS if slurm else ()))
        rows = [option_row(o, catalog) for o in shown]
        if slurm is not None:
            rows.append(slurm_row(slurm, request))
        render.print_csv(columns, rows)
        extra = slurm_assumptions(slurm) if slurm else ()
        render.print_notes([*result.notes, *result.assumptions, *extra], err=True)
    else:
        for one in results:  # one table per GPU asked for; the assumptions once, at the end
            shown_one = limit_places(one.options, options["top"])
            last = one is results[-1]
            print_table(one, shown_one, catalog, slurm if last else None, assumptions=last)
        print_answers(result, catalog, budget)
    if stale is not None and settings.stale_warning and not options["no_stale_warning"]:
        render.print_prose(
            f"{stale_text(stale, catalog)}: `costguard pricing refresh` updates them "
            "(--no-stale-warning hides this)",
            first="Warning: ",
            indent="  ",
            err=True,
        )
    cheapest = result.cheapest
    if budget is not None and cheapest is not None and cheapest.total_usd > budget:
        msg = (
            f"the cheapest option ({cheapest.provider} {cheapest.region} "
            f"{cheapest.instance_type} {cheapest.market}, {format_usd(cheapest.total_usd)}) "
            f"is over the budget of {format_usd(budget)}"
        )
        raise BudgetExceededError(
            msg, hint="fewer hours or instances, spot, a smaller GPU, or a bigger budget"
        )
    if slurm is not None and slurm.within_budget is False:
        msg = (
            f"the SLURM run needs {format_su(slurm.service_units)} SU, more than the "
            f"--su-budget of {format_su(slurm.rate.su_budget or Decimal(0))} SU"
        )
        raise BudgetExceededError(
            msg, hint="fewer hours or GPUs, a supplement to the allocation, or the cloud"
        )


def slurm_rate(options: dict[str, Any]) -> SlurmRate | None:
    """The SLURM rate when --provider slurm is asked for; exit 2 on a half-given one."""
    wanted = any(p.strip().lower() == SLURM for p in options["providers"])
    given = [
        flag
        for flag, name in (
            ("--su-per-gpu-hour", "su_per_gpu_hour"),
            ("--su-budget", "su_budget"),
            ("--usd-per-su", "usd_per_su"),
        )
        if options[name] is not None
    ]
    if not wanted:
        if given:
            msg = f"{given[0]} is for SLURM allocations, and --provider slurm is not asked for"
            raise InputError(msg, hint=f"add --provider slurm, or drop {given[0]}")
        return None
    if options["su_per_gpu_hour"] is None:
        msg = "--provider slurm needs --su-per-gpu-hour (allocations are counted in SUs)"
        raise InputError(
            msg,
            hint="your centre publishes it, e.g. --su-per-gpu-hour 64 (a GPU-hour costs 64 SU)",
        )
    return SlurmRate(
        su_per_gpu_hour=options["su_per_gpu_hour"],
        usd_per_su=options["usd_per_su"],
        su_budget=options["su_budget"],
    )


def slurm_query(rate: SlurmRate | None) -> dict[str, Any] | None:
    """The SLURM part of the JSON ``query``."""
    if rate is None:
        return None
    return {
        "su_per_gpu_hour": rate.su_per_gpu_hour,
        "usd_per_su": rate.usd_per_su,
        "su_budget": rate.su_budget,
    }


def slurm_document(slurm: SlurmOption | None, cheapest: CostOption | None) -> dict[str, Any] | None:
    """The SLURM allocation in the JSON document: SUs, and dollars only when given."""
    if slurm is None:
        return None
    return {
        "provider": SLURM,
        "accelerator": slurm.accelerator,
        "gpus": slurm.gpus,
        "hours": slurm.hours,
        "gpu_hours": slurm.gpu_hours,
        "su_per_gpu_hour": slurm.rate.su_per_gpu_hour,
        "service_units": slurm.service_units,
        "su_budget": slurm.rate.su_budget,
        "su_budget_share": slurm.budget_share,
        "within_su_budget": slurm.within_budget,
        "billed": slurm.usd is not None,
        "usd_per_su": slurm.rate.usd_per_su,
        "total_usd": slurm.usd,
        "cheapest_cloud_total_usd": cheapest.total_usd if cheapest else None,
        "notes": [slurm_comparison(slurm, cheapest)],
    }


def slurm_row(slurm: SlurmOption, request: EstimateRequest) -> dict[str, Any]:
    """The SLURM allocation as one more CSV row (money columns empty when not billed)."""
    usd = slurm.usd
    per_hour = None
    if slurm.rate.usd_per_su is not None:
        per_hour = slurm.rate.su_per_gpu_hour * request.gpus_per_instance * slurm.rate.usd_per_su
    row: dict[str, Any] = dict.fromkeys((*OPTION_FIELDS, "pricing_as_of"))
    row.update(
        {
            "provider": SLURM,
            "region": "allocation",
            "accelerator": slurm.accelerator,
            "gpus_per_instance": request.gpus_per_instance,
            "market": "allocation",
            "usd_per_hour": per_hour,
            "compute_usd": usd,
            "total_usd": usd,
            "notes": ["allocation, not billed" if usd is None else "SUs valued at --usd-per-su"],
            "service_units": slurm.service_units,
            "su_per_gpu_hour": slurm.rate.su_per_gpu_hour,
            "usd_per_su": slurm.rate.usd_per_su,
            "gpu_hours": slurm.gpu_hours,
        }
    )
    return row


def build_request(catalog: Catalog, options: dict[str, Any]) -> EstimateRequest:
    """Validate names against the tables and build the request (no cloud call)."""
    clouds = [p for p in options["providers"] if p.strip().lower() != SLURM]
    providers = tuple(dict.fromkeys(check_provider(p) for p in clouds))
    regions = []
    for name in options["regions"]:
        group = expand_regions(name, catalog.regions)
        if group == []:
            msg = f"the tables have no region in {name}"
            raise InputError(msg, hint="costguard pricing show lists the regions")
        for region in group or [catalog.find_region(name)]:
            if providers and region.provider not in providers:
                if group is not None:
                    continue  # a group stays within the providers asked for
                providers = (*providers, region.provider)
            regions.append(region.name)
    if options["regions"] and not regions:
        msg = f"none of the regions {', '.join(options['regions'])} is of {', '.join(providers)}"
        raise InputError(msg, hint="drop --provider, or name another region")
    gpu = options["gpu"]
    spot = options["spot"]
    markets = (
        (Market.ON_DEMAND, Market.SPOT)
        if spot is None
        else ((Market.SPOT,) if spot else (Market.ON_DEMAND,))
    )
    data_region = options["data_region"]
    return EstimateRequest(
        hours=options["hours"],
        count=options["count"],
        gpu=canonical_gpu(gpu, catalog.accelerators) if gpu else None,
        gpus_per_instance=options["gpus_per_instance"],
        instance_type=options["instance_type"],
        providers=providers,
        regions=tuple(dict.fromkeys(regions)),
        markets=markets,
        disk_gb=options["disk_gb"],
        storage_gb=options["storage_gb"],
        storage_months=options["storage_months"],
        egress_gb=options["egress_gb"],
        data_region=catalog.find_region(data_region) if data_region else None,
        data_gb=options["data_gb"],
    )


def estimates(catalog: Catalog, options: dict[str, Any]) -> list[Estimate]:
    """One estimate per GPU asked for (``--gpu l4,t4``), or the one for the instance
    type. A GPU not offered where asked is left out when another is (the first such
    error is raised when none is)."""
    names: list[str | None] = [*split_names(options["gpus"])] or [None]
    located = None
    if options["data_url"] and not options["data_region"]:
        # Bad input is refused before the lookup goes out.
        build_request(catalog, {**options, "gpu": names[0], "data_gb": Decimal(0)})
        located = locate(options["data_url"])
        options = {**options, "data_region": f"{located.provider}:{located.region}"}
    results: list[Estimate] = []
    errors: list[InputError] = []
    for name in names:
        request = build_request(catalog, {**options, "gpu": name})
        try:
            results.append(estimate(request, catalog))
        except InputError as exc:
            if len(names) == 1:
                raise
            errors.append(exc)
    if not results:
        raise errors[0]
    extra = []
    if located is not None:
        extra.append(f"Data: {located.how}")
    if options["data_url"] and not options["data_gb"]:
        extra.append("Give --data-gb (how much of the data the run reads) to price moving it")
    return [replace(r, notes=(*extra, *r.notes)) for r in results]


def combine(results: Sequence[Estimate]) -> Estimate:
    """Several GPUs' estimates as one: every option, cheapest first."""
    if len(results) == 1:
        return results[0]
    first = results[0]
    options = sorted((o for r in results for o in r.options), key=lambda o: o.sort_key)
    near = [r.near_data for r in results if r.near_data is not None]
    notes = dict.fromkeys(n for r in results for n in r.notes)
    return replace(
        first,
        options=tuple(options),
        near_data=min(near, key=lambda o: o.sort_key) if near else None,
        notes=tuple(notes),
    )


def result_data_url(result: Estimate) -> str | None:
    """How the data's region was found (the ``Data:`` note), for the JSON query."""
    return next((n.removeprefix("Data: ") for n in result.notes if n.startswith("Data: ")), None)


def print_answers(result: Estimate, catalog: Catalog, budget: Decimal | None) -> None:
    """The lines under the table(s): the cheapest option, why a spot pick is bigger, and
    with --budget, whether each option fits and how many hours the budget buys."""
    lines = [line for line in (cheapest_line(result.options),) if line]
    lines += spot_size_notes(result.options, catalog)
    render.print_notes(lines, heading="Answers:")
    if budget is not None:
        render.print_notes(
            budget_lines(result.options, budget, result.request.hours),
            heading=f"Budget {format_usd(budget)}:",
        )


def places(options: Sequence[CostOption]) -> list[tuple[str, str, str, Market]]:
    """The (table, provider, region, market) each option was priced from."""
    return [
        ("gpu_instances" if o.accelerator else "cpu_instances", o.provider, o.region, o.market)
        for o in options
    ]


def stale_text(stale: Staleness | None, catalog: Catalog) -> str | None:
    """The staleness warning, without its prefix and hint; ``None`` when fresh."""
    if stale is None:
        return None
    what = "spot prices" if stale.spot_only else "prices"
    return (
        f"the {what} used are {stale.age_days} days old "
        f"({catalog.origin} tables, as of {stale.as_of.isoformat()})"
    )


def option_row(
    option: CostOption,
    catalog: Catalog,
    budget: Decimal | None = None,
    hours: Decimal | None = None,
) -> dict[str, Any]:
    """One option as a flat record (JSON object or CSV row).

    ``pricing_as_of`` is the as-of date of the table part (provider and region) its
    price came from, so a region refreshed today says today. With a ``budget``: whether
    the option fits it, and the hours it buys.
    """
    row: dict[str, Any] = {name: getattr(option, name) for name in OPTION_FIELDS}
    row["market"] = str(option.market)
    row["price_status"] = str(option.price_status) if option.price_status else None
    row["notes"] = list(option.notes)
    row["pricing_as_of"] = prices_as_of(catalog, places([option])).isoformat()
    if budget is not None and hours is not None:
        verdict = budget_verdict(option, budget, hours)
        row["within_budget"] = verdict.fits
        row["hours_within_budget"] = verdict.hours
    return row


def to_document(
    result: Estimate,
    shown: Sequence[CostOption],
    catalog: Catalog,
    budget: Decimal | None,
    top: int,
) -> dict[str, Any]:
    """The ``--format json`` document: query, pricing_as_of, assumptions, options.

    ``pricing_as_of`` is the oldest as-of date of the prices of the options shown (the
    instance tables' oldest date when none is shown); each option has its own
    ``pricing_as_of``, and ``pricing_source.tables`` the date of each whole table.
    """
    request = result.request
    options = [option_row(option, catalog, budget, request.hours) for option in shown]
    cheapest = result.cheapest
    return {
        "query": {
            "gpu": request.gpu,
            "instance_type": request.instance_type,
            "hours": request.hours,
            "count": request.count,
            "gpus_per_instance": request.gpus_per_instance,
            "providers": list(request.providers),
            "regions": list(request.regions),
            "markets": [str(m) for m in request.markets],
            "disk_gb": request.disk_gb,
            "storage_gb": request.storage_gb,
            "storage_months": request.storage_months,
            "egress_gb": request.egress_gb,
            "data_region": str(request.data_region) if request.data_region else None,
            "data": result_data_url(result),
            "data_gb": request.data_gb,
            "budget_usd": budget,
            "top": top,
        },
        "pricing_as_of": prices_as_of(catalog, places(shown)).isoformat(),
        "pricing_source": {
            "origin": catalog.origin,
            "directory": str(catalog.directory),
            "tables": {
                name: {
                    "as_of": info.as_of.isoformat(),
                    "refreshed_at": (info.refreshed_at.isoformat() if info.refreshed_at else None),
                    "source": info.source,
                }
                for name, info in catalog.tables.items()
            },
        },
        "assumptions": list(result.assumptions),
        "notes": list(result.notes),
        "within_budget": None
        if budget is None or cheapest is None
        else cheapest.total_usd <= budget,
        "options_total": len(result.options),
        "near_data": option_row(result.near_data, catalog) if result.near_data else None,
        "options": options,
    }


def print_table(
    result: Estimate,
    shown: Sequence[CostOption],
    catalog: Catalog,
    slurm: SlurmOption | None = None,
    *,
    assumptions: bool = True,
) -> None:
    """Two rows per provider and region, on-demand above spot, cheapest place first.

    A narrow terminal loses the compute, storage and egress columns (the total keeps
    them), never a price, a total, an instance or a region. A SLURM allocation gets its
    own table right below, in service units, and a line that sets it against the
    cheapest cloud option.
    """
    request = result.request
    markets = request.markets
    by_place: dict[tuple[str, str], dict[Market, CostOption]] = {}
    for shown_option in shown:
        by_place.setdefault((shown_option.provider, shown_option.region), {})[
            shown_option.market
        ] = shown_option
    what = request.gpu or request.instance_type
    per_instance = "" if request.instance_type else f" x {request.gpus_per_instance} per instance"
    # The oldest of the prices shown: after a partial refresh, not the oldest region's.
    as_of = prices_as_of(catalog, places(shown)).isoformat()
    title = (
        f"{what}{per_instance}, {request.count} instance(s), {request.hours} h"
        f" - {catalog.origin} prices as of {as_of}"
    )
    columns = (
        render.Column("Where"),
        render.Column("Market"),
        render.Column("Instance"),
        render.Column("$/h", "right"),
        render.Column("Compute", "right", drop=1),
        render.Column("Total", "right"),
        render.Column("Storage", "right", drop=2),
        render.Column("Egress", "right", drop=3),
    )
    rows: list[list[str]] = []
    flagged = False
    for (provider, region), by_market in by_place.items():
        where = f"{provider} {region}"
        for market in markets:
            option = by_market.get(market)
            if option is None:
                rows.append([where, str(market), "-", "-", "-", "-", "-", "-"])
            else:
                mark = "*" if option.price_status is PriceStatus.UNVERIFIED else ""
                flagged = flagged or bool(mark)
                rows.append(
                    [
                        where,
                        str(market),
                        option.instance_type,
                        format_usd(option.usd_per_hour, rate=True) + mark,
                        format_usd(option.compute_usd),
                        format_usd(option.total_usd),
                        format_usd(option.storage_usd),
                        format_usd(option.egress_usd),
                    ]
                )
            where = ""
    render.print_table(title, columns, rows)
    hidden = len({(o.provider, o.region) for o in result.options}) - len(by_place)
    if hidden > 0:
        click.echo(f"({hidden} more region(s): --top 0 shows all)")
    notes = list(result.notes)
    if flagged:
        notes.append(
            "* unverified price (suspect in the source, or not read from one): "
            "`costguard pricing show gpu_instances --unverified` gives the reasons"
        )
    if slurm is not None:
        print_slurm_table(slurm)
        notes.append(slurm_comparison(slurm, result.cheapest))
    render.print_notes(notes, heading="Notes:")
    if not assumptions:
        return
    extra = slurm_assumptions(slurm) if slurm is not None else ()
    render.print_notes(
        ["total = compute + storage + egress", *result.assumptions, *extra],
        heading="Assumptions:",
    )


def print_slurm_table(slurm: SlurmOption) -> None:
    """The SLURM allocation: GPU-hours, service units, and dollars only when given."""
    rate = slurm.rate
    title = (
        f"SLURM allocation: {slurm.gpus} x {slurm.accelerator} GPU(s), {slurm.hours} h "
        "- counted in service units (SU)"
    )
    columns = [
        render.Column("Provider"),
        render.Column("GPU-hours", "right"),
        render.Column("SU/GPU-h", "right"),
        render.Column("Service units", "right"),
    ]
    cells = [SLURM, format_su(slurm.gpu_hours), format_su(rate.su_per_gpu_hour)]
    cells.append(format_su(slurm.service_units))
    if rate.su_budget is not None:
        columns.append(render.Column("Of allocation", "right"))
        share = slurm.budget_share or Decimal(0)
        cells.append(f"{share * 100:.1f}% of {format_su(rate.su_budget)}")
    columns.append(render.Column("USD", "right"))
    if slurm.usd is None:
        cells.append("allocation, not billed")
    else:
        usd_per_su = format_usd(rate.usd_per_su or Decimal(0), rate=True)
        cells.append(f"{format_usd(slurm.usd)} (at {usd_per_su}/SU)")
    render.print_table(title, columns, [cells])
