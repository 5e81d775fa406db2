"""Publish price tables atomically: readers see one complete version, never a mix.

The cache folder (``--output``, default the user cache) holds::

    current -> versions/<id>      a relative symbolic link to the version in use
    versions/<id>/                one complete set of tables, never changed once published
    .lock                         refreshes hold an exclusive lock on it while they publish

Each version has the layout of ``pricing/`` (``tables.toml`` and the five CSV files,
same columns), so :func:`costguard.pricing.tables.load_catalog` reads it. A refresh
writes a new version into a staging folder under ``versions/``, fsyncs every file and
the folder, renames it to its final name, then switches ``current`` in one step by
renaming a new link over it (:func:`os.replace`). Readers resolve ``current`` once and
read everything from the folder it names
(:func:`costguard.pricing.tables.cache_tables_dir`), so a reader sees the old version
or the new one, whole. The version that was current just before stays, for readers
still reading it; older ones are removed (a reader that loses its folder all the same
reads again from the new ``current``).

Refreshes serialise on an exclusive :func:`fcntl.flock` of ``.lock`` around reading the
tables they merge into, tidying and publishing, so two refreshes at once cannot lose
each other's prices. A crash leaves at worst a staging folder or an unused version,
which the next refresh removes; ``current`` always names a complete version.

Caches written by earlier releases (the tables directly in the folder, swapped by
renaming folders) are still read; the first refresh adds ``current`` and the next one
removes the old files. Where symbolic links cannot be made (Windows without Developer
Mode), a refresh fails with an error that says so, and nothing is changed.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from costguard._version import __version__
from costguard.errors import CostguardError, InputError
from costguard.files import fsync_dir
from costguard.pricing.advisor import TABLE, InterruptionTable, render_csv
from costguard.pricing.catalog import (
    INSTANCE_COLUMNS,
    INSTANCE_TABLES,
    ROW_DATE_COLUMNS,
    Catalog,
    InstancePrice,
    TableInfo,
    as_of_text,
)
from costguard.pricing.refresh.merge import MergedTables, TableMeta
from costguard.pricing.tables import (
    CACHE_CURRENT,
    CACHE_VERSIONS,
    cache_tables_dir,
    load_interruptions,
)

#: The lock file refreshes serialise on.
LOCK_FILE = ".lock"
#: Names of what a refresh is writing (staging folders, new links): removed by the next
#: refresh, which holds the lock, so they can only be left by a crash.
_STAGING_PREFIX = ".tmp-"
_RETIRED_PREFIX = ".old-"
_LINK_PREFIX = f".{CACHE_CURRENT}.tmp-"
#: Staging folders that earlier releases left next to the cache, older than this, are
#: leftovers of a crashed refresh (a live one finishes in minutes).
STALE_STAGING_S = 3600


def write_tables(
    target: Path,
    merged: MergedTables,
    catalog: Catalog,
    written_at: datetime,
    interruptions: InterruptionTable | None = None,
) -> None:
    """Write ``merged`` into ``target`` atomically; tables not refreshed are copied from
    ``catalog`` byte for byte. The interruption table is ``interruptions`` when given
    (read from the Spot Instance Advisor's file), else ``catalog``'s, copied."""
    files: dict[str, bytes] = {}
    for meta in merged.meta:
        if meta.name in INSTANCE_TABLES:
            files[meta.file] = render_instances(merged.instances[meta.name])
        else:
            files[meta.file] = catalog.tables[meta.name].path.read_bytes()
    index = list(merged.meta)
    if interruptions is not None:
        files[INTERRUPTIONS_FILE] = render_csv(interruptions.rows)
        index.append(
            TableMeta(TABLE, INTERRUPTIONS_FILE, interruptions.as_of, interruptions.source)
        )
    else:
        kept = _interruption_table(catalog.directory)
        if kept is not None:
            files[kept.path.name] = kept.path.read_bytes()
            index.append(TableMeta(TABLE, kept.path.name, kept.as_of, kept.source))
    files["tables.toml"] = render_index(index, written_at).encode("utf-8")
    publish(target, files)


#: The interruption table's file in a folder a refresh writes.
INTERRUPTIONS_FILE = "interruptions.csv"


def _interruption_table(directory: Path) -> TableInfo | None:
    """The ``[interruptions]`` entry of the tables in ``directory`` (or the bundled
    ones'), ``None`` when neither has one."""
    try:
        info, _ = load_interruptions(directory)
    except CostguardError:
        return None
    return info


def render_instances(rows: Iterable[InstancePrice]) -> bytes:
    """An instance table as CSV, in the columns of ``pricing/gpu_instances.csv``."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow((*INSTANCE_COLUMNS, *ROW_DATE_COLUMNS))
    for row in rows:
        writer.writerow(
            [
                row.provider,
                row.region,
                row.instance_type,
                row.accelerator or "",
                row.accelerator_count if row.accelerator else "",
                _number(row.vcpus),
                _number(row.memory_gib),
                _number(row.ondemand_usd_per_hour),
                _number(row.spot_usd_per_hour),
                row.ondemand_status or "",
                row.spot_status or "",
                row.note,
                as_of_text(row.as_of),
                "" if row.spot_as_of == row.as_of else as_of_text(row.spot_as_of),
                row.source,
            ]
        )
    return out.getvalue().encode("utf-8")


def _number(value: Decimal | None) -> str:
    """A price or size as plain text without trailing zeros (``1.0060`` -> ``1.006``)."""
    if value is None:
        return ""
    text = f"{value.normalize():f}"
    return "0" if text == "-0" else text


def render_index(meta: Sequence[TableMeta], written_at: datetime) -> str:
    """The ``tables.toml`` for ``meta``: file, as_of and source per table, and for the
    instance tables when they were refreshed and a part per provider and region.

    >>> from datetime import date
    >>> print(render_index([TableMeta("regions", "regions.csv", date(2026, 11, 30),
    ...                              'lists "A"')], datetime(2026, 12, 1, tzinfo=UTC)))
    ... # doctest: +ELLIPSIS
    # Price tables written by `costguard pricing refresh`...
    [regions]
    file = "regions.csv"
    as_of = 2026-11-30
    source = "lists \\"A\\""
    <BLANKLINE>
    """
    lines = [
        "# Price tables written by `costguard pricing refresh`. costguard reads this file",
        "# to say how old each figure is and where it came from; refresh again to update.",
        "",
        "[refresh]",
        f"written_at = {_toml_datetime(written_at)}",
        f"tool = {toml_string('costguard ' + __version__)}",
    ]
    for table in meta:
        lines += [
            "",
            f"[{table.name}]",
            f"file = {toml_string(table.file)}",
            f"as_of = {table.as_of.isoformat()}",
            f"source = {toml_string(table.source)}",
        ]
        if table.refreshed_at is not None:
            lines.append(f"refreshed_at = {_toml_datetime(table.refreshed_at)}")
        for provider in sorted({provider for provider, _ in table.parts}):
            lines += ["", f"[{table.name}.parts.{provider}]"]
            for (owner, region), part in sorted(table.parts.items()):
                if owner == provider:
                    lines.append(
                        f"{toml_string(region)} = {{ as_of = {part.as_of.isoformat()}, "
                        f"source = {toml_string(part.source)} }}"
                    )
    return "\n".join(lines) + "\n"


def toml_string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped.

    >>> print(toml_string('a "b"\\tc'))
    "a \\"b\\"\\tc"
    """
    escaped = []
    for char in text:
        if char in ('"', "\\"):
            escaped.append("\\" + char)
        elif char == "\t":
            escaped.append("\\t")
        elif char == "\n":
            escaped.append("\\n")
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            escaped.append(f"\\u{ord(char):04X}")
        else:
            escaped.append(char)
    return '"' + "".join(escaped) + '"'


def _toml_datetime(moment: datetime) -> str:
    return moment.astimezone(UTC).replace(microsecond=0).isoformat()


def check_target(target: Path) -> None:
    """Refuse a target that holds anything but price tables (replacing it would lose it).

    Raises :class:`~costguard.errors.InputError`; a missing or empty folder is fine, and
    so is one that a refresh wrote, or a folder of tables laid out like ``pricing/``.
    """
    if not target.exists():
        return
    if not target.is_dir():
        msg = f"{target} exists and is not a folder"
        raise InputError(msg, hint="choose another folder for the price tables")
    foreign = sorted(entry.name for entry in target.iterdir() if not _ours(entry))
    if foreign:
        msg = f"{target} holds files costguard did not write ({', '.join(foreign[:5])})"
        raise InputError(msg, hint="refresh replaces the whole folder: choose an empty or new one")


def _ours(entry: Path) -> bool:
    """Whether ``entry``, in a target folder, is something a refresh writes."""
    name = entry.name
    if entry.is_symlink():
        return name == CACHE_CURRENT or name.startswith(_LINK_PREFIX)
    if name == CACHE_VERSIONS:
        return entry.is_dir()
    return entry.is_file() and (name in ("tables.toml", LOCK_FILE) or entry.suffix == ".csv")


def has_tables(target: Path) -> bool:
    """Whether ``target`` holds tables in use (a ``current`` version, or older files)."""
    try:
        return cache_tables_dir(target) is not None
    except CostguardError:
        return False


_held = threading.local()


@contextlib.contextmanager
def locked(target: Path) -> Iterator[None]:
    """Hold the exclusive refresh lock of ``target`` (created if need be), waiting for it.

    Re-entrant within a thread, so :func:`publish` can be called under it. Where
    :mod:`fcntl` is missing (Windows) there is no lock: one refresh at a time there.
    """
    key = str(target.absolute())
    held: set[str] = getattr(_held, "paths", set())
    _held.paths = held
    if key in held:
        yield
        return
    target.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        fcntl = None  # type: ignore[assignment]
    descriptor = os.open(target / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        held.add(key)
        try:
            yield
        finally:
            held.discard(key)
    finally:
        os.close(descriptor)  # releases the lock


def publish(target: Path, files: Mapping[str, bytes]) -> Path:
    """Publish ``files`` (name -> content) as a new version of ``target`` and make it the
    one in use, atomically (see the module docstring). Returns the version's folder.

    Raises :class:`~costguard.errors.InputError` for a target of other files, and
    :class:`~costguard.errors.CostguardError` where no symbolic link can be made.
    """
    check_target(target)
    with locked(target):
        tidy(target)
        versions = target / CACHE_VERSIONS
        versions.mkdir(exist_ok=True)
        previous = _current_version(target)
        staging = Path(tempfile.mkdtemp(prefix=_STAGING_PREFIX, dir=versions))
        version = versions / _version_name()
        try:
            staging.chmod(0o755)  # mkdtemp makes it private; a shared --output must be readable
            for name, content in files.items():
                _write_synced(staging / Path(name).name, content)
            fsync_dir(staging)
            staging.replace(version)
            fsync_dir(versions)
            _switch_current(target, version)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            if _current_version(target) != version.name:
                shutil.rmtree(version, ignore_errors=True)
            raise
        _remove_versions(versions, keep={version.name, previous})
    return version


def tidy(target: Path) -> None:
    """Clear what crashed refreshes left in (and next to) ``target``.

    Under the lock: staging folders and links, versions that never became current or are
    older than the one before it, and the files of an earlier release's layout once a
    ``current`` version replaces them. Tables an earlier release moved aside just before
    a crash are put back when ``target`` is missing.
    """
    _tidy_legacy(target)
    try:
        check_target(target)
    except InputError:
        return  # not a folder of tables: touch nothing (publish will refuse it)
    if not target.is_dir():
        return
    with locked(target):
        for entry in target.iterdir():
            if entry.is_symlink() and entry.name.startswith(_LINK_PREFIX):
                entry.unlink(missing_ok=True)
        current = _current_version(target)
        versions = target / CACHE_VERSIONS
        if current is None or not versions.is_dir():
            return
        for entry in target.iterdir():
            if entry.is_file() and (entry.name == "tables.toml" or entry.suffix == ".csv"):
                entry.unlink(missing_ok=True)  # the earlier layout, replaced by `current`
        older = sorted(
            entry.name
            for entry in versions.iterdir()
            if entry.is_dir() and not entry.name.startswith(".") and entry.name < current
        )
        _remove_versions(versions, keep={current, older[-1] if older else None})


def _tidy_legacy(target: Path) -> None:
    """What an earlier release's crashed refresh left next to ``target``."""
    parent = target.parent
    if not parent.is_dir():
        return
    aside = sorted(
        parent.glob(f".{target.name}.old-*"), key=lambda p: p.stat().st_mtime, reverse=True
    )
    for folder in aside:
        if not target.exists() and (folder / "tables.toml").is_file():
            folder.replace(target)
        else:
            shutil.rmtree(folder, ignore_errors=True)
    for folder in parent.glob(f".{target.name}.tmp-*"):
        if time.time() - folder.stat().st_mtime > STALE_STAGING_S:
            shutil.rmtree(folder, ignore_errors=True)


def _version_name() -> str:
    """A new version's folder name: the time (so names sort by age), then a random part."""
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S%fZ}-{uuid.uuid4().hex[:8]}"


def _current_version(target: Path) -> str | None:
    """The name of the version ``current`` links to, if any (the link is not followed)."""
    link = target / CACHE_CURRENT
    if not link.is_symlink():
        return None
    return link.readlink().name


def _switch_current(target: Path, version: Path) -> None:
    """Point ``target/current`` at ``version`` in one step: a new link renamed over it."""
    link = target / CACHE_CURRENT
    if link.exists() and not link.is_symlink():
        msg = f"{link} is not a symbolic link"
        raise CostguardError(msg, hint=f"remove {link}, then refresh again")
    temporary = target / f"{_LINK_PREFIX}{uuid.uuid4().hex[:12]}"
    try:
        temporary.symlink_to(Path(CACHE_VERSIONS) / version.name, target_is_directory=True)
    except (OSError, NotImplementedError) as exc:
        msg = f"cannot make a symbolic link in {target}: {exc}"
        raise CostguardError(
            msg,
            hint="the price cache needs symbolic links (on Windows: turn on Developer "
            "Mode); or keep tables in a folder of your own and use --pricing-dir",
        ) from None
    try:
        temporary.replace(link)  # os.replace: atomic, over the old link
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_dir(target)


def _remove_versions(versions: Path, keep: set[str | None]) -> None:
    """Remove every version not in ``keep``, and staging folders (the lock is held, so
    they are a crashed refresh's). Each is renamed first, so it vanishes in one step."""
    for entry in versions.iterdir():
        if entry.name in keep or not entry.is_dir() or entry.is_symlink():
            continue
        if entry.name.startswith("."):
            shutil.rmtree(entry, ignore_errors=True)
            continue
        retired = versions / f"{_RETIRED_PREFIX}{entry.name}"
        try:
            entry.replace(retired)
        except OSError:
            continue
        shutil.rmtree(retired, ignore_errors=True)


def _write_synced(path: Path, content: bytes) -> None:
    with path.open("wb") as handle:
        handle.write(content)
        handle.flush()
        os.fsync(handle.fileno())
