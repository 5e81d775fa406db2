"""Click parameter types that refuse bad input with a one-line reason, before any work.

Every option of every command that takes a number, a name or a URL uses one of these, so
NaN, infinity, ``1e400``, a trailing newline, a control character, a unicode look-alike
(a fullwidth ``5``, ``s3://`` in fullwidth letters) or a 100 KB value is refused at parse
time (exit 2) instead of reaching a controller loop, a batch-script header or a cloud call
(``tests/cli/test_hostile_input.py`` walks the whole command tree to prove it).

* :class:`WholeNumber`, :class:`FiniteFloat`, :class:`DecimalRange`: plain ASCII numbers
  in a range (``1_000`` is fine; ``nan``, ``inf``, ``" 5"``, ``"5\\n"``, a fullwidth digit are not).
* :class:`Name`: one word of printable ASCII (a GPU, region, project, SLURM partition...).
* :class:`Text`: free text (a command line, ``KEY=VALUE``) without control characters.
* :class:`Url`: a folder or ``scheme://bucket/path`` with an ASCII scheme and bucket.

:func:`option_group` and :func:`table_or_json` declare options several commands share
(the larger groups are in :mod:`costguard.cli.options`).

Refusals quote at most :data:`SHOWN_CHARS` characters of the value.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any, NoReturn, TypeVar

import click

from costguard.errors import InputError
from costguard.money import parse_decimal

#: The most characters of a refused value an error message quotes.
SHOWN_CHARS = 60
#: Longer than any number a flag needs; the limit keeps ``int()`` away from huge strings.
MAX_NUMBER_CHARS = 40
MAX_NAME_CHARS = 200
MAX_TEXT_CHARS = 4096
MAX_URL_CHARS = 2048

_DIGITS = r"[0-9](?:_?[0-9])*"
_INTEGER = re.compile(rf"[+-]?{_DIGITS}", re.ASCII)
_REAL = re.compile(
    rf"[+-]?(?:{_DIGITS}(?:\.(?:{_DIGITS})?)?|\.{_DIGITS})(?:[eE][+-]?{_DIGITS})?", re.ASCII
)
_NAME = re.compile(r"[!-~]+", re.ASCII)  # printable ASCII, no space
#: C0, DEL and C1 controls and the line and paragraph separators: a set, not a character
#: class (compiling one that reaches past Latin-1 costs every command a third of a ms).
_CONTROL = frozenset(map(chr, (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029)))
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*", re.ASCII)
_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(:[0-9]{1,5})?", re.ASCII)
#: Schemes whose URLs name no bucket (``file:///abs/path``).
_HOSTLESS = frozenset({"file", "local"})
#: What an unquoted ``$200``, ``$1000`` or ``$2.50`` becomes in a shell.
_SHELL_ATE_DOLLAR = re.compile(r"|0[0-9]+(\.[0-9]*)?|\.[0-9]+", re.ASCII)


def shown(value: object) -> str:
    """``value`` quoted for an error message, credentials masked, cut to :data:`SHOWN_CHARS`
    characters.

    >>> shown("a10g"), shown("x" * 500)
    ("'a10g'", "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...' (500 characters)")
    """
    from costguard.secrets import redact  # a refusal only: not every run

    text = redact(str(value))  # before the cut, which could leave half a token unrecognised
    if len(text) <= SHOWN_CHARS:
        return repr(text)
    return f"{text[:SHOWN_CHARS]!r}"[:-1] + f"...' ({len(text)} characters)"


class _Strict(click.ParamType):
    """Shared refusal helper: the message names the value shortly, never whole."""

    def refuse(
        self, why: str, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> NoReturn:
        self.fail(f"{shown(value)} {why}", param, ctx)


class _Bounded(_Strict):
    """Text that must be there and not longer than ``max_chars``; subclasses add the rest."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars

    def bounded(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if not text:
            self.refuse("is empty", value, param, ctx)
        if len(text) > self.max_chars:
            self.refuse(f"is longer than {self.max_chars} characters", value, param, ctx)
        return text


def _number_text(
    kind: _Strict,
    value: Any,
    pattern: re.Pattern[str],
    what: str,
    param: click.Parameter | None,
    ctx: click.Context | None,
) -> str:
    text = str(value)
    if len(text) > MAX_NUMBER_CHARS or not pattern.fullmatch(text):
        kind.refuse(f"is not {what}", value, param, ctx)
    return text


class WholeNumber(click.IntRange, _Strict):
    """A whole number in ``min..max`` written in ASCII digits.

    >>> WholeNumber(1, 10).convert("7", None, None)
    7
    """

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            _number_text(self, value, _INTEGER, "a whole number", param, ctx)
        return super().convert(value, param, ctx)


class FiniteFloat(click.FloatRange, _Strict):
    """A finite number in a range (seconds, minutes, hours); NaN and infinities are refused,
    and so is ``1e400``, which a float holds as infinity.

    >>> FiniteFloat(0, min_open=True).convert("0.5", None, None)
    0.5
    """

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            text = _number_text(self, value, _REAL, "a finite number", param, ctx)
            if float(text) in (float("inf"), float("-inf")):
                self.refuse("is too large", value, param, ctx)
        return super().convert(value, param, ctx)


class DecimalRange(_Strict):
    """A finite decimal number within bounds; NaN, infinity and text are refused.

    ``minimum_open`` makes the lower bound exclusive (hours must be more than 0); ``unit``
    names what the bounds count, in the error.
    """

    name = "number"

    def __init__(
        self,
        minimum: Decimal | int = 0,
        *,
        minimum_open: bool = False,
        maximum: Decimal | int | None = None,
        unit: str = "",
    ) -> None:
        self.unit = f" {unit}" if unit else ""
        self.minimum = Decimal(minimum)
        self.minimum_open = minimum_open
        self.maximum = None if maximum is None else Decimal(maximum)

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> Decimal:
        if isinstance(value, Decimal):
            number = value
        else:
            if isinstance(value, str):
                _number_text(self, value, _REAL, "a finite number", param, ctx)
            try:
                number = parse_decimal(value)
            except ValueError:
                self.refuse("is not a finite number", value, param, ctx)
        if self.minimum_open and number <= self.minimum:
            self.fail(f"must be more than {self.minimum}, not {shown(value)}", param, ctx)
        if not self.minimum_open and number < self.minimum:
            self.fail(f"must be at least {self.minimum}, not {shown(value)}", param, ctx)
        if self.maximum is not None and number > self.maximum:
            self.fail(f"must be at most {self.maximum}{self.unit}, not {shown(value)}", param, ctx)
        return number


class DecimalOrWord(_Strict):
    """A :class:`DecimalRange` number, or one word (``--interruptions-per-day advisor``).

    >>> DecimalOrWord("advisor", maximum=48).convert("Advisor", None, None)
    'advisor'
    >>> DecimalOrWord("advisor", maximum=48).convert("2", None, None)
    Decimal('2')
    """

    name = "number"

    def __init__(self, word: str, minimum: int = 0, *, maximum: int | None = None) -> None:
        self.word = word
        self.number = DecimalRange(minimum, maximum=maximum)

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> Decimal | str:
        if isinstance(value, str):
            if value.lower() == self.word:
                return self.word
            if len(value) > MAX_NUMBER_CHARS or not _REAL.fullmatch(value):
                self.refuse(f"is neither a number nor the word {self.word}", value, param, ctx)
        return self.number.convert(value, param, ctx)


class Usd(DecimalRange):
    """An amount in USD: a :class:`DecimalRange` that also takes a leading ``$`` (quoted,
    ``'$200'``), and says what the shell did to an unquoted one: ``$200`` arrives as
    ``00`` (``$2`` is an empty variable), ``$2.50`` as ``.50``.

    >>> Usd(0, minimum_open=True).convert("$200", None, None)
    Decimal('200')
    >>> Usd(0, minimum_open=True).convert("00", None, None)
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: --budget '00' is not an amount in USD
    """

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> Decimal:
        if isinstance(value, str) and value.startswith("$"):
            value = value[1:]
        elif isinstance(value, str) and _SHELL_ATE_DOLLAR.fullmatch(value):
            flag = _flag(param, "--budget")
            msg = f"{flag} {shown(value)} is not an amount in USD"
            raise InputError(
                msg,
                hint=f"in a shell, $ starts a variable ($200 arrives as 00): write {flag} 200, "
                f"or quote it: {flag} '$200'",
            )
        return super().convert(value, param, ctx)


class Name(_Bounded):
    """One word of printable ASCII: a GPU, region, zone, project, account, SLURM name...

    Look-alikes (``a100`` in fullwidth letters), spaces, control characters and trailing
    newlines are refused here; the command then checks the word against its own list or
    syntax.

    >>> Name().convert("us-east-1", None, None)
    'us-east-1'
    """

    name = "name"

    def __init__(self, max_chars: int = MAX_NAME_CHARS) -> None:
        super().__init__(max_chars)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = self.bounded(value, param, ctx)
        if not _NAME.fullmatch(text):
            self.refuse(
                "is not one word of plain ASCII (letters, digits, punctuation)", value, param, ctx
            )
        return text


class AzureSubscription(_Strict):
    """An Azure subscription id: the GUID ``az account show --query id`` prints, checked
    before any call (a typo would otherwise be the first API call's error).

    >>> AzureSubscription().convert("00000000-0000-0000-0000-000000000000", None, None)
    '00000000-0000-0000-0000-000000000000'
    """

    name = "guid"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = str(value).strip()
        if len(text) > MAX_NAME_CHARS or not _GUID.fullmatch(text):
            self.refuse(
                "is not an Azure subscription id (the GUID `az account show --query id` prints)",
                value,
                param,
                ctx,
            )
        return text


_GUID = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")


class Text(_Bounded):
    """Free text on one line: a command line, ``KEY=VALUE``, a list. No control characters.

    >>> Text().convert("pixi run costguard", None, None)
    'pixi run costguard'
    """

    name = "text"

    def __init__(self, max_chars: int = MAX_TEXT_CHARS) -> None:
        super().__init__(max_chars)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = self.bounded(value, param, ctx)
        if not _CONTROL.isdisjoint(text):
            self.refuse("contains a control character (a newline?)", value, param, ctx)
        return text


class Url(_Strict):
    """A local folder, or ``scheme://bucket/path`` with an ASCII scheme and bucket name.

    ``s3://`` (no bucket), a scheme or bucket in fullwidth letters and control characters
    are refused before any store is opened.

    >>> Url().convert("s3://my-bucket/run1", None, None)
    's3://my-bucket/run1'
    >>> Url().convert("checkpoints/", None, None)
    'checkpoints/'
    """

    name = "url"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = str(value)
        if not text.strip():
            self.refuse("is empty", value, param, ctx)
        if len(text) > MAX_URL_CHARS:
            self.refuse(f"is longer than {MAX_URL_CHARS} characters", value, param, ctx)
        if not _CONTROL.isdisjoint(text) or text != text.strip():
            self.refuse("contains a control character or surrounding space", value, param, ctx)
        scheme, sep, rest = text.partition("://")
        if sep:
            if not _SCHEME.fullmatch(scheme):
                self.refuse("does not start with a plain scheme like s3://", value, param, ctx)
            host = rest.split("/", 1)[0].rpartition("@")[2].split("?", 1)[0]
            if scheme not in _HOSTLESS and not _BUCKET.fullmatch(host):
                self.refuse(
                    "has no bucket (or one with characters no bucket name has)", value, param, ctx
                )
        return text


class StoreUrl(Url):
    """A checkpoint store: a local folder, or a URL of a store fsspec serves here.

    What looks like a store URL and is not one (``s3:/b``, ``S3://b``, an ``https://``
    address of a bucket) is refused with the URL it probably meant (exit 2): as a local
    folder it would lose a spot instance's checkpoints with its disk.

    >>> StoreUrl().convert("s3:b", None, None)
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: URL: 's3:b' looks like a store URL but is not one
    """

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from costguard.checkpoint.backends import check_url

        try:
            check_url(str(value))
        except InputError as exc:
            msg = f"{_flag(param, 'URL')}: {exc.message}"
            raise InputError(msg, hint=exc.hint) from None
        return super().convert(value, param, ctx)


def _flag(param: click.Parameter | None, default: str) -> str:
    """How an error names the parameter: its flag, or an argument's metavar."""
    if isinstance(param, click.Option) and param.opts:
        return param.opts[0]
    return param.human_readable_name if param is not None else default


F = TypeVar("F", bound=Callable[..., Any])


def option_group(*options: Callable[[Any], Any]) -> Callable[[F], F]:
    """Several click options (or arguments) as one decorator; ``--help`` lists them in the
    order given."""

    def decorate(command: F) -> F:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def table_or_json(
    help_text: str | None = None, *, case_sensitive: bool = True, csv: bool = False
) -> Any:
    """The ``--format table|json`` option (``|csv`` with ``csv``; ``output_format``, table
    by default) of the commands that print a report."""
    return click.option(
        "--format",
        "output_format",
        type=click.Choice(
            ["table", "json", *(["csv"] if csv else [])], case_sensitive=case_sensitive
        ),
        default="table",
        show_default=True,
        help=help_text,
    )
