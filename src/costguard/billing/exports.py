"""Read billing exports, local or in a bucket, into a :class:`~costguard.billing.spend.Tally`.

Files, globs, folders and ``s3://``/``gs://``/``az://`` URLs are opened through fsspec and
read in place, only the columns the report needs: Parquet by column projection, CSV and
CSV.gz as a stream of blocks (memory bounded by the block size, not the file), JSONL
with the fields named in an explicit schema. Each batch is summed by pyarrow (costs cast
to exact decimals, grouped in C++), so Python sees a handful of sums per batch, not rows.

Parquet, the large exports' format, is read fast (benchmarks/spend.py): row groups in
parallel, text as dictionaries (rows grouped by integer indices, each distinct tag or
service decided once), float costs turned into decimals as integers where that is exact,
and a batch of one currency and one billing period grouped by its key alone.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from costguard.billing.spend import (
    CUR2,
    FOCUS,
    GCP_EXPORT,
    GROUPING_TAGS,
    ComputeCharge,
    ExportFormat,
    Tally,
    charge_hours,
    charge_kind,
    detect,
    is_tag,
    parse_tags,
    tag_value,
)
from costguard.clouds import require
from costguard.errors import CostguardError, InputError

EXTRA = "billing"
#: Rows per Parquet batch and bytes per CSV block: what one batch holds in memory; row
#: groups read at once (each holding a batch).
PARQUET_BATCH_ROWS = 512 * 1024
PARQUET_WORKERS = 4
CSV_BLOCK_BYTES = 8 * 1024 * 1024
#: Costs are cast to exact decimals of 36 digits, 18 after the point: every export's digits
#: fit, and a sum of two (the amortised figures) stays within decimal128's 38 digits. A
#: batch's sum is decimal128(38, 18): exact up to 10**20 per batch.
SCALE = 18
PRECISION = 36
#: The files a folder or glob yields, by name ending (manifests and others are skipped).
DATA_SUFFIXES = (".csv", ".csv.gz", ".parquet", ".jsonl", ".jsonl.gz", ".ndjson", ".json")
_MAX_FILES = 100_000
#: Rows of a batch whose distinct float amounts decide how the batch's are converted.
_SAMPLE_ROWS = 4096
#: Float amounts of at most this many decimal places, under 10**5 each (every export's
#: line items), are converted as integers (:func:`_float_amounts`); others as text.
FLOAT_PLACES = 10
_FLOAT_SCALE = 10.0**FLOAT_PLACES
_FLOAT_UNITS_LIMIT = 10**15
#: Between the words of a charge's kind columns (a character no export writes).
_SEPARATOR = "\x1f"


def read_spend(sources: Sequence[str], by: str, *, job: str | None = None) -> Tally:
    """Sum every charge of the exports ``sources`` per ``by`` group, currency and month;
    with ``job``, only the charges tagged with that ``costguard:job``."""
    tally = Tally()
    for fs, path, shown in expand(sources):
        _read_file(fs, path, shown, Grouping(by, job), tally)
        tally.files.append(shown)
    return tally


@dataclass(frozen=True)
class Grouping:
    """What a report groups by, and the one job it keeps (``None``: every charge)."""

    by: str
    job: str | None = None

    def columns(self, fmt: ExportFormat, present: Sequence[str]) -> list[str]:
        """The columns to read: those of the grouping, and the tags for a job."""
        wanted = _columns_for(fmt, self.by, present)
        if self.job is not None:
            wanted += [c for c in _columns_for(fmt, "job", present) if c not in wanted]
            around = [fmt.project]
            if self.by == "charge":
                around += [fmt.day_end, *_top(_quantity(fmt, present)), *_top([fmt.resource])]
            wanted += [c for c in around if c in present and c not in wanted]
        return wanted

    def detect(self, columns: Sequence[str], source: str) -> ExportFormat:
        fmt = detect(columns, self.by, source)
        return fmt if self.job is None else detect(columns, "job", source)


def _quantity(fmt: ExportFormat, present: Sequence[str]) -> tuple[str, str] | None:
    """The first (quantity, unit) columns of ``fmt`` the file has."""
    return next((q for q in fmt.quantities if set(_top(q)) <= set(present)), None)


def _top(names: Sequence[str] | None) -> list[str]:
    """The columns that hold ``names`` (``a.b``: field ``b`` of record ``a``)."""
    return list(dict.fromkeys(name.split(".", 1)[0] for name in names or ()))


def _field(table: Any, name: str) -> Any:
    """Column ``name`` of ``table`` (``a.b``: field ``b`` of record ``a``), as text."""
    pc = require("pyarrow.compute", EXTRA)
    column, _, inner = name.partition(".")
    return _text(pc.struct_field(table[column], inner) if inner else table[column])


def expand(sources: Sequence[str]) -> Iterator[tuple[Any, str, str]]:
    """Each data file of ``sources``: ``(filesystem, path, name to show)``. A folder gives
    the data files below it, a glob those matching; a missing file is refused. Buckets
    are opened as checkpoint stores are, with the fsspec options of
    ``COSTGUARD_STORAGE_OPTIONS`` (an endpoint, a connection string, a token)."""
    from costguard.checkpoint.backends import PROTOCOLS
    from costguard.checkpoint.store import open_filesystem, storage_options_from_env

    fsspec = require("fsspec", EXTRA)
    for source in sources:
        scheme = source.split("://", 1)[0] if "://" in source else "file"
        if PROTOCOLS.get(scheme):
            fs, path = open_filesystem(source, storage_options_from_env(), what="export URL")
        else:
            fs, path = fsspec.core.url_to_fs(source)
        # Names shown with the scheme the source was given with (az://, not adlfs' abfs://).
        prefix = "" if scheme in ("file", "local") else f"{scheme}://"
        found = _listed(fs, path, source)
        if not found:
            msg = f"no billing export files at {source}"
            raise InputError(
                msg, hint=f"name CSV, CSV.gz, Parquet or JSONL files: {', '.join(DATA_SUFFIXES)}"
            )
        if len(found) > _MAX_FILES:
            msg = f"{source} names {len(found)} files, more than {_MAX_FILES}"
            raise InputError(msg, hint="name one billing period's folder")
        for path_found in found:
            yield fs, path_found, prefix + path_found if prefix else path_found


def _is_data(path: str) -> bool:
    name = path.rsplit("/", 1)[-1].lower()
    return name.endswith(DATA_SUFFIXES) and "manifest" not in name


def _listed(fs: Any, path: str, source: str) -> list[str]:
    """The files ``path`` names: a glob's matches, a folder's data files, the file."""
    try:
        if any(ch in path for ch in "*?["):
            return sorted(fs.glob(path))
        if fs.isdir(path):
            return sorted(p for p in fs.find(path) if _is_data(p))
        return [path] if fs.exists(path) else []
    except Exception as exc:
        raise _unreadable(source, exc) from None


def _unreadable(source: str, exc: Exception) -> CostguardError:
    """Why a bucket could not be read: an endpoint that does not answer, credentials
    missing or refused (what fsspec backends raise: OSError, and the SDKs' errors they
    let through, botocore's among them). Anything else is re-raised."""
    from costguard.checkpoint.backends import is_transient, no_credentials

    if not isinstance(exc, OSError) and not is_transient(exc) and not no_credentials(exc):
        raise exc
    return CostguardError(
        f"could not read {source}: {exc}",
        hint="check the URL and the cloud credentials (AWS_PROFILE, gcloud auth, "
        "AZURE_STORAGE_CONNECTION_STRING, COSTGUARD_STORAGE_OPTIONS)",
    )


def _kind(path: str) -> str:
    name = path.lower()
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith((".jsonl", ".jsonl.gz", ".ndjson", ".json", ".json.gz")):
        return "jsonl"
    return "csv"


def _read_file(fs: Any, path: str, shown: str, by: Grouping, tally: Tally) -> None:
    kind = _kind(path)
    try:
        if kind == "parquet":
            _read_parquet(fs, path, shown, by, tally)
        elif kind == "jsonl":
            _read_jsonl(fs, path, shown, by, tally)
        else:
            _read_csv(fs, path, shown, by, tally)
    except CostguardError:
        raise
    except (OSError, ValueError) as exc:
        # pyarrow's ArrowInvalid is a ValueError: a file that is not what its name says.
        msg = f"could not read {shown} as {kind}: {str(exc).splitlines()[0][:300]}"
        raise InputError(msg, hint="name the billing export's own data files") from None


def _columns_for(fmt: ExportFormat, by: str, present: Sequence[str]) -> list[str]:
    wanted = list(fmt.needed(by))
    if by in GROUPING_TAGS and fmt.tags not in present:
        tags = next(t for t in fmt.tags_elsewhere if t in present)
        wanted = [tags if c == fmt.tags else c for c in wanted]
    more = fmt.optional + (fmt.kinds if by == "charge" else ())
    return wanted + [c for c in dict.fromkeys(more) if c in present and c not in wanted]


def _read_csv(fs: Any, path: str, shown: str, by: Grouping, tally: Tally) -> None:
    pa = require("pyarrow", EXTRA)
    pcsv = require("pyarrow.csv", EXTRA)
    with fs.open(path, "rb", compression="infer") as raw:
        first = _first_line(raw, 1 << 20).decode("utf-8-sig", errors="replace")
    header = next(csv.reader(io.StringIO(first)), [])
    fmt = by.detect(header, shown)
    columns = by.columns(fmt, header)
    convert = pcsv.ConvertOptions(
        include_columns=columns,
        column_types=dict.fromkeys(columns, pa.string()),
        null_values=["", "NULL", "null"],
        strings_can_be_null=True,
    )
    with fs.open(path, "rb", compression="infer") as raw:
        reader = pcsv.open_csv(
            raw, read_options=pcsv.ReadOptions(block_size=CSV_BLOCK_BYTES), convert_options=convert
        )
        for batch in reader:
            _add_batch(pa.Table.from_batches([batch]), fmt, by, tally)


def _first_line(raw: Any, limit: int) -> bytes:
    """The first line of an open file, at most ``limit`` bytes: read in blocks (a bucket's
    file objects take no size for ``readline``)."""
    head = b""
    while len(head) < limit and b"\n" not in head:
        block = raw.read(min(64 * 1024, limit - len(head)))
        if not block:
            break
        head += block
    return head.split(b"\n", 1)[0][:limit]


def _read_parquet(fs: Any, path: str, shown: str, by: Grouping, tally: Tally) -> None:
    """Read a Parquet file's row groups in parallel (:data:`PARQUET_WORKERS` at a time,
    each with its own handle on the file and its own tally), added in file order."""
    pq = require("pyarrow.parquet", EXTRA)
    # A local file is read by pyarrow itself: its threads decode the columns without
    # holding the GIL, where an fsspec file object reads through Python.
    local = "file" in ([fs.protocol] if isinstance(fs.protocol, str) else fs.protocol)

    def opened() -> Any:
        return nullcontext(path) if local else fs.open(path, "rb")

    with opened() as raw:
        footer = pq.ParquetFile(raw)
        metadata = footer.metadata
    names = footer.schema_arrow.names
    fmt = by.detect(names, shown)
    columns = by.columns(fmt, names)
    # Text read as dictionaries: the few distinct tags, currencies and services are
    # decoded once per column chunk, and rows are grouped by their integer indices.
    schema = footer.schema
    # Periods written as text stay plain text: their least and greatest are taken.
    text = [
        leaf.path
        for leaf in (schema.column(i) for i in range(len(schema)))
        if leaf.path.split(".", 1)[0] in columns
        and leaf.logical_type.type == "STRING"
        and leaf.path not in (fmt.day, fmt.day_end)
    ]

    def row_group(group: int) -> Tally:
        # One row group at a time: a batch across two would hold two dictionaries of a
        # nested column (the tags map), which pyarrow does not return.
        with opened() as raw:
            parquet = pq.ParquetFile(raw, metadata=metadata, read_dictionary=text)
            return _row_group(parquet, group, columns, fmt, by)

    workers = min(PARQUET_WORKERS, os.cpu_count() or 1, metadata.num_row_groups)
    if workers <= 1:
        for group in range(metadata.num_row_groups):
            tally.merge(row_group(group))
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="costguard-spend") as pool:
        for part in pool.map(row_group, range(metadata.num_row_groups)):
            tally.merge(part)


