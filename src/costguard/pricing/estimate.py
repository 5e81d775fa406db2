"""The cost arithmetic: price x hours x count + storage + egress. Pure: no I/O.

:func:`estimate` takes an :class:`EstimateRequest` and a loaded
:class:`~costguard.pricing.catalog.Catalog` and returns every matching option, the best
instance per provider, region and market, cheapest first, with the assumptions behind
the figures.

Each option's cost (compute, block and object storage, egress, moving the data) is
computed next to the words that say what it assumed, so that no figure is shown without
its assumption.

>>> from costguard.pricing.tables import load_catalog
>>> result = estimate(EstimateRequest(gpu="A10G", hours=Decimal(8), count=4,
...                                   regions=("us-east-1",), markets=(Market.ON_DEMAND,),
...                                   disk_gb=Decimal(0)), load_catalog())
>>> best = result.options[0]
>>> best.instance_type, best.compute_usd, best.total_usd
('g5.xlarge', Decimal('32.192'), Decimal('32.192'))
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import NamedTuple

from costguard.errors import InputError
from costguard.money import HOURS_PER_MONTH, format_usd, gb_to_gib
from costguard.pricing.catalog import (
    Catalog,
    InstancePrice,
    Market,
    PriceStatus,
    Region,
    StorageRate,
    TransferRate,
    prices_as_of,
    refresh_hint,
)
from costguard.pricing.gpus import gpu_model
from costguard.pricing.retired import retired_carrying, retired_size

#: Block storage per instance when the user gives none: a boot disk plus room for a
#: container image, a dataset shard and a few checkpoints.
DEFAULT_DISK_GB = Decimal(100)
ZERO = Decimal(0)


@dataclass(frozen=True)
class EstimateRequest:
    """What to price. Quantities are validated by the caller (the CLI) and here."""

    hours: Decimal
    count: int = 1
    gpu: str | None = None  # canonical accelerator name (see costguard.pricing.gpus)
    gpus_per_instance: int = 1
    instance_type: str | None = None
    providers: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()
    markets: tuple[Market, ...] = (Market.ON_DEMAND, Market.SPOT)
    disk_gb: Decimal = DEFAULT_DISK_GB  # block storage per instance
    storage_gb: Decimal = ZERO  # object storage, next to the compute
    storage_months: Decimal = Decimal(1)
    egress_gb: Decimal = ZERO  # to the internet, in total
    data_region: Region | None = None  # where the input data lives
    data_gb: Decimal = ZERO  # read from data_region, in total over all instances

    def __post_init__(self) -> None:
        if self.gpu is None and self.instance_type is None:
            msg = "say what to price: a GPU or an instance type"
            raise InputError(msg, hint="e.g. --gpu a10g or --instance-type g5.xlarge")
        if not self.hours > 0:
            msg = f"hours must be more than 0, not {self.hours}"
            raise InputError(msg, hint="e.g. --hours 8")
        if self.count < 1 or self.gpus_per_instance < 1:
            msg = "count and gpus per instance must be whole numbers of at least 1"
            raise InputError(msg, hint="e.g. --count 4 --gpus-per-instance 1")
        for name in ("disk_gb", "storage_gb", "storage_months", "egress_gb", "data_gb"):
            if getattr(self, name) < 0:
                msg = f"{name.replace('_', '-')} must not be negative"
                raise InputError(msg, hint="use 0 to leave it out")
        if not self.markets:
            msg = "no market to price"
            raise InputError(msg, hint="use --spot, --on-demand, or neither for both")
        if self.data_gb > 0 and self.data_region is None:
            msg = "--data-gb needs --data-region (where the data is stored)"
            raise InputError(msg, hint="e.g. --data-region us-east-1 --data-gb 500")


class PricedPart(NamedTuple):
    """A storage or transfer price an option's figures use: which part it prices
    (``block_storage``, ``object_storage``, ``internet_egress`` or ``data_transfer``) and
    the table row it was read from (its own date, status and source)."""

    part: str
    rate: StorageRate | TransferRate


class CostOption(NamedTuple):
    """The cost of running ``count`` instances of one type, in one region and market.

    ``parts`` are the storage and transfer prices its figures use (none for a part that
    costs nothing or that the tables do not price: a note then says so)."""

    provider: str
    region: str
    instance_type: str
    accelerator: str | None
    gpus_per_instance: int
    market: Market
    usd_per_hour: Decimal
    price_status: PriceStatus | None
    compute_usd: Decimal
    block_storage_usd: Decimal
    object_storage_usd: Decimal
    internet_egress_usd: Decimal
    data_transfer_usd: Decimal
    notes: tuple[str, ...] = ()
    parts: tuple[PricedPart, ...] = ()

    @property
    def storage_usd(self) -> Decimal:
        """Block storage of the instances plus object storage."""
        return self.block_storage_usd + self.object_storage_usd

    @property
    def egress_usd(self) -> Decimal:
        """Internet egress plus data read from another region or cloud."""
        return self.internet_egress_usd + self.data_transfer_usd

    @property
    def total_usd(self) -> Decimal:
        """compute + storage + egress."""
        return self.compute_usd + self.storage_usd + self.egress_usd

    @property
    def verified(self) -> bool:
        """Whether its price is one a sentence may name as an answer (listed or corrected,
        not unverified): see :attr:`~costguard.pricing.catalog.PriceStatus.verified`."""
        return self.price_status is not None and self.price_status.verified

    @property
    def sort_key(self) -> tuple[Decimal, str, str, str, str]:
        """Cheapest first; ties broken by name so the order is stable."""
        return (self.total_usd, self.provider, self.region, self.instance_type, self.market)


class Estimate(NamedTuple):
    """The options, cheapest first, and what the figures assume."""

    request: EstimateRequest
    options: tuple[CostOption, ...]
    assumptions: tuple[str, ...]
    #: The cheapest option in the data's own region, when --data-region was given and
    #: that region offers the GPU (it pays no transfer).
    near_data: CostOption | None = None
    notes: tuple[str, ...] = ()

    @property
    def cheapest(self) -> CostOption | None:
        """The cheapest option on a verified price (the answer a sentence names); the
        cheapest of all when no price is verified; ``None`` when nothing matched."""
        return cheapest_of(self.options)

    @property
    def cheaper_unverified(self) -> CostOption | None:
        """The cheapest option when its price is unverified and below :attr:`cheapest`'s
        (a sentence naming the answer says it exists), else ``None``."""
        return cheaper_unverified(self.options)


def cheapest_of(options: Sequence[CostOption]) -> CostOption | None:
    """The first option (of ``options``, cheapest first) on a verified price, else the
    first of all; ``None`` when there is none."""
    return next((o for o in options if o.verified), options[0] if options else None)


def cheaper_unverified(options: Sequence[CostOption]) -> CostOption | None:
    """The first option of ``options`` (cheapest first) when it is unverified and cheaper
    than :func:`cheapest_of` picks, else ``None``."""
    best = cheapest_of(options)
    if best is None or best is options[0] or options[0].total_usd >= best.total_usd:
        return None
    return options[0]


def estimate(request: EstimateRequest, catalog: Catalog) -> Estimate:
    """Price every matching option; see the module docstring for an example.

    Raises :class:`~costguard.errors.InputError` with a hint when nothing in the tables
    matches (a GPU not offered in the region, no instance with that many GPUs, ...).
    """
    candidates = _matching(request, catalog.instances)
    if not candidates:
        raise _no_match(request, catalog)
    uncovered = _uncovered(request, catalog)
    options = [
        _cost(request, catalog, instance, market)
        for instance in _best_per_region(candidates, request.markets)
        for market in request.markets
        if instance.usd_per_hour(market) is not None
    ]
    options = _dedupe_cheapest(options)
    options.sort(key=lambda o: o.sort_key)
    notes = list(_market_notes(request, candidates))
    for provider, names in uncovered.items():
        notes.append(
            f"Not covered by the {catalog.origin} tables (no prices): {provider} "
            f"{', '.join(names)}; {refresh_hint(provider, names)}"
        )
    near = None
    if request.data_region is not None:
        near = _near_data(request, catalog)
        notes.extend(_near_data_notes(request, near, options))
    return Estimate(
        request=request,
        options=tuple(options),
        assumptions=_assumptions(request, catalog, options),
        near_data=near,
        notes=tuple(notes),
    )


def _matching(
    request: EstimateRequest,
    instances: Iterable[InstancePrice],
    *,
    ignore_location: bool = False,
    ignore_count: bool = False,
) -> list[InstancePrice]:
    wanted_type = request.instance_type.lower() if request.instance_type else None
    found = []
    for inst in instances:
        if not ignore_location:
            if request.providers and inst.provider not in request.providers:
                continue
            if request.regions and inst.region not in request.regions:
                continue
        if wanted_type is not None and inst.instance_type.lower() != wanted_type:
            continue
        if request.gpu is not None:
            if inst.accelerator != request.gpu:
                continue
            if (
                not ignore_count
                and wanted_type is None
                and inst.accelerator_count != request.gpus_per_instance
            ):
                continue
        found.append(inst)
    return found


def _best_per_region(
    candidates: Sequence[InstancePrice], markets: Sequence[Market]
) -> list[InstancePrice]:
    """For each provider/region and market, the cheapest instance (one list, no repeats)."""
    best: dict[tuple[str, str, Market], InstancePrice] = {}
    for inst in candidates:
        for market in markets:
            price = inst.usd_per_hour(market)
            if price is None:
                continue
            key = (inst.provider, inst.region, market)
            current = best.get(key)
            if current is None or (price, inst.instance_type) < (
                current.usd_per_hour(market) or price,
                current.instance_type,
            ):
                best[key] = inst
    unique: dict[tuple[str, str, str, str | None], InstancePrice] = {}
    for inst in best.values():
        unique[(inst.provider, inst.region, inst.instance_type, inst.accelerator)] = inst
    return list(unique.values())


def _dedupe_cheapest(options: list[CostOption]) -> list[CostOption]:
    """Keep one option per provider, region and market: the cheapest in total."""
    kept: dict[tuple[str, str, Market], CostOption] = {}
    for option in options:
        key = (option.provider, option.region, option.market)
        if key not in kept or option.sort_key < kept[key].sort_key:
            kept[key] = option
    return list(kept.values())


def _cost(
    request: EstimateRequest, catalog: Catalog, inst: InstancePrice, market: Market
) -> CostOption:
    usd_per_hour = inst.usd_per_hour(market)
    assert usd_per_hour is not None
    notes: list[str] = []
    status = inst.status(market)
    if status in (PriceStatus.UNVERIFIED, PriceStatus.CORRECTED):
        notes.append(f"{market} price {status}: {inst.note}" if inst.note else f"{status}")
    block, block_note, block_rate = _block_storage(request, catalog, inst)
    obj, obj_note, obj_rate = _object_storage(request, catalog, inst)
    egress, egress_note, egress_rate = _internet_egress(
        request.egress_gb, catalog, inst.provider, inst.region
    )
    transfer, transfer_note, transfer_rate = _data_transfer(request, catalog, inst)
    notes += [n for n in (block_note, obj_note, egress_note, transfer_note) if n]
    used = (
        ("block_storage", block_rate),
        ("object_storage", obj_rate),
        ("internet_egress", egress_rate),
        ("data_transfer", transfer_rate),
    )
    return CostOption(
        provider=inst.provider,
        region=inst.region,
        instance_type=inst.instance_type,
        accelerator=inst.accelerator,
        gpus_per_instance=inst.accelerator_count,
        market=market,
        usd_per_hour=usd_per_hour,
        price_status=status,
        compute_usd=usd_per_hour * request.hours * request.count,
        block_storage_usd=block,
        object_storage_usd=obj,
        internet_egress_usd=egress,
        data_transfer_usd=transfer,
        notes=tuple(notes),
        parts=tuple(PricedPart(part, rate) for part, rate in used if rate is not None),
    )


def _per_unit(quantity_gb: Decimal, unit: str) -> Decimal:
    """A quantity given in GB expressed in the unit a price is quoted in (GB or GiB)."""
    return gb_to_gib(quantity_gb) if unit.startswith("GiB") else quantity_gb


#: A part's cost, the note that goes with it (``None``: none), and the price it used.
Part = tuple[Decimal, str | None, StorageRate | TransferRate | None]


def _block_storage(request: EstimateRequest, catalog: Catalog, inst: InstancePrice) -> Part:
    if request.disk_gb == 0:
        return ZERO, None, None
    rates = catalog.storage_rates(inst.provider, inst.region, "block")
    if not rates:
        return ZERO, f"no block-storage price for {inst.region}: disks not included", None
    # Monthly rates prorated by the hour; dividing last keeps the result exact where it
    # can be (and linear in hours and count).
    instance_hours = request.hours * request.count
    first = rates[0]
    if first.unit != "disk-month":
        size = _per_unit(request.disk_gb, first.unit)
        return size * first.usd * instance_hours / HOURS_PER_MONTH, None, first
    # Azure managed disks bill per tier: the smallest tier that holds the disk.
    size_gib = gb_to_gib(request.disk_gb)
    tier = _disk_tier(rates, size_gib)
    disks = max(1, math.ceil(size_gib / tier.disk_size_gib)) if tier.disk_size_gib else 1
    note = None
    if disks > 1:
        note = f"{request.disk_gb} GB is more than one {tier.sku} disk: priced as {disks} disks"
    return tier.usd * disks * instance_hours / HOURS_PER_MONTH, note, tier


def _disk_tier(rates: Sequence[StorageRate], size_gib: Decimal) -> StorageRate:
    for rate in rates:
        if rate.disk_size_gib is not None and rate.disk_size_gib >= size_gib:
            return rate
    return rates[-1]


def _object_storage(request: EstimateRequest, catalog: Catalog, inst: InstancePrice) -> Part:
    if request.storage_gb == 0:
        return ZERO, None, None
    rates = catalog.storage_rates(inst.provider, inst.region, "object")
    if not rates:
        return ZERO, f"no object-storage price for {inst.region}: storage not included", None
    rate = rates[0]
    usd = _per_unit(request.storage_gb, rate.unit) * rate.usd * request.storage_months
    return usd, None, rate


def _internet_egress(quantity_gb: Decimal, catalog: Catalog, provider: str, region: str) -> Part:
    if quantity_gb == 0:
        return ZERO, None, None
    rate = catalog.transfer_rate(provider, region, "internet_egress", "internet")
    if rate is None:
        return ZERO, f"no internet-egress price for {region}: egress not included", None
    return _per_unit(quantity_gb, rate.unit) * rate.usd, None, rate


def transfer_rate_between(catalog: Catalog, source: Region, target: Region) -> TransferRate | None:
    """The price of moving data from ``source`` to compute in ``target``.

    Same region: free (``None``). Same provider: the source region's inter-region rate
    (a special pair, else to the target's continent, else same/other continent, else
    ``any``). Another provider: the source's internet egress.
    """
    if (source.provider, source.name) == (target.provider, target.name):
        return None
    if source.provider != target.provider:
        return catalog.transfer_rate(source.provider, source.name, "internet_egress", "internet")
    if source.continent == target.continent:
        destinations: tuple[str, ...] = (target.name, "same-continent", "any")
    else:  # a rate to the target's continent, when the table has one, is the closer fit
        destinations = (target.name, target.continent, "other-continent", "any")
    for destination in destinations:
        rate = catalog.transfer_rate(source.provider, source.name, "inter_region", destination)
        if rate is not None:
            return rate
    return None


def _data_transfer(request: EstimateRequest, catalog: Catalog, inst: InstancePrice) -> Part:
    if request.data_region is None or request.data_gb == 0:
        return ZERO, None, None
    here = catalog.region(inst.provider, inst.region)
    rate = transfer_rate_between(catalog, request.data_region, here)
    if rate is None:
        if request.data_region == here:
            return ZERO, None, None
        note = f"no transfer price from {request.data_region}: transfer not included"
        return ZERO, note, None
    return _per_unit(request.data_gb, rate.unit) * rate.usd, None, rate


def _near_data(request: EstimateRequest, catalog: Catalog) -> CostOption | None:
    assert request.data_region is not None
    region = request.data_region
    nearby = [
        inst
        for inst in _matching(request, catalog.instances, ignore_location=True)
        if (inst.provider, inst.region) == (region.provider, region.name)
    ]
    options = [
        _cost(request, catalog, inst, market)
        for inst in nearby
        for market in request.markets
        if inst.usd_per_hour(market) is not None
    ]
    return min(options, key=lambda o: o.sort_key) if options else None


def _near_data_notes(
    request: EstimateRequest, near: CostOption | None, options: Sequence[CostOption]
) -> Iterable[str]:
    region = request.data_region
    what = request.gpu or request.instance_type
    if near is None:
        yield (
            f"{what} is not offered in the data's region {region}: every option pays "
            "to move the data (or copy it next to the compute first)"
        )
        return
    cheapest = options[0] if options else None
    if cheapest is not None and cheapest.data_transfer_usd > 0:
        yield (
            f"Compute next to the data ({region}): {near.instance_type} {near.market} "
            f"totals {format_usd(near.total_usd)} with no transfer charge; the cheapest "
            f"option pays {format_usd(cheapest.data_transfer_usd)} to move "
            f"{request.data_gb} GB"
        )
    else:
        yield f"The cheapest option runs next to the data ({region}): no transfer charge"


def _market_notes(request: EstimateRequest, candidates: Sequence[InstancePrice]) -> Iterable[str]:
    if Market.SPOT in request.markets and all(c.spot_usd_per_hour is None for c in candidates):
        yield "No spot price in the tables for these instances: spot is not offered or not known"


def _assumptions(
    request: EstimateRequest, catalog: Catalog, options: Sequence[CostOption]
) -> tuple[str, ...]:
    places = [
        (
            "gpu_instances" if o.accelerator else "cpu_instances",
            o.provider,
            o.region,
            o.market,
            o.instance_type,
        )
        for o in options
    ]
    oldest = prices_as_of(catalog, places)
    when = f"as of {oldest.isoformat()}" if oldest is not None else "of no known date"
    where = "" if catalog.origin == "bundled" else f" from {catalog.directory}"
    lines = [
        f"Prices: {catalog.origin} tables{where}, the oldest price shown {when} (each row's "
        "date and source: `costguard pricing show`); list prices in USD, before taxes",
        f"Compute: price per hour x {request.hours} h x {request.count} instance(s)",
    ]
    if Market.SPOT in request.markets:
        lines.insert(
            1,
            "Spot prices move (hourly on AWS): the spot figures are a snapshot, the lowest "
            "over the region's zones, and a spot instance can be reclaimed",
        )
    if request.disk_gb:
        lines.append(
            f"Block storage: {request.disk_gb} GB per instance (AWS EBS gp3, GCP "
            "pd-balanced, Azure Premium SSD tier) for the same hours"
        )
    else:
        lines.append("Block storage: none (--disk-gb 0)")
    if request.storage_gb:
        lines.append(
            f"Object storage: {request.storage_gb} GB for {request.storage_months} month(s) "
            "in the compute's region (S3 Standard, GCS Standard, Blob Hot LRS)"
        )
    lines.append(
        f"Egress: data sent out to the internet ({request.egress_gb} GB, --egress-gb) plus "
        f"data read from another region or cloud ({request.data_gb} GB, --data-gb)"
    )
    if request.egress_gb or request.data_gb:
        lines.append(
            "Transfer at the first paid tier; free allowances (100 GB/month on AWS and "
            "Azure) are per account per month and not applied"
        )
    lines += _part_dates(options)
    if request.data_gb:
        lines.append(
            f"Data: {request.data_gb} GB read in total from {request.data_region}; same "
            "region is free, another region pays inter-region rates, another cloud pays "
            "the source's internet egress"
        )
    lines.append(
        "Not included: taxes, discounts (savings plans, committed/sustained use), "
        "support plans, public IPs, request charges"
    )
    return tuple(lines)


def _part_dates(options: Sequence[CostOption]) -> list[str]:
    """How old the storage and transfer prices of ``options`` are, and how many of them
    are not verified: a line, or none when no option pays for storage or transfer."""
    rates = {part.rate for option in options for part in option.parts}
    if not rates:
        return []
    oldest, newest = min(r.as_of for r in rates), max(r.as_of for r in rates)
    when = f"dated {oldest}" if oldest == newest else f"dated {oldest} to {newest}"
    doubtful = sum(1 for r in rates if not r.status.verified)
    line = (
        f"Storage and transfer prices: {when} (each row's date and source: `costguard "
        "pricing show storage` or `transfer`; `costguard pricing refresh` keeps them)"
    )
    if doubtful:
        line += f"; {doubtful} of the {len(rates)} unverified or assumed (--unverified lists why)"
    return [line]


def _uncovered(request: EstimateRequest, catalog: Catalog) -> dict[str, list[str]]:
    """The regions asked for that the tables have no prices for, by provider."""
    found: dict[str, list[str]] = {}
    for name in request.regions:
        for region in catalog.regions:
            if region.name == name and (region.provider, name) not in catalog.covered:
                found.setdefault(region.provider, []).append(name)
    return found


def _no_match(request: EstimateRequest, catalog: Catalog) -> InputError:
    """Explain why nothing matched, with the closest thing that would."""
    what = request.gpu or request.instance_type
    uncovered = _uncovered(request, catalog)
    if uncovered and sum(map(len, uncovered.values())) == len(request.regions):
        provider, names = next(iter(uncovered.items()))
        return InputError(
            f"{', '.join(names)} is not covered by the {catalog.origin} price tables "
            "(no public source read for it)",
            hint=refresh_hint(provider, names),
        )
    anywhere = _matching(request, catalog.instances, ignore_location=True, ignore_count=True)
    asked = request.providers or tuple(
        sorted({r.provider for r in catalog.regions if r.name in request.regions})
    )
    if not anywhere:
        if request.instance_type:
            return _unknown_instance_type(request, catalog)
        gone = retired_carrying(request.gpu or "", asked)
        if gone:
            return InputError(
                f"{what} can no longer be launched: " + "; ".join(series.said() for series in gone),
                hint=gone[-1].instead(),
            )
        return InputError(
            f"no instance with {what} in the tables",
            hint="`costguard pricing gpus` lists the GPUs and where they are",
        )
    located = _matching(request, catalog.instances, ignore_count=True)
    where = ", ".join(request.regions or request.providers) or "any region in the tables"
    if not located:
        places = sorted({f"{i.provider}:{i.region}" for i in anywhere})
        hint = f"it is offered in {_shorten(places)}"
        gone = retired_carrying(request.gpu or "", asked) if asked else []
        retired = ": " + "; ".join(series.said() for series in gone) if gone else ""
        return InputError(f"{what} is not offered in {where} (in the tables){retired}", hint=hint)
    counts = sorted({i.accelerator_count for i in located})
    alternatives = " or ".join(str(c) for c in counts)
    suggestion = next((c for c in counts if c >= request.gpus_per_instance), counts[-1])
    model = gpu_model(request.gpu or "")
    similar = f"; similar: {', '.join(model.similar)}" if model and model.similar else ""
    return InputError(
        f"no instance with {request.gpus_per_instance} x {what} per instance in {where}",
        hint=f"{what} comes with {alternatives} GPUs per instance there: try "
        f"--gpus-per-instance {suggestion}{similar}",
    )


def _unknown_instance_type(request: EstimateRequest, catalog: Catalog) -> InputError:
    """An instance type that is not in the tables, or that carries another GPU than
    ``--gpu`` says: what it is, and the names closest to it."""
    import difflib  # on error paths only: not worth its import on every run

    assert request.instance_type is not None
    gone = next(
        (
            found
            for p in request.providers or (None,)
            if (found := retired_size(p, request.instance_type))
        ),
        None,
    )
    if gone is not None:
        return InputError(
            f"{request.instance_type} can no longer be launched: {gone.said()}",
            hint=gone.instead(),
        )
    wanted = request.instance_type.lower()
    same_type = [i for i in catalog.instances if i.instance_type.lower() == wanted]
    if same_type and request.gpu:
        carried = same_type[0]
        gpus = (
            f"{carried.accelerator_count} x {carried.accelerator}"
            if carried.accelerator
            else "no GPU"
        )
        examples = sorted(
            {i.instance_type for i in catalog.instances if i.accelerator == request.gpu}
        )[:3]
        instead = f", or an instance with {request.gpu} ({', '.join(examples)})" if examples else ""
        return InputError(
            f"--gpu {request.gpu} and --instance-type {carried.instance_type} disagree: "
            f"{carried.instance_type} carries {gpus}",
            hint=f"drop --gpu{instead}",
        )
    names = sorted({i.instance_type for i in catalog.instances})
    close = difflib.get_close_matches(request.instance_type, names, n=3, cutoff=0.6)
    lowered = {name.lower(): name for name in names}
    close = close or [
        lowered[n] for n in difflib.get_close_matches(wanted, list(lowered), n=3, cutoff=0.6)
    ]
    hint = (
        f"did you mean {' or '.join(close)}?"
        if close
        else "costguard pricing show gpu_instances lists the instance types"
    )
    return InputError(f"instance type {request.instance_type} is not in the tables", hint=hint)


def limit_places(options: Sequence[CostOption], top: int) -> tuple[CostOption, ...]:
    """The options of the ``top`` cheapest places (provider and region).

    A place keeps all its markets, so on-demand and spot stay side by side; ``top`` 0
    keeps everything. The order (cheapest first) is preserved.
    """
    if top <= 0:
        return tuple(options)
    places: dict[tuple[str, str], None] = {}
    for option in options:
        places.setdefault((option.provider, option.region), None)
    kept = set(list(places)[:top])
    return tuple(o for o in options if (o.provider, o.region) in kept)


def _shorten(items: Sequence[str], limit: int = 8) -> str:
    if len(items) <= limit:
        return ", ".join(items)
    return ", ".join(items[:limit]) + f" and {len(items) - limit} more"
