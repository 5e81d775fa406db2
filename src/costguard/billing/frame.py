"""``costguard.spend(...)``: what billing exports billed, as a pandas DataFrame.

>>> import costguard
>>> costguard.spend.__module__
'costguard.billing.frame'
"""

from __future__ import annotations

from typing import Any


def spend(
    *exports: str, by: str = "job", month: str | None = None, currency: str | None = None
) -> Any:
    """``costguard spend`` for notebooks: a pandas DataFrame of the groups (``key``,
    ``billed_usd``, ``effective_usd`` as exact :class:`~decimal.Decimal`), the untagged
    line's key missing (NA); ``frame.attrs`` holds the currency, period and totals.
    Needs the ``billing`` and ``pandas`` extras.
    """
    from costguard.billing.exports import read_spend
    from costguard.billing.spend import GROUPINGS, parse_month, report
    from costguard.clouds import require
    from costguard.errors import InputError

    if by not in GROUPINGS:
        msg = f"by must be one of {', '.join(GROUPINGS)}, not {by!r}"
        raise InputError(msg, hint="by='job'")
    result = report(
        read_spend(exports, by),
        by,
        month=None if month is None else parse_month(month),
        currency=currency,
    )
    pandas = require("pandas", "pandas")
    frame = pandas.DataFrame(
        [(g.key, g.billed_usd, g.effective_usd) for g in result.groups],
        columns=["key", "billed_usd", "effective_usd"],
    )
    frame.attrs.update(
        by=by,
        currency=result.currency,
        period=result.period,
        total_billed_usd=result.total_billed_usd,
        total_effective_usd=result.total_effective_usd,
    )
    return frame
