"""Read the price tables into :mod:`~costguard.pricing.catalog` values.

The tables are CSV files plus a ``tables.toml`` that names each file's source and as-of
date (see ``pricing/README.md`` in the repository). They ship inside the package; a user
can point at another directory (``--pricing-dir`` / ``COSTGUARD_PRICING_DIR``) with the
same layout. ``costguard pricing refresh`` writes such a directory into the user cache;
:func:`load_tables` prices from the fresher of that cache and the bundled tables.

Loading validates every row and fails with the file and line of a bad one; the lookups
afterwards are pure. Where the tables are (bundled, a folder, the refresh cache and its
versions) and what makes a row valid are both decided here.
"""

from __future__ import annotations

import dataclasses
import stat
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from costguard.errors import CostguardError, InputError, UnknownNameError
from costguard.money import parse_decimal
from costguard.pricing.catalog import (
    INSTANCE_COLUMNS,
    INSTANCE_TABLES,
    PROVIDERS,
    REQUIRED_TABLES,
    ROW_DATE_COLUMNS,
    UNKNOWN_DATE,
    Catalog,
    GpuPart,
    InstancePrice,
    PriceStatus,
    Region,
    StorageRate,
    TableInfo,
    TablePart,
    TransferRate,
    check_provider,
)
from costguard.pricing.retired import retired_size

if TYPE_CHECKING:
    from costguard.pricing.advisor import InterruptionRow


def bundled_tables_dir() -> Path:
    """The directory of the tables shipped with the package.

    In a wheel they sit in ``costguard/_tables``; in a source checkout (editable install)
    they are the repository's ``pricing/`` directory.
    """
    package = Path(__file__).resolve().parents[1]  # costguard/, where the wheel puts them
    packaged = package / "_tables"
    if (packaged / "tables.toml").is_file():
        return packaged
    checkout = package.parents[1] / "pricing"
    if (checkout / "tables.toml").is_file():
        return checkout
    msg = "the price tables are missing from this installation of costguard"
    raise CostguardError(msg, hint="reinstall it: pip install --force-reinstall . in its checkout")


def load_catalog(
    directory: Path | None = None, *, origin: str | None = None, parsed: Path | None = None
) -> Catalog:
    """Load and validate the tables in ``directory`` (default: the bundled ones).

    ``origin`` names where the directory comes from in what the estimate prints
    (default: ``directory``, or ``bundled`` for the bundled tables). ``parsed``: the
    file of :mod:`costguard.pricing.parsed` that keeps what was parsed, for the next run.
    """
    origin = origin or ("directory" if directory is not None else "bundled")
    directory = bundled_tables_dir() if directory is None else directory
    index_path = directory / "tables.toml"
    if not index_path.is_file():
        msg = f"no price tables in {directory} (tables.toml is missing)"
        raise InputError(msg, hint="point --pricing-dir at a folder laid out like pricing/")
    if parsed is not None:
        from costguard.pricing import parsed as cache

        kept = cache.read(parsed, directory)
        if kept is not None:
            return _without_retired(Catalog(*kept, directory=directory, origin=origin))
    index = _read_index(index_path)
    tables = {name: _table_info(name, index, directory) for name in REQUIRED_TABLES}
    instances = tuple(
        row
        for name in INSTANCE_TABLES
        for row in _load(tables[name].path, _instance_parser(tables[name]))
    )
    catalog = Catalog(
        instances=instances,
        storage=_load(tables["storage"].path, _by_name(_storage)),
        transfer=_load(tables["transfer"].path, _by_name(_transfer)),
        regions=_load(tables["regions"].path, _by_name(_region)),
        tables=tables,
        directory=directory,
        origin=origin,
    )
    if parsed is not None:
        files = [index_path, *(info.path for info in tables.values())]
        parts = (catalog.instances, catalog.storage, catalog.transfer, catalog.regions, tables)
        cache.write(parsed, directory, files, parts)
    return _without_retired(catalog)


