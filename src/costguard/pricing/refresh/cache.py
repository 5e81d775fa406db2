"""Write price tables atomically: a folder that is complete, or not there at all.

The folder has the layout of ``pricing/`` (``tables.toml`` and the five CSV files, same
columns), so :func:`costguard.pricing.catalog.load_catalog` reads it. It is written into
a staging folder next to the target, every file and the folder fsynced, then renamed
into place; the old folder is moved aside first and removed after. A reader therefore
sees the old tables, the new ones, or (for an instant, or after a crash between the two
renames) none, and then uses the bundled tables; never a half-written folder. The next
refresh puts tables moved aside by a crash back, and clears staging folders that a
crashed refresh left.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from costguard import __version__
from costguard.errors import InputError
from costguard.pricing.catalog import INSTANCE_TABLES, Catalog, InstancePrice
from costguard.pricing.refresh.merge import MergedTables, TableMeta

INSTANCE_COLUMNS = (
    "provider",
    "region",
    "instance_type",
    "accelerator",
    "accelerator_count",
    "vcpus",
    "memory_gib",
    "ondemand_usd_per_hour",
    "spot_usd_per_hour",
    "ondemand_status",
    "spot_status",
    "note",
)
#: Staging folders older than this are leftovers of a crashed refresh (a live one
#: finishes in minutes), so a refresh running in parallel keeps its own.
STALE_STAGING_S = 3600


def write_tables(
    target: Path, merged: MergedTables, catalog: Catalog, written_at: datetime
) -> None:
    """Write ``merged`` into ``target`` atomically; tables not refreshed are copied from
    ``catalog`` byte for byte."""
    files: dict[str, bytes] = {}
    for meta in merged.meta:
        if meta.name in INSTANCE_TABLES:
            files[meta.file] = render_instances(merged.instances[meta.name])
        else:
            files[meta.file] = catalog.tables[meta.name].path.read_bytes()
    files["tables.toml"] = render_index(merged.meta, written_at).encode("utf-8")
    publish(target, files)


def render_instances(rows: Iterable[InstancePrice]) -> bytes:
    """An instance table as CSV, in the columns of ``pricing/gpu_instances.csv``."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(INSTANCE_COLUMNS)
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

    Raises :class:`~costguard.errors.InputError`; a missing or empty folder is fine.
    """
    if not target.exists():
        return
    if not target.is_dir():
        msg = f"{target} exists and is not a folder"
        raise InputError(msg, hint="choose another folder for the price tables")
    foreign = sorted(
        entry.name
        for entry in target.iterdir()
        if not entry.is_file() or not (entry.name == "tables.toml" or entry.suffix == ".csv")
    )
    if foreign:
        msg = f"{target} holds files costguard did not write ({', '.join(foreign[:5])})"
        raise InputError(msg, hint="refresh replaces the whole folder: choose an empty or new one")


def publish(target: Path, files: Mapping[str, bytes]) -> None:
    """Write ``files`` (name -> content) as the folder ``target``, atomically."""
    check_target(target)
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    tidy(target)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=parent))
    try:
        staging.chmod(0o755)  # mkdtemp makes it private; a shared --output must be readable
        for name, content in files.items():
            _write_synced(staging / Path(name).name, content)
        _fsync_dir(staging)
        _swap_into_place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def tidy(target: Path) -> None:
    """Clear what crashed refreshes left next to ``target``.

    Tables moved aside just before a crash are put back when ``target`` is missing
    (else removed); staging folders older than :data:`STALE_STAGING_S` are removed.
    """
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


def _swap_into_place(staging: Path, target: Path) -> None:
    if target.exists():
        aside = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:12]}")
        target.replace(aside)
        staging.replace(target)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        staging.replace(target)
    _fsync_dir(target.parent)


def _write_synced(path: Path, content: bytes) -> None:
    with path.open("wb") as handle:
        handle.write(content)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    """Make a folder's entries (new files, a rename) durable; a no-op where folders
    cannot be opened (Windows)."""
    if os.name == "nt":
        return
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
