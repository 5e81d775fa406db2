"""A compact cache of the parsed price tables, so ``costguard estimate`` does not parse
every CSV row of every region again on each run.

:func:`costguard.pricing.tables.load_catalog` parses and validates a folder of tables
(a few thousand rows: most of the estimate's own time), then keeps the values here, in
one JSON file of plain columns (strings, whole numbers, ``null``) beside the user's
refresh cache (``Settings.parsed_tables``); it is written by the run that parsed the
tables, never shipped.
An entry is used only while it describes the same folder, the same files (each one's size
and CRC-32: reading and summing the half megabyte of the bundled tables takes a fraction
of a millisecond, and no file time can fool it) and the same parsing code (the sources of
this module, ``tables.py`` and ``catalog.py``). Anything else (no
entry, another folder, a file changed, a file that is not one this module wrote) is a
miss: the tables are parsed again and the entry rewritten.

What is read back is checked again as it is turned into values, so no price reaches an
estimate unchecked even from a cache file someone else wrote: every price a finite,
non-negative decimal, spot not above on-demand, every status and provider one costguard
knows, every date a real day, every column of the type and length the tables have.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Iterable, Sequence
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from itertools import repeat
from pathlib import Path
from typing import Any

from costguard.pricing import catalog

#: What a cache file starts with: a file without it is not one of these.
MAGIC = "costguard parsed price tables 1"
#: The most bytes read of a cache file (the bundled tables take about 0.5 MB).
MAX_BYTES = 64 * 1024 * 1024

Stamp = list[Any]  # a file's name, size and CRC-32
Columns = list[list[Any]]
Parts = tuple[
    tuple[catalog.InstancePrice, ...],
    tuple[catalog.StorageRate, ...],
    tuple[catalog.TransferRate, ...],
    tuple[catalog.Region, ...],
    dict[str, catalog.TableInfo],
]


class _UnusableError(Exception):
    """The file is not a usable entry for this folder (a miss, never an error)."""


def _stamp(path: Path) -> Stamp:
    data = path.read_bytes()
    return [path.name, len(data), zlib.crc32(data)]


def _code() -> list[Stamp]:
    """The parsing code an entry was made by: the stamps of ``catalog.py``, ``tables.py``
    (its neighbour: read, not imported, as ``tables.py`` imports this module) and this
    module."""
    here = Path(__file__)
    return [_stamp(here.with_name(name)) for name in ("catalog.py", "tables.py", here.name)]


def read(cache: Path, directory: Path) -> Parts | None:
    """The parsed tables of ``directory`` from the cache file ``cache``, or ``None`` when it
    holds no usable entry for them."""
    try:
        with cache.open("rb") as stream:
            data = stream.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            return None
        entry = json.loads(data)
        if not isinstance(entry, dict) or entry.get("magic") != MAGIC:
            return None
        if entry.get("directory") != str(directory) or entry.get("code") != _code():
            return None
        files = entry.get("files")
        if not isinstance(files, list) or not files:
            return None
        for stamp in files:
            if not isinstance(stamp, list) or len(stamp) != 3 or not _plain_name(stamp[0]):
                return None
            if _stamp(directory / str(stamp[0])) != stamp:
                return None
        return _decode(entry, directory)
    except (OSError, ValueError, TypeError, KeyError, IndexError, RecursionError, _UnusableError):
        return None


def _plain_name(name: object) -> bool:
    """Whether ``name`` names a file in the tables' folder itself (no other folder's)."""
    return isinstance(name, str) and "/" not in name and name not in ("", ".", "..")


def write(cache: Path, directory: Path, files: Iterable[Path], parts: Parts) -> None:
    """Keep ``parts``, parsed from ``files`` of ``directory``, in ``cache``; a cache that
    cannot be written is left as it is (the next run parses again)."""
    from costguard.files import atomic_write  # tempfile: only when the cache is written

    instances, storage, transfer, regions, tables = parts
    try:
        entry = {
            "magic": MAGIC,
            "directory": str(directory),
            "code": _code(),
            "files": [_stamp(path) for path in files],
            "instances": _columns(instances, INSTANCE_KINDS),
            "storage": _columns(storage, STORAGE_KINDS),
            "transfer": _columns(transfer, TRANSFER_KINDS),
            "regions": _columns(regions, REGION_KINDS),
            "tables": [_table_entry(info, directory) for info in tables.values()],
        }
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(cache, json.dumps(entry, separators=(",", ":")).encode())
    except (OSError, ValueError):
        return


# -- columns: each field of a row kind as its distinct plain values and an index per row

#: How each field is kept: text, a whole number, a price (a decimal's text), a status's
#: value, a date's ordinal; ``?`` where the field may be ``None``.
INSTANCE_KINDS = ("provider", "text", "text", "text?", "count", "price?", "price?", "price?",
                  "price?", "status?", "status?", "text", "date?", "date?", "text")  # fmt: skip
STORAGE_KINDS = ("provider", "text", "text", "text", "text", "price?", "price", "status",
                 "date", "text")  # fmt: skip
TRANSFER_KINDS = ("provider", "text", "text", "text", "text", "price", "status", "date", "text")
REGION_KINDS = ("provider", "text", "text", "text")


def _plain(value: Any) -> Any:
    if isinstance(value, date):
        return value.toordinal()
    if isinstance(value, Decimal | catalog.PriceStatus):
        return str(value)
    return value


def _columns(rows: Sequence[tuple[Any, ...]], kinds: Sequence[str]) -> Columns:
    """Each column as ``[distinct values, the index of each row's value]``: the tables
    repeat most values (a source, a status, a date) row after row."""
    columns = []
    for at in range(len(kinds)):
        plain = [_plain(row[at]) for row in rows]
        distinct = list(dict.fromkeys(plain))
        index = {value: number for number, value in enumerate(distinct)}
        columns.append([distinct, [index[value] for value in plain]])
    return columns


def _table_entry(info: catalog.TableInfo, directory: Path) -> list[Any]:
    if info.path.parent != directory:
        raise ValueError(info.path)  # never in the tables load_catalog reads
    parts = [[p, r, part.as_of.toordinal(), part.source] for (p, r), part in info.parts.items()]
    refreshed = info.refreshed_at.isoformat() if info.refreshed_at is not None else None
    return [info.name, info.path.name, info.as_of.toordinal(), info.source, refreshed, parts]


# Each value kind's reader takes a column's distinct values and gives each its value, or
# raises: every value is checked as a table's row would be.


def _texts(values: list[Any]) -> list[Any]:
    if not set(map(type, values)) <= {str}:
        raise _UnusableError
    return values


def _prices(texts: list[Any]) -> list[Any]:
    prices = [Decimal(text) for text in _texts(texts)]
    for price in prices:
        if not price.is_finite() or price < 0:
            raise _UnusableError
    return prices


def _counts(numbers: list[Any]) -> list[Any]:
    if not set(map(type, numbers)) <= {int} or min(numbers, default=0) < 0:
        raise _UnusableError
    return numbers


def _statuses(texts: list[Any]) -> list[Any]:
    known = {status.value: status for status in catalog.PriceStatus}
    return [known[text] for text in _texts(texts)]


def _dates(ordinals: list[Any]) -> list[Any]:
    return [date.fromordinal(ordinal) for ordinal in _counts(ordinals)]


def _providers(texts: list[Any]) -> list[Any]:
    if not set(_texts(texts)) <= set(catalog.PROVIDERS):
        raise _UnusableError
    return texts


_KINDS: dict[str, Callable[[list[Any]], list[Any]]] = {
    "text": _texts,
    "count": _counts,
    "price": _prices,
    "status": _statuses,
    "date": _dates,
    "provider": _providers,
}


def _read(values: Any, kind: str) -> list[Any]:
    """A column's distinct values, each read and checked as ``kind`` says."""
    if not isinstance(values, list):
        raise _UnusableError
    optional, kind = kind.endswith("?"), kind.rstrip("?")
    present = [value for value in values if value is not None]
    if len(present) != len(values) and not optional:
        raise _UnusableError
    read = iter(_KINDS[kind](present))
    return [None if value is None else next(read) for value in values]


def _column(column: Any, kind: str) -> list[Any]:
    """Every row's value of one column (see :func:`_columns`)."""
    if not isinstance(column, list) or len(column) != 2:
        raise _UnusableError
    distinct, indices = column
    values = _read(distinct, kind)
    if not isinstance(indices, list) or min(indices, default=0) < 0:
        raise _UnusableError
    # Past the end: IndexError; not a whole number: TypeError (bool is one, and harmless).
    return list(map(values.__getitem__, indices))


def _rows(columns: Any, kinds: Sequence[str], make: type[tuple[Any, ...]]) -> tuple[Any, ...]:
    if not isinstance(columns, list) or len(columns) != len(kinds):
        raise _UnusableError
    values = [_column(column, kind) for column, kind in zip(columns, kinds, strict=True)]
    if len(set(map(len, values))) > 1:
        raise _UnusableError
    # The named tuples made as tuples are (their __new__ is Python code, run per row).
    return tuple(map(tuple.__new__, repeat(make), zip(*values, strict=True)))


def _decode(entry: dict[str, Any], directory: Path) -> Parts:
    try:
        instances = _rows(entry["instances"], INSTANCE_KINDS, catalog.InstancePrice)
        for row in instances:
            spot, ondemand = row.spot_usd_per_hour, row.ondemand_usd_per_hour
            if spot is not None and ondemand is not None and spot > ondemand:
                raise _UnusableError
        return (
            instances,
            _rows(entry["storage"], STORAGE_KINDS, catalog.StorageRate),
            _rows(entry["transfer"], TRANSFER_KINDS, catalog.TransferRate),
            _rows(entry["regions"], REGION_KINDS, catalog.Region),
            {info.name: info for info in map(_table_info(directory), entry["tables"])},
        )
    except (InvalidOperation, OverflowError) as exc:
        raise _UnusableError from exc


def _table_info(directory: Path) -> Callable[[list[Any]], catalog.TableInfo]:
    def make(fields: list[Any]) -> catalog.TableInfo:
        name, file, as_of, source, refreshed, parts = fields
        _texts([name, source])
        if not _plain_name(file):
            raise _UnusableError
        if refreshed is not None:
            refreshed = datetime.fromisoformat(_texts([refreshed])[0])
        columns = [list(column) for column in zip(*parts, strict=True)] or [[], [], [], []]
        providers, regions, days, sources = (
            _read(column, kind)
            for column, kind in zip(columns, ("provider", "text", "date", "text"), strict=True)
        )
        return catalog.TableInfo(
            name,
            directory / file,
            _dates([as_of])[0],
            source,
            refreshed_at=refreshed,
            parts={
                (provider, region): catalog.TablePart(day, text)
                for provider, region, day, text in zip(
                    providers, regions, days, sources, strict=True
                )
            },
        )

    return make