def _row_group(
    parquet: Any, group: int, columns: list[str], fmt: ExportFormat, by: Grouping
) -> Tally:
    pa = require("pyarrow", EXTRA)
    tally = Tally()
    batches = parquet.iter_batches(
        batch_size=PARQUET_BATCH_ROWS, row_groups=[group], columns=columns
    )
    for batch in batches:
        _add_batch(pa.Table.from_batches([batch]), fmt, by, tally)
    return tally


def _gcp_schema(pa: Any) -> Any:
    """The GCP export's fields costguard reads, as BigQuery's JSON extract writes them."""
    pair = pa.struct([("key", pa.string()), ("value", pa.string())])
    return pa.schema(
        [
            ("cost", pa.decimal128(PRECISION, SCALE)),
            ("currency", pa.string()),
            ("usage_start_time", pa.string()),
            ("usage_end_time", pa.string()),
            (
                "usage",
                pa.struct(
                    [("amount_in_pricing_units", pa.float64()), ("pricing_unit", pa.string())]
                ),
            ),
            ("invoice", pa.struct([("month", pa.string())])),
            ("labels", pa.list_(pair)),
            ("credits", pa.list_(pa.struct([("amount", pa.decimal128(PRECISION, SCALE))]))),
            ("project", pa.struct([("id", pa.string())])),
            ("resource", pa.struct([("name", pa.string())])),  # the detailed export's
            ("service", pa.struct([("description", pa.string())])),
            ("sku", pa.struct([("description", pa.string())])),
            ("cost_type", pa.string()),
        ]
    )


