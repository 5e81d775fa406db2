"""Answers to the questions people ask of an estimate, beside the table. Pure: no I/O.

* Which GPUs: ``--gpu l4,t4`` (or ``--gpu`` repeated) prices each (:func:`split_names`).
* Where: ``--region europe`` (a continent, or ``us``/``eu``/``apac``) stands for every
  region of the tables on it (:func:`expand_regions`).
* "I have $50": for each option, whether it fits and how many hours the budget buys
  (:func:`budget_verdict`).
* Which is cheapest (:func:`cheapest_line`), and why the spot pick is sometimes a bigger
  instance than the on-demand one (:func:`spot_size_notes`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from decimal import ROUND_FLOOR, Decimal
from typing import NamedTuple

from costguard.money import format_usd
from costguard.pricing.catalog import Catalog, InstancePrice, Market, Region
from costguard.pricing.estimate import CostOption, Estimate, cheaper_unverified, cheapest_of

#: Names for a group of regions (a continent of ``regions.csv``), as people type them.
REGION_GROUPS: dict[str, str] = {
    "us": "north-america",
    "usa": "north-america",
    "na": "north-america",
    "america": "north-america",
    "north-america": "north-america",
    "northamerica": "north-america",
    "canada": "north-america",
    "eu": "europe",
    "europe": "europe",
    "uk": "europe",
    "asia": "asia",
    "apac": "asia",
    "asia-pacific": "asia",
    "south-america": "south-america",
    "latam": "south-america",
    "oceania": "oceania",
    "australia": "oceania",
    "africa": "africa",
    "middle-east": "middle-east",
    "me": "middle-east",
}


def split_names(values: Iterable[str]) -> list[str]:
    """``--gpu l4,t4 --gpu a10g`` as a list, each once, in order.

    >>> split_names(["l4,t4", "a10g", "L4", " "])
    ['l4', 't4', 'a10g']
    """
    names: dict[str, str] = {}
    for value in values:
        for part in value.split(","):
            name = part.strip()
            if name:
                names.setdefault(name.lower(), name)
    return list(names.values())


def expand_regions(name: str, regions: Sequence[Region]) -> list[Region] | None:
    """The regions a group name stands for (``europe``, ``us``, ``asia``...), or
    ``None`` when ``name`` is not a group (then it names one region).

    >>> from costguard.pricing.tables import load_catalog
    >>> sorted(r.name for r in expand_regions("eu", load_catalog().regions) or [])[:2]
    ['eu-central-1', 'eu-central-2']
    """
    continent = REGION_GROUPS.get(name.strip().lower().replace("_", "-").replace(" ", "-"))
    if continent is None:
        return None
    return [r for r in regions if r.continent == continent]


class BudgetVerdict(NamedTuple):
    """Whether an option fits a budget, and how many hours the budget buys."""

    fits: bool
    hours: Decimal  # hours each instance could run within the budget (0: not even that)


def budget_verdict(option: CostOption, budget_usd: Decimal, hours: Decimal) -> BudgetVerdict:
    """Whether ``option`` fits ``budget_usd``, and the hours (to 0.1 h, rounded down) the
    budget buys: compute and block storage grow with the hours, object storage and
    transfers do not.

    >>> from costguard.pricing.estimate import EstimateRequest, estimate
    >>> from costguard.pricing.tables import load_catalog
    >>> request = EstimateRequest(instance_type="g5.xlarge", hours=Decimal(10),
    ...                           regions=("us-east-1",), markets=(Market.ON_DEMAND,),
    ...                           disk_gb=Decimal(0))
    >>> option = estimate(request, load_catalog()).options[0]
    >>> budget_verdict(option, Decimal(50), Decimal(10))
    BudgetVerdict(fits=True, hours=Decimal('49.7'))
    """
    per_hour = (option.compute_usd + option.block_storage_usd) / hours
    fixed = option.total_usd - option.compute_usd - option.block_storage_usd
    left = budget_usd - fixed
    affordable = Decimal(0) if left <= 0 or per_hour <= 0 else left / per_hour
    return BudgetVerdict(
        fits=option.total_usd <= budget_usd,
        hours=affordable.quantize(Decimal("0.1"), rounding=ROUND_FLOOR),
    )


def budget_lines(
    options: Sequence[CostOption], budget_usd: Decimal, hours: Decimal, *, limit: int = 6
) -> list[str]:
    """One line per option (cheapest first, at most ``limit``): fits or not, and the
    hours the budget buys."""
    lines = []
    for option in options[:limit]:
        verdict = budget_verdict(option, budget_usd, hours)
        word = "fits" if verdict.fits else "over"
        lines.append(
            f"{word}: {describe(option)} {format_usd(option.total_usd)} for {hours} h; "
            f"{format_usd(budget_usd)} buys {verdict.hours} h"
        )
    if len(options) > limit:
        lines.append(f"... and {len(options) - limit} more option(s) (--format json has all)")
    return lines


def cheapest_line(options: Sequence[CostOption]) -> str | None:
    """The cheapest option on a verified price in one sentence, and the cheapest
    on-demand one when that is spot (it can be reclaimed); a cheaper unverified price
    is named as such, never as the answer.

    >>> from costguard.pricing.estimate import EstimateRequest, estimate
    >>> from costguard.pricing.tables import load_catalog
    >>> request = EstimateRequest(gpu="H100", gpus_per_instance=8, hours=Decimal(10),
    ...                           providers=("aws",), disk_gb=Decimal(0))
    >>> print(cheapest_line(estimate(request, load_catalog()).options))  # doctest: +ELLIPSIS
    Cheapest: aws ... spot, ... in total; ...; a cheaper unverified price exists: aws ...
    """
    best = cheapest_of(options)
    if best is None:
        return None
    line = f"Cheapest: {describe(best)}, {format_usd(best.total_usd)} in total"
    if best.market is Market.SPOT:
        on_demand = [o for o in options if o.market is Market.ON_DEMAND]
        steady = cheapest_of(on_demand)
        if steady is not None:
            line += (
                f"; cheapest on-demand (not reclaimed): {describe(steady)}, "
                f"{format_usd(steady.total_usd)}{unverified_note(cheaper_unverified(on_demand))}"
            )
    return line + unverified_note(cheaper_unverified(options))


def unverified_fit(result: Estimate, budget_usd: Decimal) -> str:
    """``; a cheaper unverified price exists: ...`` when an option on an unverified
    price fits ``budget_usd`` though the cheapest verified one does not, else ``""``."""
    other = result.cheaper_unverified
    return unverified_note(other if other and other.total_usd <= budget_usd else None)


def unverified_note(other: CostOption | None) -> str:
    """``; a cheaper unverified price exists: <option>, <total>``, or ``""`` for ``None``."""
    if other is None:
        return ""
    return f"; a cheaper unverified price exists: {_name(other)}, {format_usd(other.total_usd)}"


def describe(option: CostOption) -> str:
    """The option's name, with ``(unverified price)`` when its price is not verified:
    every sentence that names an option as an answer names it so."""
    unverified = "" if option.verified else " (unverified price)"
    return f"{_name(option)}{unverified}"


def _vcpus(row: InstancePrice | None) -> Decimal | None:
    return row.vcpus if row is not None else None


def spot_size_notes(options: Sequence[CostOption], catalog: Catalog) -> list[str]:
    """One note naming the places among ``options`` (those shown) where the spot pick is a
    bigger instance than the on-demand pick, and why, said once; none when there is none.

    Places with the same two sizes share a clause: ``aws us-east-2, us-west-2: the spot
    pick g5.2xlarge (8 vCPUs) is bigger than the on-demand g5.xlarge (4 vCPUs)``.
    """
    picks: dict[tuple[str, str], dict[Market, CostOption]] = {}
    for option in options:
        picks.setdefault((option.provider, option.region), {})[option.market] = option
    places: dict[tuple[str, str, Decimal, str, Decimal], list[tuple[str, str]]] = {}
    for (provider, region), by_market in picks.items():
        steady, spot = by_market.get(Market.ON_DEMAND), by_market.get(Market.SPOT)
        if steady is None or spot is None or steady.instance_type == spot.instance_type:
            continue
        big = _vcpus(catalog.row(provider, region, spot.instance_type))
        small = _vcpus(catalog.row(provider, region, steady.instance_type))
        if big is None or small is None or big <= small:
            continue
        key = (provider, spot.instance_type, big, steady.instance_type, small)
        places.setdefault(key, []).append((provider, region))
    clauses = [
        f"{provider} {', '.join(region for _, region in where)}: the spot pick {spot} "
        f"({big} vCPUs) is bigger than the on-demand {steady} ({small} vCPUs)"
        for (provider, spot, big, steady, small), where in places.items()
    ]
    if not clauses:
        return []
    why = (
        "spot prices are set per size by spare capacity, and there the bigger size is "
        "cheaper on spot; same GPUs, more CPU and memory"
    )
    return [f"{'; '.join(clauses)}: {why}"]


def _name(option: CostOption) -> str:
    gpu = f" ({option.accelerator})" if option.accelerator else ""
    return f"{option.provider} {option.region} {option.instance_type}{gpu} {option.market}"
