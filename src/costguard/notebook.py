"""The Python API for notebooks and scripts: ``costguard.estimate(...)``.

It builds the request, checks it and prices it exactly as ``costguard estimate`` does (the
same functions), and returns an :class:`EstimateResult`: the estimate with the options
shown, whose :meth:`~EstimateResult.document` is the ``--format json`` document,
:meth:`~EstimateResult.to_pandas` a DataFrame (pandas is an optional extra, imported only
there) and ``_repr_html_`` the table Jupyter shows. Money is :class:`~decimal.Decimal`,
but in a DataFrame (:mod:`costguard.frames`); old prices give a :class:`StalePricesWarning`.

>>> import costguard
>>> result = costguard.estimate(gpu="a10g", hours=8, count=4)
>>> type(result).__name__, result.estimate.request.count
('EstimateResult', 4)
"""

from __future__ import annotations

import html
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from costguard.clouds import require
from costguard.errors import InputError, StalePricesWarning
from costguard.frames import numeric_columns
from costguard.money import format_usd, usd_str
from costguard.pricing.advice import describe, unverified_note
from costguard.pricing.catalog import Catalog
from costguard.pricing.document import OPTION_FIELDS, option_row, to_document
from costguard.pricing.estimate import DEFAULT_DISK_GB, CostOption, Estimate
from costguard.pricing.question import Question, to_decimal
from costguard.pricing.quote import quote
from costguard.pricing.tables import load_tables
from costguard.settings import Settings

#: The parts ``--format json`` splits storage and egress into; the DataFrame shows the sums.
_PARTS = ("block_storage_usd", "object_storage_usd", "internet_egress_usd", "data_transfer_usd")
#: The DataFrame's columns: those of ``--format json``'s options, in that order, with the
#: tables' date before the notes.
COLUMNS = (*(f for f in OPTION_FIELDS if f not in (*_PARTS, "notes")), "pricing_as_of", "notes")


@dataclass(frozen=True)
class EstimateResult:
    """An estimate as ``costguard estimate`` prints it: the options shown, cheapest first."""

    estimate: Estimate
    shown: tuple[CostOption, ...]
    catalog: Catalog
    top: int

    @property
    def cheapest(self) -> CostOption | None:
        """The cheapest option, or ``None`` when nothing matched."""
        return self.estimate.cheapest

    @property
    def assumptions(self) -> tuple[str, ...]:
        """What every figure assumes (the lines under the table)."""
        return ("total = compute + storage + egress", *self.estimate.assumptions)

    def document(self) -> dict[str, Any]:
        """The ``costguard estimate --format json`` document (money as Decimal)."""
        return to_document(self.estimate, self.shown, self.catalog, None, self.top)

    def records(self) -> list[dict[str, Any]]:
        """One dict per option shown, with the ``--format json`` keys of :data:`COLUMNS`.

        Money is the Decimal of the JSON's exact string (rounded as ``--format json``
        rounds it), so the two always agree.
        """
        rows = []
        for option in self.shown:
            row = option_row(option, self.catalog)
            rows.append(
                {
                    name: Decimal(usd_str(row[name]))
                    if isinstance(row[name], Decimal)
                    else row[name]
                    for name in COLUMNS
                }
            )
        return rows

    def to_pandas(self, *, exact: bool = False) -> Any:
        """The options as a ``pandas.DataFrame`` (needs costguard[pandas]).

        Money and the other figures are ``float64`` columns, which pandas plots and sums
        (``df.plot.barh(x="region", y="total_usd")``); with ``exact=True`` the money
        columns hold the Decimals of :meth:`records` instead, exact to the cent.
        ``DataFrame.attrs`` holds ``assumptions`` and ``pricing_as_of``.
        """
        frame = require("pandas", "pandas").DataFrame.from_records(
            self.records(), columns=list(COLUMNS)
        )
        frame = numeric_columns(frame, exact=exact)
        frame.attrs["assumptions"] = list(self.assumptions)
        frame.attrs["pricing_as_of"] = self.document()["pricing_as_of"]
        return frame

    def _repr_html_(self) -> str:
        """The table Jupyter shows: the figures of the terminal table, and the assumptions."""
        heads = ("Provider", "Region", "Market", "Instance", "$/h", "Compute", "Storage",
                 "Egress", "Total")  # fmt: skip
        rows = [
            (
                o.provider,
                o.region,
                str(o.market),
                o.instance_type,
                format_usd(o.usd_per_hour, rate=True),
                format_usd(o.compute_usd),
                format_usd(o.storage_usd),
                format_usd(o.egress_usd),
                format_usd(o.total_usd),
            )
            for o in self.shown
        ]
        right = {"$/h", "Compute", "Storage", "Egress", "Total"}

        def cells(tag: str, values: Iterable[str]) -> str:
            return "".join(
                f'<{tag} style="text-align:{"right" if h in right else "left"}">'
                f"{html.escape(v)}</{tag}>"
                for h, v in zip(heads, values, strict=True)
            )

        body = "".join(f"<tr>{cells('td', row)}</tr>" for row in rows)
        notes = "".join(f"<li>{html.escape(line)}</li>" for line in self.assumptions)
        return (
            f"<p><b>{html.escape(self._title())}</b></p>"
            f"<table><thead><tr>{cells('th', heads)}</tr></thead><tbody>{body}</tbody></table>"
            f"<p>Assumptions:</p><ul>{notes}</ul>"
        )

    def __repr__(self) -> str:
        cheapest = self.cheapest
        best = (
            f"cheapest {describe(cheapest)} {format_usd(cheapest.total_usd)}"
            f"{unverified_note(self.estimate.cheaper_unverified)}"
            if cheapest
            else "no option"
        )
        return f"<EstimateResult {self._title()}: {len(self.shown)} option(s), {best}>"

    def _title(self) -> str:
        request = self.estimate.request
        what = request.gpu or request.instance_type
        return (
            f"{what} x {request.gpus_per_instance} per instance, {request.count} instance(s), "
            f"{request.hours} h - {self.catalog.origin} prices as of "
            f"{self.document()['pricing_as_of']}"
        )


