"""Read billing exports, local or in a bucket, into a :class:`~costguard.billing.spend.Tally`.

Files, globs, folders and ``s3://``/``gs://``/``az://`` URLs are opened through fsspec and
read in place, only the columns the report needs: Parquet by column projection, CSV and
CSV.gz as a stream of blocks (memory bounded by the block size, not the file), JSONL
with the fields named in an explicit schema. Each batch is summed by pyarrow (costs cast
to exact decimals, grouped in C++, in decimal256 where decimal128 could overflow), so
Python sees a handful of sums per batch, not rows. Charge times are counted on their UTC
day; what is not a billing export (dates that are not ISO 8601, a cost column twice, a
charge without a currency) is refused.

Both formats are read fast (benchmarks/spend.py, beside DuckDB): local files by pyarrow
itself, the next Parquet batch read while one is summed, text as dictionaries (rows
grouped by integer indices), each distinct tags text decided once per read
(:class:`TagMemo`), float costs turned into decimals as integers where that is exact,
and a batch of one currency and one billing period grouped by its key alone.
"""

from __future__ import annotations

import csv
import importlib.abc
import io
import json
import queue
import re
import sys
import threading
from collections.abc import Generator, Iterator, Sequence
from contextlib import closing, nullcontext, suppress
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from functools import lru_cache
from typing import Any