def _read_jsonl(fs: Any, path: str, shown: str, by: Grouping, tally: Tally) -> None:
    pa = require("pyarrow", EXTRA)
    pjson = require("pyarrow.json", EXTRA)
    with fs.open(path, "rb", compression="infer") as raw:
        first = _first_line(raw, 1 << 24)
    try:
        keys = list(json.loads(first)) if first.strip() else []
    except ValueError:
        keys = []
    fmt = by.detect(keys, shown)
    if fmt is not GCP_EXPORT:
        msg = f"{shown} is a {fmt.name} export saved as JSON lines"
        raise InputError(msg, hint="read its CSV or Parquet files")
    options = pjson.ParseOptions(
        explicit_schema=_gcp_schema(pa), unexpected_field_behavior="ignore"
    )
    with fs.open(path, "rb", compression="infer") as raw:
        reader = pjson.open_json(raw, parse_options=options)
        for batch in reader:
            _add_batch(pa.Table.from_batches([batch]), fmt, by, tally)


# -- one batch: normalised to (key, currency, month, day, billed, effective), summed


def _add_batch(table: Any, fmt: ExportFormat, grouping: Grouping, tally: Tally) -> None:
    """Sum one batch per (key, currency, billing period) in pyarrow. The currency, the
    period and the day are grouped as read (a timestamp, a dictionary index) and made
    text only for the few groups that come out."""
    pa = require("pyarrow", EXTRA)
    pc = require("pyarrow.compute", EXTRA)
    np = require("numpy", EXTRA)
    if table.num_rows == 0:
        return
    billed = _money(table, fmt.billed)
    if fmt is FOCUS:
        effective = (
            billed
            if _same(table[fmt.billed], table["EffectiveCost"])
            else _money(table, "EffectiveCost")
        )
    elif fmt is CUR2:
        effective = _cur_effective(table, billed)
    else:
        effective = billed
    by = grouping.by
    key = _date(table, fmt.day) if by == "day" else _key(table, fmt, by)
    columns = {
        "key": key,
        "currency": table[fmt.currency],
        "month": (
            pc.struct_field(table["invoice"], "month") if fmt is GCP_EXPORT else table[fmt.period]
        ),
        "day": table[fmt.day],
        "billed": billed,
        "effective": effective,
        "charges": pa.array(np.ones(table.num_rows, np.int8)),
    }
    # A batch is mostly of one currency and one billing period: then the rows are grouped
    # by their key alone.
    same: dict[str, Any] = {}
    for name in ("currency", "month"):
        values = pc.unique(columns[name])
        if len(values) == 1:
            same[name] = values[0].as_py()
            del columns[name]
    if grouping.job is not None:
        columns.update(_job_columns(table, fmt, grouping, key))
    parts = pa.table(columns)
    if fmt is GCP_EXPORT:
        parts = _with_gcp_credits(table, parts)
    if grouping.job is not None:
        _add_around_job(table, fmt, parts, same, tally)
        parts = parts.filter(_is(parts["job"], grouping.job))
        tally.accounts.update(pc.unique(parts["account"]).to_pylist())
        if by == "charge":
            _add_compute(parts, fmt, same, tally)
    grouped = [name for name in ("key", "currency", "month") if name not in same]
    sums = parts.group_by(grouped).aggregate(
        [("billed", "sum"), ("effective", "sum"), ("charges", "sum")]
    )
    for row in sums.to_pylist():
        row.update(same)
        tally.add(
            _as_text(row["key"]),
            row["currency"] or "",
            _period(row["month"], fmt),
            row["billed_sum"] or Decimal(0),
            row["effective_sum"] or Decimal(0),
            rows=row["charges_sum"] or 0,
        )
    # The days charged, per billing period (not per group: fewer values to make text).
    if "month" in same:
        spans = [{"month": same["month"], "day_min_max": pc.min_max(parts["day"]).as_py()}]
    else:
        spans = parts.group_by("month").aggregate([("day", "min_max")]).to_pylist()
    for row in spans:
        first, last = _day(row["day_min_max"]["min"]), _day(row["day_min_max"]["max"])
        if first and last:
            tally.span(_period(row["month"], fmt), first, last)


