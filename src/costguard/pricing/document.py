"""An estimate as plain records, the shape ``--format json`` and ``--format csv`` print
and the notebook API returns: one flat row per option, and the whole document with the
question, the tables' dates and every assumption. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from costguard.pricing.advice import budget_verdict
from costguard.pricing.catalog import (
    SLURM,
    Catalog,
    Place,
    Staleness,
    as_of_text,
    price_date,
    prices_as_of,
    stale_summary,
)
from costguard.pricing.estimate import CostOption, Estimate, EstimateRequest

if TYPE_CHECKING:
    from costguard.pricing.slurm import SlurmOption, SlurmRate

#: The columns of one option, in order (CSV header, JSON keys).
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
#: The extra columns of the SLURM allocation's CSV row.
SLURM_FIELDS = ("service_units", "su_per_gpu_hour", "usd_per_su", "gpu_hours")


def places(options: Sequence[CostOption]) -> list[Place]:
    """The (table, provider, region, market, instance type) each option was priced from."""
    return [
        (
            "gpu_instances" if o.accelerator else "cpu_instances",
            o.provider,
            o.region,
            o.market,
            o.instance_type,
        )
        for o in options
    ]


#: The mark of a table row priced as of another date than the table's title.
OTHER_DATE_MARK = "^"


def header_as_of(catalog: Catalog, shown: Sequence[CostOption]) -> date | None:
    """The date a table of ``shown`` options is titled with: the date most of their
    prices carry (the older on a tie; ``None``: unknown); rows of another date are
    marked (:func:`dated_apart`). The JSON's ``pricing_as_of`` stays the oldest."""
    counts: dict[date | None, int] = {}
    for place in places(shown):
        day = price_date(catalog, place)
        counts[day] = counts.get(day, 0) + 1
    if not counts:
        return prices_as_of(catalog, [])
    return max(counts, key=lambda d: (counts[d], d is not None, -(d.toordinal() if d else 0)))


def dated_apart(
    catalog: Catalog, shown: Sequence[CostOption], header: date | None
) -> tuple[list[CostOption], str | None]:
    """The options of ``shown`` priced as of another date than ``header``, and the note
    that says so under the table (``None`` when there are none)."""
    apart = [o for o in shown if price_date(catalog, places([o])[0]) != header]
    if not apart:
        return [], None
    by_date: dict[str, list[str]] = {}
    for option in apart:
        day = as_of_text(price_date(catalog, places([option])[0]))
        by_date.setdefault(day, []).append(f"{option.market}")
    said = "; ".join(
        f"{len(markets)} {' and '.join(sorted(set(markets)))} price(s) of "
        + ("no known date" if day == "unknown" else day)
        for day, markets in sorted(by_date.items())
    )
    note = (
        f"{OTHER_DATE_MARK} priced as of another date than the title's "
        f"{as_of_text(header)}: {said}; `costguard pricing show gpu_instances` gives each "
        "row's date and source"
    )
    return apart, note


def stale_text(stale: Staleness | None, catalog: Catalog, today: date | None = None) -> str | None:
    """The staleness warning, without its prefix and hint; ``None`` when fresh: how many
    of the prices shown are old and from when (:func:`stale_summary`)."""
    if stale is None:
        return None
    today = today or datetime.now(UTC).date()
    return f"{stale_summary(stale, today)} ({catalog.origin} tables)"


def option_row(
    option: CostOption,
    catalog: Catalog,
    budget: Decimal | None = None,
    hours: Decimal | None = None,
) -> dict[str, Any]:
    """One option as a flat record (JSON object or CSV row).

    ``price_as_of`` (and, as before, ``pricing_as_of``) is the as-of date of its price
    (its row's date for its market, ``unknown`` where no source gives one), so a region
    refreshed today says today; ``part_prices_as_of`` the date of each storage and
    transfer price it pays (``block_storage``, ``object_storage``, ``internet_egress``,
    ``data_transfer``), which a refresh keeps as the tables have them. With a ``budget``: whether
    the option fits it, and the hours it buys.
    """
    row: dict[str, Any] = {name: getattr(option, name) for name in OPTION_FIELDS}
    row["market"] = str(option.market)
    row["price_status"] = str(option.price_status) if option.price_status else None
    row["notes"] = list(option.notes)
    as_of = as_of_text(price_date(catalog, places([option])[0]))
    row["price_as_of"] = as_of
    row["pricing_as_of"] = as_of
    # The date of each storage or transfer price its figures use (the parts it pays for).
    row["part_prices_as_of"] = {part.part: part.rate.as_of.isoformat() for part in option.parts}
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
        "pricing_as_of": as_of_text(prices_as_of(catalog, places(shown))),
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


def result_data_url(result: Estimate) -> str | None:
    """How the data's region was found (the ``Data:`` note), for the JSON query."""
    return next((n.removeprefix("Data: ") for n in result.notes if n.startswith("Data: ")), None)


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
    from costguard.pricing.slurm import slurm_comparison

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
