"""Offers for ``costguard launch``: priced places from the pricing tables. Pure.

An offer is one instance type in one region and market with its hourly price. The
launcher runs on the cheapest that fits; the recovery policy moves to the next when a
place is preempted. ``local`` (the preemption simulator) runs on this machine and gets
the cloud offers re-labelled, so that its report says what the run would have cost and
its recovery moves between (simulated) regions exactly as on the cloud.

Offers come per region, as the tables are; the controller splits one into zones
(:func:`expand_zones`, the launcher's :meth:`~costguard.spot.launcher.base.Launcher.zones`)
when it is about to launch there, each zone at the region's price.

>>> from costguard.pricing.tables import load_catalog
>>> found = find_offers(load_catalog(), gpu="A10G", provider="aws", regions=("us-east-1",))
>>> [(o.instance_type, o.market.value, str(o.usd_per_hour)) for o in found][:1]
[('g5.xlarge', 'spot', '0.4246')]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import date
from decimal import Decimal

from costguard.errors import InputError
from costguard.pricing.catalog import Catalog, InstancePrice, Market, prices_as_of
from costguard.shell import command
from costguard.spot.launcher.base import Offer

CLOUDS = ("aws", "gcp", "azure")
LOCAL = "local"
PROVIDERS = (*CLOUDS, LOCAL)


def find_offers(
    catalog: Catalog,
    *,
    gpu: str,
    gpu_count: int = 1,
    provider: str = "aws",
    regions: Sequence[str] = (),
    max_usd_per_hour: Decimal | None = None,
) -> list[Offer]:
    """Every (region, market) where ``gpu_count`` x ``gpu`` is sold, the cheapest instance
    type of each: verified prices first, then unverified ones, each cheapest first.
    ``max_usd_per_hour`` caps the spot price only: it is the spot bid, and on-demand (the
    fallback) has its own fixed price.

    ``provider="local"`` returns the offers of all three clouds, re-labelled ``local``
    with the cloud's place as the region (``aws:us-east-1``).
    """
    clouds = CLOUDS if provider == LOCAL else (provider,)
    best: dict[tuple[str, str, Market], tuple[Decimal, InstancePrice]] = {}
    for inst in catalog.instances:
        if inst.provider not in clouds or inst.accelerator != gpu:
            continue
        if inst.accelerator_count != gpu_count:
            continue
        if regions and inst.region not in regions:
            continue
        for market in (Market.SPOT, Market.ON_DEMAND):
            price = inst.usd_per_hour(market)
            if price is None or price <= 0:
                continue
            if market is Market.SPOT and max_usd_per_hour is not None and price > max_usd_per_hour:
                continue
            key = (inst.provider, inst.region, market)
            current = best.get(key)
            if current is None or (price, inst.instance_type) < (
                current[0],
                current[1].instance_type,
            ):
                best[key] = (price, inst)
    offers = [
        Offer(
            provider=provider if provider == LOCAL else inst.provider,
            region=f"{inst.provider}:{inst.region}" if provider == LOCAL else inst.region,
            instance_type=inst.instance_type,
            market=market,
            usd_per_hour=price,
            gpu=gpu,
            gpu_count=gpu_count,
            verified=_verified(inst, market),
        )
        for (_, _, market), (price, inst) in best.items()
    ]
    offers.sort(
        key=lambda o: (not o.verified, o.usd_per_hour, o.provider, o.region, o.market.value)
    )
    return offers


def fallback_offer(offers: Sequence[Offer]) -> Offer | None:
    """The on-demand offer a job falls back to after repeated preemptions (the cheapest)."""
    return next((o for o in offers if o.market is Market.ON_DEMAND), None)


def offers_as_of(catalog: Catalog, offers: Sequence[Offer]) -> date | None:
    """How old the prices of ``offers`` are: the oldest as-of date of the table parts
    (provider and region) they were read from, as ``estimate`` dates what it shows; a
    local offer by its cloud's place (``aws:us-east-1``)."""
    places = []
    for offer in offers:
        cloud, _, region = offer.region.partition(":") if offer.provider == LOCAL else ("", "", "")
        places.append(
            (
                "gpu_instances",
                cloud or offer.provider,
                region or offer.region,
                offer.market,
                offer.instance_type,
            )
        )
    return prices_as_of(catalog, places)


def _verified(inst: InstancePrice, market: Market) -> bool:
    status = inst.status(market)
    return status is not None and status.verified


def expand_zones(
    offers: Sequence[Offer], region: str, instance_type: str, zones: Sequence[str]
) -> list[Offer]:
    """``offers`` with each zoneless offer of ``instance_type`` in ``region`` replaced by one
    offer per zone, at the same price: the price tables are per region (a zone's spot
    price is not in them), so a zone is a place to move to, not a cheaper one. Order kept.

    >>> o = Offer("aws", "us-east-1", "g5.xlarge", Market.SPOT, Decimal("0.42"), "A10G", 1)
    >>> [(z.place, str(z.usd_per_hour)) for z in expand_zones([o], "us-east-1", "g5.xlarge",
    ...                                                       ["us-east-1a", "us-east-1b"])]
    [('aws/us-east-1/us-east-1a', '0.42'), ('aws/us-east-1/us-east-1b', '0.42')]
    >>> expand_zones([o], "us-west-2", "g5.xlarge", ["us-west-2a"]) == [o]
    True
    """
    out: list[Offer] = []
    for offer in offers:
        if offer.zone or offer.region != region or offer.instance_type != instance_type:
            out.append(offer)
            continue
        out.extend(replace(offer, zone=zone) for zone in dict.fromkeys(zones) if zone)
        if not any(zones):
            out.append(offer)
    return out


def require_offers(
    catalog: Catalog,
    *,
    gpu: str,
    gpu_count: int,
    provider: str,
    regions: Sequence[str],
    spot: bool,
    max_usd_per_hour: Decimal | None,
) -> list[Offer]:
    """:func:`find_offers`, or an :class:`InputError` that says which filter left nothing."""
    wanted = Market.SPOT if spot else Market.ON_DEMAND
    offers = find_offers(
        catalog,
        gpu=gpu,
        gpu_count=gpu_count,
        provider=provider,
        regions=regions,
        max_usd_per_hour=max_usd_per_hour,
    )
    if any(o.market is wanted for o in offers):
        return offers
    where = f"{provider}" + (f" {', '.join(regions)}" if regions else "")
    uncapped = find_offers(
        catalog, gpu=gpu, gpu_count=gpu_count, provider=provider, regions=regions
    )
    cheapest = [o for o in uncapped if o.market is wanted]
    if cheapest and max_usd_per_hour is not None:
        msg = (
            f"--max-price ${max_usd_per_hour}/h is below the cheapest {wanted.value} price of "
            f"{gpu_count} x {gpu} on {where}: ${cheapest[0].usd_per_hour}/h "
            f"({cheapest[0].instance_type}, {cheapest[0].region})"
        )
        raise InputError(msg, hint=f"raise --max-price to at least {cheapest[0].usd_per_hour}")
    msg = f"no {wanted.value} offer for {gpu_count} x {gpu} on {where} in the price tables"
    raise InputError(
        msg,
        hint=command(
            "costguard", "estimate", "--gpu", gpu, "--gpus-per-instance", gpu_count, "--hours", 1
        )
        + " shows where it is sold",
    )
