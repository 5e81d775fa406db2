"""How often AWS reclaims spot capacity: the Spot Instance Advisor's bands, as a table.

AWS's Spot Instance Advisor publishes, per region and instance type (Linux), a band of
its "frequency of interruption": "the rate at which Spot has reclaimed capacity during
the trailing month" (``<5%``, ``5-10%``, ``10-15%``, ``15-20%``, ``>20%``), and the
spot saving over on-demand. ``pricing/interruptions.csv`` keeps it for the AWS GPU types
of the instance tables; GCP and Azure publish no such figure.

``estimate --interruptions-per-day advisor`` reads a band as a rate: a share ``p`` of
capacity reclaimed over a 30-day month, taken as a constant hazard, is
``-ln(1 - p) / 30`` preemptions a day, with ``p`` the band's midpoint; ``>20%`` has no
upper end, so it is read as 20%, a lower bound.

Pure: the advisor's JSON (already parsed) in, rows and rates out; no I/O.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import date
from decimal import Decimal
from typing import Any, NoReturn

from costguard.errors import CostguardError
from costguard.money import format_usd
from costguard.pricing.catalog import Market
from costguard.pricing.estimate import CostOption
from costguard.pricing.interruptions import (
    COST_LINE,
    Checkpointing,
    Interruptions,
    cheaper_on_demand,
    checkpoint_line,
    effective_total_usd,
    expected,
)
from costguard.pricing.question import ADVISOR_WORD

#: The advisor's file, as AWS serves it and as a ``--from`` mirror holds it.
ADVISOR_FILE = "spot-advisor-data.json"
ADVISOR_URL = "https://spot-bid-advisor.s3.amazonaws.com/spot-advisor-data.json"
#: The table's name in ``tables.toml`` and its columns.
TABLE = "interruptions"
COLUMNS = (
    "provider",
    "region",
    "instance_type",
    "band",
    "band_low_pct",
    "band_high_pct",
    "savings_pct",
)
#: Days in the advisor's "trailing month".
MONTH_DAYS = Decimal(30)
#: Rates are kept to a millionth of a preemption a day.
RATE_PLACES = Decimal("0.000001")
#: Why a spot row has no advisor figure, per provider.
NO_FIGURE = {
    "gcp": "GCP publishes no interruption frequency",
    "azure": "Azure publishes no interruption frequency",
}

_LABEL = re.compile(r"\s*(?:<\s*(\d+)|>\s*(\d+)|(\d+)\s*-\s*(\d+))\s*%\s*")


@dataclass(frozen=True)
class Band:
    """A band of the share of capacity reclaimed in a month, in percent; no upper end
    for the last (``>20%``)."""

    label: str
    low_pct: Decimal
    high_pct: Decimal | None

    @property
    def lower_bound(self) -> bool:
        """Whether the share taken (its low end) is only a lower bound."""
        return self.high_pct is None

    @property
    def share(self) -> Decimal:
        """The share of a month's capacity read from the band: its midpoint, or its low
        end when it has no upper one."""
        if self.high_pct is None:
            return self.low_pct / 100
        return (self.low_pct + self.high_pct) / 2 / 100


def parse_band(label: str) -> Band:
    """A band from the advisor's label; :class:`ValueError` for any other text.

    >>> parse_band("<5%"), parse_band(">20%").lower_bound
    (Band(label='<5%', low_pct=Decimal('0'), high_pct=Decimal('5')), True)
    >>> parse_band("10-15%").share
    Decimal('0.125')
    """
    match = _LABEL.fullmatch(label)
    if match is None:
        msg = f"{label!r} is not an interruption band (<5%, 5-10%, ..., >20%)"
        raise ValueError(msg)
    below, above, low, high = match.groups()
    if below is not None:
        return Band(label, Decimal(0), Decimal(below))
    if above is not None:
        return Band(label, Decimal(above), None)
    if Decimal(low) >= Decimal(high):
        msg = f"{label!r} is not an interruption band (its low end is not below its high)"
        raise ValueError(msg)
    return Band(label, Decimal(low), Decimal(high))


def rate_per_day(band: Band) -> Decimal:
    """Preemptions a day for a band: ``-ln(1 - p) / 30``, ``p`` its :attr:`Band.share`.

    >>> rate_per_day(parse_band("<5%")), rate_per_day(parse_band(">20%"))
    (Decimal('0.000844'), Decimal('0.007438'))
    """
    return (-(1 - band.share).ln() / MONTH_DAYS).quantize(RATE_PLACES)


@dataclass(frozen=True)
class InterruptionRow:
    """One instance type in one region: its band and the spot saving AWS states."""

    provider: str
    region: str
    instance_type: str
    band: Band
    savings_pct: int

    @property
    def rate_per_day(self) -> Decimal:
        """The band read as preemptions a day (:func:`rate_per_day`)."""
        return rate_per_day(self.band)


@dataclass(frozen=True)
class InterruptionTable:
    """A new interruption table: its rows, the date of its figures and their source."""

    rows: tuple[InterruptionRow, ...]
    as_of: date
    source: str


def rows_from_advisor(data: Any, instance_types: Collection[str]) -> tuple[InterruptionRow, ...]:
    """The rows for ``instance_types`` (AWS) in every region the advisor lists them in
    (Linux), sorted by region and type.

    Raises :class:`CostguardError` when ``data`` is not the advisor's shape (``ranges``
    with an index and a label each, ``spot_advisor[region]["Linux"][type]`` with ``s``
    and ``r``, ``r`` one of the ranges), or when it lists none of the types.
    """
    ranges = _mapping(data, "the file").get("ranges")
    if not isinstance(ranges, list) or not ranges:
        _refuse("it has no list of 'ranges'")
    bands: dict[int, Band] = {}
    for entry in ranges:
        item = _mapping(entry, "a range")
        index, label = item.get("index"), item.get("label")
        if type(index) is not int or not isinstance(label, str):
            _refuse(f"a range has no whole 'index' and text 'label': {entry!r:.80}")
        try:
            bands[index] = parse_band(label)
        except ValueError as exc:
            _refuse(str(exc))
    regions = _mapping(data, "the file").get("spot_advisor")
    if not isinstance(regions, Mapping) or not regions:
        _refuse("it has no 'spot_advisor' object of regions")
    wanted = set(instance_types)
    rows = []
    for region, systems in regions.items():
        linux = _mapping(systems, f"region {region!r}").get("Linux", {})
        for instance_type, figures in _mapping(linux, f"{region} Linux").items():
            if instance_type not in wanted:
                continue
            item = _mapping(figures, f"{region} {instance_type}")
            savings, band = item.get("s"), item.get("r")
            if type(savings) is not int or type(band) is not int or band not in bands:
                _refuse(f"{region} {instance_type} has no whole 's' and a known 'r': {item!r}")
            rows.append(InterruptionRow("aws", str(region), instance_type, bands[band], savings))
    if not rows:
        _refuse("it lists none of the AWS GPU instance types of the tables")
    return tuple(sorted(rows, key=lambda r: (r.region, r.instance_type)))


def _mapping(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        _refuse(f"{what} is not a JSON object")
    return value


def _refuse(problem: str) -> NoReturn:
    msg = f"not the Spot Instance Advisor's data ({ADVISOR_FILE}): {problem}"
    raise CostguardError(msg, hint=f"download it again from {ADVISOR_URL}")


def render_csv(rows: Iterable[InterruptionRow]) -> bytes:
    """The rows as ``pricing/interruptions.csv`` holds them."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        high = row.band.high_pct
        writer.writerow(
            [
                row.provider,
                row.region,
                row.instance_type,
                row.band.label,
                row.band.low_pct,
                "" if high is None else high,
                row.savings_pct,
            ]
        )
    return out.getvalue().encode("utf-8")


