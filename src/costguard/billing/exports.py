"""Read billing exports, local or in a bucket, into a :class:`~costguard.billing.spend.Tally`.

Files, globs, folders and ``s3://``/``gs://``/``az://`` URLs are opened through fsspec and
read in place, only the columns the report needs: Parquet by column projection, CSV and
CSV.gz as a stream of blocks (memory bounded by the block size, not the file), JSONL
with the fields named in an explicit schema. Each batch is summed by pyarrow (costs cast
to exact decimals, grouped in C++), so Python sees a handful of sums per batch, not rows.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from costguard.billing.spend import (
    CUR2,
    FOCUS,
    GCP_EXPORT,
    GROUPING_TAGS,
    ExportFormat,
    Tally,
    detect,
    keys_matching,
    parse_tags,
    tag_value,
)
from costguard.clouds import require
from costguard.errors import CostguardError, InputError

EXTRA = "billing"
#: Rows per Parquet batch and bytes per CSV block: what one batch holds in memory.
PARQUET_BATCH_ROWS = 256 * 1024
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
        return wanted

    def detect(self, columns: Sequence[str], source: str) -> ExportFormat:
        fmt = detect(columns, self.by, source)
        return fmt if self.job is None else detect(columns, "job", source)


def expand(sources: Sequence[str]) -> Iterator[tuple[Any, str, str]]:
    """Each data file of ``sources``: ``(filesystem, path, name to show)``. A folder gives
    the data files below it, a glob those matching; a missing file is refused."""
    fsspec = require("fsspec", EXTRA)
    for source in sources:
        fs, path = fsspec.core.url_to_fs(source)
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        prefix = "" if protocol in ("file", "local") else f"{protocol}://"
        if any(ch in path for ch in "*?["):
            found = sorted(fs.glob(path))
        elif _isdir(fs, path):
            found = sorted(p for p in fs.find(path) if _is_data(p))
        else:
            found = [path] if _exists(fs, path, source) else []
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


def _isdir(fs: Any, path: str) -> bool:
    try:
        return bool(fs.isdir(path))
    except OSError as exc:
        raise _unreadable(path, exc) from None


def _exists(fs: Any, path: str, source: str) -> bool:
    try:
        return bool(fs.exists(path))
    except OSError as exc:
        raise _unreadable(source, exc) from None


def _unreadable(source: str, exc: BaseException) -> CostguardError:
    return CostguardError(
        f"could not read {source}: {exc}",
        hint="check the URL and the cloud credentials (AWS_PROFILE, gcloud auth, "
        "AZURE_STORAGE_CONNECTION_STRING)",
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
    return wanted + [c for c in fmt.optional if c in present and c not in wanted]


def _read_csv(fs: Any, path: str, shown: str, by: Grouping, tally: Tally) -> None:
    pa = require("pyarrow", EXTRA)
    pcsv = require("pyarrow.csv", EXTRA)
    with fs.open(path, "rb", compression="infer") as raw:
        first = raw.readline(1 << 20).decode("utf-8-sig", errors="replace")
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


def _read_parquet(fs: Any, path: str, shown: str, by: Grouping, tally: Tally) -> None:
    pa = require("pyarrow", EXTRA)
    pq = require("pyarrow.parquet", EXTRA)
    with fs.open(path, "rb") as raw:
        parquet = pq.ParquetFile(raw)
        names = parquet.schema_arrow.names
        fmt = by.detect(names, shown)
        columns = by.columns(fmt, names)
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=columns):
            _add_batch(pa.Table.from_batches([batch]), fmt, by, tally)


def _gcp_schema(pa: Any) -> Any:
    """The GCP export's fields costguard reads, as BigQuery's JSON extract writes them."""
    pair = pa.struct([("key", pa.string()), ("value", pa.string())])
    return pa.schema(
        [
            ("cost", pa.decimal128(PRECISION, SCALE)),
            ("currency", pa.string()),
            ("usage_start_time", pa.string()),
            ("invoice", pa.struct([("month", pa.string())])),
            ("labels", pa.list_(pair)),
            ("credits", pa.list_(pa.struct([("amount", pa.decimal128(PRECISION, SCALE))]))),
            ("project", pa.struct([("id", pa.string())])),
            ("service", pa.struct([("description", pa.string())])),
        ]
    )


def _read_jsonl(fs: Any, path: str, shown: str, by: Grouping, tally: Tally) -> None:
    pa = require("pyarrow", EXTRA)
    pjson = require("pyarrow.json", EXTRA)
    with fs.open(path, "rb", compression="infer") as raw:
        first = raw.readline(1 << 24)
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
    pa = require("pyarrow", EXTRA)
    pc = require("pyarrow.compute", EXTRA)
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
    day = _date(table, fmt.day)
    month = _month(table, fmt)
    key = _key(table, fmt, by, day)
    currency = pc.fill_null(_text(table[fmt.currency]), "")
    columns = {
        "key": key,
        "currency": currency,
        "month": month,
        "day": day,
        "billed": billed,
        "effective": effective,
        "charges": pa.array([1] * table.num_rows, pa.int64()),
    }
    if grouping.job is not None:
        columns["job"] = key if by == "job" else _key(table, fmt, "job", day)
    parts = pa.table(columns)
    if fmt is GCP_EXPORT:
        parts = pa.concat_tables([parts, _gcp_credits(table, parts)])
    if grouping.job is not None:
        parts = parts.filter(pc.fill_null(pc.equal(parts["job"], grouping.job), False))
    sums = parts.group_by(["key", "currency", "month"]).aggregate(
        [("billed", "sum"), ("effective", "sum"), ("charges", "sum"), ("day", "min_max")]
    )
    for row in sums.to_pylist():
        tally.add(
            _as_text(row["key"]),
            row["currency"],
            (_as_text(row["month"]) or "")[:7],
            row["billed_sum"] or Decimal(0),
            row["effective_sum"] or Decimal(0),
            rows=row["charges_sum"] or 0,
            days=(_as_text(row["day_min_max"]["min"]), _as_text(row["day_min_max"]["max"])),
        )


def _same(first: Any, second: Any) -> bool:
    """Whether two columns hold the same values (a batch without commitments bills what
    it costs): one comparison, where converting the second would cost a cast per row."""
    pc = require("pyarrow.compute", EXTRA)
    if first.type != second.type or first.null_count or second.null_count:
        return False
    return bool(pc.all(pc.equal(first, second)).as_py())


def _as_text(value: Any) -> str | None:
    """A group's key or month as text: dates (from Parquet timestamps) in ISO form."""
    if value is None or isinstance(value, str):
        return value
    return str(value.isoformat())