def _job_columns(table: Any, fmt: ExportFormat, grouping: Grouping, key: Any) -> dict[str, Any]:
    """The columns a job's reconciliation reads besides a report's: each charge's job and
    account, and for its kinds of charges (``charge``) when its period ends and how long
    it billed."""
    pa = require("pyarrow", EXTRA)
    present = table.column_names
    nothing = pa.nulls(table.num_rows, pa.string())
    columns = {
        "job": key if grouping.by == "job" else _key(table, fmt, "job"),
        "account": _key(table, fmt, "project") if fmt.project in present else nothing,
    }
    if grouping.by == "charge":
        quantity = _quantity(fmt, present)
        columns["end"] = table[fmt.day_end] if fmt.day_end in present else nothing
        columns["quantity"] = _field(table, quantity[0]) if quantity else nothing
        columns["unit"] = _field(table, quantity[1]) if quantity else nothing
        columns["what"] = _kind_words(table, fmt)
        has_resource = _top([fmt.resource])[0] in present
        columns["resource"] = _field(table, fmt.resource) if has_resource else nothing
    return columns


def _add_around_job(
    table: Any, fmt: ExportFormat, parts: Any, same: dict[str, Any], tally: Tally
) -> None:
    """What a job's reconciliation needs besides its charges: the last day the batch
    charges, and what it billed without a job tag, per day, account and currency
    (``same``: the currency of every row, when there is one)."""
    pc = require("pyarrow.compute", EXTRA)
    last = pc.max(table[fmt.day]).as_py()
    if _day(last) is not None:
        tally.covered_to = max(tally.covered_to or "", _day(last) or "")
    untagged = parts.filter(pc.is_null(parts["job"]))
    if untagged.num_rows:
        days = untagged.append_column("date", _date(untagged, "day"))
        keys = ["date", "account"] + ([] if "currency" in same else ["currency"])
        for row in days.group_by(keys).aggregate([("billed", "sum")]).to_pylist():
            currency = row.get("currency", same.get("currency")) or ""
            where = (_day(row["date"]) or "", _as_text(row["account"]), currency)
            tally.untagged[where] = tally.untagged.get(where, Decimal(0)) + row["billed_sum"]


