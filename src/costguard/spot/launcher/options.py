"""The ``--option KEY=VALUE`` settings a launcher reads, declared as data, and the one
validator that checks them before any cloud call.

Each adapter lists its options as :class:`Option` values (name, what it is, an example,
whether it is required, its default, and the rule its value follows: a pattern, a set of
choices, a whole-number range, a list of items); :meth:`Options.check` applies every rule
in order and raises the first refusal as an :class:`~costguard.errors.InputError` with a
hint. Rules that tie two settings together (``--max-price`` against ``max_price``, a
subnet for each region) stay in the adapter's own ``check``.

>>> import re
>>> DISK = Option("disk_gb", "the boot disk's size in GB", example="200", default="100",
...               whole=(10, 65536))
>>> Options(DISK).check({"disk_gb": "200"}, "gcp")
{'disk_gb': '200'}
>>> Options(DISK).check({"disk_gb": "2"}, "gcp")
Traceback (most recent call last):
...
costguard.errors.InputError: the disk_gb option must be a whole number from 10 to 65536, not '2'
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from costguard.errors import InputError

#: What is stripped from around a value: spaces and tabs, never a line break.
BLANKS = " \t"


@dataclass(frozen=True)
class Option:
    """One option of a launcher: what it is, and the rule its value follows.

    ``help`` says what to give (the hint when a required option is missing); ``example``
    is a valid value (tests check every example against its own rule). ``invalid`` is the
    refusal of a bad value, a template with ``{name}`` and ``{value!r}``; ``hint`` its hint.
    A ``name`` ending in ``_*`` declares a family of keys (``subnet_*``: ``subnet_westus``...).
    """

    name: str
    help: str
    example: str = ""
    required: bool = False
    default: str = ""
    #: The whole value must match (``fullmatch``).
    pattern: re.Pattern[str] | None = None
    #: The value, folded to ``case``, must be one of these.
    choices: tuple[str, ...] = ()
    case: Literal["", "upper", "lower"] = ""
    #: A whole number within (low, high).
    whole: tuple[int, int] | None = None
    #: Comma-separated items, each following the rule.
    listed: bool = False
    #: Values refused whatever the pattern says (compared in lower case).
    refused: frozenset[str] = frozenset()
    invalid: str = "the {name} option is not valid: {value!r}"
    hint: str = ""

    @property
    def family(self) -> bool:
        """Whether this declares a family of keys (``name_*``)."""
        return self.name.endswith("_*")

    def keys(self, given: Mapping[str, str]) -> list[str]:
        """The keys of ``given`` this option governs."""
        if self.family:
            return sorted(k for k in given if k.startswith(self.name[:-1]))
        return [self.name]

    def folded(self, value: str) -> str:
        """``value`` without surrounding spaces or tabs, in the option's case. A line break
        is kept, so the rule refuses it (``tests/test_regex_anchors.py``): a value is used
        as it was checked, and one ending in a newline was never meant."""
        value = value.strip(BLANKS)
        return value.upper() if self.case == "upper" else value.lower() if self.case else value

    def refusal(self, key: str, value: str) -> InputError | None:
        """Why ``value`` (of key ``key``) breaks this option's rule, or ``None``."""
        if self.whole is not None:
            low, high = self.whole
            if not value.isdigit() or not low <= int(value) <= high:
                msg = f"the {key} option must be a whole number from {low} to {high}, not {value!r}"
                return InputError(msg, hint=f"e.g. {key}={self.default or self.example}")
            return None
        items = (
            [v.strip(BLANKS) for v in value.split(",") if v.strip(BLANKS)]
            if self.listed
            else [value]
        )
        for item in items:
            if (
                (self.pattern is not None and not self.pattern.fullmatch(item))
                or (self.choices and item not in self.choices)
                or item.lower() in self.refused
            ):
                return InputError(self.invalid.format(name=key, value=item), hint=self.hint)
        return None


class Options:
    """A launcher's declared options, checked in the order given."""

    def __init__(self, *declared: Option) -> None:
        self.declared = declared

    def __iter__(self) -> Iterator[Option]:
        return iter(self.declared)

    def __getitem__(self, name: str) -> Option:
        for option in self.declared:
            if option.name == name:
                return option
        raise KeyError(name)

    def value(self, given: Mapping[str, str], name: str, default: str = "") -> str:
        """Option ``name`` as given (stripped, folded), else ``default`` (the launcher's
        own), else the declared default."""
        option = self[name]
        return option.folded(given.get(name, "")) or default or option.default

    def check(
        self, given: Mapping[str, str], provider: str, defaults: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """Every declared option of ``given`` checked (``defaults``: the launcher's own
        values, e.g. the project it was built with); the values, defaults filled in. The
        first refusal is raised: a required option missing, or a value against its rule.
        An option neither given nor defaulted is left out."""
        defaults = defaults or {}
        values: dict[str, str] = {}
        for option in self.declared:
            for key in option.keys(given):
                value = option.folded(given.get(key, "")) or defaults.get(key, "")
                if not value and option.required:
                    msg = f"launching on {provider} needs the {key} option"
                    raise InputError(msg, hint=option.help)
                value = value or option.default
                if not value:
                    continue
                refusal = option.refusal(key, value)
                if refusal is not None:
                    raise refusal
                values[key] = value
        return values


def placement_option(strategy: str, where: str) -> Option:
    """The ``placement`` option of a launcher whose gangs (``--nodes``) may be placed close
    together: ``strategy`` (its only value) puts the nodes ``where``.

    >>> placement_option("cluster", "in one cluster placement group").refusal("placement", "spread")
    InputError("the placement option must be cluster, not 'spread'")
    """
    return Option(
        "placement",
        f"a gang's (--nodes) placement: {strategy} puts its nodes {where} "
        "(lower latency between them; capacity is scarcer)",
        example=strategy,
        choices=(strategy,),
        case="lower",
        invalid=f"the placement option must be {strategy}, not {{value!r}}",
        hint=f"placement={strategy}, or leave it out",
    )