def index_by_place(
    rows: Sequence[InterruptionRow],
) -> dict[tuple[str, str, str], InterruptionRow]:
    """The rows by (provider, region, instance type)."""
    return {(r.provider, r.region, r.instance_type): r for r in rows}


def no_figure_reason(provider: str, region: str, instance_type: str) -> str:
    """Why a spot row has no advisor figure.

    >>> no_figure_reason("azure", "eastus", "Standard_NC4as_T4_v3")
    'Azure publishes no interruption frequency'
    """
    return NO_FIGURE.get(
        provider, f"the AWS Spot Instance Advisor lists no figure for {instance_type} in {region}"
    )


#: How a band is read as a rate, in the assumptions.
CONVERSION = (
    "the share p of capacity reclaimed over a 30-day month read as a constant hazard: "
    "-ln(1 - p) / 30 preemptions a day, p the band's midpoint (>20%: 20%, a lower bound)"
)


@dataclass(frozen=True)
class AdvisorFigures:
    """Each spot row's preemptions under ``--interruptions-per-day advisor``: the rows
    of the advisor table (dated ``as_of``) that name its place and type, and the model's
    result at the rate of their band; a row the table lacks has none."""

    checkpointing: Checkpointing
    as_of: date
    source: str
    bands: Mapping[tuple[str, str, str], InterruptionRow]
    figures: Mapping[tuple[str, str, str], Interruptions]

    def band(self, option: CostOption) -> InterruptionRow | None:
        """The advisor row of a spot option, if the table has one."""
        if option.market is not Market.SPOT:
            return None
        return self.bands.get((option.provider, option.region, option.instance_type))

    def interruptions(self, option: CostOption) -> Interruptions | None:
        """The model's result for a spot option at its band's rate, if it has one."""
        return self.figures.get((option.provider, option.region, option.instance_type))