def _exact_type(pa: Any) -> Any:
    return pa.decimal128(PRECISION, SCALE)


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
        total = _money(table, names[0])
        for name in names[1:]:
            total = pc.cast(pc.add(total, _money(table, name)), pa.decimal128(PRECISION, SCALE))
        return total

    zero = pa.scalar(Decimal(0), pa.decimal128(PRECISION, SCALE))
    committed = figure("savings_plan_total_commitment_to_date")
    used = figure("savings_plan_used_commitment")
    unused_sp = (
        pc.cast(pc.subtract(committed, used), pa.decimal128(PRECISION, SCALE))
        if committed is not None and used is not None
        else None
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
    effective = unblended
    for when, value in reversed(rules):
        if value is not None:
            effective = pc.if_else(when, value, effective)
    return effective


def _date(table: Any, name: str, chars: int = 10) -> Any:
    """A timestamp column as dates, in UTC: Parquet timestamps as ``date32`` (formatted
    once per group, after the sums: ``strftime`` on every row took most of the time),
    text cut to its first ``chars`` characters (``YYYY-MM-DD``, or 7 for ``YYYY-MM``)."""
    pa = require("pyarrow", EXTRA)
    pc = require("pyarrow.compute", EXTRA)
    column = table[name]
    if pa.types.is_timestamp(column.type):
        if column.type.tz is not None:
            column = pc.cast(column, pa.timestamp(column.type.unit, "UTC"))
        return pc.cast(column, pa.date32())
    if pa.types.is_date(column.type):
        return column
    return pc.utf8_slice_codeunits(_text(column), 0, chars)


def _month(table: Any, fmt: ExportFormat) -> Any:
    pc = require("pyarrow.compute", EXTRA)
    if fmt is GCP_EXPORT:
        # invoice.month is YYYYMM.
        month = pc.struct_field(table["invoice"], "month")
        return pc.binary_join_element_wise(
            pc.utf8_slice_codeunits(month, 0, 4), pc.utf8_slice_codeunits(month, 4, 6), "-"
        )
    return _date(table, fmt.period, 7)


def _key(table: Any, fmt: ExportFormat, by: str, day: Any) -> Any:
    pa = require("pyarrow", EXTRA)
    pc = require("pyarrow.compute", EXTRA)
    if by == "day":
        return day
    if by in GROUPING_TAGS:
        tags = fmt.tags if fmt.tags in table.column_names else fmt.tags_elsewhere[0]
        values = _tag_values(table[tags], GROUPING_TAGS[by])
    elif fmt is GCP_EXPORT:
        record, name = (
            (table["project"], "id") if by == "project" else (table["service"], "description")
        )
        values = pc.struct_field(record, name)
    else:
        values = _text(table[fmt.project if by == "project" else fmt.service])
    values = pc.utf8_trim_whitespace(_text(values))
    return pc.if_else(pc.equal(values, ""), pa.scalar(None, pa.string()), values)


def _tag_values(column: Any, tag: str) -> Any:
    """The value of costguard's ``tag`` on each row, from a JSON text column (FOCUS CSV,
    Azure), a ``map<string, string>`` (CUR 2.0, FOCUS Parquet) or a list of
    ``{key, value}`` records (GCP labels)."""
    pa = require("pyarrow", EXTRA)
    pc = require("pyarrow.compute", EXTRA)
    column = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        encoded = pc.dictionary_encode(column)
        found = [tag_value(parse_tags(text), tag) for text in encoded.dictionary.to_pylist()]
        return pc.take(pa.array(found, pa.string()), encoded.indices)
    if pa.types.is_map(column.type):
        # As a list of (key, value) records: list kernels do not all take maps.
        column = pa.ListArray.from_arrays(column.offsets, column.values)
        pairs = pc.list_flatten(column)
        keys, values = pc.struct_field(pairs, 0), pc.struct_field(pairs, 1)
    elif pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        pairs = pc.list_flatten(column)
        keys, values = pc.struct_field(pairs, "key"), pc.struct_field(pairs, "value")
    else:
        msg = f"a tags column of type {column.type} is not one costguard reads"
        raise InputError(msg, hint="tags come as JSON text, a map or a list of key/value records")
    rows = pc.list_parent_indices(column)
    # Every spelling of costguard:job holds "job" in some case (tag_key only lowers and
    # replaces punctuation): a substring scan leaves the few keys worth hashing.
    near = pc.match_substring(keys, tag.rsplit(":", 1)[-1], ignore_case=True)
    keys, rows, values = pc.filter(keys, near), pc.filter(rows, near), pc.filter(values, near)
    # The rule runs on the distinct keys; the rows are then matched by dictionary index.
    encoded = pc.dictionary_encode(keys)
    known = encoded.dictionary.to_pylist()
    spelled = set(keys_matching([k for k in known if k is not None], tag))
    wanted = pa.array([i for i, k in enumerate(known) if k in spelled], encoded.indices.type)
    mask = pc.and_(pc.is_in(encoded.indices, wanted), pc.is_valid(values))
    return _scatter(pa, pc, len(column), pc.filter(rows, mask), pc.filter(values, mask))


def _scatter(pa: Any, pc: Any, length: int, rows: Any, values: Any) -> Any:
    """A column of ``length`` rows holding ``values`` at ``rows`` (null elsewhere)."""
    np = require("numpy", EXTRA)
    where = np.full(length, -1, dtype=np.int64)
    where[rows.to_numpy(zero_copy_only=False)] = np.arange(len(rows), dtype=np.int64)
    indices = pa.array(where, mask=where < 0)
    return pc.take(values, indices)


def _gcp_credits(table: Any, parts: Any) -> Any:
    """One row per GCP credit (negative amounts), keyed like the charge it reduces."""
    pa = require("pyarrow", EXTRA)
    pc = require("pyarrow.compute", EXTRA)
    credits = table["credits"].combine_chunks()
    amounts = _money(table, pc.struct_field(pc.list_flatten(credits), "amount"))
    rows = pc.list_parent_indices(credits)
    credit_rows = {name: pc.take(parts[name], rows) for name in parts.column_names}
    none = pa.array([0] * len(rows), pa.int64())  # a credit is part of its charge, not one
    return pa.table({**credit_rows, "billed": amounts, "effective": amounts, "charges": none})
