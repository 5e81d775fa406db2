"""AWS Budgets + SNS + CloudWatch billing alarm: read what exists, run a plan.

Budgets, the SNS topic and the billing alarm all live in us-east-1 (AWS/Billing metrics
exist only there). Endpoints that lack an operation (moto has no ``update_budget`` or
subscriber calls) get an equivalent sequence: delete + recreate.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from typing import Any

from costguard.alarms.backend import Scope
from costguard.alarms.plan import ApiCall, BudgetStatus, Plan
from costguard.alarms.plan_aws import (
    AWS_BILLING_REGION,
    HARD_STOP_POLICY,
    ObservedAws,
    ObservedAwsBudget,
    aws_alarm_name,
    aws_create_budget,
    aws_notification_key,
    aws_subscribers,
    aws_topic_arn,
    plan_aws,
)
from costguard.alarms.spec import NAME_PREFIX, AlarmSpec, Notification
from costguard.clouds import aws
from costguard.errors import CostguardError
from costguard.settings import Settings

ClientFactory = Callable[[str, str], Any]


def _default_clients(service: str, region: str) -> Any:
    return aws.client(service, region)


class AwsAlarms:
    """The AWS side of ``costguard alarm``. Clients come from ``clients(service, region)``."""

    @classmethod
    def for_scope(cls, settings: Settings, scope: Scope) -> AwsAlarms:
        """The budgets of the credentials' account (AWS takes no scope)."""
        return cls()

    def __init__(self, clients: ClientFactory = _default_clients) -> None:
        self._clients = clients
        self._cache: dict[str, Any] = {}
        self._identity: tuple[str, str] | None = None

    def _client(self, service: str) -> Any:
        if service not in self._cache:
            self._cache[service] = self._clients(service, AWS_BILLING_REGION)
        return self._cache[service]

    def _call(self, service: str, operation: str, action: str, **params: Any) -> Any:
        try:
            return getattr(self._client(service), operation)(**params)
        except aws.errors() as exc:
            raise aws.translate(exc, action) from None

    # -- reading ---------------------------------------------------------------------

    def account(self) -> tuple[str, str]:
        """(account id, partition) of the credentials in use (asked once)."""
        if self._identity is None:
            identity = self._call("sts", "get_caller_identity", "checking the AWS account")
            self._identity = (str(identity["Account"]), str(identity["Arn"]).split(":")[1])
        return self._identity

    def observe(self, spec: AlarmSpec) -> ObservedAws:
        """Everything ``plan_aws`` needs to know about the account."""
        account, partition = self.account()
        topic_arn = aws_topic_arn(account, partition)
        topic_exists, policy_ok = self._topic(topic_arn, account)
        alarm_threshold, alarm_actions = self._alarm(aws_alarm_name(spec.name))
        metrics = self._call(
            "cloudwatch",
            "list_metrics",
            "checking for AWS/Billing metrics",
            Namespace="AWS/Billing",
            MetricName="EstimatedCharges",
        )
        budget = self._budget(account, spec.name)
        hard_stop = spec.hard_stop_role_arn is not None
        policy_arn = f"arn:{partition}:iam::{account}:policy/{HARD_STOP_POLICY}"
        return ObservedAws(
            account_id=account,
            partition=partition,
            budget=budget,
            hard_stop_policy_exists=hard_stop and self._policy_exists(policy_arn),
            budget_actions=self._budget_actions(account, spec.name)
            if hard_stop and budget is not None
            else (),
            topic_exists=topic_exists,
            topic_policy_allows_budgets=policy_ok,
            topic_email_subscriptions=self._email_subscriptions(topic_arn)
            if topic_exists
            else frozenset(),
            alarm_threshold_usd=alarm_threshold,
            alarm_actions=alarm_actions,
            billing_metrics_enabled=bool(metrics.get("Metrics")),
        )

    def _budget(self, account: str, name: str) -> ObservedAwsBudget | None:
        budgets = self._client("budgets")
        try:
            raw = budgets.describe_budget(AccountId=account, BudgetName=name)["Budget"]
        except budgets.exceptions.NotFoundException:
            return None
        except aws.errors() as exc:
            raise aws.translate(exc, f"reading budget {name}") from None
        notifications = self._notifications(account, name)
        return ObservedAwsBudget(
            amount_usd=Decimal(raw["BudgetLimit"]["Amount"]),
            time_unit=raw.get("TimeUnit", "MONTHLY"),
            notifications=frozenset(notifications),
            subscribers=self._subscribers(account, name, notifications),
        )

    def _notifications(self, account: str, name: str) -> dict[Notification, dict[str, Any]]:
        found: dict[Notification, dict[str, Any]] = {}
        params: dict[str, Any] = {"AccountId": account, "BudgetName": name, "MaxResults": 100}
        for _page in range(100):  # bounded: a budget has at most 10 notifications
            page = self._call(
                "budgets",
                "describe_notifications_for_budget",
                f"reading the alerts of {name}",
                **params,
            )
            for raw in page.get("Notifications", []):
                key = aws_notification_key(raw)
                if key is not None:
                    found[key] = raw
            if not page.get("NextToken"):
                break
            params["NextToken"] = page["NextToken"]
        return found

    def _policy_exists(self, arn: str) -> bool:
        iam = self._client("iam")
        try:
            iam.get_policy(PolicyArn=arn)
        except iam.exceptions.NoSuchEntityException:
            return False
        except aws.errors() as exc:
            raise aws.translate(exc, "reading the hard-stop policy") from None
        return True

    def _budget_actions(self, account: str, name: str) -> tuple[dict[str, Any], ...] | None:
        budgets = self._client("budgets")
        try:  # every page: the API answers a NextToken past MaxResults (at most 100)
            actions = aws.paginate(
                budgets, "describe_budget_actions_for_budget", "Actions",
                AccountId=account, BudgetName=name,
            )  # fmt: skip
            return tuple(actions)
        except aws.errors() as exc:
            if aws.is_unsupported(exc):
                return None
            raise aws.translate(exc, f"reading the actions of {name}") from None

    def _subscribers(
        self, account: str, name: str, notifications: dict[Notification, dict[str, Any]]
    ) -> dict[Notification, frozenset[tuple[str, str]]] | None:
        subscribers = {}
        budgets = self._client("budgets")
        for key, raw in notifications.items():
            try:
                page = budgets.describe_subscribers_for_notification(
                    AccountId=account, BudgetName=name, Notification=raw, MaxResults=100
                )
            except aws.errors() as exc:
                if aws.is_unsupported(exc):
                    return None
                raise aws.translate(exc, f"reading the subscribers of {name}") from None
            subscribers[key] = frozenset(
                (s["SubscriptionType"], s["Address"]) for s in page.get("Subscribers", [])
            )
        return subscribers

    def _topic(self, topic_arn: str, account: str) -> tuple[bool, bool]:
        sns = self._client("sns")
        try:
            attributes = sns.get_topic_attributes(TopicArn=topic_arn)["Attributes"]
        except sns.exceptions.NotFoundException:
            return False, False
        except aws.errors() as exc:
            raise aws.translate(exc, "reading the alert topic") from None
        policy = json.loads(attributes.get("Policy") or "{}")
        allowed = any(
            s.get("Sid") == "CostguardBudgetsPublish"
            and s.get("Condition", {}).get("StringEquals", {}).get("aws:SourceAccount") == account
            for s in policy.get("Statement", [])
        )
        return True, allowed

    def _email_subscriptions(self, topic_arn: str) -> frozenset[str]:
        emails: set[str] = set()
        params: dict[str, Any] = {"TopicArn": topic_arn}
        for _page in range(100):
            page = self._call("sns", "list_subscriptions_by_topic", "reading the topic", **params)
            emails.update(
                s["Endpoint"] for s in page.get("Subscriptions", []) if s.get("Protocol") == "email"
            )
            if not page.get("NextToken"):
                break
            params["NextToken"] = page["NextToken"]
        return frozenset(emails)

    def _alarm(self, name: str) -> tuple[Decimal | None, tuple[str, ...]]:
        alarms = self._call(
            "cloudwatch", "describe_alarms", "reading the billing alarm", AlarmNames=[name]
        ).get("MetricAlarms", [])
        if not alarms:
            return None, ()
        alarm = alarms[0]
        return Decimal(str(alarm["Threshold"])), tuple(alarm.get("AlarmActions", []))

    def plan(self, spec: AlarmSpec) -> Plan:
        """Read the account and return the calls that make it match ``spec``."""
        return plan_aws(spec, self.observe(spec))

    def dry_run_plan(self, spec: AlarmSpec) -> Plan:
        """Every call a run would make in a fresh account, without making any."""
        fresh = plan_aws(spec, ObservedAws(account_id="<account-id>"))
        return Plan(self._read_calls(spec) + fresh.calls, fresh.notes)

    def _read_calls(self, spec: AlarmSpec) -> tuple[ApiCall, ...]:
        hard_stop = (
            (
                (
                    "iam",
                    "get_policy",
                    {"PolicyArn": f"...:policy/{HARD_STOP_POLICY}"},
                    "hard-stop policy",
                ),
                (
                    "budgets",
                    "describe_budget_actions_for_budget",
                    {"BudgetName": spec.name},
                    "hard-stop action",
                ),
            )
            if spec.hard_stop_role_arn
            else ()
        )
        return tuple(
            ApiCall(service, operation, params, reason, read_only=True)
            for service, operation, params, reason in (
                ("sts", "get_caller_identity", {}, "which account"),
                (
                    "sns",
                    "get_topic_attributes",
                    {"TopicArn": aws_topic_arn("<account-id>")},
                    "the alert topic",
                ),
                (
                    "cloudwatch",
                    "describe_alarms",
                    {"AlarmNames": [aws_alarm_name(spec.name)]},
                    "billing alarm",
                ),
                (
                    "cloudwatch",
                    "list_metrics",
                    {"Namespace": "AWS/Billing"},
                    "billing metrics enabled?",
                ),
                ("budgets", "describe_budget", {"BudgetName": spec.name}, "budget"),
                (
                    "budgets",
                    "describe_notifications_for_budget",
                    {"BudgetName": spec.name},
                    "its alerts",
                ),
                *hard_stop,
            )
        )

    # -- changing --------------------------------------------------------------------

    def apply(self, spec: AlarmSpec, plan: Plan) -> list[ApiCall]:
        """Run the plan's changes in order; return the calls actually made.

        When the budget had to be recreated (no ``update_budget`` on this endpoint), it
        was recreated with every alert and subscriber of the spec, so the plan's
        remaining alert edits for it are skipped.
        """
        made: list[ApiCall] = []
        recreated = False
        alert_edits = (
            "create_notification",
            "delete_notification",
            "create_subscriber",
            "delete_subscriber",
        )
        for call in plan.changes:
            if recreated and call.operation in alert_edits:
                continue
            done = list(self._execute(spec, call))
            if call.operation == "update_budget":
                recreated = any(c.operation == "create_budget" for c in done)
            made.extend(done)
        return made

    def _execute(self, spec: AlarmSpec, call: ApiCall) -> Iterator[ApiCall]:
        params = dict(call.params)
        for key in ("AttributeValue", "PolicyDocument"):  # IAM/SNS take policies as JSON text
            if isinstance(params.get(key), dict):
                params[key] = json.dumps(params[key])
        client = self._client(call.service)
        try:
            getattr(client, call.operation)(**params)
        except aws.errors() as exc:
            if not aws.is_unsupported(exc):
                raise aws.translate(exc, f"{call} ({call.reason})") from None
            yield from self._fallback(spec, call)
            return
        yield call

    def _fallback(self, spec: AlarmSpec, call: ApiCall) -> Iterator[ApiCall]:
        """Equivalent calls for an endpoint that lacks ``call``'s operation."""
        params = call.params
        account = str(params.get("AccountId", ""))
        _, partition = self.account() if account else ("", "aws")
        topic = aws_topic_arn(account, partition)
        if call.operation == "update_budget":
            steps = [
                ApiCall(
                    "budgets",
                    "delete_budget",
                    {"AccountId": account, "BudgetName": spec.name},
                    "this endpoint has no update_budget: delete and recreate",
                ),
                aws_create_budget(spec, account, topic),
            ]
        elif call.operation in ("create_subscriber", "delete_subscriber"):
            base = {k: params[k] for k in ("AccountId", "BudgetName", "Notification")}
            subscribers = aws_subscribers(spec, topic)
            steps = [
                ApiCall(
                    "budgets",
                    "delete_notification",
                    base,
                    "this endpoint has no subscriber calls: recreate the alert",
                ),
                ApiCall(
                    "budgets",
                    "create_notification",
                    {**base, "Subscribers": subscribers},
                    call.reason,
                ),
            ]
        else:
            msg = f"{call} is not supported by this endpoint"
            raise CostguardError(msg, hint="check AWS_ENDPOINT_URL: it is not AWS itself")
        for step in steps:
            yield from self._execute(spec, step)

    # -- status and delete -----------------------------------------------------------

    def budgets(self) -> list[dict[str, Any]]:
        """Every costguard budget in the account (raw AWS dicts)."""
        account, _ = self.account()
        found = []
        params: dict[str, Any] = {"AccountId": account, "MaxResults": 100}
        for _page in range(100):
            page = self._call("budgets", "describe_budgets", "listing budgets", **params)
            found += [b for b in page.get("Budgets", []) if b["BudgetName"].startswith(NAME_PREFIX)]
            if not page.get("NextToken"):
                break
            params["NextToken"] = page["NextToken"]
        return found

    def status(self) -> list[BudgetStatus]:
        """What costguard has set up: budgets with their alerts and the billing alarm state."""
        account, _ = self.account()
        statuses = []
        for raw in self.budgets():
            name = raw["BudgetName"]
            spend = raw.get("CalculatedSpend", {})
            actual = spend.get("ActualSpend", {}).get("Amount")
            forecast = spend.get("ForecastedSpend", {}).get("Amount")
            alarms = self._call(
                "cloudwatch",
                "describe_alarms",
                "reading the billing alarm",
                AlarmNames=[aws_alarm_name(name)],
            ).get("MetricAlarms", [])
            alarm = f"billing alarm {alarms[0]['StateValue']}" if alarms else "no billing alarm"
            statuses.append(
                BudgetStatus(
                    provider="aws",
                    name=name,
                    amount_usd=Decimal(raw["BudgetLimit"]["Amount"]),
                    actual_usd=Decimal(actual) if actual is not None else None,
                    forecast_usd=Decimal(forecast) if forecast is not None else None,
                    alerts=tuple(str(n) for n in sorted(self._notifications(account, name))),
                    extra=alarm,
                )
            )
        return statuses

    def plan_delete(self, names: Sequence[str] | None = None) -> Plan:
        """Calls that remove costguard's budgets (all, or ``names``), alarms, and the topic."""
        account, partition = self.account()
        existing = [b["BudgetName"] for b in self.budgets()]
        targets = [n for n in existing if names is None or n in names]
        calls = [
            ApiCall(
                "budgets",
                "delete_budget",
                {"AccountId": account, "BudgetName": n},
                "costguard budget",
            )
            for n in targets
        ]
        alarm_names = [aws_alarm_name(n) for n in targets]
        found_alarms = (
            [
                a["AlarmName"]
                for a in self._call(
                    "cloudwatch",
                    "describe_alarms",
                    "reading billing alarms",
                    AlarmNames=alarm_names,
                ).get("MetricAlarms", [])
            ]
            if alarm_names
            else []
        )
        if found_alarms:
            calls.append(
                ApiCall(
                    "cloudwatch",
                    "delete_alarms",
                    {"AlarmNames": found_alarms},
                    "costguard billing alarms",
                )
            )
        if set(targets) == set(existing):
            topic = aws_topic_arn(account, partition)
            if self._topic(topic, account)[0]:
                calls.append(
                    ApiCall(
                        "sns",
                        "delete_topic",
                        {"TopicArn": topic},
                        "no costguard budget is left to use it",
                    )
                )
        return Plan(tuple(calls))

    def delete(self, plan: Plan) -> list[ApiCall]:
        """Run a plan from :meth:`plan_delete`."""
        made = []
        for call in plan.changes:
            self._call(call.service, call.operation, str(call), **call.params)
            made.append(call)
        return made

    def has_alarm(self) -> bool:
        """Whether any costguard budget exists (the launch guard's question)."""
        return bool(self.budgets())


def publish_alert(subject: str, message: str, clients: ClientFactory = _default_clients) -> bool:
    """Publish to costguard's alert topic if it exists (the alarm's channel)."""
    sns = clients("sns", AWS_BILLING_REGION)
    try:
        account = clients("sts", AWS_BILLING_REGION).get_caller_identity()
        arn = aws_topic_arn(str(account["Account"]), str(account["Arn"]).split(":")[1])
        sns.get_topic_attributes(TopicArn=arn)
    except aws.errors():
        return False
    try:
        sns.publish(TopicArn=arn, Subject=subject[:100], Message=message)
    except aws.errors() as exc:
        raise aws.translate(exc, "publishing the burn-rate alert") from None
    return True