def advisor_figures(
    work_hours: Decimal,
    checkpointing: Checkpointing,
    rows: Sequence[InterruptionRow],
    options: Sequence[CostOption],
    *,
    as_of: date,
    source: str,
) -> AdvisorFigures:
    """The figures of the spot ``options`` that the advisor rows cover (AWS only)."""
    table = index_by_place(rows)
    bands: dict[tuple[str, str, str], InterruptionRow] = {}
    figures: dict[tuple[str, str, str], Interruptions] = {}
    for option in options:
        key = (option.provider, option.region, option.instance_type)
        row = table.get(key)
        if option.market is not Market.SPOT or row is None or key in figures:
            continue
        bands[key] = row
        figures[key] = expected(work_hours, replace(checkpointing, per_day=row.rate_per_day))
    return AdvisorFigures(checkpointing, as_of, source, bands, figures)


def _place(option: CostOption) -> str:
    return f"{option.provider} {option.region} {option.instance_type}"


def _spot(options: Sequence[CostOption]) -> list[CostOption]:
    return [o for o in options if o.market is Market.SPOT]


def assumption_lines(advisor: AdvisorFigures, options: Sequence[CostOption]) -> list[str]:
    """What the spot rows assume: the source and its date, the conversion, each row's
    band and rate, why a row has none, and the checkpoint figures."""
    lines = [
        f"spot: preemptions a day from the AWS Spot Instance Advisor band of each AWS "
        f"row's region and type (table as of {advisor.as_of}): {CONVERSION}"
    ]
    missing: dict[str, list[str]] = {}
    for option in _spot(options):
        row = advisor.band(option)
        if row is None:
            reason = no_figure_reason(option.provider, option.region, option.instance_type)
            missing.setdefault(reason, []).append(f"{option.provider} {option.region}")
            continue
        bound = ", a lower bound" if row.band.lower_bound else ""
        lines.append(
            f"{_place(option)}: band {row.band.label} -> {row.rate_per_day} preemptions "
            f"a day{bound}"
        )
    for reason, places in missing.items():
        lines.append(f"no preemption figure for spot in {', '.join(places)}: {reason}")
    return [*lines, checkpoint_line(advisor.checkpointing), COST_LINE]


def advice_lines(advisor: AdvisorFigures, options: Sequence[CostOption]) -> list[str]:
    """Per spot row with a band: the preemptions expected and the effective hours, and
    whether on-demand is cheaper there for this job."""
    lines = []
    for option in _spot(options):
        e = advisor.interruptions(option)
        row = advisor.band(option)
        if e is None or row is None:
            continue
        line = (
            f"{_place(option)} ({row.band.label}): {e.expected_preemptions:.1f} "
            f"preemption(s) expected, {e.effective_hours:.1f} effective hours"
        )
        same_place = [
            o for o in options if (o.provider, o.region) == (option.provider, option.region)
        ]
        for on_demand, _ in cheaper_on_demand(same_place, e):
            line += f"; on-demand is cheaper here ({format_usd(on_demand.total_usd)})"
        lines.append(line)
    return lines


def document(advisor: AdvisorFigures) -> dict[str, object]:
    """The ``interruptions`` part of ``estimate --format json`` under the advisor."""
    c = advisor.checkpointing
    return {
        "preemptions_per_day": ADVISOR_WORD,
        "every_minutes": c.every_minutes,
        "save_seconds": c.save_seconds,
        "restart_minutes": c.restart_minutes,
        "advisor_as_of": advisor.as_of.isoformat(),
        "advisor_source": advisor.source,
        "conversion": CONVERSION,
    }


def option_fields(advisor: AdvisorFigures, option: CostOption) -> dict[str, object]:
    """A spot option's JSON fields under the advisor: its band and rate and the model's
    result, or why it has none."""
    row = advisor.band(option)
    e = advisor.interruptions(option)
    if row is None or e is None:
        return {
            "interruption_band": None,
            "preemptions_per_day": None,
            "no_preemption_figure": no_figure_reason(
                option.provider, option.region, option.instance_type
            ),
        }
    return {
        "interruption_band": row.band.label,
        "interruption_band_lower_bound": row.band.lower_bound,
        "preemptions_per_day": row.rate_per_day,
        "expected_preemptions": e.expected_preemptions,
        "effective_hours": e.effective_hours,
        "effective_total_usd": effective_total_usd(option, e),
    }
