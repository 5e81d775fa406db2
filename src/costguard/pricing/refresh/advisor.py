"""Read the AWS Spot Instance Advisor's file from a ``--from`` mirror into a new
interruption table (``interruptions.csv``; see :mod:`costguard.pricing.advisor`).

The file is ``DIR/spot-advisor-data.json`` (or ``DIR/aws/spot-advisor-data.json``), as
AWS serves it. It is dated as the mirror's price responses are: ``fetched.json``, else
the file's modification date; never the day of the refresh. A file of another shape is
refused before anything is written.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from costguard.errors import CostguardError
from costguard.pricing.advisor import (
    ADVISOR_FILE,
    ADVISOR_URL,
    InterruptionTable,
    rows_from_advisor,
)
from costguard.pricing.catalog import Catalog
from costguard.pricing.refresh import mirror


def find(mirror_dir: Path) -> Path | None:
    """The advisor's file in ``mirror_dir``, or ``None`` when it has none."""
    for path in (mirror_dir / ADVISOR_FILE, mirror_dir / "aws" / ADVISOR_FILE):
        if path.is_file():
            return path
    return None


def read(mirror_dir: Path, catalog: Catalog) -> InterruptionTable | None:
    """The interruption table from the advisor's file in ``mirror_dir`` for the AWS GPU
    types of ``catalog``; ``None`` when the mirror has no such file.

    Raises :class:`CostguardError` for a file that is not JSON or not the advisor's shape.
    """
    path = find(mirror_dir)
    if path is None:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        msg = f"cannot read {path}: {exc}"
        raise CostguardError(msg, hint=f"download it again from {ADVISOR_URL}") from None
    types = {r.instance_type for r in catalog.instances if r.provider == "aws" and r.accelerator}
    try:
        rows = rows_from_advisor(data, types)
    except CostguardError as exc:
        msg = f"{path}: {exc.message}"
        raise CostguardError(msg, hint=exc.hint) from None
    fetched = mirror.fetched_at(mirror_dir, "aws")
    if fetched is None:
        day = datetime.fromtimestamp(path.stat().st_mtime, UTC).date()
        when = "its modification date"
    else:
        day = fetched.astimezone(UTC).date()
        when = "fetched.json"
    source = (
        f"AWS Spot Instance Advisor data ({ADVISOR_URL}) read from {path} by costguard "
        f"pricing refresh --from (dated by {when}): the AWS GPU instance types of the "
        "instance tables in each region it lists them in, Linux"
    )
    return InterruptionTable(rows, day, source)
