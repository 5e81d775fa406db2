"""Price tables and cost estimates.

* :mod:`costguard.pricing.catalog` loads the tables (bundled with the package, or a
  directory the user names) into plain dataclasses.
* :mod:`costguard.pricing.gpus` maps what people type (``a10g``, ``A100 80GB``) to the
  canonical accelerator names the tables use.
* :mod:`costguard.pricing.estimate` is the pure arithmetic: price x hours x count +
  storage + egress, per provider, region and market.

``table(name)`` gives one of the tables as a ``pandas.DataFrame`` (costguard[pandas]).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TABLES = ("gpu_instances", "cpu_instances", "storage", "transfer", "regions")


def table(name: str, *, pricing_dir: str | Path | None = None, exact: bool = False) -> Any:
    """The rows of price table ``name`` as a DataFrame, as ``costguard pricing show NAME``.

    The fresher of the bundled tables and ``pricing refresh``'s cache, like the CLI.
    Numbers (vCPUs, GiB, prices) are ``float64`` columns, which pandas plots and sums;
    with ``exact=True`` the prices stay :class:`~decimal.Decimal` (see
    :mod:`costguard.frames`). ``DataFrame.attrs`` holds ``as_of``, ``source`` and
    ``origin``.
    """
    from costguard.clouds import require
    from costguard.errors import InputError
    from costguard.frames import numeric_columns
    from costguard.pricing.catalog import as_of_text, rows_as_of, table_rows
    from costguard.pricing.tables import load_tables
    from costguard.settings import Settings

    if name not in TABLES:
        msg = f"unknown price table {name!r}"
        raise InputError(msg, hint=f"one of: {', '.join(TABLES)}")
    pandas = require("pandas", "pandas")
    settings = Settings.load({"pricing_dir": Path(pricing_dir) if pricing_dir else None})
    catalog = load_tables(settings.pricing_dir, settings.pricing_cache_dir)
    rows = table_rows(catalog, name)
    frame = numeric_columns(pandas.DataFrame.from_records(rows), exact=exact)
    as_of = as_of_text(rows_as_of(catalog, name, rows))
    frame.attrs.update(as_of=as_of, source=catalog.tables[name].source, origin=catalog.origin)
    return frame