def _add_compute(parts: Any, fmt: ExportFormat, same: dict[str, Any], tally: Tally) -> None:
    """The job's compute charges of a batch (a few rows: one job's hours)."""
    compute = parts.filter(_is(parts["key"], "compute"))
    for row in compute.to_pylist():
        start, end = _unix(row["day"]), _unix(row["end"])
        if start is None:
            continue
        period = Decimal(str(end - start)) / 3600 if end is not None and end > start else None
        charge = ComputeCharge(
            month=_period(row.get("month", same.get("month")), fmt),
            currency=row.get("currency", same.get("currency")) or "",
            start=start,
            period=period,
            what=row["what"],
            hours=charge_hours(row["quantity"], row["unit"]),
            usd=row["billed"],
            resource=_trimmed(row["resource"]),
        )
        tally.compute.append(charge)


def _unix(value: Any) -> float | None:
    """A charge's timestamp as read (a timestamp, ISO text, BigQuery's ``... UTC``) as a
    Unix time; a time without a zone is UTC."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        text = str(value).strip().removesuffix(" UTC").replace("Z", "+00:00")
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            return None
    return (value if value.tzinfo is not None else value.replace(tzinfo=UTC)).timestamp()


def _period(value: Any, fmt: ExportFormat) -> str:
    """A billing period as read, as ``YYYY-MM`` (GCP's invoice month is ``YYYYMM``)."""
    month = _as_text(value) or ""
    return f"{month[:4]}-{month[4:6]}" if fmt is GCP_EXPORT else month[:7]


def _same(first: Any, second: Any) -> bool:
    """Whether two columns hold the same values (a batch without commitments bills what
    it costs): one comparison, where converting the second would cost a cast per row."""
    pc = require("pyarrow.compute", EXTRA)
    if first.type != second.type or first.null_count or second.null_count:
        return False
    return bool(pc.all(pc.equal(first, second)).as_py())


def _as_text(value: Any) -> str | None:
    """A value grouped as read, as text: a timestamp as its UTC date (``YYYY-MM-DD``)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        moment = value.astimezone(UTC) if value.tzinfo is not None else value
        return moment.date().isoformat()
    if isinstance(value, date):
        return value.isoformat()
    return str(value)


def _day(value: Any) -> str | None:
    """The date of a charge's start as read: text is cut to its first 10 characters
    (``YYYY-MM-DD``). Text sorts as its first characters do, so the least of a
    column's values gives the least date."""
    text = _as_text(value)
    return text[:10] if text else None


def _exact_type(pa: Any) -> Any:
    return pa.decimal128(PRECISION, SCALE)


def _exact(column: Any) -> Any:
    """Amounts as ``decimal128(PRECISION, SCALE)``, to add to or pick among others."""
    pa = require("pyarrow", EXTRA)
    pc = require("pyarrow.compute", EXTRA)
    return column if column.type == _exact_type(pa) else pc.cast(column, _exact_type(pa))


def _text(column: Any) -> Any:
    pc = require("pyarrow.compute", EXTRA)
    return pc.cast(column, "string")


def _money(table: Any, name: str | Any) -> Any:
    """A cost column as exact decimals: text as written, floats through their shortest
    decimal form (``0.1`` stays ``0.1``), missing values as zero. ``name`` is a column
    of ``table``, or a column itself (GCP's credit amounts)."""
    pa = require("pyarrow", EXTRA)
    pc = require("pyarrow.compute", EXTRA)
    column = table[name] if isinstance(name, str) else name
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    try:
        if pa.types.is_floating(column.type):
            amounts = _float_amounts(column)
            if amounts is not None:
                return amounts
            # Bills repeat amounts (an instance's hourly price): each distinct one is
            # formatted and parsed once, when a sample of the batch says they repeat.
            sample = column.slice(0, _SAMPLE_ROWS)
            if pc.count_distinct(sample).as_py() * 2 <= len(sample):
                encoded = pc.dictionary_encode(column)
                amounts = pc.cast(pc.cast(encoded.dictionary, pa.string()), _exact_type(pa))
                exact = pc.take(amounts, encoded.indices)
                return pc.fill_null(exact, Decimal(0)) if exact.null_count else exact
            column = pc.cast(column, pa.string())
        exact = pc.cast(column, _exact_type(pa))
        # Only where there is a null to fill: fill_null on decimals costs as much as a cast.
        return pc.fill_null(exact, Decimal(0)) if exact.null_count else exact
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        what = name if isinstance(name, str) else "a credit"
        msg = f"{what} holds a value that is not a decimal amount: {str(exc)[:200]}"
        raise InputError(msg, hint="check that the file is an unmodified billing export") from None


def _float_amounts(column: Any) -> Any:
    """Float amounts as ``decimal128(38, FLOAT_PLACES)`` without formatting each one, when
    every amount of the column is the float nearest a decimal of at most
    :data:`FLOAT_PLACES` places under 10**5: that decimal is then the only one of its
    places that reads as the float, so it is the float's shortest form with zeros
    appended. ``None`` when some amount is not (more places, a larger amount, NaN).

    The test is exact: an integer under 10**15 is exact as a double, and dividing it by
    10**FLOAT_PLACES rounds as reading the decimal's text does.
    """
    pa = require("pyarrow", EXTRA)
    pc = require("pyarrow.compute", EXTRA)
    np = require("numpy", EXTRA)
    if column.null_count:
        column = pc.fill_null(column, 0.0)
    amounts = _view(column if column.type == pa.float64() else pc.cast(column, pa.float64()))
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = amounts * _FLOAT_SCALE
        np.rint(scaled, out=scaled)
        # NaN fails both comparisons; an integer under 10**15 is exact as a double.
        if not (scaled.max() < _FLOAT_UNITS_LIMIT and scaled.min() > -_FLOAT_UNITS_LIMIT):
            return None
        if not np.array_equal(scaled / _FLOAT_SCALE, amounts):
            return None
    # decimal128 values are 16-byte little-endian integers: the units, sign-extended.
    words = np.empty((len(scaled), 2), np.int64)
    words[:, 0] = scaled
    words[:, 1] = words[:, 0] >> 63
    kind = pa.decimal128(38, FLOAT_PLACES)
    return pa.Array.from_buffers(kind, len(scaled), [None, pa.py_buffer(words)])


def _view(array: Any) -> Any:
    """An array of integers or floats without nulls as a numpy view of its values
    (``Array.to_numpy`` would import pandas, when installed, on its first call)."""
    pa = require("pyarrow", EXTRA)
    np = require("numpy", EXTRA)
    letter = "f" if pa.types.is_floating(array.type) else "i"
    kind = np.dtype(f"{letter}{array.type.bit_width // 8}")
    values = array.buffers()[1]
    return np.frombuffer(values, kind, count=len(array), offset=array.offset * kind.itemsize)


def _cur_effective(table: Any, unblended: Any) -> Any:
    """CUR 2.0's amortised cost per line: covered usage at its savings plan or reservation
    effective cost, the unused part of a commitment's fee, nothing for the negations and
    upfront fees the amortisation already spreads; everything else as billed."""
    pa = require("pyarrow", EXTRA)
    pc = require("pyarrow.compute", EXTRA)
    kind = pc.fill_null(table["line_item_line_item_type"], "")

    def figure(*names: str) -> Any:
        if not all(n in table.column_names for n in names):
            return None
        total = _exact(_money(table, names[0]))
        for name in names[1:]:
            total = _exact(pc.add(total, _exact(_money(table, name))))
        return total

    zero = pa.scalar(Decimal(0), _exact_type(pa))
    committed = figure("savings_plan_total_commitment_to_date")
    used = figure("savings_plan_used_commitment")
    unused_sp = (
        _exact(pc.subtract(committed, used)) if committed is not None and used is not None else None
    )
    rules: list[tuple[Any, Any]] = [
        (
            pc.equal(kind, "SavingsPlanCoveredUsage"),
            figure("savings_plan_savings_plan_effective_cost"),
        ),
        (pc.equal(kind, "SavingsPlanRecurringFee"), unused_sp),
        (pc.is_in(kind, pa.array(["SavingsPlanNegation", "SavingsPlanUpfrontFee"])), zero),
        (pc.equal(kind, "DiscountedUsage"), figure("reservation_effective_cost")),
        (
            pc.equal(kind, "RIFee"),
            figure(
                "reservation_unused_amortized_upfront_fee_for_billing_period",
                "reservation_unused_recurring_fee",
            ),
        ),
    ]
    if "reservation_reservation_a_r_n" in table.column_names:
        arn = pc.fill_null(table["reservation_reservation_a_r_n"], "")
        rules.append((pc.and_(pc.equal(kind, "Fee"), pc.not_equal(arn, "")), zero))
    effective = _exact(unblended)
    for when, value in reversed(rules):
        if value is not None:
            effective = pc.if_else(when, value, effective)
    return effective


def _date(table: Any, name: str) -> Any:
    """A timestamp column as dates, in UTC: Parquet timestamps as ``date32``, text cut to
    its first 10 characters (``YYYY-MM-DD``)."""
    pa = require("pyarrow", EXTRA)
    pc = require("pyarrow.compute", EXTRA)
    column = table[name]
    if pa.types.is_timestamp(column.type):
        if column.type.tz is not None:
            column = pc.cast(column, pa.timestamp(column.type.unit, "UTC"))
        return pc.cast(column, pa.date32())
    if pa.types.is_date(column.type):
        return column
    return pc.utf8_slice_codeunits(_text(column), 0, 10)


def _key(table: Any, fmt: ExportFormat, by: str) -> Any:
    """The group of each charge for ``--by`` job, owner, project or service (or the
    charge's kind, for ``--job``), as a dictionary array of its trimmed text (empty:
    missing)."""
    pc = require("pyarrow.compute", EXTRA)
    if by == "charge":
        return _kinds(table, fmt)
    if by in GROUPING_TAGS:
        tags = fmt.tags if fmt.tags in table.column_names else fmt.tags_elsewhere[0]
        return _tag_values(table[tags], GROUPING_TAGS[by])
    if fmt is GCP_EXPORT:
        record, name = (
            (table["project"], "id") if by == "project" else (table["service"], "description")
        )
        return _labels(pc.struct_field(record, name))
    return _labels(table[fmt.project if by == "project" else fmt.service])


def _kinds(table: Any, fmt: ExportFormat) -> Any:
    """Each charge's :func:`~costguard.billing.spend.charge_kind`, decided once per
    distinct combination of the words the export has for it."""
    encoded = _encoded(_kind_words(table, fmt))
    found = [charge_kind(*text.split(_SEPARATOR)) for text in encoded.dictionary.to_pylist()]
    return _relabel(encoded.indices, found)


def _kind_words(table: Any, fmt: ExportFormat) -> Any:
    """The words of each charge's kind columns, joined by :data:`_SEPARATOR`."""
    pa = require("pyarrow", EXTRA)
    pc = require("pyarrow.compute", EXTRA)
    words = []
    for name in fmt.kinds:
        if name in table.column_names:
            column = table[name]
            if pa.types.is_struct(column.type):
                column = pc.struct_field(column, "description")
            words.append(pc.fill_null(_text(column), ""))
    return (
        pc.binary_join_element_wise(*words, _SEPARATOR)
        if words
        else pa.repeat(pa.scalar(""), table.num_rows)
    )


def _encoded(column: Any) -> Any:
    """``column`` as a dictionary array (read as one already, or encoded now)."""
    pa = require("pyarrow", EXTRA)
    pc = require("pyarrow.compute", EXTRA)
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_dictionary(column.type):
        return column
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        column = _text(column)
    return pc.dictionary_encode(column)


def _labels(column: Any) -> Any:
    """A text column as a dictionary array of its values trimmed, empty ones missing."""
    encoded = _encoded(column)
    return _relabel(encoded.indices, [_trimmed(v) for v in encoded.dictionary.to_pylist()])


def _trimmed(value: str | None) -> str | None:
    return value.strip() or None if value is not None else None


def _relabel(indices: Any, labels: Sequence[str | None]) -> Any:
    """A dictionary array whose row ``i`` reads ``labels[indices[i]]``: its dictionary
    holds each label once (so a group is one index), ``None`` labels are missing."""
    pa = require("pyarrow", EXTRA)
    pc = require("pyarrow.compute", EXTRA)
    distinct = list(dict.fromkeys(label for label in labels if label is not None))
    where = {label: i for i, label in enumerate(distinct)}
    mapping = pa.array([None if x is None else where[x] for x in labels], pa.int32())
    return pa.DictionaryArray.from_arrays(
        pc.take(mapping, indices), pa.array(distinct, pa.string())
    )


def _is(labels: Any, value: str) -> Any:
    """Which rows of a dictionary array read ``value`` (never a missing one)."""
    pa = require("pyarrow", EXTRA)
    pc = require("pyarrow.compute", EXTRA)
    labels = labels.combine_chunks() if isinstance(labels, pa.ChunkedArray) else labels
    known = labels.dictionary.to_pylist()
    index = known.index(value) if value in known else -1
    return pc.fill_null(pc.equal(labels.indices, index), False)


def _tag_values(column: Any, tag: str) -> Any:
    """The value of costguard's ``tag`` on each row, as a dictionary array, from a JSON
    text column (FOCUS CSV, Azure), a ``map<string, string>`` (CUR 2.0, FOCUS Parquet)
    or a list of ``{key, value}`` records (GCP labels; GCP's FOCUS view adds the project's
    labels with ``x_inherited`` true, which, as in the native export, tag no charge)."""
    pa = require("pyarrow", EXTRA)
    pc = require("pyarrow.compute", EXTRA)
    np = require("numpy", EXTRA)
    column = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    kind = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        encoded = _encoded(column)
        found = [tag_value(parse_tags(text), tag) for text in encoded.dictionary.to_pylist()]
        return _relabel(encoded.indices, found)
    if pa.types.is_map(column.type):
        # As a list of (key, value) records: list kernels do not all take maps.
        column = pa.ListArray.from_arrays(column.offsets, column.values)
        pairs = pc.list_flatten(column)
        keys, values = pc.struct_field(pairs, 0), pc.struct_field(pairs, 1)
    elif pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        pairs = pc.list_flatten(column)
        keys, values = pc.struct_field(pairs, "key"), pc.struct_field(pairs, "value")
        if pairs.type.get_field_index("x_inherited") >= 0:
            inherited = pc.fill_null(pc.struct_field(pairs, "x_inherited"), False)
            keys = pc.if_else(inherited, pa.scalar(None, keys.type), keys)
    else:
        msg = f"a tags column of type {column.type} is not one costguard reads"
        raise InputError(msg, hint="tags come as JSON text, a map or a list of key/value records")
    # The spelling rule runs on the few distinct keys; the pairs are matched by index.
    keys = _encoded(keys)
    spelled = [i for i, k in enumerate(keys.dictionary.to_pylist()) if k and is_tag(k, tag)]
    chosen = pc.is_in(keys.indices, pa.array(spelled, keys.indices.type))
    values = _labels(pc.filter(values, chosen))
    rows = pc.filter(pc.list_parent_indices(column), chosen)
    present = values.indices.is_valid()
    rows, found = pc.filter(rows, present), pc.filter(values.indices, present)
    # Each row's value index (-1: none), then missing where none was found.
    where = np.full(len(column), -1, dtype=np.int32)
    where[_view(rows)] = _view(found)
    return pa.DictionaryArray.from_arrays(pa.array(where, mask=where < 0), values.dictionary)


def _with_gcp_credits(table: Any, parts: Any) -> Any:
    """``parts`` and one row per GCP credit (negative amounts), keyed like the charge it
    reduces: amounts as ``decimal128(PRECISION, SCALE)`` on both."""
    pa = require("pyarrow", EXTRA)
    pc = require("pyarrow.compute", EXTRA)
    for name in ("billed", "effective"):
        parts = parts.set_column(
            parts.column_names.index(name), name, _exact(parts[name].combine_chunks())
        )
    credits = table["credits"].combine_chunks()
    amounts = _exact(_money(table, pc.struct_field(pc.list_flatten(credits), "amount")))
    rows = pc.list_parent_indices(credits)
    credit_rows = {name: pc.take(parts[name], rows) for name in parts.column_names}
    none = pa.array([0] * len(rows), pa.int8())  # a credit is part of its charge, not one
    credit_rows.update(billed=amounts, effective=amounts, charges=none)
    if "quantity" in credit_rows:  # its hours are its charge's
        credit_rows["quantity"] = pa.nulls(len(rows), parts.schema.field("quantity").type)
    return pa.concat_tables([parts, pa.table(credit_rows, schema=parts.schema)])