def estimate(
    gpu: str | None = None,
    hours: float | int | str | Decimal | None = None,
    count: int = 1,
    *,
    gpus_per_instance: int = 1,
    provider: str | Sequence[str] = (),
    region: str | Sequence[str] = (),
    instance_type: str | None = None,
    spot: bool | None = None,
    disk_gb: float | int | str | Decimal = DEFAULT_DISK_GB,
    storage_gb: float | int | str | Decimal = 0,
    storage_months: float | int | str | Decimal = 1,
    egress_gb: float | int | str | Decimal = 0,
    data_region: str | None = None,
    data_gb: float | int | str | Decimal = 0,
    top: int = 10,
    pricing_dir: str | Path | None = None,
) -> EstimateResult:
    """What a GPU run costs, as ``costguard estimate`` computes it, offline.

    The arguments are the command's options (``provider`` and ``region`` take a name or a
    list); ``hours`` is required, as ``--hours`` is. Bad input raises
    :class:`~costguard.errors.InputError` with a hint.
    """
    if hours is None:
        msg = "hours is required: how long the run takes"
        raise InputError(msg, hint=f"e.g. costguard.estimate(gpu={gpu or 'a10g'!r}, hours=8)")
    question = Question(
        hours=to_decimal("hours", hours),
        disk_gb=to_decimal("disk_gb", disk_gb),
        storage_gb=to_decimal("storage_gb", storage_gb),
        storage_months=to_decimal("storage_months", storage_months),
        egress_gb=to_decimal("egress_gb", egress_gb),
        data_gb=to_decimal("data_gb", data_gb),
        gpus=(gpu,) if gpu else (),
        count=count,
        gpus_per_instance=gpus_per_instance,
        providers=_names(provider),
        regions=_names(region),
        instance_type=instance_type,
        spot=spot,
        data_region=data_region,
        top=top,
    )
    settings = Settings.load({"pricing_dir": Path(pricing_dir) if pricing_dir else None})
    catalog = load_tables(
        settings.pricing_dir, settings.pricing_cache_dir, parsed=settings.parsed_tables
    )
    answer = quote(question, catalog)
    stale = answer.stale_warning()
    if stale is not None and settings.stale_warning:
        warn_stale(stale)
    return EstimateResult(answer.estimate, answer.shown, catalog, top)


def warn_stale(stale: str) -> None:
    """The prices' age as a :class:`~costguard.errors.StalePricesWarning` (a notebook shows
    it under the cell; COSTGUARD_STALE_WARNING=0 or ``warnings`` filters hide it)."""
    message = f"{stale}: `costguard pricing refresh` updates them"
    warnings.warn(message, StalePricesWarning, stacklevel=3)


def _names(value: str | Sequence[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


#: The columns of an array's DataFrame (:func:`job_status`), one row per task.
TASK_COLUMNS = ("index", "status", "attempts", "preemptions", "failures", "step", "left_s",
                "cost_usd", "projected_usd", "reason", "job_id", "checkpoint_url")  # fmt: skip


def job_status(url: str, *, exact: bool = False) -> Any:
    """The launched job at checkpoint ``url`` as ``costguard jobs status --format json``
    reports it: a dict (:func:`costguard.spot.report.job_status`); for an array
    (``costguard launch --array``), a ``pandas.DataFrame`` of its tasks, one row each with
    the roll-up's figures (:data:`TASK_COLUMNS`; money as ``float64``, or the exact
    Decimals with ``exact=True``), the array's own in ``DataFrame.attrs`` (``array_id``,
    ``array``, ``concurrency``, ``max_total_usd``, ``spent_usd``, ``counts``,
    ``unreadable``: the tasks whose record is not costguard's, left out).

    ``costguard.job_status("s3://my-bucket/sweep")["status"].value_counts()``
    """
    import time

    from costguard.spot import array
    from costguard.spot.prepare import normal_url, open_store
    from costguard.spot.report import job_status as single_job_status
    from costguard.spot.sweep import load_tasks, rollup_document, rows

    url = normal_url(url)
    record = array.read_record(open_store(url))
    if record is None:
        return single_job_status(url)
    tasks = load_tasks(record, skip_bad=True)
    paces = {t.index: t.pace_copy for t in tasks if t.pace_copy is not None}
    task_rows = rows(record.url, ((t.index, t.job) for t in tasks), time.time(), paces=paces)
    records = [
        {
            "index": r.index, "status": r.status, "attempts": r.attempts,
            "preemptions": r.preemptions, "failures": r.failures, "step": r.step,
            "left_s": r.left_s, "cost_usd": r.spent_usd, "projected_usd": r.projected_usd,
            "reason": r.reason, "job_id": r.job_id, "checkpoint_url": r.checkpoint_url,
        }
        for r in task_rows
    ]  # fmt: skip
    frame = require("pandas", "pandas").DataFrame.from_records(records, columns=list(TASK_COLUMNS))
    frame = numeric_columns(frame, exact=exact)
    document = rollup_document(record, task_rows)
    frame.attrs.update({key: value for key, value in document.items() if key != "tasks"})
    return frame
