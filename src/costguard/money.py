"""Money and units: ``Decimal`` everywhere, rounded only for display; a time in words.

Prices in the tables are exact decimals as the providers list them. Computed amounts
keep full precision until they are shown; :func:`usd_str` gives the exact figure for
machines (JSON, CSV) and :func:`format_usd` a rounded one for people.
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

#: Hours in a billing month, the convention AWS, GCP and Azure use for monthly rates.
HOURS_PER_MONTH = Decimal(730)
#: Bytes per GB (decimal, as AWS and Azure bill) and per GiB (binary, as GCP bills).
BYTES_PER_GB = Decimal(10) ** 9
BYTES_PER_GIB = Decimal(2) ** 30
#: Computed amounts are exact to a millionth of a dollar; finer digits are noise.
MICRO_USD = Decimal("0.000001")
CENT = Decimal("0.01")


def parse_decimal(text: str | int | float | Decimal) -> Decimal:
    """Parse a finite decimal number, or raise ``ValueError``.

    Floats are converted through ``str`` so ``0.1`` stays ``0.1``.

    >>> parse_decimal("8")
    Decimal('8')
    >>> parse_decimal("nan")
    Traceback (most recent call last):
    ...
    ValueError: not a finite number: 'nan'
    """
    if isinstance(text, float):
        text = repr(text)
    try:
        value = Decimal(str(text).strip().replace("_", ""))
    except InvalidOperation:
        msg = f"not a number: {text!r}"
        raise ValueError(msg) from None
    if not value.is_finite():
        msg = f"not a finite number: {text!r}"
        raise ValueError(msg)
    return value


def gb_to_gib(gigabytes: Decimal) -> Decimal:
    """Convert decimal gigabytes to binary gibibytes.

    >>> gb_to_gib(Decimal("1.073741824")) == 1
    True
    """
    return gigabytes * BYTES_PER_GB / BYTES_PER_GIB


def round_usd(amount: Decimal) -> Decimal:
    """Round a computed amount to a millionth of a dollar (banker's rounding).

    >>> round_usd(Decimal("0.10958904109589041"))
    Decimal('0.109589')
    """
    return amount.quantize(MICRO_USD, rounding=ROUND_HALF_EVEN)


def usd_str(amount: Decimal) -> str:
    """The exact figure as a plain decimal string, without trailing zeros.

    >>> usd_str(Decimal("32.192000"))
    '32.192'
    >>> usd_str(Decimal("100.00"))
    '100'
    """
    text = f"{round_usd(amount).normalize():f}"
    return "0" if text in ("-0", "0") else text


def format_usd(amount: Decimal, *, rate: bool = False) -> str:
    """Dollars for people: cents for amounts, up to four decimals for small rates.

    >>> format_usd(Decimal("1234.5"))
    '$1,234.50'
    >>> format_usd(Decimal("0.0052"), rate=True)
    '$0.0052'
    """
    if rate and abs(amount) < 10:
        shown = amount.quantize(Decimal("0.0001"), rounding=ROUND_HALF_EVEN)
        text = f"{shown.normalize():f}"
        if "." not in text or len(text.split(".")[1]) < 2:
            text = f"{shown.quantize(CENT):f}"
        return f"${text}"
    return f"${amount.quantize(CENT, rounding=ROUND_HALF_EVEN):,}"


def duration(seconds: float) -> str:
    """A time left in words.

    >>> duration(42), duration(4000), duration(200000)
    ('42 s', '1 h 6 min', '2 d 7 h')
    """
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"
