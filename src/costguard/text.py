"""Untrusted text made safe to show: on a terminal, in a pipe, in a CSV cell.

What a store, a billing export, a tag or a cloud API holds was written by someone else
(a labmate, a leaked key, any job's instance role). Every such value goes through this
module before it reaches a person:

- :func:`visible`: control characters (C0, DEL, C1: ``ESC`` and so every CSI/OSC
  sequence, a newline that would fake a report line), Unicode line separators, bidi
  overrides and lone surrogates are shown escaped, as Python writes them (``\\x1b``,
  ``\\n``, ``\\u202e``), on a terminal and in a pipe alike. :func:`visible_lines` keeps
  the newlines of a text the CLI composed itself.
- Rich markup (``[/bad]``, ``[link=...]``) is never interpreted: the render layer
  (``cli/render.py``) hands rich every cell as a ``Text``, never as markup, so brackets
  show as typed and no hyperlink is made.
- :func:`csv_cell`: a text cell that a spreadsheet would read as a formula (it starts
  with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return, OWASP's list, or their
  full-width forms) gets a leading ``'``. Numbers stay numbers: a ``Decimal``, an
  ``int`` or a ``float`` is written as the number it is, and so is a text that is only
  a decimal number (``-4.21``), so a negative amount in a money column reads as one.

JSON needs nothing from here: ``json.dump`` (``ensure_ascii``) writes every control and
non-ASCII character as ``\\uXXXX``.
"""

from __future__ import annotations

import re
from decimal import Decimal

#: C0, DEL and C1 controls; the Arabic letter mark, left-to-right and right-to-left
#: marks; line and paragraph separators and the bidi embeddings and overrides
#: (U+2028-U+202E); the bidi isolates (U+2066-U+2069); lone surrogates (unencodable).
#: (A newline apart: :func:`visible` escapes it after, so one pattern is compiled, not two.)
_UNSAFE_BUT_NEWLINE = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]"
)

#: What a spreadsheet reads as the start of a formula (OWASP "CSV Injection"), with the
#: full-width forms some spreadsheets fold to them.
_FORMULA_START = frozenset("=+-@\t\r\uff1d\uff0b\uff0d\uff20")
#: A text that is only a decimal number: a spreadsheet reads it as that number.
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _escaped(found: re.Match[str]) -> str:
    return ascii(found[0])[1:-1]


def visible(value: object) -> str:
    """``value`` as text with every control, separator and bidi character escaped.

    >>> visible("us-east-1\\x1b]0;owned\\x07")
    'us-east-1\\\\x1b]0;owned\\\\x07'
    >>> visible("done\\nsucceeded: fake line")
    'done\\\\nsucceeded: fake line'
    >>> visible("[link=https://evil.example]x[/link]")
    '[link=https://evil.example]x[/link]'
    """
    return _UNSAFE_BUT_NEWLINE.sub(_escaped, str(value)).replace("\n", "\\n")


def visible_lines(text: str) -> str:
    """``text`` escaped as :func:`visible` does, its newlines kept (the CLI's own lines).

    >>> visible_lines("line one\\nline \\x1b[2Jtwo")
    'line one\\nline \\\\x1b[2Jtwo'
    """
    return _UNSAFE_BUT_NEWLINE.sub(_escaped, text)


def csv_cell(value: object) -> object:
    """``value`` for a CSV cell: numbers as they are, text escaped (:func:`visible`) and
    a formula's first character neutralised with a leading ``'``.

    >>> csv_cell("=HYPERLINK(\\"http://evil.example\\")")
    '\\'=HYPERLINK("http://evil.example")'
    >>> csv_cell("-4.21"), csv_cell(Decimal("-4.21")), csv_cell("-1+cmd")
    ('-4.21', Decimal('-4.21'), "'-1+cmd")
    >>> csv_cell("\\t=1+1")
    '\\\\t=1+1'

    A list (an option's notes) is one cell, its items joined by ``; ``:

    >>> csv_cell(["spot price unverified", "no spot price"])
    'spot price unverified; no spot price'
    >>> csv_cell(["=1+1", "spot"])
    "'=1+1; spot"
    """
    if isinstance(value, Decimal | int | float) and not isinstance(value, bool):
        return value
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, list | tuple):
        value = "; ".join(str(item) for item in value)
    text = visible(value)
    start = text.lstrip(" ")[:1]
    if start in _FORMULA_START and not _NUMBER.fullmatch(text.strip()):
        return "'" + text
    return text