from costguard.billing.spend import (
    CUR2,
    FOCUS,
    GCP_EXPORT,
    GROUPING_TAGS,
    PLACES,
    READ_HINT,
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
# This module is imported only to read an export: without the extra, the import says
# what to install.
pa = require("pyarrow", EXTRA)
pc = require("pyarrow.compute", EXTRA)
pcsv = require("pyarrow.csv", EXTRA)
pjson = require("pyarrow.json", EXTRA)
pq = require("pyarrow.parquet", EXTRA)
np = require("numpy", EXTRA)
#: Rows per Parquet batch and bytes per CSV block: what one batch holds in memory;
#: Parquet batches read ahead of the one being summed. With row groups read in parallel
#: (4 at a time, 512 Ki rows a batch) a 10-million-row file peaked at 2.7x DuckDB's
#: memory; 64 Ki rows, one read ahead: 1.14x, for 1.37x its CPU (benchmarks/spend.py).
PARQUET_BATCH_ROWS = 64 * 1024
PARQUET_AHEAD = 1
CSV_BLOCK_BYTES = 4 * 1024 * 1024
#: The longest CSV line read (in blocks this large); a longer one is no billing charge.
CSV_LONGEST_LINE = 64 * 1024 * 1024
#: Costs are cast to exact decimals of 36 digits, PLACES (18) after the point: every
#: export's digits fit (more places are rounded, :func:`_rounded`), and a sum of two (the
#: amortised figures) stays within decimal128's 38 digits. A batch is summed in decimal128
#: where its rows cannot add up past 38 digits, else in decimal256 (:func:`_summable`).
SCALE = PLACES
PRECISION = 36
#: Amounts as read before they are rounded to SCALE places: any text a double prints as.
_WIDE = pa.decimal256(76, 38)
#: The files a folder or glob yields, by name ending (manifests and others are skipped).
DATA_SUFFIXES = (".csv", ".csv.gz", ".parquet", ".jsonl", ".jsonl.gz", ".ndjson", ".json")
_MAX_FILES = 100_000
_GLOB = re.compile(r"[*?\[]")
_ISO_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", re.ASCII)
_MONTH = re.compile(r"[0-9]{4}-(?:0[1-9]|1[0-2])", re.ASCII)
_ISO_HINT = (
    "billing exports write times in ISO 8601 (FOCUS, CUR 2.0, BigQuery): was the file "
    "opened and saved by a spreadsheet? Read the export's own file"
)
#: Rows of a batch whose distinct float amounts decide how the batch's are converted.
_SAMPLE_ROWS = 4096
#: Float amounts of at most this many decimal places, under 10**5 each (every export's
#: line items), are converted as integers (:func:`_float_amounts`); others as text.
FLOAT_PLACES = 10
_FLOAT_SCALE = 10.0**FLOAT_PLACES
_FLOAT_UNITS_LIMIT = 10**15
#: Distinct tags texts a :class:`TagMemo` keeps (about 100 MB of an export's longest).
MEMO_TEXTS = 1 << 20
#: Between the words of a charge's kind columns (a character no export writes).
_SEPARATOR = "\x1f"


class _NoPandas(importlib.abc.MetaPathFinder):
    """An import finder that says pandas is not installed."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        if name.split(".", 1)[0] == "pandas":
            msg = f"No module named {name!r}"
            raise ModuleNotFoundError(msg, name=name)


def for_a_command() -> None:
    """Set pyarrow up for a command's own process, which hands it no DataFrame and takes
    none back (never a notebook's):

    - on its first conversion of Python values, and as its dataset module loads
      (``group_by``'s), pyarrow imports pandas to ask whether they are pandas objects
      (50 MiB and a quarter second for ``costguard spend``): it is told once that there
      is none (``Table.to_pandas`` would still import it);
    - jemalloc where pyarrow has it: a 10-million-row Parquet export then peaks at 191
      MiB where pyarrow's mimalloc held 246 (CSV.gz: 316 and 310; the system allocator
      held 198 and 407).
    """
    if "pandas" not in sys.modules:
        finder = _NoPandas()
        sys.meta_path.insert(0, finder)
        try:
            pa.array([], pa.string())  # pyarrow looks for pandas once, and remembers
            require("pyarrow.acero", EXTRA)
        finally:
            sys.meta_path.remove(finder)
    with suppress(NotImplementedError):  # a pyarrow built without jemalloc
        pa.set_memory_pool(pa.jemalloc_memory_pool())


def read_spend(
    sources: Sequence[str], by: str, *, job: str | tuple[str, ...] | None = None
) -> Tally:
    """Sum every charge of the exports ``sources`` per ``by`` group, currency and month;
    with ``job``, only the charges tagged with that ``costguard:job`` (a tuple: with any
    of them, an array's tasks)."""
    tally = Tally()
    grouping = Grouping(by, job)
    for fs, path, shown in expand(sources):
        _read_file(fs, path, shown, grouping, tally)
        tally.files.append(shown)
    return tally


class TagMemo:
    """Which value of one costguard tag each distinct tags text holds, decided once per
    read (:func:`~costguard.billing.spend.parse_tags` costs a JSON parse; an export
    repeats a resource's tags on each of its charges, in every block of the file) and
    looked up by pyarrow. Shared by the threads reading a file's row groups."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self._lock = threading.Lock()
        self._texts: list[str] = []
        self._known_set: set[str] = set()
        self._label_of_text: list[int | None] = []
        self._labels: dict[str, int] = {}
        self._known = pa.array([], pa.string())
        self._ids = pa.array([], pa.int32())
        self._names = pa.array([], pa.string())

    def values(self, texts: Any) -> Any:
        """The tag's value in each tags text of ``texts`` (a dictionary array)."""
        encoded = _encoded(texts)
        with self._lock:  # arrays of one moment: another thread may learn meanwhile
            known, ids, names = self._known, self._ids, self._names
        where = pc.index_in(encoded.dictionary, value_set=known)
        if where.null_count:
            known, ids, names = self._learn(encoded.dictionary, where)
            where = pc.index_in(encoded.dictionary, value_set=known)
        return pa.DictionaryArray.from_arrays(pc.take(pc.take(ids, where), encoded.indices), names)

    def _learn(self, dictionary: Any, where: Any) -> tuple[Any, Any, Any]:
        """Learn the texts of ``dictionary`` not found (``where`` null); past
        :data:`MEMO_TEXTS` texts, forget the others and learn all of ``dictionary``.
        The arrays after, together."""
        with self._lock:
            if len(self._texts) + where.null_count > MEMO_TEXTS:
                self._texts, self._known_set, self._label_of_text = [], set(), []
                texts = dictionary.to_pylist()
            else:
                texts = pc.filter(dictionary, where.is_null()).to_pylist()
            for text in texts:
                if text in self._known_set:
                    continue
                found = tag_value(parse_tags(text), self.tag)
                self._texts.append(text)
                self._known_set.add(text)
                if found is None:
                    self._label_of_text.append(None)
                else:
                    self._label_of_text.append(self._labels.setdefault(found, len(self._labels)))
            self._known = pa.array(self._texts, pa.string())
            self._ids = pa.array(self._label_of_text, pa.int32())
            self._names = pa.array(list(self._labels), pa.string())
            return self._known, self._ids, self._names


@dataclass(frozen=True)
class Grouping:
    """What a report groups by, and the one job it keeps (``None``: every charge); what
    it learnt of the export's tags as it read (:class:`TagMemo`)."""

    by: str
    job: str | tuple[str, ...] | None = None
    memos: dict[str, TagMemo] = field(default_factory=dict, compare=False)

    def memo(self, tag: str) -> TagMemo:
        """The :class:`TagMemo` of ``tag``."""
        return self.memos.setdefault(tag, TagMemo(tag))

    def columns(self, fmt: ExportFormat, present: Sequence[str]) -> list[str]:
        """The columns to read: those of the grouping, and the tags for a job."""
        wanted = _columns_for(fmt, self.by, present)
        if self.job is not None:
            wanted += [c for c in _columns_for(fmt, "job", present) if c not in wanted]
            around = [fmt.project]
            if self.by == "charge":
                around += [
                    fmt.day_end,
                    *_record_columns(_quantity(fmt, present)),
                    *_record_columns([fmt.resource]),
                ]
            wanted += [c for c in around if c in present and c not in wanted]
        return wanted

    def detect(self, columns: Sequence[str], source: str) -> ExportFormat:
        fmt = detect(columns, self.by, source)
        return fmt if self.job is None else detect(columns, "job", source)


def _quantity(fmt: ExportFormat, present: Sequence[str]) -> tuple[str, str] | None:
    """The first (quantity, unit) columns of ``fmt`` the file has."""
    return next((q for q in fmt.quantities if set(_record_columns(q)) <= set(present)), None)


def _record_columns(names: Sequence[str] | None) -> list[str]:
    """The columns that hold ``names`` (``a.b``: field ``b`` of record ``a``)."""
    return list(dict.fromkeys(name.split(".", 1)[0] for name in names or ()))


def _field(table: Any, name: str) -> Any:
    """Column ``name`` of ``table`` (``a.b``: field ``b`` of record ``a``), as text."""
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
        # A local path that is not there (a bucket's prefix with nothing below it is
        # the same as an empty one: "no billing export files").
        if not found and not prefix and not _GLOB.search(path) and not _exists(fs, path, source):
            msg = f"{source} does not exist"
            raise InputError(msg, hint="name a billing export's file or folder")
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
        if _GLOB.search(path):
            return sorted(fs.glob(path))
        if fs.isdir(path):
            return sorted(p for p in fs.find(path) if _is_data(p))
        return [path] if fs.exists(path) else []
    except Exception as exc:
        raise _unreadable(source, exc) from None


def _exists(fs: Any, path: str, source: str) -> bool:
    """Whether ``path`` is a file or a folder (a bucket's prefix: an object below it)."""
    try:
        return bool(fs.exists(path))
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
        if "straddl" in str(exc):  # pyarrow: a row longer than the block it is read in
            msg = f"{shown} has a line longer than {CSV_LONGEST_LINE // 2**20} MiB"
            hint = "a billing export's lines are a few KiB: name the export's own data files"
            raise InputError(msg, hint=hint) from None
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
    with fs.open(path, "rb", compression="infer") as raw:
        first = _first_line(raw, 1 << 20).decode("utf-8-sig", errors="replace")
    header = _header(first, shown)
    fmt = by.detect(header, shown)
    columns = _once(by.columns(fmt, header), header, shown)
    convert = pcsv.ConvertOptions(
        include_columns=columns,
        column_types=dict.fromkeys(columns, pa.string()),
        null_values=["", "NULL", "null"],
        strings_can_be_null=True,
    )
    block = CSV_BLOCK_BYTES
    while True:  # again in larger blocks where a line is longer than a block
        part = Tally()
        try:
            with _stream(fs, path) as raw:
                read = pcsv.ReadOptions(block_size=block)
                reader = pcsv.open_csv(raw, read_options=read, convert_options=convert)
                # Closed before the file is, whatever happens: pyarrow reads ahead on a
                # thread of its own, which must not outlive the file (the process aborted
                # at exit).
                with closing(reader):
                    for batch in reader:
                        _add_batch(pa.Table.from_batches([batch]), fmt, by, part)
        except pa.ArrowInvalid as exc:
            if "straddl" not in str(exc) or block >= CSV_LONGEST_LINE:
                raise
            block *= 4
            continue
        tally.merge(part)
        return


def _is_local(fs: Any) -> bool:
    return "file" in ([fs.protocol] if isinstance(fs.protocol, str) else fs.protocol)


def _stream(fs: Any, path: str) -> Any:
    """``path`` opened to be read from start to end, unpacked if its name says so. A local
    file is read and unpacked by pyarrow itself, without holding the GIL (a fifth less
    CPU on CSV.gz than Python's gzip behind an fsspec file object)."""
    if not _is_local(fs):
        return fs.open(path, "rb", compression="infer")
    gzipped = path.lower().endswith(".gz")
    return pa.input_stream(path, compression="gzip" if gzipped else None)


def _header(line: str, shown: str) -> list[str]:
    """The column names of a CSV file's first line."""
    try:
        return next(csv.reader(io.StringIO(line)), [])
    except csv.Error as exc:  # a field over the csv module's limit (128 KiB), a stray NUL
        msg = f"{shown} is not a billing export: its first line is not a CSV header ({exc})"
        raise InputError(msg, hint=READ_HINT) from None


def _once(columns: list[str], present: Sequence[str], shown: str) -> list[str]:
    """``columns``, refused when the file has one of them twice (which is the cost?)."""
    twice = [c for c in columns if present.count(c) > 1]
    if twice:
        msg = f"{shown} has the column {twice[0]} {present.count(twice[0])} times"
        raise InputError(msg, hint="which one holds the charges is not clear: " + READ_HINT)
    return columns


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
    """Read a Parquet file a batch of :data:`PARQUET_BATCH_ROWS` rows at a time, row group
    after row group, only the columns needed: the next batch is read and decoded on a
    thread of its own while this one is summed (:func:`_read_ahead`), so that memory
    holds about two batches, not the file nor a row group per thread."""
    # A local file is read by pyarrow itself: its threads decode the columns without
    # holding the GIL, where an fsspec file object reads through Python.
    local = _is_local(fs)

    def opened() -> Any:
        return nullcontext(path) if local else fs.open(path, "rb")

    with opened() as raw:
        footer = pq.ParquetFile(raw)
        metadata = footer.metadata
    names = footer.schema_arrow.names
    fmt = by.detect(names, shown)
    columns = _once(by.columns(fmt, names), names, shown)
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

    def batches() -> Generator[Any, None, None]:
        with opened() as raw:
            parquet = pq.ParquetFile(raw, metadata=metadata, read_dictionary=text)
            for group in range(metadata.num_row_groups):
                # One row group at a time: a batch across two would hold two dictionaries
                # of a nested column (the tags map), which pyarrow does not return.
                yield from parquet.iter_batches(
                    batch_size=PARQUET_BATCH_ROWS, row_groups=[group], columns=columns
                )

    for batch in _read_ahead(batches(), PARQUET_AHEAD):
        _add_batch(pa.Table.from_batches([batch]), fmt, by, tally)


def _read_ahead(items: Generator[Any, None, None], ahead: int) -> Generator[Any, None, None]:
    """``items`` (a generator), made on a thread of its own at most ``ahead`` before the
    one in use: the next batch is read and decoded while this one is summed. An error
    there is raised here; when this iterator is left early (an error, Ctrl-C), that
    thread stops at its next item and closes ``items``."""
    done = object()
    handed: queue.Queue[tuple[Any, BaseException | None]] = queue.Queue(maxsize=ahead)
    stop = threading.Event()

    def give(item: Any, error: BaseException | None = None) -> bool:
        while not stop.is_set():
            try:
                handed.put((item, error), timeout=0.1)
            except queue.Full:
                continue
            return True
        return False

    def make() -> None:
        with closing(items):
            try:
                for item in items:
                    if not give(item):
                        return
            except Exception as exc:  # raised to the reader, on its thread
                give(done, exc)
                return
        give(done)

    threading.Thread(target=make, name="costguard-read-ahead", daemon=True).start()
    try:
        while True:
            item, error = handed.get()
            if error is not None:
                raise error
            if item is done:
                return
            yield item
    finally:
        stop.set()


def _gcp_schema() -> Any:
    """The GCP export's fields costguard reads, as BigQuery's JSON extract writes them:
    amounts as the decimals written, to 38 places (BigQuery's FLOAT64 costs are written
    with up to 17 digits: ``1.0000000000000002e-05``), rounded to
    :data:`~costguard.billing.spend.PLACES` when summed."""
    pair = pa.struct([("key", pa.string()), ("value", pa.string())])
    return pa.schema(
        [
            ("cost", _WIDE),
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
            ("credits", pa.list_(pa.struct([("amount", _WIDE)]))),
            ("project", pa.struct([("id", pa.string())])),
            ("resource", pa.struct([("name", pa.string())])),  # the detailed export's
            ("service", pa.struct([("description", pa.string())])),
            ("sku", pa.struct([("description", pa.string())])),
            ("cost_type", pa.string()),
        ]
    )


def _read_jsonl(fs: Any, path: str, shown: str, by: Grouping, tally: Tally) -> None:
    with fs.open(path, "rb", compression="infer") as raw:
        first = _first_line(raw, 1 << 24)
    try:
        record = json.loads(first) if first.strip() else {}
    except ValueError:
        record = {}
    if first.lstrip().startswith(b"[") or not isinstance(record, dict):
        msg = f"{shown} holds a JSON array or value, not JSON lines (one charge a line)"
        raise InputError(
            msg, hint="save the BigQuery billing export as newline-delimited JSON: " + READ_HINT
        )
    fmt = by.detect(list(record), shown)
    if fmt is not GCP_EXPORT:
        msg = f"{shown} is a {fmt.name} export saved as JSON lines"
        raise InputError(msg, hint="read its CSV or Parquet files")
    options = pjson.ParseOptions(explicit_schema=_gcp_schema(), unexpected_field_behavior="ignore")
    with _stream(fs, path) as raw:
        reader = pjson.open_json(raw, parse_options=options)
        with closing(reader):
            for batch in reader:
                _add_batch(pa.Table.from_batches([batch]), fmt, by, tally)


# -- one batch: normalised to (key, currency, month, day, billed, effective), summed


def _add_batch(table: Any, fmt: ExportFormat, grouping: Grouping, tally: Tally) -> None:
    """Sum one batch per (key, currency, billing period) in pyarrow. The currency, the
    period and the day are grouped as read (a timestamp, a dictionary index) and made
    text only for the few groups that come out."""
    if table.num_rows == 0:
        return
    table = _in_utc(table, fmt.day)
    billed = _money(table, fmt.billed, tally)
    if fmt is FOCUS:
        effective = (
            billed
            if _same_values(table[fmt.billed], table["EffectiveCost"])
            else _money(table, "EffectiveCost", tally)
        )
    elif fmt is CUR2:
        effective = _cur_effective(table, billed, tally)
    else:
        effective = billed
    by = grouping.by
    key = _date(table, fmt.day) if by == "day" else _group_keys(table, fmt, by, grouping)
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
        parts = _with_gcp_credits(table, parts, tally)
    parts = _summable(parts)
    if grouping.job is not None:
        _add_around_job(table, fmt, parts, same, tally)
        parts = parts.filter(_rows_reading(parts["job"], grouping.job))
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
    present = table.column_names
    nothing = pa.nulls(table.num_rows, pa.string())
    columns = {
        "job": key if grouping.by == "job" else _group_keys(table, fmt, "job", grouping),
        "account": (
            _group_keys(table, fmt, "project", grouping) if fmt.project in present else nothing
        ),
    }
    if grouping.by == "charge":
        quantity = _quantity(fmt, present)
        columns["end"] = table[fmt.day_end] if fmt.day_end in present else nothing
        columns["quantity"] = _field(table, quantity[0]) if quantity else nothing
        columns["unit"] = _field(table, quantity[1]) if quantity else nothing
        columns["what"] = _kind_words(table, fmt)
        has_resource = _record_columns([fmt.resource])[0] in present
        columns["resource"] = _field(table, fmt.resource) if has_resource else nothing
    return columns


def _add_around_job(
    table: Any, fmt: ExportFormat, parts: Any, same: dict[str, Any], tally: Tally
) -> None:
    """What a job's reconciliation needs besides its charges: the last day the batch
    charges, and what it billed without a job tag, per day, account and currency
    (``same``: the currency of every row, when there is one)."""
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
    compute = parts.filter(_rows_reading(parts["key"], "compute"))
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
    """A billing period as read, as ``YYYY-MM`` (GCP's invoice month is ``YYYYMM``):
    text that is no ISO 8601 date (``4/1/25``) or month is refused."""
    text = (_as_text(value) or "").strip()
    month = f"{text[:4]}-{text[4:6]}" if fmt is GCP_EXPORT else text[:7]
    if not _MONTH.fullmatch(month) or (fmt is not GCP_EXPORT and not _ISO_DATE.match(text)):
        column = "invoice.month" if fmt is GCP_EXPORT else fmt.period
        msg = f"the billing period {text[:40]!r} ({column}) is not an ISO 8601 date"
        raise InputError(msg, hint=_ISO_HINT)
    return month


def _in_utc(table: Any, name: str) -> Any:
    """``table`` with its text column ``name`` (a charge's start) as UTC timestamps:
    ``2026-11-14 05:00:00`` (no zone: UTC), ``...Z``, ``...+02:00``, BigQuery's
    ``... UTC``; other text (``4/1/25``) is refused. Each distinct text is read once."""
    column = table[name]
    kind = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        return table
    encoded = _encoded(column)
    moments = [_instant(text, name) for text in encoded.dictionary.to_pylist()]
    stamps = pc.take(pa.array(moments, pa.timestamp("us", "UTC")), encoded.indices)
    return table.set_column(table.column_names.index(name), name, stamps)


@lru_cache(maxsize=1 << 16)
def _instant(text: str, name: str) -> datetime:
    """One charge's start as a UTC time, from ISO 8601 text."""
    plain = text.strip().removesuffix(" UTC")
    try:
        if not _ISO_DATE.match(plain):
            raise ValueError
        moment = datetime.fromisoformat(plain)
    except ValueError:
        msg = f"{name} holds {text[:40]!r}, not an ISO 8601 time (2026-11-14T05:00:00Z)"
        raise InputError(msg, hint=_ISO_HINT) from None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def _same_values(first: Any, second: Any) -> bool:
    """Whether two columns hold the same values (a batch without commitments bills what
    it costs): one comparison, where converting the second would cost a cast per row."""
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


def _exact_type() -> Any:
    return pa.decimal128(PRECISION, SCALE)


def _exact(column: Any) -> Any:
    """Amounts as ``decimal128(PRECISION, SCALE)``, to add to or pick among others."""
    return column if column.type == _exact_type() else pc.cast(column, _exact_type())


def _text(column: Any) -> Any:
    return pc.cast(column, "string")


def _money(table: Any, name: str | Any, tally: Tally) -> Any:
    """A cost column as exact decimals: text as written, floats through their decimal
    text (``0.1`` stays ``0.1``), missing values as zero; amounts of more than
    :data:`SCALE` places rounded (counted in ``tally``). ``name`` is a column of
    ``table``, or a column itself (GCP's credit amounts)."""
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
                amounts = _decimals(pc.cast(encoded.dictionary, pa.string()))
                if amounts is not None:  # else each row is rounded (and counted) below
                    exact = pc.take(amounts, encoded.indices)
                    return pc.fill_null(exact, Decimal(0)) if exact.null_count else exact
            column = pc.cast(column, pa.string())
        exact = _decimals(column)
        if exact is None:
            exact, rounded = _rounded(column)
            tally.rounded += rounded
        # Only where there is a null to fill: fill_null on decimals costs as much as a cast.
        return pc.fill_null(exact, Decimal(0)) if exact.null_count else exact
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        what = name if isinstance(name, str) else "a credit"
        msg = f"{what} holds a value that is not a decimal amount: {str(exc)[:200]}"
        raise InputError(msg, hint="check that the file is an unmodified billing export") from None


def _decimals(column: Any) -> Any:
    """Amounts (text or decimals) as ``decimal128(PRECISION, SCALE)``; ``None`` when one
    has more places, or is not an amount."""
    try:
        return pc.cast(column, _exact_type())
    except pa.ArrowInvalid:
        return None


def _rounded(column: Any) -> tuple[Any, int]:
    """Amounts (text or decimals) of up to 38 places as ``decimal128(PRECISION, SCALE)``,
    rounded half to even at the last place, and how many were rounded. Raises
    ``ArrowInvalid`` for what is not an amount or too large."""
    wide = pc.cast(column, _WIDE)
    rounded = pc.round(wide, ndigits=SCALE, round_mode="half_to_even")
    changed = pc.sum(pc.not_equal(wide, rounded)).as_py() or 0
    return pc.cast(rounded, _exact_type()), changed


def _summable(parts: Any) -> Any:
    """``parts`` with its amounts in decimal256 where decimal128 sums could run past 38
    digits (pyarrow would wrap them round silently: 171 rows of 999999999999999999 summed
    to a negative amount): the largest amount times the rows bounds any sum."""
    for name in ("billed", "effective"):
        column = parts[name]
        if pa.types.is_decimal256(column.type) or not parts.num_rows:
            continue
        extremes = pc.min_max(column).as_py()
        largest = max(abs(extremes["min"] or 0), abs(extremes["max"] or 0))
        limit = Decimal(10) ** (38 - column.type.scale)
        if largest * parts.num_rows >= limit:
            wide = pc.cast(column, pa.decimal256(76, column.type.scale))
            parts = parts.set_column(parts.column_names.index(name), name, wide)
    return parts


def _float_amounts(column: Any) -> Any:
    """Float amounts as ``decimal128(38, FLOAT_PLACES)`` without formatting each one, when
    every amount of the column is the float nearest a decimal of at most
    :data:`FLOAT_PLACES` places under 10**5: that decimal is then the only one of its
    places that reads as the float, so it is the float's shortest form with zeros
    appended. ``None`` when some amount is not (more places, a larger amount, NaN).

    The test is exact: an integer under 10**15 is exact as a double, and dividing it by
    10**FLOAT_PLACES rounds as reading the decimal's text does.
    """
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
    letter = "f" if pa.types.is_floating(array.type) else "i"
    kind = np.dtype(f"{letter}{array.type.bit_width // 8}")
    values = array.buffers()[1]
    return np.frombuffer(values, kind, count=len(array), offset=array.offset * kind.itemsize)


def _cur_effective(table: Any, unblended: Any, tally: Tally) -> Any:
    """CUR 2.0's amortised cost per line: covered usage at its savings plan or reservation
    effective cost, the unused part of a commitment's fee, nothing for the negations and
    upfront fees the amortisation already spreads; everything else as billed."""
    kind = pc.fill_null(table["line_item_line_item_type"], "")

    def figure(*names: str) -> Any:
        if not all(n in table.column_names for n in names):
            return None
        total = _exact(_money(table, names[0], tally))
        for name in names[1:]:
            total = _exact(pc.add(total, _exact(_money(table, name, tally))))
        return total

    zero = pa.scalar(Decimal(0), _exact_type())
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
    """A charge's start (a timestamp, text read by :func:`_in_utc`) as dates, in UTC."""
    column = table[name]
    if pa.types.is_timestamp(column.type):
        if column.type.tz is not None:
            column = pc.cast(column, pa.timestamp(column.type.unit, "UTC"))
        return pc.cast(column, pa.date32())
    return column


def _group_keys(table: Any, fmt: ExportFormat, by: str, grouping: Grouping) -> Any:
    """The group of each charge for ``--by`` job, owner, project or service (or the
    charge's kind, for ``--job``), as a dictionary array of its trimmed text (empty:
    missing)."""
    if by == "charge":
        return _kinds(table, fmt)
    if by in GROUPING_TAGS:
        tags = fmt.tags if fmt.tags in table.column_names else fmt.tags_elsewhere[0]
        return _tag_values(table[tags], grouping.memo(GROUPING_TAGS[by]))
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
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_dictionary(column.type):
        return column
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        column = _text(column)
    return pc.dictionary_encode(column)


def _labels(column: Any) -> Any:
    """A text column as a dictionary array of its values trimmed, empty ones missing.
    Only the dictionary's values some row reads are trimmed (a Parquet column chunk's
    dictionary holds every value of the chunk: 20,000 resources' names where a batch of
    the job tag's values reads 400)."""
    encoded = _encoded(column)
    used = pc.unique(encoded.indices).drop_null()
    found = [_trimmed(v) for v in pc.take(encoded.dictionary, used).to_pylist()]
    distinct = list(dict.fromkeys(label for label in found if label is not None))
    where = {label: i for i, label in enumerate(distinct)}
    mapping = np.full(len(encoded.dictionary), -1, np.int32)
    mapping[_view(used.cast(pa.int64()))] = [-1 if x is None else where[x] for x in found]
    labels = pa.array(mapping, mask=mapping < 0)
    return pa.DictionaryArray.from_arrays(
        pc.take(labels, encoded.indices), pa.array(distinct, pa.string())
    )


def _trimmed(value: str | None) -> str | None:
    return value.strip() or None if value is not None else None


def _relabel(indices: Any, labels: Sequence[str | None]) -> Any:
    """A dictionary array whose row ``i`` reads ``labels[indices[i]]``: its dictionary
    holds each label once (so a group is one index), ``None`` labels are missing."""
    distinct = list(dict.fromkeys(label for label in labels if label is not None))
    where = {label: i for i, label in enumerate(distinct)}
    mapping = pa.array([None if x is None else where[x] for x in labels], pa.int32())
    return pa.DictionaryArray.from_arrays(
        pc.take(mapping, indices), pa.array(distinct, pa.string())
    )


def _rows_reading(labels: Any, value: str | tuple[str, ...]) -> Any:
    """Which rows of a dictionary array read ``value`` (a tuple: any of its values; never
    a missing one)."""
    labels = labels.combine_chunks() if isinstance(labels, pa.ChunkedArray) else labels
    wanted = {value} if isinstance(value, str) else set(value)
    indexes = [at for at, known in enumerate(labels.dictionary.to_pylist()) if known in wanted]
    chosen = pc.is_in(labels.indices, value_set=pa.array(indexes, labels.indices.type))
    return pc.fill_null(chosen, False)


def _tag_values(column: Any, memo: TagMemo) -> Any:
    """The value of costguard's ``tag`` on each row, as a dictionary array, from a JSON
    text column (FOCUS CSV, Azure), a ``map<string, string>`` (CUR 2.0, FOCUS Parquet)
    or a list of ``{key, value}`` records (GCP labels; GCP's FOCUS view adds the project's
    labels with ``x_inherited`` true, which, as in the native export, tag no charge)."""
    column = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    kind = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return memo.values(column)
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
    spelled = [i for i, k in enumerate(keys.dictionary.to_pylist()) if k and is_tag(k, memo.tag)]
    chosen = pc.is_in(keys.indices, pa.array(spelled, keys.indices.type))
    values = _labels(pc.filter(values, chosen))
    rows = pc.filter(pc.list_parent_indices(column), chosen)
    present = values.indices.is_valid()
    rows, found = pc.filter(rows, present), pc.filter(values.indices, present)
    # Each row's value index (-1: none), then missing where none was found.
    where = np.full(len(column), -1, dtype=np.int32)
    where[_view(rows)] = _view(found)
    return pa.DictionaryArray.from_arrays(pa.array(where, mask=where < 0), values.dictionary)


def _with_gcp_credits(table: Any, parts: Any, tally: Tally) -> Any:
    """``parts`` and one row per GCP credit (negative amounts), keyed like the charge it
    reduces: amounts as ``decimal128(PRECISION, SCALE)`` on both."""
    for name in ("billed", "effective"):
        parts = parts.set_column(
            parts.column_names.index(name), name, _exact(parts[name].combine_chunks())
        )
    credits = table["credits"].combine_chunks()
    amounts = _exact(_money(table, pc.struct_field(pc.list_flatten(credits), "amount"), tally))
    rows = pc.list_parent_indices(credits)
    credit_rows = {name: pc.take(parts[name], rows) for name in parts.column_names}
    none = pa.array([0] * len(rows), pa.int8())  # a credit is part of its charge, not one
    credit_rows.update(billed=amounts, effective=amounts, charges=none)
    if "quantity" in credit_rows:  # its hours are its charge's
        credit_rows["quantity"] = pa.nulls(len(rows), parts.schema.field("quantity").type)
    return pa.concat_tables([parts, pa.table(credit_rows, schema=parts.schema)])
