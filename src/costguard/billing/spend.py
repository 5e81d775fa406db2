"""Spend from billing exports, decided: which format a file is, which tag a key spells,
and what a report says for a period and a currency. Values in, values out: no I/O here.

The three export families costguard reads, each with the columns it needs
(:data:`FORMATS`): FOCUS 1.0 (AWS Data Exports ``FOCUS_1_0_AWS``, the GCP FOCUS view,
Azure Cost Management's FOCUS export), AWS CUR 2.0 (``COST_AND_USAGE_REPORT``) and the GCP
standard usage cost export to BigQuery, saved as JSONL or Parquet.

Money is summed as exact decimals (:data:`EXACT`: no sum is ever rounded): a charge's
``billed`` is what the invoice counts (FOCUS ``BilledCost``; CUR
``line_item_unblended_cost``; GCP ``cost`` plus its ``credits``), its ``effective`` the
amortised figure (FOCUS ``EffectiveCost``; CUR the savings-plan and reservation effective
costs; GCP the same as billed). A charge's amount is kept to :data:`PLACES` decimal
places; one with more (a double such as ``1.0000000000000002e-05``) is rounded half to
even at the last of them, and the report counts how many were.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal, Inexact, InvalidOperation
from typing import Any

from costguard.errors import InputError
from costguard.tags import JOB_TAG, OWNER_TAG, tag_key

#: The decimal places a charge's amount is kept to (more are rounded half to even).
PLACES = 18
#: Sums of money: exact at any size (a result that would need rounding raises ``Inexact``
#: instead; Python's default context keeps 28 digits and rounds the rest away silently).
EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN, traps=[Inexact, InvalidOperation])

#: What ``--by`` may group by.
GROUPINGS = ("job", "owner", "project", "day", "service")
#: The tag each tag grouping reads.
GROUPING_TAGS = {"job": JOB_TAG, "owner": OWNER_TAG}

READ_HINT = (
    "costguard spend reads FOCUS 1.0 exports (AWS Data Exports, the GCP FOCUS view, Azure "
    "Cost Management), AWS CUR 2.0 and the GCP BigQuery billing export saved as JSONL or "
    "Parquet, as CSV, CSV.gz or Parquet files"
)


@dataclass(frozen=True)
class ExportFormat:
    """One family of billing exports: the columns each figure comes from.

    ``period`` holds the billing period (the invoice month), ``day`` the start of the
    charge; ``project`` and ``service`` are what ``--by project`` and ``--by service``
    group by. GCP's ``invoice``, ``project`` and ``service`` are records whose fields
    (``month``, ``id``, ``description``) the reader takes.
    """

    name: str
    billed: str
    currency: str
    period: str
    day: str
    tags: str
    project: str
    service: str
    #: Columns needed besides those above (FOCUS ``EffectiveCost``, GCP ``credits``, the
    #: CUR line item type) and columns read when present (the CUR amortisation figures).
    also: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    #: Other names of the tags column, tried when ``tags`` is absent.
    tags_elsewhere: tuple[str, ...] = ()
    #: The columns that say what a charge is (:func:`charge_kind`), read when present
    #: for ``--job`` (records: their ``description``).
    kinds: tuple[str, ...] = ()
    #: Where a charge's period ends, and the (quantity, unit) columns that say how long
    #: it was billed, tried in turn (``a.b``: field ``b`` of record ``a``), read for
    #: ``--job`` when present: instance-hours, for idle time and price changes; and
    #: the resource a charge is for (an instance: its hours are counted apart).
    day_end: str = ""
    quantities: tuple[tuple[str, str], ...] = ()
    resource: str = ""

    def needed(self, by: str) -> tuple[str, ...]:
        """The columns a report grouped ``by`` cannot do without.

        >>> FOCUS.needed("service")[-2:], GCP_EXPORT.needed("job")[-2:]
        (('EffectiveCost', 'ServiceName'), ('credits', 'labels'))
        """
        grouped = {"job": self.tags, "owner": self.tags, "project": self.project}
        extra = grouped.get(by, self.service if by == "service" else None)
        columns = (self.billed, self.currency, self.period, self.day, *self.also)
        return columns + ((extra,) if extra and extra not in columns else ())


FOCUS = ExportFormat(
    name="FOCUS 1.0",
    billed="BilledCost",
    currency="BillingCurrency",
    period="BillingPeriodStart",
    day="ChargePeriodStart",
    tags="Tags",
    project="SubAccountId",
    service="ServiceName",
    also=("EffectiveCost",),
    kinds=("ChargeCategory", "ChargeClass", "ServiceCategory", "ServiceName", "ChargeDescription"),
    day_end="ChargePeriodEnd",
    quantities=(("PricingQuantity", "PricingUnit"), ("ConsumedQuantity", "ConsumedUnit")),
    resource="ResourceId",
)
#: Column names from the CUR 2.0 data dictionary (docs.aws.amazon.com/cur/latest/userguide/
#: table-dictionary-cur2.html); the amortisation columns are those of its savings plan and
#: reservation sections.
CUR2 = ExportFormat(
    name="AWS CUR 2.0",
    billed="line_item_unblended_cost",
    currency="line_item_currency_code",
    period="bill_billing_period_start_date",
    day="line_item_usage_start_date",
    tags="resource_tags",
    project="line_item_usage_account_id",
    service="line_item_product_code",
    also=("line_item_line_item_type",),
    optional=(
        "savings_plan_savings_plan_effective_cost",
        "savings_plan_total_commitment_to_date",
        "savings_plan_used_commitment",
        "reservation_effective_cost",
        "reservation_unused_amortized_upfront_fee_for_billing_period",
        "reservation_unused_recurring_fee",
        "reservation_reservation_a_r_n",
    ),
    tags_elsewhere=("tags",),
    kinds=(
        "line_item_line_item_type",
        "line_item_product_code",
        "line_item_usage_type",
        "line_item_line_item_description",
    ),
    day_end="line_item_usage_end_date",
    quantities=(("line_item_usage_amount", "pricing_unit"),),
    resource="line_item_resource_id",
)
#: Field names from "Structure of Standard data export" (cloud.google.com/billing/docs/
#: how-to/export-data-bigquery-tables/standard-usage).
GCP_EXPORT = ExportFormat(
    name="GCP BigQuery billing export",
    billed="cost",
    currency="currency",
    period="invoice",
    day="usage_start_time",
    tags="labels",
    project="project",
    service="service",
    also=("credits",),
    kinds=("cost_type", "service", "sku"),
    day_end="usage_end_time",
    quantities=(("usage.amount_in_pricing_units", "usage.pricing_unit"),),
    # The detailed export's; the standard one names no resource.
    resource="resource.name",
)
FORMATS = (FOCUS, CUR2, GCP_EXPORT)


def detect(columns: Iterable[str], by: str, source: str) -> ExportFormat:
    """The export format whose columns ``columns`` has, for a report grouped ``by``.

    A file that is none of them is refused, naming the columns missing from the format it
    is closest to.

    >>> detect(["BilledCost", "EffectiveCost", "BillingCurrency", "BillingPeriodStart",
    ...         "ChargePeriodStart", "Tags"], "job", "a.csv").name
    'FOCUS 1.0'
    >>> detect(["date", "amount"], "service", "a.csv")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: a.csv is not a billing export: it lacks the FOCUS 1.0 columns ...
    """
    present = set(columns)
    gaps = []
    for fmt in FORMATS:
        tags = next((t for t in (fmt.tags, *fmt.tags_elsewhere) if t in present), fmt.tags)
        missing = [c for c in fmt.needed(by) if c not in present and c != fmt.tags]
        if by in GROUPING_TAGS and tags not in present:
            missing.append(fmt.tags)
        if not missing:
            return fmt
        found = len([c for c in fmt.needed(by) if c in present])
        gaps.append((-found, FORMATS.index(fmt), fmt, missing))
    _, _, closest, missing = min(gaps)
    if len(missing) < len(closest.needed(by)):
        message = (
            f"{source} looks like a {closest.name} export but lacks the column(s) "
            f"{', '.join(missing)} that --by {by} needs"
        )
    else:
        message = (
            f"{source} is not a billing export: it lacks the {closest.name} columns "
            f"{', '.join(missing)}"
        )
    raise InputError(message, hint=READ_HINT)


def is_tag(key: str, tag: str) -> bool:
    """Whether an export's key ``key`` spells costguard's ``tag`` (:func:`tag_key`).

    >>> is_tag("user_costguard_owner", OWNER_TAG), is_tag("costguard-jobs", JOB_TAG)
    (True, False)
    """
    return tag_key(key) == tag_key(tag)


def parse_tags(text: str | None) -> dict[str, str]:
    """The tags of one charge from a JSON ``Tags`` cell: FOCUS writes an object, Azure's
    cost exports the same pairs without the braces. Anything else counts as no tags.

    >>> parse_tags('{"costguard:job": "a"}'), parse_tags('"env": "dev","costguard:job": "b"')
    ({'costguard:job': 'a'}, {'env': 'dev', 'costguard:job': 'b'})
    >>> parse_tags("NULL"), parse_tags('{"a": 1')
    ({}, {})
    """
    if not text or not text.strip():
        return {}
    body = text.strip()
    if not body.startswith("{"):
        body = "{" + body + "}"
    try:
        parsed = json.loads(body)
    except ValueError:
        return {}
    if not isinstance(parsed, dict):
        return {}
    return {str(k): str(v) for k, v in parsed.items() if v is not None}


def tag_value(tags: Mapping[str, str], tag: str) -> str | None:
    """The value of costguard's ``tag`` among ``tags``, in whichever spelling; an empty
    value counts as none.

    >>> tag_value({"env": "dev", "costguard-job": "j1"}, JOB_TAG)
    'j1'
    >>> tag_value({"costguard:job": " "}, JOB_TAG) is None
    True
    """
    for key, value in tags.items():
        if is_tag(key, tag) and value.strip():
            return value.strip()
    return None


_MONTH = re.compile(r"([0-9]{4})-(0[1-9]|1[0-2])", re.ASCII)


def parse_month(text: str) -> str:
    """A ``YYYY-MM`` month, or :class:`InputError`.

    >>> parse_month("2026-11")
    '2026-11'
    >>> parse_month("2026-13")
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: --month must be a month written YYYY-MM, not '2026-13'
    """
    if not _MONTH.fullmatch(text):
        msg = f"--month must be a month written YYYY-MM, not {text[:40]!r}"
        raise InputError(msg, hint="e.g. --month 2026-11")
    return text


@dataclass(frozen=True)
class ComputeCharge:
    """One of a job's compute charges (``--job``): its billing month and currency, when
    its period starts (Unix time) and how long it is (hours; ``None``: not said), what
    the export calls it, the hours of its quantity (:func:`charge_hours`), its cost, and
    the resource it is for (``None``: not said)."""

    month: str
    currency: str
    start: float
    period: Decimal | None
    what: str
    hours: Decimal | None
    usd: Decimal
    resource: str | None = None


@dataclass
class Tally:
    """Sums of billed and effective cost per (group key, currency, billing month), added
    batch by batch as the files are read, with their count of charges and, per billing
    month, the first and last day charged. ``None`` is the key of a charge without one
    (untagged, no project)."""

    sums: dict[tuple[str | None, str, str], list[Decimal]] = field(default_factory=dict)
    counts: dict[tuple[str | None, str, str], int] = field(default_factory=dict)
    days: dict[str, tuple[str, str]] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    #: Read for one job (``--job``): the last day the export has any charge for; what it
    #: billed without a job tag, per day, account (AWS account, GCP project, Azure
    #: subscription; ``None``: the export names none) and currency; the accounts of the
    #: job's own charges; and its compute charges.
    covered_to: str | None = None
    untagged: dict[tuple[str, str | None, str], Decimal] = field(default_factory=dict)
    accounts: set[str | None] = field(default_factory=set)
    compute: list[ComputeCharge] = field(default_factory=list)
    #: Charges whose amount had more than :data:`PLACES` decimal places (rounded).
    rounded: int = 0

    def add(
        self,
        key: str | None,
        currency: str,
        month: str,
        billed: Decimal,
        effective: Decimal,
        *,
        rows: int = 1,
        days: tuple[str | None, str | None] = (None, None),
    ) -> None:
        """Add one charge (or ``rows`` charges already summed, charged from ``days[0]``
        to ``days[1]``)."""
        group = (key, currency, month)
        figures = self.sums.setdefault(group, [Decimal(0), Decimal(0)])
        figures[0] = EXACT.add(figures[0], billed)
        figures[1] = EXACT.add(figures[1], effective)
        self.counts[group] = self.counts.get(group, 0) + rows
        first, last = days
        if first and last:
            self.span(month, first, last)

    def merge(self, other: Tally) -> None:
        """Add the sums of ``other`` (a part of the same export, read apart)."""
        for (key, currency, month), (billed, effective) in other.sums.items():
            self.add(
                key, currency, month, billed, effective, rows=other.counts[key, currency, month]
            )
        for month, (first, last) in other.days.items():
            self.span(month, first, last)
        for where, billed in other.untagged.items():
            self.untagged[where] = EXACT.add(self.untagged.get(where, Decimal(0)), billed)
        self.rounded += other.rounded
        self.accounts |= other.accounts
        self.compute.extend(other.compute)
        if other.covered_to is not None:
            self.covered_to = max(self.covered_to or other.covered_to, other.covered_to)

    def span(self, month: str, first: str, last: str) -> None:
        """Count ``first`` to ``last`` among the days charged in ``month``."""
        seen = self.days.get(month, (first, last))
        self.days[month] = (min(seen[0], first), max(seen[1], last))


@dataclass(frozen=True)
class SpendGroup:
    key: str | None
    billed_usd: Decimal
    effective_usd: Decimal


@dataclass(frozen=True)
class SpendReport:
    """What was billed, per group, in one currency over one period."""

    by: str
    groups: tuple[SpendGroup, ...]
    total_billed_usd: Decimal
    total_effective_usd: Decimal
    currency: str
    period: str
    first_day: str | None
    last_day: str | None
    rows: int
    files: tuple[str, ...]
    #: Charges whose amount was rounded to :data:`PLACES` decimal places.
    rounded: int = 0


def report(
    tally: Tally, by: str, *, month: str | None = None, currency: str | None = None
) -> SpendReport:
    """The report for ``month`` (default: every billing month in the export) in
    ``currency`` (default: the only one there is).

    Refused (:class:`InputError`): a month the export does not cover, several currencies
    without ``currency``, a currency the export does not have, charges that name no
    currency.

    >>> t = Tally()
    >>> t.add("j1", "USD", "2026-11", Decimal("1.10"), Decimal("1.00"))
    >>> t.add(None, "USD", "2026-11", Decimal("0.05"), Decimal("0.05"))
    >>> r = report(t, "job")
    >>> [(g.key, str(g.billed_usd)) for g in r.groups], str(r.total_billed_usd), r.period
    ([('j1', '1.10'), (None, '0.05')], '1.15', '2026-11')
    >>> report(t, "job", month="2026-10")
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: the export does not cover 2026-10: its billing periods are 2026-11
    """
    months = sorted({m for (_, _, m) in tally.sums})
    if not months:
        msg = "the export has no charges"
        raise InputError(msg, hint="check that the files are the billing export's data files")
    if month is not None and month not in months:
        msg = f"the export does not cover {month}: its billing periods are {', '.join(months)}"
        raise InputError(
            msg, hint=f"add the export files of {month}, or ask for --month {months[-1]}"
        )
    chosen = [month] if month else months
    in_period = {k: v for k, v in tally.sums.items() if k[2] in chosen}
    currencies = sorted({c for (_, c, _) in in_period})
    if "" in currencies:
        count = sum(n for (_, cur, m), n in tally.counts.items() if m in chosen and not cur)
        msg = f"{count} charge(s) of the export name no currency: they add to no currency's sum"
        raise InputError(
            msg,
            hint="every charge of a billing export names its currency (FOCUS BillingCurrency, "
            "CUR line_item_currency_code, GCP currency): is the file the export's own?",
        )
    if currency is None:
        if len(currencies) > 1:
            msg = f"the export mixes currencies ({', '.join(currencies)}): sums would be wrong"
            raise InputError(msg, hint=f"report one with --currency {currencies[0]}")
        currency = currencies[0]
    elif currency not in currencies:
        msg = f"the export has no charges in {currency}: it has {', '.join(currencies)}"
        raise InputError(msg, hint=f"--currency {currencies[0]}")
    per_key: dict[str | None, list[Decimal]] = {}
    for (key, cur, _), (billed, effective) in in_period.items():
        if cur == currency:
            figures = per_key.setdefault(key, [Decimal(0), Decimal(0)])
            figures[0] = EXACT.add(figures[0], billed)
            figures[1] = EXACT.add(figures[1], effective)
    groups = sorted(
        (SpendGroup(key, billed, effective) for key, (billed, effective) in per_key.items()),
        key=lambda g: (g.key is None, -g.billed_usd, g.key or ""),
    )
    period = chosen[0] if len(chosen) == 1 else f"{chosen[0]}/{chosen[-1]}"
    spans = [tally.days[m] for m in chosen if m in tally.days]
    return SpendReport(
        by=by,
        groups=tuple(groups),
        total_billed_usd=_total(g.billed_usd for g in groups),
        total_effective_usd=_total(g.effective_usd for g in groups),
        currency=currency,
        period=period,
        first_day=min((first for first, _ in spans), default=None),
        last_day=max((last for _, last in spans), default=None),
        rows=sum(n for (_, cur, m), n in tally.counts.items() if m in chosen and cur == currency),
        files=tuple(tally.files),
        rounded=tally.rounded,
    )


def _total(amounts: Iterable[Decimal]) -> Decimal:
    """The exact sum of ``amounts``."""
    total = Decimal(0)
    for amount in amounts:
        total = EXACT.add(total, amount)
    return total


def exact(amount: Decimal) -> str:
    """An exact sum as a plain decimal string, trailing zeros dropped (no rounding).

    >>> exact(Decimal("0.00000080000")), exact(Decimal("-12.500")), exact(Decimal("0E-18"))
    ('0.0000008', '-12.5', '0')
    >>> exact(Decimal("170999999999999999829.000000000000000001"))
    '170999999999999999829.000000000000000001'
    """
    text = f"{amount.normalize(EXACT):f}"
    return "0" if text in ("0", "-0") else text


def document(spend: SpendReport) -> dict[str, object]:
    """The JSON document of a report: money as exact decimal strings."""
    return {
        "by": spend.by,
        "groups": [
            {
                "key": g.key,
                "billed_usd": exact(g.billed_usd),
                "effective_usd": exact(g.effective_usd),
            }
            for g in spend.groups
        ],
        "total_billed_usd": exact(spend.total_billed_usd),
        "total_effective_usd": exact(spend.total_effective_usd),
        "currency": spend.currency,
        "period": spend.period,
        "charges_from": spend.first_day,
        "charges_to": spend.last_day,
        "rows": spend.rows,
        "files": list(spend.files),
        # Only when some were: the document of an export of plain amounts is unchanged.
        **(
            {"rounded_amounts": spend.rounded, "rounded_to_places": PLACES} if spend.rounded else {}
        ),
    }


def group_label(key: str | None, by: str) -> str:
    """How a group's key reads in a table.

    >>> group_label(None, "job"), group_label(None, "project"), group_label("j1", "job")
    ('(untagged)', '(none)', 'j1')
    """
    if key is not None:
        return key
    return "(untagged)" if by in GROUPING_TAGS else "(none)"


#: What a charge is, for a job's reconciliation (``costguard spend --job``), in the order
#: the gaps are named.
CHARGE_KINDS = ("compute", "storage", "network", "commitment", "credit", "tax", "other")
_NETWORK = re.compile(
    r"data ?transfer|egress|bandwidth|internet|inter-?region|nat ?gateway|load ?balanc|"
    r"networking|cdn|vpc|ip address",
    re.IGNORECASE,
)
_STORAGE = re.compile(
    r"storage|ebs|volume|disk|\bpd\b|snapshot|\bs3\b|bucket|gb-?mo|blob|filestore|efs|fsx",
    re.IGNORECASE,
)
_COMMITMENT = re.compile(r"savings ?plan|reserv|commit|\bri ?fee", re.IGNORECASE)
#: FOCUS's category and CUR 2.0's line item types of a commitment's fees (``Fee``: the
#: upfront ones), and the negation of the usage a savings plan covers (what it saved).
_COMMITMENT_TYPES = {
    "purchase",
    "fee",
    "rifee",
    "savingsplanrecurringfee",
    "savingsplanupfrontfee",
    "savingsplannegation",
}


def charge_kind(*fields: str | None) -> str:
    """What one charge is, from its export's words for it: FOCUS ``ChargeCategory``,
    ``ChargeClass``, ``ServiceCategory``, ``ServiceName``, ``ChargeDescription``; CUR 2.0
    ``line_item_line_item_type``, ``line_item_product_code``, ``line_item_usage_type``,
    ``line_item_line_item_description``; GCP ``cost_type``, ``service.description``,
    ``sku.description``. Tax and credits (refunds, corrections) by their category,
    network before storage before compute by their words.

    >>> charge_kind("Usage", None, None, "Amazon Elastic Compute Cloud", "g5.xlarge spot hour")
    'compute'
    >>> charge_kind("Usage", None, None, "Amazon Elastic Compute Cloud", "EBS gp3 GB-month")
    'storage'
    >>> charge_kind("Usage", "", "", "AmazonEC2", "USE1-DataTransfer-Out-Bytes")
    'network'
    >>> charge_kind("Usage", "Correction", None, "Amazon Elastic Compute Cloud", "refund")
    'credit'
    >>> [charge_kind(k) for k in ("Tax", "Credit", "Refund", "EdpDiscount", "SavingsPlanNegation")]
    ['tax', 'credit', 'credit', 'credit', 'commitment']
    >>> charge_kind("SavingsPlanCoveredUsage", "AmazonEC2", "USE1-BoxUsage:p4d.24xlarge")
    'compute'
    >>> charge_kind("Usage", None, None, "Amazon EC2", "p4d hour covered by the savings plan")
    'compute'
    >>> charge_kind("Usage", None, None, "AWS Support (Business)", "support")
    'other'
    """
    words = [f.strip() for f in fields if f and f.strip()]
    lowered = {w.lower() for w in words}
    text = " ".join(words)
    if "tax" in lowered:
        return "tax"
    if lowered & {"credit", "refund", "correction", "adjustment"} or any(
        w.endswith("discount") for w in lowered
    ):
        return "credit"
    usage = any(w.endswith("usage") for w in lowered)  # CUR's SavingsPlanCoveredUsage too
    if lowered & _COMMITMENT_TYPES or (_COMMITMENT.search(text) and not usage):
        return "commitment"
    if _NETWORK.search(text):
        return "network"
    if _STORAGE.search(text):
        return "storage"
    if lowered & {"compute", "ai and machine learning"} or re.search(
        r"compute|instance|virtual machine|\bvm\b|gpu|\bcore|\bram\b|spot|boxusage|ec2",
        text,
        re.IGNORECASE,
    ):
        return "compute"
    return "other"


_HOURS_UNIT = re.compile(
    r"\s*([0-9]+(?:\.[0-9]+)?)?\s*(hours?|hrs?|h|seconds?|secs?|s)\s*", re.IGNORECASE | re.ASCII
)


def charge_hours(quantity: str | None, unit: str | None) -> Decimal | None:
    """The hours of one charge's quantity, in a unit of time (FOCUS ``Hours``, CUR
    ``Hrs``, GCP ``hour``, Azure ``10 Hours``, ``seconds``); ``None``: no quantity, or
    not one of time (``GB-Months``, ``vCPU-Hours``, GCP's ``gibibyte hour``).

    >>> charge_hours("0.5", "Hours"), charge_hours("1", "10 Hours"), charge_hours("1800", "s")
    (Decimal('0.5'), Decimal('10'), Decimal('0.5'))
    >>> charge_hours("2", "vCPU-Hours"), charge_hours(None, "Hrs"), charge_hours("x", "Hrs")
    (None, None, None)
    """
    matched = _HOURS_UNIT.fullmatch(unit or "")
    if matched is None or quantity is None:
        return None
    try:
        amount = Decimal(str(quantity).strip())
    except ArithmeticError:
        return None
    if not amount.is_finite():
        return None
    hours = amount * Decimal(matched.group(1) or 1)
    return hours / 3600 if matched.group(2).lower().startswith("s") else hours


@dataclass(frozen=True)
class Run:
    """An attempt of a job: when it ran (Unix times) and the hourly price it was
    counted at (the offer's, which the estimate used)."""

    start: float
    end: float
    usd_per_hour: Decimal


@dataclass(frozen=True)
class BilledHours:
    """A job's compute charges as instance-hours: the hours billed, their cost, and
    what the same hours cost at the price of the attempt nearest each (the estimate's
    prices, ``prices``)."""

    hours: Decimal
    billed_usd: Decimal
    priced_usd: Decimal
    prices: tuple[Decimal, ...]


def billed_hours(charges: Sequence[ComputeCharge], runs: Sequence[Run]) -> BilledHours | None:
    """The instance-hours of a job's compute charges, priced as its controller priced
    the attempt running then (or the nearest one: an instance up before or after its
    attempt). ``None`` where a period's hours are not known, or there is no attempt.

    Each resource (instance) of a period counts apart: an instance's hours are the most
    any of its charges bills, once divided by the units that charge bills at once (GCP
    bills a VM's 4 cores as 4 core-hours an hour: the most it bills per hour of any
    period); a period's hours are its instances' sum.

    >>> runs = [Run(0, 5400, Decimal("0.5"))]  # 1.5 hours
    >>> def vm(start, cores, usd):  # a VM's 4 cores, its memory
    ...     return [ComputeCharge("2026-11", "USD", start, Decimal(1), "core", cores, usd, "vm"),
    ...             ComputeCharge("2026-11", "USD", start, Decimal(1), "ram", None, usd, "vm")]
    >>> b = billed_hours(vm(0, Decimal(4), Decimal("0.25")) + vm(3600, Decimal(2), Decimal("0.13")),
    ...                  runs)
    >>> str(b.hours), str(b.billed_usd), str(b.priced_usd), [str(p) for p in b.prices]
    ('1.5', '0.76', '0.75', ['0.5'])
    """
    if not runs:
        return None
    # Per (period, resource, charge): hours, period length, cost.
    parts: dict[tuple[float, str | None, str], list[Any]] = {}
    for charge in charges:
        part = parts.setdefault(
            (charge.start, charge.resource, charge.what), [None, charge.period, Decimal(0)]
        )
        if charge.hours is not None:
            part[0] = (part[0] or Decimal(0)) + charge.hours
        part[2] += charge.usd
    units: dict[tuple[str | None, str], Decimal] = {}
    for (_, resource, what), (hours, period, _) in parts.items():
        if hours is not None and period:
            units[resource, what] = max(units.get((resource, what), Decimal(1)), hours / period)
    instances: dict[float, dict[str | None, Decimal]] = {}
    billed_in: dict[float, Decimal] = {}
    lengths: dict[float, Decimal] = {}
    for (start, resource, what), (hours, period, usd) in parts.items():
        billed_in[start] = billed_in.get(start, Decimal(0)) + usd
        lengths[start] = max(lengths.get(start, Decimal(0)), period or Decimal(0))
        per_instance = instances.setdefault(start, {})
        if hours is not None:
            hours /= units.get((resource, what), 1)
            hours = min(hours, period) if period else hours
            per_instance[resource] = max(per_instance.get(resource, hours), hours)
    total = billed = priced = Decimal(0)
    prices: dict[Decimal, None] = {}
    for start, usd in sorted(billed_in.items()):
        if not instances[start]:
            return None
        hours = sum(instances[start].values(), Decimal(0))
        total += hours
        billed += usd
        priced += _priced(start, lengths[start] or Decimal(1), hours, runs, prices)
    return BilledHours(total, billed, priced, tuple(prices))


def _priced(
    start: float, length: Decimal, hours: Decimal, runs: Sequence[Run], prices: dict[Decimal, None]
) -> Decimal:
    """What ``hours`` billed in the period from ``start`` (``length`` hours) cost at the
    estimate's prices: the hours each attempt ran in it at its own price, hours beyond
    them (the instance up, no attempt working) at the nearest attempt's, fewer hours at
    the attempts' average (``prices``: each price used, added)."""
    end = start + float(length) * 3600
    ran = [
        (Decimal(str(min(end, r.end) - max(start, r.start))) / 3600, r.usd_per_hour)
        for r in runs
        if min(end, r.end) > max(start, r.start)
    ]
    run_hours = sum((h for h, _ in ran), Decimal(0))
    run_usd = sum((h * p for h, p in ran), Decimal(0))
    prices.update(dict.fromkeys(p for _, p in ran))
    if hours < run_hours:
        return hours * run_usd / run_hours
    nearest = min(runs, key=lambda r: max(r.start - start, start - r.end, 0))
    if hours > run_hours:
        prices[nearest.usd_per_hour] = None
    return run_usd + (hours - run_hours) * nearest.usd_per_hour


@dataclass(frozen=True)
class Gap:
    """One part of the difference between a job's bill and its controller's count."""

    kind: str
    usd: Decimal
    note: str


@dataclass(frozen=True)
class JobWindow:
    """What the controller knows of a job: its instance-hours at their launch prices,
    the days it ran (UTC, ``YYYY-MM-DD``), and what it counted after a given day."""

    running_usd: Decimal
    first_day: str
    last_day: str
    #: The controller's cost of the hours after the export's last day (0: none).
    unexported_usd: Decimal = Decimal(0)
    #: The instance-hours the attempts ran in the months reported, up to the export's
    #: last day.
    hours_run: Decimal = Decimal(0)
    #: The controller's cost of the hours outside the billing months reported.
    other_months_usd: Decimal = Decimal(0)


@dataclass(frozen=True)
class Reconciliation:
    """A launched job's estimate and its controller's running cost next to what the
    export billed under its ``costguard:job`` tag, and what the difference is made of."""

    job_id: str
    estimate_usd: Decimal | None
    running_usd: Decimal
    billed_usd: Decimal
    effective_usd: Decimal
    gap_usd: Decimal
    gaps: tuple[Gap, ...]


_NOTES = {
    "storage": "disks, snapshots and buckets: the controller counts instance-hours only",
    "network": "egress and other data transfer, NAT, load balancers, addresses",
    "commitment": "savings plan or reservation fees billed under the job's tag",
    "credit": "credits, refunds and corrections",
    "tax": "tax billed under the job's tag",
    "other": "charges of other services under the job's tag",
}


def reconcile(
    kinds: SpendReport,
    job_id: str,
    *,
    estimate_usd: Decimal | None,
    window: JobWindow,
    covered_to: str | None,
    untagged_usd: Decimal,
    hours: BilledHours | None = None,
    accounts: Sequence[str] = (),
) -> Reconciliation:
    """Billed against running cost, the difference named part by part: ``kinds`` is the
    job's bill grouped by :func:`charge_kind`; ``covered_to`` the last day the export
    has charges for (any charge, not only the job's); ``untagged_usd`` what the export
    billed without any job tag on the days the job ran, in the job's ``accounts``;
    ``hours`` the job's compute charges as instance-hours (:func:`billed_hours`). The
    gaps up to the missing days add up to ``gap_usd``; the untagged and amortised lines
    are beside it.

    The instances' part is named twice over when the export says how many hours it
    billed: idle time, the billed hours no attempt ran at the estimate's price; price
    changes, the billed hours at the billed price less the estimate's. Without hours it
    is one gap.

    >>> bill = SpendReport("charge", (SpendGroup("compute", Decimal(3), Decimal(3)),
    ...     SpendGroup("storage", Decimal("0.5"), Decimal("0.5"))), Decimal("3.5"),
    ...     Decimal("3.5"), "USD", "2026-11", None, None, 2, ())
    >>> window = JobWindow(Decimal("2.5"), "2026-11-03", "2026-11-09", Decimal("0.4"))
    >>> r = reconcile(bill, "j1", estimate_usd=None, window=window,
    ...               covered_to="2026-11-07", untagged_usd=Decimal("0.2"))
    >>> str(r.gap_usd), [(g.kind, str(g.usd)) for g in r.gaps]  # doctest: +NORMALIZE_WHITESPACE
    ('1.0', [('idle time or price changes', '0.9'), ('storage', '0.5'),
             ('missing days', '-0.4'), ('untagged', '0.2')])
    """
    billed = {g.key: g.billed_usd for g in kinds.groups}
    gaps = []
    counted = window.running_usd - window.unexported_usd - window.other_months_usd
    compute = billed.get("compute", Decimal(0)) - counted
    if hours is not None and hours.billed_usd == billed.get("compute", Decimal(0)):
        gaps.extend(_instance_gaps(hours, window))
    elif compute > 0:
        note = (
            f"the instances billed {exact(compute)} more than the controller counted "
            "(instance-hours x launch price): instance time outside the attempts (boot, "
            "shutdown, an instance left idle) or a higher price than the table's"
        )
    else:
        note = (
            f"the instances billed {exact(-compute)} less than the controller counted: a "
            "lower price than the table's (the spot price moved, discounts), or hours "
            "not billed"
        )
    if compute and not gaps:
        gaps.append(Gap("idle time or price changes", compute, note))
    for kind in CHARGE_KINDS[1:]:
        if billed.get(kind):
            gaps.append(Gap(kind, billed[kind], _NOTES[kind]))
    lagging = covered_to is not None and covered_to < window.last_day
    if window.unexported_usd or (lagging and not window.other_months_usd):
        gaps.append(
            Gap(
                "missing days",
                -window.unexported_usd,
                f"the export's charges end on {covered_to}, the job ran to "
                f"{window.last_day}: the controller counted {exact(window.unexported_usd)} "
                "after that (exports lag a day or two)",
            )
        )
    if window.other_months_usd:
        gaps.append(
            Gap(
                "other months",
                -window.other_months_usd,
                f"the controller counted {exact(window.other_months_usd)} for hours outside "
                f"{kinds.period}, which this bill leaves out",
            )
        )
    if untagged_usd:
        gaps.append(
            Gap(
                "untagged",
                untagged_usd,
                f"billed without a costguard:job tag from {window.first_day} to "
                f"{window.last_day}{_in_accounts(accounts)}, not counted above: some may "
                "be the job's (data transfer, NAT, snapshots its tags do not reach)",
            )
        )
    if kinds.total_effective_usd != kinds.total_billed_usd:
        gaps.append(
            Gap(
                "amortised",
                kinds.total_effective_usd - kinds.total_billed_usd,
                f"commitments spread over usage: effective {exact(kinds.total_effective_usd)} "
                f"against billed {exact(kinds.total_billed_usd)}",
            )
        )
    return Reconciliation(
        job_id=job_id,
        estimate_usd=estimate_usd,
        running_usd=window.running_usd,
        billed_usd=kinds.total_billed_usd,
        effective_usd=kinds.total_effective_usd,
        gap_usd=kinds.total_billed_usd - window.running_usd,
        gaps=tuple(gaps),
    )


def _instance_gaps(hours: BilledHours, window: JobWindow) -> list[Gap]:
    """Idle time and price changes: the instances' part of the gap, split."""
    counted = window.running_usd - window.unexported_usd - window.other_months_usd
    idle_usd = hours.priced_usd - counted
    price_usd = hours.billed_usd - hours.priced_usd
    idle_hours = hours.hours - window.hours_run
    prices = " and ".join(f"{exact(p)}/h" for p in hours.prices)
    gaps = []
    if idle_usd:
        ran = (
            f"{exact(hours.hours)} instance-hours billed, {exact(window.hours_run)} run by "
            "the job's attempts: "
        )
        if idle_hours > 0:
            note = (
                f"{ran}{exact(idle_hours)} h the instance was up with no attempt working "
                f"(boot, shutdown, an instance left running), at the estimate's {prices}"
            )
        else:
            note = f"{ran}{exact(-idle_hours)} h the controller counted were not billed"
        gaps.append(Gap("idle time", idle_usd, note))
    if price_usd:
        cost = f"{exact(hours.billed_usd)}"
        if hours.hours:
            average = (hours.billed_usd / hours.hours).quantize(Decimal("0.000001"))
            cost = f"{exact(average)}/h on average"
        note = (
            f"the {exact(hours.hours)} billed hours cost {cost} against the estimate's "
            f"{prices}: the spot price moved, a discount, or an out-of-date price table"
        )
        gaps.append(Gap("price changes", price_usd, note))
    return gaps


def _in_accounts(accounts: Sequence[str]) -> str:
    """Where the untagged charges were counted, for their note.

    >>> _in_accounts(["1111"]), _in_accounts(["p1", "p2"]), _in_accounts([])
    (" in the job's account 1111", " in the job's accounts p1, p2", '')
    """
    if not accounts:
        return ""
    plural = "s" if len(accounts) > 1 else ""
    return f" in the job's account{plural} {', '.join(accounts)}"
