"""Google Cloud: a Cloud Billing budget on a billing account (Billing Budgets API v1).

GCP emails budget alerts to the billing account's admins by default; other addresses go
through Cloud Monitoring email notification channels in ``--project`` (created here when
missing, at most 5 per budget).

Before a plan, two reads make the comparison honest: the billing account's currency (Cloud
Billing ``billingAccounts.get``: a budget can only be in it, so the amount is sent and shown
in it), and the ``--project``'s number (Resource Manager ``projects.get``: the Budgets API
answers the project filter as ``projects/<number>``, whatever it was sent, so comparing
against the id would update the budget on every run). Either read may be refused (it needs
``billing.accounts.get`` / ``resourcemanager.projects.get``, see infra/gcp/alarm-role.yaml);
the plan then goes on without it and says what it assumed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from costguard.alarms.backend import Scope
from costguard.alarms.plan import ApiCall, BudgetStatus, Plan
from costguard.alarms.plan_gcp import ObservedGcpBudget, plan_gcp
from costguard.alarms.spec import NAME_PREFIX, AlarmSpec, Basis, Notification
from costguard.clouds import gcp
from costguard.errors import CostguardError, InputError
from costguard.settings import Settings

BUDGETS = ("google.cloud.billing.budgets_v1", "BudgetServiceClient")


class GcpAlarms:
    """The GCP side of ``costguard alarm``.

    ``budgets_client`` / ``channels`` may be passed in (custom transports); otherwise they
    are built with :func:`costguard.clouds.gcp.client` and
    :class:`costguard.clouds.gcp.RestSession` (Monitoring's client has no REST transport).
    """

    @classmethod
    def for_scope(cls, settings: Settings, scope: Scope) -> GcpAlarms:
        """The budgets of ``scope.billing_account`` (required), for ``scope.project``."""
        hint = "gcloud billing accounts list shows yours"
        return cls(settings, scope.need("billing_account", "GCP budgets", hint), scope.project)

    def __init__(
        self,
        settings: Settings,
        billing_account: str,
        project: str | None = None,
        *,
        budgets_client: Any = None,
        channels: gcp.RestSession | None = None,
        billing: gcp.RestSession | None = None,
        projects: gcp.RestSession | None = None,
    ) -> None:
        self._settings = settings
        self.parent = f"billingAccounts/{billing_account.removeprefix('billingAccounts/')}"
        self.project = project
        self._budgets = budgets_client
        self._channels = channels
        self._billing = billing
        self._projects = projects

    @property
    def budgets_client(self) -> Any:
        if self._budgets is None:
            self._budgets = gcp.client(*BUDGETS, self._settings)
        return self._budgets

    @property
    def channels(self) -> gcp.RestSession:
        if self._channels is None:
            self._channels = gcp.RestSession("monitoring", self._settings)
        return self._channels

    def _read(self, service: str, path: str, action: str) -> dict[str, Any] | None:
        """One REST read of another Google API; None when it is refused (a missing
        permission is not a reason to stop the alarm: the plan says what it assumed)."""
        session = getattr(self, f"_{service}")
        if session is None:
            name = {"billing": "cloudbilling", "projects": "cloudresourcemanager"}[service]
            session = gcp.RestSession(name, self._settings)
            setattr(self, f"_{service}", session)
        try:
            answer: dict[str, Any] = session.request("GET", path, action)
        except CostguardError as exc:
            if "refused" not in exc.message:
                raise
            return None
        return answer

    def _currency(self) -> str | None:
        """The billing account's currency (``currencyCode``), or None if unreadable."""
        account = self._read("billing", f"v1/{self.parent}", "reading the billing account")
        return str(account.get("currencyCode") or "") or None if account else None

    def _project_filter(self, project: str | None) -> list[str] | None:
        """``projects/<number>`` for the filter, as the Budgets API answers it; None when
        there is no project, or its number cannot be read (the id is sent then)."""
        if not project:
            return None
        bare = project.removeprefix("projects/")
        if bare.isdigit():
            return [f"projects/{bare}"]
        found = self._read("projects", f"v3/projects/{bare}", f"reading project {bare}")
        name = str(found.get("name", "")) if found else ""
        return [name] if re.fullmatch(r"projects/\d+", name) else None

    def _call(
        self, client: Any, operation: str, action: str, *, paged: bool = False, **params: Any
    ) -> Any:
        """``client.OPERATION(**params)``; ``paged``: read every page here, where Google's
        errors are translated (a pager asks for its next pages as it is read)."""
        try:
            result = getattr(client, operation)(**params)
            return list(result) if paged else result
        except gcp.errors() as exc:
            raise gcp.translate(exc, action) from None

    # -- reading ---------------------------------------------------------------------

    def _ours(self) -> list[Any]:
        budgets = self._call(
            self.budgets_client, "list_budgets", "listing budgets", paged=True, parent=self.parent
        )
        return [b for b in budgets if b.display_name.startswith(NAME_PREFIX)]

    def _find(self, name: str) -> Any | None:
        return next((b for b in self._ours() if b.display_name == name), None)

    @staticmethod
    def _observed(raw: Any) -> ObservedGcpBudget:
        money = raw.amount.specified_amount
        amount = Decimal(money.units) + Decimal(money.nanos) / Decimal(10**9)
        notifications = frozenset(
            Notification(
                Basis.FORECASTED if rule.spend_basis.name == "FORECASTED_SPEND" else Basis.ACTUAL,
                (Decimal(str(rule.threshold_percent)) * 100).normalize(),
            )
            for rule in raw.threshold_rules
        )
        rule = raw.notifications_rule
        return ObservedGcpBudget(
            name=raw.name,
            amount_usd=amount.normalize(),
            notifications=notifications,
            projects=tuple(raw.budget_filter.projects),
            pubsub_topic=rule.pubsub_topic or None,
            channels=tuple(rule.monitoring_notification_channels),
            currency=money.currency_code,
        )

    def _channels_for(self, emails: Sequence[str], *, create: bool) -> list[str]:
        if not emails:
            return []
        if not self.project:
            msg = "GCP sends budget emails to other addresses through a project's channels"
            raise InputError(msg, hint="add --project PROJECT_ID (or leave out --email)")
        project = f"projects/{self.project.removeprefix('projects/')}"
        path = f"v3/{project}/notificationChannels"
        existing: dict[str, str] = {}
        params: dict[str, str] = {"filter": 'type="email"'}
        for _page in range(100):  # bounded paging
            page = self.channels.request(
                "GET", path, "listing notification channels", params=params
            )
            for channel in page.get("notificationChannels", []):
                existing[channel.get("labels", {}).get("email_address", "")] = channel["name"]
            if not page.get("nextPageToken"):
                break
            params["pageToken"] = page["nextPageToken"]
        names = []
        for email in emails:
            if email in existing:
                names.append(existing[email])
            elif create:
                channel = self.channels.request(
                    "POST",
                    path,
                    f"creating an email channel for {email}",
                    json={
                        "type": "email",
                        "displayName": f"costguard {email}",
                        "labels": {"email_address": email},
                    },
                )
                names.append(channel["name"])
            else:
                names.append(f"{project}/notificationChannels/<new: {email}>")
        return names

    # -- the AlarmBackend protocol ---------------------------------------------------

    def plan(self, spec: AlarmSpec) -> Plan:
        """Read the budget (creating missing email channels first) and diff it."""
        channels = self._channels_for(spec.emails, create=True)
        existing = self._find(spec.name)
        observed = self._observed(existing) if existing else None
        projects = self._project_filter(spec.project)
        notes: tuple[str, ...] = ()
        if spec.project and projects is None:
            notes = (
                f"The number of project {spec.project} could not be read: the budget filter "
                "is sent by id, and GCP answers it by number, so a rerun may update it again.",
            )
        currency = self._currency() if observed is None else observed.currency
        plan = plan_gcp(spec, observed, channels, currency=currency, projects=projects)
        return Plan(plan.calls, plan.notes + notes)

    def dry_run_plan(self, spec: AlarmSpec) -> Plan:
        """The calls of a first run, without making any."""
        reads = [
            ApiCall(
                "billing_budgets",
                "list_budgets",
                {"parent": self.parent},
                "find ours",
                read_only=True,
            ),
            ApiCall(
                "cloudbilling",
                "get_billing_account",
                {"name": self.parent},
                "the account's currency (the budget's)",
                read_only=True,
            ),
        ]
        if spec.project:
            reads.append(
                ApiCall(
                    "resourcemanager",
                    "get_project",
                    {"name": f"projects/{spec.project}"},
                    "the project's number (the budget filter's)",
                    read_only=True,
                )
            )
        if spec.emails:
            reads.append(
                ApiCall(
                    "monitoring",
                    "list_notification_channels",
                    {"name": f"projects/{spec.project}"},
                    "email channels",
                    read_only=True,
                )
            )
        writes = [
            ApiCall(
                "monitoring",
                "create_notification_channel",
                {
                    "name": f"projects/{spec.project}",
                    "notification_channel": {"type": "email", "labels": {"email_address": email}},
                },
                f"an email channel for {email} (if missing)",
            )
            for email in spec.emails
        ]
        placeholder = [
            f"projects/{spec.project}/notificationChannels/<new: {e}>" for e in spec.emails
        ]
        fresh = plan_gcp(spec, None, placeholder)
        return Plan(tuple(reads + writes) + fresh.calls, fresh.notes)

    def apply(self, spec: AlarmSpec, plan: Plan) -> list[ApiCall]:
        """Run the plan (create or update the budget)."""
        made = []
        for call in plan.changes:
            params = dict(call.params)
            if call.operation == "update_budget":
                params["update_mask"] = {
                    "paths": [
                        "display_name",
                        "budget_filter",
                        "amount",
                        "threshold_rules",
                        "notifications_rule",
                    ]
                }
            self._call(self.budgets_client, call.operation, f"{call} ({call.reason})", **params)
            made.append(call)
        return made

    def status(self) -> list[BudgetStatus]:
        """costguard's budgets on the billing account."""
        statuses = []
        for raw in self._ours():
            observed = self._observed(raw)
            statuses.append(
                BudgetStatus(
                    provider="gcp",
                    name=raw.display_name,
                    amount_usd=observed.amount_usd,
                    actual_usd=None,
                    forecast_usd=None,
                    alerts=tuple(str(n) for n in sorted(observed.notifications)),
                    extra=", ".join(observed.projects) or "whole billing account",
                )
            )
        return statuses

    def plan_delete(self, names: Sequence[str] | None = None) -> Plan:
        """Calls that delete costguard's budgets (all, or ``names``)."""
        return Plan(
            tuple(
                ApiCall("billing_budgets", "delete_budget", {"name": raw.name}, raw.display_name)
                for raw in self._ours()
                if names is None or raw.display_name in names
            )
        )

    def delete(self, plan: Plan) -> list[ApiCall]:
        """Run a plan from :meth:`plan_delete`."""
        for call in plan.changes:
            self._call(self.budgets_client, call.operation, str(call), **call.params)
        return list(plan.changes)

    def has_alarm(self) -> bool:
        """Whether any costguard budget exists on the billing account."""
        return bool(self._ours())
