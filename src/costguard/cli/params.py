"""Click parameter types that reject bad numbers with a one-line reason."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import click

from costguard.money import parse_decimal


class DecimalRange(click.ParamType):
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
            try:
                number = parse_decimal(value)
            except ValueError:
                self.fail(f"{value!r} is not a finite number", param, ctx)
        if self.minimum_open and number <= self.minimum:
            self.fail(f"must be more than {self.minimum}, not {value}", param, ctx)
        if not self.minimum_open and number < self.minimum:
            self.fail(f"must be at least {self.minimum}, not {value}", param, ctx)
        if self.maximum is not None and number > self.maximum:
            self.fail(f"must be at most {self.maximum}{self.unit}, not {value}", param, ctx)
        return number


FORMAT = click.Choice(["table", "json", "csv"], case_sensitive=False)