def _without_retired(catalog: Catalog) -> Catalog:
    """``catalog`` without the rows of sizes their provider has retired (a table written
    before the retirement still has them): a size that cannot be launched is never priced."""
    kept = tuple(i for i in catalog.instances if retired_size(i.provider, i.instance_type) is None)
    if len(kept) == len(catalog.instances):
        return catalog
    return dataclasses.replace(catalog, instances=kept)


def load_gpu_parts(directory: Path) -> tuple[GpuPart, ...]:
    """The GPU parts table (``[gpu_parts]`` in ``tables.toml``) of ``directory``, or the
    bundled one when that folder has none (a refresh writes only the tables it reads).
    ``costguard pricing check`` reads it; the estimate does not need it.
    """
    index_path = directory / "tables.toml"
    index = _read_index(index_path) if index_path.is_file() else {}
    if "gpu_parts" not in index:
        bundled = bundled_tables_dir()
        if directory == bundled:
            return ()
        return load_gpu_parts(bundled)
    return _load(_table_info("gpu_parts", index, directory).path, _by_name(_gpu_part))


def load_interruptions(directory: Path) -> tuple[TableInfo, tuple[InterruptionRow, ...]]:
    """The interruption table (``[interruptions]`` in ``tables.toml``: the AWS Spot
    Instance Advisor's bands) of ``directory`` with its entry, or the bundled one when
    that folder has none. Read by ``estimate --interruptions-per-day advisor`` only."""
    from costguard.pricing.advisor import TABLE

    index_path = directory / "tables.toml"
    index = _read_index(index_path) if index_path.is_file() else {}
    if TABLE not in index:
        bundled = bundled_tables_dir()
        if directory == bundled:
            msg = f"{index_path} has no [{TABLE}] table"
            raise CostguardError(msg, hint="reinstall costguard, or refresh it")
        return load_interruptions(bundled)
    info = _table_info(TABLE, index, directory)
    return info, _load(info.path, _by_name(_interruption))


#: In a cache folder written by ``costguard pricing refresh``: the symbolic link to the
#: version in use, and the folder of versions (each complete and never changed once
#: published; see :mod:`costguard.pricing.refresh.cache`).
CACHE_CURRENT = "current"
CACHE_VERSIONS = "versions"
#: A read that fails because a refresh replaced (and later removed) the version it was
#: reading is tried again on the new version, this many times in all.
CACHE_READ_ATTEMPTS = 5


def cache_tables_dir(cache_dir: Path) -> Path | None:
    """The folder of tables in use in a cache folder, or ``None`` when it has none.

    A cache written by ``costguard pricing refresh`` holds a link ``current`` to one of
    its immutable ``versions/``; it is resolved here, once, and everything is then read
    from the folder it names, so a refresh publishing meanwhile cannot mix two versions.
    A folder of tables laid out like ``pricing/`` (``tables.toml`` at the top, as older
    releases wrote the cache) is used as it is.

    Raises :class:`~costguard.errors.CostguardError` for a link that leads nowhere.

    >>> cache_tables_dir(Path("/nonexistent")) is None
    True
    """
    link = cache_dir / CACHE_CURRENT
    if not (link.is_symlink() or link.exists()):
        return cache_dir if (cache_dir / "tables.toml").is_file() else None
    for _ in range(CACHE_READ_ATTEMPTS):
        named = _link_value(link)
        try:
            resolved = link.resolve(strict=True)
            if resolved.is_dir():
                return resolved
            problem = f"{resolved} is not a folder"
        except (OSError, RuntimeError) as exc:
            problem = str(exc)
        if named is not None and _link_value(link) != named:
            # Refreshes replaced, then removed, the version it named between reading the
            # link and following it: follow the new one.
            continue
        msg = f"{link} does not lead to a folder of tables ({problem})"
        raise CostguardError(msg)
    msg = f"{link} kept changing while it was read"
    raise CostguardError(msg, hint="a refresh may be looping: try again later")


