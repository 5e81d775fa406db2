"""The Azure budget alarm plan: a Consumption budget with its notifications. Pure.

:func:`plan_azure` diffs an :class:`~costguard.alarms.spec.AlarmSpec` against the budget
:mod:`costguard.alarms.azure` read (:class:`ObservedAzureBudget`).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from costguard.alarms.plan import ApiCall, Plan
from costguard.alarms.spec import AlarmSpec, Basis, Notification


@dataclass(frozen=True)
class ObservedAzureBudget:
    """One costguard budget at the scope."""

    amount_usd: Decimal
    time_grain: str
    notifications: frozenset[Notification]
    emails: frozenset[str]
    #: ``timePeriod`` as created (ISO dates); the start date can never change.
    start_date: str | None = None
    end_date: str | None = None


def azure_scope(spec: AlarmSpec) -> str:
    """Subscription or resource-group scope of the budget."""
    scope = f"/subscriptions/{spec.subscription}"
    if spec.resource_group:
        scope += f"/resourceGroups/{spec.resource_group}"
    return scope


def azure_notifications(spec: AlarmSpec) -> dict[str, dict[str, Any]]:
    """Azure's notification map: one entry per threshold, keyed by a stable name."""
    return {
        f"{n.basis.lower()}_{n.threshold_percent.normalize():f}".replace(".", "_"): {
            "enabled": True,
            "operator": "GreaterThan",
            "threshold": float(n.threshold_percent),
            "contactEmails": list(spec.emails),
            "thresholdType": "Actual" if n.basis is Basis.ACTUAL else "Forecasted",
        }
        for n in spec.notifications
    }


def plan_azure(spec: AlarmSpec, existing: ObservedAzureBudget | None, start_date: str) -> Plan:
    """``create_or_update`` is an upsert: one call when anything differs, none otherwise.

    ``start_date`` is the first day of the current month (Azure requires it), ISO format,
    for a new budget. An existing budget keeps its own time period: Azure refuses to change
    a budget's start date ("Start date of budgets cannot be updated. Please delete and
    create a new budget."), so an update sent in a later month must carry the old one.
    """
    same = existing is not None and (
        existing.amount_usd == spec.budget_usd
        and existing.time_grain == "Monthly"
        and existing.notifications == frozenset(spec.notifications)
        and existing.emails == frozenset(spec.emails)
    )
    if same:
        return Plan(())
    period = {"startDate": start_date}
    if existing is not None and existing.start_date:
        period = {"startDate": existing.start_date}
        if existing.end_date:
            period["endDate"] = existing.end_date
    body = {  # the REST shape of Microsoft.Consumption/budgets
        "properties": {
            "category": "Cost",
            "amount": float(spec.budget_usd),
            "timeGrain": "Monthly",
            "timePeriod": period,
            "notifications": azure_notifications(spec),
        }
    }
    return Plan(
        (
            ApiCall(
                "consumption",
                "budgets.create_or_update",
                {"scope": azure_scope(spec), "budget_name": spec.name, "parameters": body},
                "create" if existing is None else "update in place",
            ),
        ),
    )
