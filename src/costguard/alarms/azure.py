"""Azure: a consumption budget at subscription or resource-group scope.

``budgets.create_or_update`` is an upsert, so a change is one call. Azure emails only the
contact emails given (and sends them 8-20 hours after the fact: see ``costguard burn``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from costguard.alarms.backend import Scope
from costguard.alarms.plan import ApiCall, BudgetStatus, Plan
from costguard.alarms.plan_azure import ObservedAzureBudget, azure_scope, plan_azure
from costguard.alarms.spec import NAME_PREFIX, AlarmSpec, Basis, Notification
from costguard.clouds import azure
from costguard.settings import Settings

CONSUMPTION = ("azure.mgmt.consumption", "ConsumptionManagementClient")


def month_start(today: date) -> str:
    """The first day of ``today``'s month as Azure wants a budget's start date.

    >>> month_start(date(2026, 12, 17))
    '2026-12-01T00:00:00Z'
    """
    return f"{today:%Y-%m}-01T00:00:00Z"


def _iso(moment: datetime | None) -> str | None:
    """A budget date as the API takes it back (``2026-11-01T00:00:00Z``).

    >>> _iso(datetime(2026, 11, 1, tzinfo=UTC))
    '2026-11-01T00:00:00Z'
    """
    if moment is None:
        return None
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _value(item: Any) -> str:
    """An SDK enum's wire value (``TimeGrainType.MONTHLY`` -> ``"Monthly"``), or the text."""
    return str(getattr(item, "value", item))


class AzureAlarms:
    """The Azure side of ``costguard alarm``; ``client`` may be passed in (tests)."""

    @classmethod
    def for_scope(cls, settings: Settings, scope: Scope) -> AzureAlarms:
        """The budgets of ``scope.subscription`` (required), or of its resource group."""
        hint = "az account show --query id shows yours"
        subscription = scope.need("subscription", "Azure budgets", hint)
        return cls(settings, subscription, scope.resource_group)

    def __init__(
        self,
        settings: Settings,
        subscription: str,
        resource_group: str | None = None,
        *,
        client: Any = None,
        today: Callable[[], date] = lambda: datetime.now(UTC).date(),
    ) -> None:
        self._settings = settings
        self.subscription = subscription
        self.resource_group = resource_group
        self._client = client
        self._today = today

    @property
    def scope(self) -> str:
        """The budgets' scope."""
        scope = f"/subscriptions/{self.subscription}"
        return scope + (f"/resourceGroups/{self.resource_group}" if self.resource_group else "")

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = azure.client(*CONSUMPTION, self.subscription, self._settings)
        return self._client

    def _call(self, operation: str, action: str, *, paged: bool = False, **params: Any) -> Any:
        """``budgets.OPERATION(**params)``; ``paged``: read every page here, where Azure's
        errors (a missing credential among them) are translated: a pager asks as it is read."""
        try:
            result = getattr(self.client.budgets, operation)(**params)
            return list(result) if paged else result
        except azure.errors() as exc:
            raise azure.translate(exc, action) from None

    def _ours(self) -> list[Any]:
        return [
            b
            for b in self._call("list", "listing budgets", paged=True, scope=self.scope)
            if b.name.startswith(NAME_PREFIX)
        ]

    @staticmethod
    def _observed(raw: Any) -> ObservedAzureBudget:
        notifications = set()
        emails: set[str] = set()
        for item in (raw.notifications or {}).values():
            forecast = _value(item.threshold_type) == "Forecasted"
            basis = Basis.FORECASTED if forecast else Basis.ACTUAL
            notifications.add(Notification(basis, Decimal(str(item.threshold)).normalize()))
            emails.update(item.contact_emails or ())
        period = raw.time_period
        return ObservedAzureBudget(
            amount_usd=Decimal(str(raw.amount)).normalize(),
            time_grain=_value(raw.time_grain),
            notifications=frozenset(notifications),
            emails=frozenset(emails),
            start_date=_iso(period.start_date) if period is not None else None,
            end_date=_iso(period.end_date) if period is not None else None,
        )

    def plan(self, spec: AlarmSpec) -> Plan:
        """Read the budget and diff it (an upsert when anything differs)."""
        existing = next((b for b in self._ours() if b.name == spec.name), None)
        observed = self._observed(existing) if existing is not None else None
        return plan_azure(spec, observed, month_start(self._today()))

    def dry_run_plan(self, spec: AlarmSpec) -> Plan:
        """The calls of a first run, without making any."""
        fresh = plan_azure(spec, None, month_start(self._today()))
        read = ApiCall(
            "consumption", "budgets.list", {"scope": azure_scope(spec)}, "find ours", read_only=True
        )
        return Plan((read, *fresh.calls), fresh.notes)

    def apply(self, spec: AlarmSpec, plan: Plan) -> list[ApiCall]:
        """Run the upsert (the plan holds the REST body, which the client sends as is)."""
        made = []
        for call in plan.changes:
            self._call("create_or_update", f"{call} ({call.reason})", **call.params)
            made.append(call)
        return made

    def status(self) -> list[BudgetStatus]:
        """costguard's budgets at the scope, with current spend as Azure reports it."""
        statuses = []
        for raw in self._ours():
            observed = self._observed(raw)
            spend = getattr(raw, "current_spend", None)
            forecast = getattr(raw, "forecast_spend", None)
            statuses.append(
                BudgetStatus(
                    provider="azure",
                    name=raw.name,
                    amount_usd=observed.amount_usd,
                    actual_usd=Decimal(str(spend.amount))
                    if spend and spend.amount is not None
                    else None,
                    forecast_usd=Decimal(str(forecast.amount))
                    if forecast and forecast.amount is not None
                    else None,
                    alerts=tuple(str(n) for n in sorted(observed.notifications)),
                    extra=", ".join(sorted(observed.emails)),
                )
            )
        return statuses

    def plan_delete(self, names: Sequence[str] | None = None) -> Plan:
        """Calls that delete costguard's budgets (all, or ``names``)."""
        return Plan(
            tuple(
                ApiCall(
                    "consumption",
                    "budgets.delete",
                    {"scope": self.scope, "budget_name": b.name},
                    "costguard budget",
                )
                for b in self._ours()
                if names is None or b.name in names
            )
        )

    def delete(self, plan: Plan) -> list[ApiCall]:
        """Run a plan from :meth:`plan_delete`."""
        for call in plan.changes:
            self._call("delete", str(call), **call.params)
        return list(plan.changes)

    def has_alarm(self) -> bool:
        """Whether any costguard budget exists at the scope."""
        return bool(self._ours())