def _link_value(link: Path) -> Path | None:
    """Where the symbolic link ``link`` points, as written; ``None`` if it is not one."""
    try:
        return link.readlink()
    except OSError:
        return None


def load_tables(
    pricing_dir: Path | None = None, cache_dir: Path | None = None, *, parsed: Path | None = None
) -> Catalog:
    """The tables to price from: ``pricing_dir`` when given, else the user cache
    (``cache_dir``, written by ``costguard pricing refresh``) or the bundled tables.

    The rule: the cache is used unless the bundled tables are newer than anything in
    it, i.e. their oldest as-of date is after the cache's last refresh (its newest
    ``refreshed_at`` or as-of date). A cache mixes regions refreshed on different days
    (a refresh may cover one provider or region); comparing its *oldest* date would let
    a newer release of the bundled tables silently replace regions refreshed since. In
    turn, regions a newer bundled release covers that the cache carried over from an
    older one stay at the cache's figures until the next refresh (their parts say how
    old they are, and the estimate warns when they are stale); refresh again, or delete
    the cache, to take the bundled figures.

    The cache's ``current`` version is resolved once and read as a whole (see
    :func:`cache_tables_dir`); a read that a concurrent refresh pulled the folder from
    under is tried again on the version that replaced it. A cache that cannot be read is
    an error that says how to recover. ``pricing_dir`` may also be a folder a refresh
    wrote (``--output``).

    ``parsed``: the file where what was parsed is kept for the next run
    (:mod:`costguard.pricing.parsed`; :attr:`Settings.parsed_tables
    <costguard.settings.Settings.parsed_tables>` names the user's).

    >>> load_tables(cache_dir=Path("/nonexistent")).origin
    'bundled'
    """
    if pricing_dir is not None:
        return _load_versioned(pricing_dir, origin="directory", bundled=None, parsed=parsed)
    bundled = bundled_tables_dir()
    if cache_dir is None:
        return load_catalog(bundled, origin="bundled", parsed=parsed)
    return _load_versioned(cache_dir, origin="cache", bundled=bundled, parsed=parsed)


def _load_versioned(
    folder: Path, *, origin: str, bundled: Path | None, parsed: Path | None
) -> Catalog:
    """Load the tables in use in ``folder`` (a cache, or a plain folder of tables); with
    ``bundled``, those instead when the cache has none or they are newer (see
    :func:`load_tables`)."""
    attempt = 0
    while True:
        attempt += 1
        tables: Path | None = None
        try:
            tables = cache_tables_dir(folder)
            if tables is None:
                if bundled is None:
                    return load_catalog(folder, origin=origin)  # says what is missing
                return load_catalog(bundled, origin="bundled", parsed=parsed)
            if bundled is not None and _cache_newest(tables) < _oldest(bundled):
                return load_catalog(bundled, origin="bundled", parsed=parsed)
            return load_catalog(tables, origin=origin, parsed=parsed)
        except (CostguardError, OSError) as exc:
            if tables is not None and attempt < CACHE_READ_ATTEMPTS and _moved_on(folder, tables):
                continue  # a refresh replaced that version as it was read: read the new one
            if bundled is None:
                if isinstance(exc, CostguardError):
                    raise
                msg = f"cannot read the price tables in {folder}: {exc}"
                raise CostguardError(msg, hint="check --pricing-dir") from None
            message = exc.message if isinstance(exc, CostguardError) else str(exc)
            msg = f"the price cache {folder} cannot be used: {message}"
            raise CostguardError(
                msg,
                hint=f"run `costguard pricing refresh` again, or delete {folder} "
                "to use the bundled tables",
            ) from None


def _moved_on(folder: Path, read: Path) -> bool:
    """Whether the tables in use in ``folder`` are no longer those in ``read``."""
    try:
        return cache_tables_dir(folder) != read
    except CostguardError:
        return False


def _oldest(directory: Path) -> date:
    """The oldest as-of date of the instance tables named in ``directory/tables.toml``."""
    index = _read_index(directory / "tables.toml")
    return min(_table_info(name, index, directory).as_of for name in INSTANCE_TABLES)


