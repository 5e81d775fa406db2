"""Budget alarms as values: the calls to make, and what exists. Pure.

Each provider adapter reads what exists into an ``Observed*`` value and its plan function
(:func:`costguard.alarms.plan_aws.plan_aws`, :func:`~costguard.alarms.plan_gcp.plan_gcp`,
:func:`~costguard.alarms.plan_azure.plan_azure`) returns the exact API calls that bring it
to the :class:`~costguard.alarms.spec.AlarmSpec`, as :class:`ApiCall` values in a
:class:`Plan`: the same list is printed by ``--dry-run`` and executed otherwise, so what
is shown is what is done.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any


@dataclass(frozen=True)
class BudgetStatus:
    """One costguard budget as it stands, on any provider."""

    provider: str
    name: str
    amount_usd: Decimal
    actual_usd: Decimal | None
    forecast_usd: Decimal | None
    alerts: tuple[str, ...]
    extra: str = ""


@dataclass(frozen=True)
class ApiCall:
    """One cloud API call: printed by ``--dry-run``, executed otherwise."""

    service: str
    operation: str
    params: Mapping[str, Any] = field(default_factory=dict)
    #: Why the call is made, for people.
    reason: str = ""
    #: Calls that cannot change anything (reads) are marked so they can be told apart.
    read_only: bool = False

    def __str__(self) -> str:
        return f"{self.service}.{self.operation}"


@dataclass(frozen=True)
class Plan:
    """The calls that bring a provider to the spec, and what the user should know."""

    calls: tuple[ApiCall, ...]
    notes: tuple[str, ...] = ()

    @property
    def changes(self) -> tuple[ApiCall, ...]:
        """The calls that change something."""
        return tuple(c for c in self.calls if not c.read_only)
