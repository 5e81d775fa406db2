"""DataFrames for notebooks (:meth:`costguard.notebook.EstimateResult.to_pandas`,
:func:`costguard.pricing.table`): columns pandas can plot and sum.

A column of :class:`~decimal.Decimal` is an ``object`` column to pandas: ``df.plot`` finds
"no numeric data", ``df.sum()`` concatenates nothing useful. So every column of numbers
held as Python objects (Decimal, int, float or blank) becomes ``float64`` (blank: NaN).
With ``exact=True`` the money columns (a name with ``usd``) keep their Decimals, exact to
the cent, and only the other numbers (vCPUs, GiB, counts) become ``float64``. The exact
figures are also always in ``records()`` and ``document()``.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any


def numeric_columns(frame: Any, *, exact: bool = False) -> Any:
    """``frame`` with its columns of numbers as ``float64`` (money too, unless ``exact``).

    >>> import pandas
    >>> frame = pandas.DataFrame({"vcpus": [Decimal(8), None], "total_usd": [Decimal("1.5")] * 2})
    >>> numeric_columns(frame).dtypes.tolist()
    [dtype('float64'), dtype('float64')]
    >>> numeric_columns(frame, exact=True)["total_usd"][0]
    Decimal('1.5')
    """
    frame = frame.copy()
    for name in frame.columns:
        if frame[name].dtype != object:  # already numbers (int64, float64) or text
            continue
        values = [v for v in frame[name] if v is not None and v == v]  # NaN != NaN
        numbers = all(
            isinstance(v, Decimal | int | float) and not isinstance(v, bool) for v in values
        )
        if not values or not numbers or (exact and "usd" in str(name)):
            continue
        frame[name] = frame[name].astype("float64")
    return frame