def _cache_newest(directory: Path) -> date:
    """The day of the newest figure in ``directory``'s instance tables: the last refresh
    (``refreshed_at``), else the newest as-of date of a table or a part."""
    index = _read_index(directory / "tables.toml")
    days: list[date] = []
    for name in INSTANCE_TABLES:
        info = _table_info(name, index, directory)
        days.append(info.as_of)
        days.extend(part.as_of for part in info.parts.values())
        if info.refreshed_at is not None:
            days.append(info.refreshed_at.date())
    return max(days)


def _read_index(path: Path) -> dict[str, Any]:
    import tomllib  # not on the estimate's path when its tables come from the parsed cache

    try:
        _within_limit(path)
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        msg = f"{path} is not UTF-8 text (byte {exc.start})"
        raise InputError(msg, hint="an index of price tables is a TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        msg = f"{path} is not valid TOML: {exc}"
        raise InputError(msg, hint="fix it where it says, or copy the bundled one") from None


def _table_info(name: str, index: Mapping[str, Any], directory: Path) -> TableInfo:
    entry = index.get(name)
    if not isinstance(entry, Mapping):
        msg = f"{directory / 'tables.toml'} has no [{name}] table"
        raise InputError(msg, hint="each table needs file, as_of and source")
    try:
        parts: Mapping[str, Mapping[str, Mapping[str, Any]]] = entry.get("parts", {})
        refreshed = entry.get("refreshed_at")
        return TableInfo(
            name,
            directory / str(entry["file"]),
            _as_date(entry["as_of"]),
            str(entry["source"]),
            refreshed_at=None if refreshed is None else _as_datetime(refreshed),
            parts={
                (check_provider(provider), str(region)): TablePart(
                    _as_date(part["as_of"]), str(part["source"])
                )
                for provider, regions in parts.items()
                for region, part in regions.items()
            },
        )
    except (KeyError, ValueError, TypeError, AttributeError, UnknownNameError) as exc:
        msg = f"[{name}] in {directory / 'tables.toml'} is incomplete or malformed: {exc}"
        raise InputError(msg, hint="each table needs file, as_of (YYYY-MM-DD) and source") from None


def _as_date(value: Any) -> date:
    """A TOML date or date-time (or its text) as a date; a date-time counts by its UTC day."""
    if isinstance(value, datetime):  # before date: a datetime is a date too
        return _as_datetime(value).date()
    if isinstance(value, date):
        return value
    text = str(value)
    return _as_datetime(text).date() if "T" in text else date.fromisoformat(text)


def _as_datetime(value: Any) -> datetime:
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    if moment.tzinfo is None:
        msg = f"{value} has no time zone"
        raise ValueError(msg)
    return moment.astimezone(UTC)


class _BadRowError(ValueError):
    """A row of a price table that cannot be used."""


_Row = TypeVar("_Row")


def _load(
    path: Path, parser: Callable[[Sequence[str]], Callable[[list[str]], _Row]]
) -> tuple[_Row, ...]:
    """Parse every row of a CSV table; a bad row fails with its file and line.

    ``parser`` gets the header and returns the function that parses one row: it looks the
    columns up once per table, not once per row (the instance tables hold every region of
    the world, and the estimate reads them whole on every run).
    """
    import csv  # not on the estimate's path when its tables come from the parsed cache

    parsed: list[_Row] = []
    line = 1
    try:
        _within_limit(path)
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            header = [name.strip() for name in next(reader, [])]
            try:
                parse = parser(header)
            except _BadRowError as exc:
                msg = f"{path}, line 1: {exc}"
                raise InputError(msg, hint="fix the header of that table") from None
            width = len(header)
            append = parsed.append
            for values in reader:
                line = reader.line_num
                if not values:
                    continue  # a blank line, as DictReader skips it
                try:
                    if len(values) != width:
                        msg = f"{len(values)} fields, the header has {width}"
                        raise _BadRowError(msg)
                    append(parse(values))
                except (_BadRowError, UnknownNameError) as exc:
                    msg = f"{path}, line {reader.line_num}: {exc}"
                    raise InputError(msg, hint="fix or remove that row") from None
    except FileNotFoundError:
        msg = f"price table {path} is missing"
        raise InputError(msg, hint="check tables.toml in that folder") from None
    except UnicodeDecodeError as exc:
        msg = f"{path} is not UTF-8 text (near line {line + 1}: {exc.reason})"
        raise InputError(msg, hint="a price table is a UTF-8 CSV file") from None
    except csv.Error as exc:
        msg = f"{path}, line {line + 1}: not a CSV row ({exc})"
        raise InputError(msg, hint="a price table is a UTF-8 CSV file") from None
    return tuple(parsed)


#: The largest price table or index read (every region of every cloud is a few MB): a
#: larger file is not one, and reading it would hold it in memory.
MAX_TABLE_BYTES = 64 * 1024 * 1024


def _within_limit(path: Path) -> None:
    """Refuse a table file that is not a regular file or is larger than any price table
    (:data:`MAX_TABLE_BYTES`), before it is read. A missing one is the reader's to say."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return
    if not stat.S_ISREG(info.st_mode):
        msg = f"{path} is not a regular file"
        raise InputError(msg, hint="a price table is a UTF-8 CSV file")
    if info.st_size > MAX_TABLE_BYTES:
        msg = f"{path} is {info.st_size:,} bytes, more than any price table ({MAX_TABLE_BYTES:,})"
        raise InputError(msg, hint="is that the right folder?")


def _by_name(
    parse: Callable[[Mapping[str, str]], _Row],
) -> Callable[[Sequence[str]], Callable[[list[str]], _Row]]:
    """A row parser that reads its columns by name (for the small tables)."""

    def for_header(header: Sequence[str]) -> Callable[[list[str]], _Row]:
        return lambda values: parse(dict(zip(header, values, strict=True)))

    return for_header


def _field(row: Mapping[str, str], name: str) -> str:
    try:
        return row[name].strip()
    except KeyError:
        msg = f"column {name!r} is missing"
        raise _BadRowError(msg) from None


def _price(row: Mapping[str, str], name: str, *, optional: bool = False) -> Decimal | None:
    return _price_text(_field(row, name), name, optional=optional)


def _price_text(text: str, name: str, *, optional: bool = False) -> Decimal | None:
    if not text:
        if optional:
            return None
        msg = f"{name} is empty"
        raise _BadRowError(msg)
    value = _SHAPES.get(text)
    if value is not None:
        return value
    try:
        value = Decimal(text)  # the common case, fast (tables hold thousands of prices)
    except InvalidOperation:
        value = None
    if value is None or not value.is_finite():
        try:
            value = parse_decimal(text)
        except ValueError as exc:
            msg = f"{name}: {exc}"
            raise _BadRowError(msg) from None
    if value < 0:
        msg = f"{name} is negative ({text})"
        raise _BadRowError(msg)
    if value > MAX_TABLE_FIGURE:
        msg = f"{name} is {text}: more than any price or size of a cloud's tables"
        raise _BadRowError(msg)
    return value


#: The largest figure a table holds (a price per hour, GB or month, a size): 10^7 is far
#: above any; a larger one is a typo or a forgery, and Decimal arithmetic on 1e400
#: overflows the money formatting.
MAX_TABLE_FIGURE = Decimal(10) ** 7


#: vCPU and memory figures repeat in every region: parsed once (Decimals are immutable).
_SHAPES: dict[str, Decimal] = {str(n): Decimal(n) for n in range(1025)}
#: Statuses by their text (a dict lookup costs a tenth of an enum call).
_STATUSES = {status.value: status for status in PriceStatus}


def _status(row: Mapping[str, str], name: str) -> PriceStatus | None:
    return _status_text(_field(row, name), name)


def _status_text(text: str, name: str) -> PriceStatus | None:
    if not text:
        return None
    status = _STATUSES.get(text)
    if status is None:
        msg = f"{name} must be one of {', '.join(PriceStatus)}, not {text!r}"
        raise _BadRowError(msg)
    return status


def _date(row: Mapping[str, str], name: str) -> date:
    try:
        return date.fromisoformat(_field(row, name))
    except ValueError:
        msg = f"{name} must be a YYYY-MM-DD date"
        raise _BadRowError(msg) from None


def _required_price(row: Mapping[str, str], name: str) -> Decimal:
    value = _price(row, name)
    assert value is not None
    return value


def _instance_parser(
    info: TableInfo,
) -> Callable[[Sequence[str]], Callable[[list[str]], InstancePrice]]:
    """The row parser of the instance table ``info``: a row that gives no date of its
    own (a blank ``as_of``, or a file without the column) takes its table part's."""
    return lambda header: _instance(header, info)


def _row_date(text: str, name: str, default: date | None) -> date | None:
    """A row's price date: ``default`` when blank, ``None`` for ``unknown``."""
    if not text:
        return default
    if text == UNKNOWN_DATE:
        return None
    try:
        return date.fromisoformat(text)
    except ValueError:
        msg = f"{name} must be a YYYY-MM-DD date or {UNKNOWN_DATE!r}, not {text!r}"
        raise _BadRowError(msg) from None


def _instance(header: Sequence[str], info: TableInfo) -> Callable[[list[str]], InstancePrice]:
    """The parser of one instance row, its columns found once in ``header``."""
    missing = [name for name in INSTANCE_COLUMNS if name not in header]
    if missing:
        msg = f"column {missing[0]!r} is missing"
        raise _BadRowError(msg)
    at = {name: header.index(name) for name in INSTANCE_COLUMNS}
    provider_at, region_at, type_at, accelerator_at = (
        at["provider"],
        at["region"],
        at["instance_type"],
        at["accelerator"],
    )
    count_at, vcpus_at, memory_at = at["accelerator_count"], at["vcpus"], at["memory_gib"]
    ondemand_at, spot_at = at["ondemand_usd_per_hour"], at["spot_usd_per_hour"]
    ondemand_status_at, spot_status_at, note_at = (
        at["ondemand_status"],
        at["spot_status"],
        at["note"],
    )
    as_of_at, spot_as_of_at, source_at = (
        header.index(name) if name in header else None for name in ROW_DATE_COLUMNS
    )

    def parse(values: list[str]) -> InstancePrice:
        ondemand = _price_text(values[ondemand_at].strip(), "ondemand_usd_per_hour", optional=True)
        spot = _price_text(values[spot_at].strip(), "spot_usd_per_hour", optional=True)
        if ondemand is not None and spot is not None and spot > ondemand:
            msg = f"spot price {spot} is above on-demand {ondemand}"
            raise _BadRowError(msg)
        count_text = values[count_at].strip()
        try:
            count = int(count_text) if count_text else 0
        except ValueError:
            msg = f"accelerator_count must be a whole number, not {count_text!r}"
            raise _BadRowError(msg) from None
        provider = values[provider_at].strip().lower()
        region = values[region_at].strip()
        part = info.part(provider, region)
        as_of = _row_date(
            values[as_of_at].strip() if as_of_at is not None else "", "as_of", part.as_of
        )
        spot_text = values[spot_as_of_at].strip() if spot_as_of_at is not None else ""
        spot_as_of = _row_date(spot_text, "spot_as_of", as_of) if spot_text else as_of
        source = values[source_at].strip() if source_at is not None else ""
        return InstancePrice(
            provider=provider if provider in PROVIDERS else check_provider(provider),
            region=region,
            instance_type=values[type_at].strip(),
            accelerator=values[accelerator_at].strip() or None,
            accelerator_count=count,
            vcpus=_price_text(values[vcpus_at].strip(), "vcpus", optional=True),
            memory_gib=_price_text(values[memory_at].strip(), "memory_gib", optional=True),
            ondemand_usd_per_hour=ondemand,
            spot_usd_per_hour=spot,
            ondemand_status=_status_text(values[ondemand_status_at].strip(), "ondemand_status"),
            spot_status=_status_text(values[spot_status_at].strip(), "spot_status"),
            note=values[note_at].strip(),
            as_of=as_of,
            spot_as_of=spot_as_of,
            source=source or part.source,
        )

    return parse


def _one_of(row: Mapping[str, str], name: str, allowed: tuple[str, ...]) -> str:
    value = _field(row, name)
    if value not in allowed:
        msg = f"{name} must be one of {', '.join(allowed)}, not {value!r}"
        raise _BadRowError(msg)
    return value


def _required_status(row: Mapping[str, str]) -> PriceStatus:
    status = _status(row, "status")
    if status is None:
        msg = "status is empty"
        raise _BadRowError(msg)
    return status


def _storage(row: Mapping[str, str]) -> StorageRate:
    unit = _one_of(row, "unit", ("GB-month", "GiB-month", "disk-month"))
    size = _price(row, "disk_size_gib", optional=True)
    if unit == "disk-month" and not size:
        msg = "a disk-month price needs disk_size_gib"
        raise _BadRowError(msg)
    return StorageRate(
        provider=check_provider(_field(row, "provider")),
        region=_field(row, "region"),
        kind=_one_of(row, "kind", ("block", "object")),
        sku=_field(row, "sku"),
        unit=unit,
        disk_size_gib=size,
        usd=_required_price(row, "usd"),
        status=_required_status(row),
        as_of=_date(row, "as_of"),
        source=_field(row, "source"),
    )


def _gpu_part(row: Mapping[str, str]) -> GpuPart:
    return GpuPart(
        provider=check_provider(_field(row, "provider")),
        region=_field(row, "region"),
        accelerator=_field(row, "accelerator"),
        ondemand_usd_per_gpu_hour=_required_price(row, "ondemand_usd_per_gpu_hour"),
        spot_usd_per_gpu_hour=_price(row, "spot_usd_per_gpu_hour", optional=True),
        as_of=_date(row, "as_of"),
        source=_field(row, "source"),
    )


def _interruption(row: Mapping[str, str]) -> InterruptionRow:
    from costguard.pricing.advisor import InterruptionRow, parse_band

    try:
        band = parse_band(_field(row, "band"))
    except ValueError as exc:
        raise _BadRowError(str(exc)) from None
    low, high = _price(row, "band_low_pct"), _price(row, "band_high_pct", optional=True)
    if (low, high) != (band.low_pct, band.high_pct):
        msg = f"band_low_pct and band_high_pct ({low}, {high}) disagree with {band.label}"
        raise _BadRowError(msg)
    savings = _field(row, "savings_pct")
    if not savings.lstrip("-").isdigit():
        msg = f"savings_pct must be a whole number, not {savings!r}"
        raise _BadRowError(msg)
    return InterruptionRow(
        provider=check_provider(_field(row, "provider")),
        region=_field(row, "region"),
        instance_type=_field(row, "instance_type"),
        band=band,
        savings_pct=int(savings),
    )


def _transfer(row: Mapping[str, str]) -> TransferRate:
    return TransferRate(
        provider=check_provider(_field(row, "provider")),
        region=_field(row, "region"),
        kind=_one_of(row, "kind", ("internet_egress", "inter_region")),
        destination=_field(row, "destination"),
        unit=_one_of(row, "unit", ("GB", "GiB")),
        usd=_required_price(row, "usd"),
        status=_required_status(row),
        as_of=_date(row, "as_of"),
        source=_field(row, "source"),
    )


def _region(row: Mapping[str, str]) -> Region:
    return Region(
        provider=check_provider(_field(row, "provider")),
        name=_field(row, "region"),
        continent=_field(row, "continent"),
        location=_field(row, "location"),
    )
