"""The GCP budget alarm plan: a Cloud Billing budget with its thresholds. Pure.

:func:`plan_gcp` diffs an :class:`~costguard.alarms.spec.AlarmSpec` against the budget
:mod:`costguard.alarms.gcp` read (:class:`ObservedGcpBudget`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from costguard.alarms.plan import ApiCall, Plan
from costguard.alarms.spec import AlarmSpec, Basis, Notification


@dataclass(frozen=True)
class ObservedGcpBudget:
    """One costguard budget on the billing account (``name`` is its resource name)."""

    name: str
    amount_usd: Decimal
    notifications: frozenset[Notification]
    projects: tuple[str, ...] = ()
    pubsub_topic: str | None = None
    channels: tuple[str, ...] = ()
    #: The budget's currency, as the API answers it (the billing account's).
    currency: str = ""


def gcp_budget_body(
    spec: AlarmSpec,
    channels: Sequence[str],
    currency: str | None = None,
    projects: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The Budget resource in the shape of the Billing Budgets API (v1).

    ``currency``: ``specified_amount.currency_code``, left out when None. The proto: "If
    specified when creating a budget, it must match the currency of the billing account.
    If specified when updating a budget, it must match the currency_code of the existing
    budget." So it is never a constant: the caller passes the account's (or the existing
    budget's), or None to let the API use the account's. ``projects``: the filter's
    ``projects/<number>`` entries (the API answers with numbers, whatever it was sent);
    by default ``projects/<spec.project>``.
    """
    units, cents = divmod(spec.budget_usd, 1)
    money: dict[str, Any] = {"units": int(units), "nanos": int(cents * 10**9)}
    if currency:
        money = {"currency_code": currency, **money}
    body: dict[str, Any] = {
        "display_name": spec.name,
        "budget_filter": {"calendar_period": "MONTH"},
        "amount": {"specified_amount": money},
        "threshold_rules": [
            {
                "threshold_percent": float(n.threshold_percent / 100),
                "spend_basis": "CURRENT_SPEND" if n.basis is Basis.ACTUAL else "FORECASTED_SPEND",
            }
            for n in spec.notifications
        ],
    }
    if projects is None and spec.project:
        projects = [_gcp_project(spec.project)]
    if projects:
        body["budget_filter"]["projects"] = list(projects)
    rule: dict[str, Any] = {}
    if spec.pubsub_topic:
        rule["pubsub_topic"] = spec.pubsub_topic
        rule["schema_version"] = "1.0"
    if channels:
        rule["monitoring_notification_channels"] = list(channels)
    if rule:
        body["notifications_rule"] = rule
    return body


def _gcp_project(project: str) -> str:
    return project if project.startswith("projects/") else f"projects/{project}"


def plan_gcp(
    spec: AlarmSpec,
    existing: ObservedGcpBudget | None,
    channels: Sequence[str],
    *,
    currency: str | None = None,
    projects: Sequence[str] | None = None,
) -> Plan:
    """Create the budget, update it in place, or do nothing.

    ``channels`` are the Monitoring email channels for ``spec.emails`` (created by the
    adapter first when missing). ``currency``: the billing account's, when it could be
    read (a GCP budget is always in it). ``projects``: the filter as the API spells it
    (``projects/<number>``), when the project's number could be read.
    """
    parent = f"billingAccounts/{spec.billing_account}"
    if existing is None:
        body = gcp_budget_body(spec, channels, currency, projects)
        return Plan(
            (
                ApiCall(
                    "billing_budgets",
                    "create_budget",
                    {"parent": parent, "budget": body},
                    f"monthly budget of {_money(spec.budget_usd, currency)}",
                ),
            ),
            _currency_notes(currency),
        )
    # An update keeps the existing budget's currency (the API refuses any other).
    body = gcp_budget_body(spec, channels, existing.currency or None, projects)
    same = (
        existing.amount_usd == spec.budget_usd
        and existing.notifications == frozenset(spec.notifications)
        and existing.projects == tuple(body["budget_filter"].get("projects", ()))
        and existing.pubsub_topic == spec.pubsub_topic
        and sorted(existing.channels) == sorted(channels)
    )
    notes = _currency_notes(existing.currency or None)
    if same:
        return Plan((), notes)
    body["name"] = existing.name
    return Plan(
        (
            ApiCall(
                "billing_budgets", "update_budget", {"budget": body}, f"update {spec.name} in place"
            ),
        ),
        notes,
    )


def _money(amount: Decimal, currency: str | None) -> str:
    """``$200`` for USD, ``200 EUR`` otherwise, ``200 (account currency)`` when unknown."""
    if currency == "USD":
        return f"${amount:f}"
    return f"{amount:f} {currency}" if currency else f"{amount:f} (the account's currency)"


def _currency_notes(currency: str | None) -> tuple[str, ...]:
    """What the user must know when the budget is not in US dollars (or may not be)."""
    if currency == "USD":
        return ()
    if currency:
        return (
            f"The billing account bills in {currency}: a GCP budget can only be in that "
            f"currency, so the amount is {currency}, not USD.",
        )
    return (
        "The billing account's currency could not be read: the budget's amount is in that "
        "currency (GCP allows no other), which may not be USD.",
    )
