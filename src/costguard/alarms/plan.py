"""Budget alarms as values: what the user asked for, what exists, the calls to make. Pure.

:func:`alarm_spec` validates the user's input once (before any cloud call) into an
:class:`AlarmSpec`. Each provider adapter reads what exists into an ``Observed*`` value
and the ``plan_*`` functions here return the exact API calls that bring it to the spec,
as :class:`ApiCall` values: the same list is printed by ``--dry-run`` and executed
otherwise, so what is shown is what is done.

>>> spec = alarm_spec(budget="200", emails=["me@uni.edu"], thresholds="50,80,100")
>>> [str(n) for n in spec.notifications]
['ACTUAL > 50%', 'ACTUAL > 80%', 'ACTUAL > 100%', 'FORECASTED > 100%']
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import Any

from costguard.errors import InputError
from costguard.money import parse_decimal

NAME_PREFIX = "costguard-"
MAX_BUDGET_USD = Decimal(10) ** 9
#: Provider limits, checked before any call (AWS Budgets: 10 notifications per budget and
#: 10 email subscribers per notification; GCP: 5 monitoring channels; Azure: 5
#: notifications per budget).
LIMITS = {
    "aws": {"notifications": 10, "emails": 10, "name": 73},
    # Budget.display_name: "The name must be less than or equal to 60 characters."
    # (googleapis google/cloud/billing/budgets/v1/budget_model.proto)
    "gcp": {"notifications": 10, "emails": 5, "name": 60},
    "azure": {"notifications": 5, "emails": 50, "name": 73},
}
DEFAULT_THRESHOLDS = (Decimal(50), Decimal(80), Decimal(100))
# A deliberately plain check: one @, no spaces, a dot in the domain. Providers validate
# fully; this catches typos before any call.
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[A-Za-z]{2,}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class Basis(StrEnum):
    """Whether a notification fires on spend so far or on the month's forecast."""

    ACTUAL = "ACTUAL"
    FORECASTED = "FORECASTED"


@dataclass(frozen=True, order=True)
class Notification:
    """Alert when spend (actual or forecast) passes ``threshold_percent`` of the budget."""

    basis: Basis
    threshold_percent: Decimal

    def __str__(self) -> str:
        return f"{self.basis} > {self.threshold_percent.normalize():f}%"


@dataclass(frozen=True)
class AlarmSpec:
    """A validated request for one monthly cost budget with its alerts."""

    provider: str
    name: str  # full name, always with the costguard- prefix
    budget_usd: Decimal
    notifications: tuple[Notification, ...]
    emails: tuple[str, ...] = ()
    #: GCP: the billing account (``XXXXXX-XXXXXX-XXXXXX``) and optional project.
    billing_account: str | None = None
    project: str | None = None
    pubsub_topic: str | None = None
    #: Azure: the subscription and optional resource group (the budget's scope).
    subscription: str | None = None
    resource_group: str | None = None
    #: AWS --hard-stop: the role AWS Budgets assumes, and the IAM principals
    #: (``user/NAME``, ``role/NAME``, ``group/NAME``) denied ``ec2:RunInstances`` at 100%.
    hard_stop_role_arn: str | None = None
    hard_stop_targets: tuple[str, ...] = ()

    @property
    def thresholds(self) -> tuple[Decimal, ...]:
        """The ACTUAL thresholds, in percent."""
        return tuple(n.threshold_percent for n in self.notifications if n.basis is Basis.ACTUAL)


def alarm_spec(
    *,
    budget: str | Decimal,
    provider: str = "aws",
    emails: Iterable[str] = (),
    thresholds: str | Sequence[Decimal] = DEFAULT_THRESHOLDS,
    forecast: bool = True,
    name: str = "monthly",
    billing_account: str | None = None,
    project: str | None = None,
    pubsub_topic: str | None = None,
    subscription: str | None = None,
    resource_group: str | None = None,
    hard_stop: bool = False,
    hard_stop_role_arn: str | None = None,
    hard_stop_targets: Iterable[str] = (),
) -> AlarmSpec:
    """Validate everything the user typed; raise :class:`InputError` (exit 2) on the first problem.

    >>> alarm_spec(budget="nan")
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: the budget must be a number of dollars, not 'nan'
    """
    provider = provider.strip().lower()
    if provider not in LIMITS:
        msg = f"unknown provider {provider!r}"
        raise InputError(msg, hint="use --provider aws, gcp or azure")
    amount = _budget(budget)
    limits = LIMITS[provider]
    percents = _thresholds(thresholds)
    notifications = [Notification(Basis.ACTUAL, p) for p in percents]
    if forecast:
        notifications.append(Notification(Basis.FORECASTED, Decimal(100)))
    if len(notifications) > limits["notifications"]:
        msg = (
            f"{provider} allows {limits['notifications']} notifications per budget; "
            f"this asks for {len(notifications)}"
        )
        raise InputError(msg, hint="use fewer --thresholds (or --no-forecast)")
    addresses = _emails(emails, limits["emails"], provider)
    full_name = _name(name)
    if len(full_name) > limits["name"]:
        msg = (
            f"budget name {full_name!r} is {len(full_name)} characters; "
            f"{provider} allows {limits['name']}"
        )
        bare = limits["name"] - len(NAME_PREFIX)
        raise InputError(msg, hint=f"use a --name of at most {bare} characters")
    if provider == "gcp":
        if not billing_account:
            msg = "a GCP budget belongs to a billing account: --billing-account is missing"
            raise InputError(msg, hint="gcloud billing accounts list shows yours")
        billing_account = _billing_account(billing_account)
    if provider == "azure" and not subscription:
        msg = "an Azure budget needs a subscription: --subscription is missing"
        raise InputError(msg, hint="az account show --query id shows yours")
    if provider == "azure" and not addresses:
        msg = "Azure sends budget alerts only to contact emails: --email is missing"
        raise InputError(msg, hint="e.g. --email me@uni.edu")
    targets = _hard_stop(provider, hard_stop, hard_stop_role_arn, tuple(hard_stop_targets))
    return AlarmSpec(
        provider=provider,
        name=full_name,
        budget_usd=amount,
        notifications=tuple(notifications),
        emails=addresses,
        billing_account=billing_account,
        project=project,
        pubsub_topic=pubsub_topic,
        subscription=subscription,
        resource_group=resource_group,
        hard_stop_role_arn=hard_stop_role_arn if hard_stop else None,
        hard_stop_targets=targets,
    )


_ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}$")
_TARGET = re.compile(r"^(user|role|group)/[\w+=,.@-]{1,128}$")


def _hard_stop(
    provider: str, enabled: bool, role_arn: str | None, targets: tuple[str, ...]
) -> tuple[str, ...]:
    if not enabled:
        if role_arn or targets:
            msg = "--hard-stop-role-arn and --hard-stop-target only apply with --hard-stop"
            raise InputError(msg, hint="add --hard-stop, or leave them out")
        return ()
    if provider != "aws":
        msg = "--hard-stop is an AWS Budgets action; GCP and Azure budgets only alert"
        raise InputError(msg, hint="leave out --hard-stop-role-arn/--hard-stop-target")
    if role_arn is None or not _ROLE_ARN.match(role_arn):
        msg = f"--hard-stop needs the ARN of the role AWS Budgets assumes, not {role_arn!r}"
        raise InputError(
            msg,
            hint="create it from infra/aws/budgets-action-role-*.json; "
            "--hard-stop-role-arn arn:aws:iam::123456789012:role/costguard-budgets",
        )
    if not targets:
        msg = "--hard-stop needs at least one --hard-stop-target (who may no longer launch)"
        raise InputError(msg, hint="e.g. --hard-stop-target user/alice or role/ResearchRole")
    for target in targets:
        if not _TARGET.match(target):
            msg = f"hard-stop target {target!r} is not user/NAME, role/NAME or group/NAME"
            raise InputError(msg, hint="e.g. --hard-stop-target user/alice")
    return tuple(sorted(set(targets)))


def _budget(value: str | Decimal) -> Decimal:
    try:
        amount = value if isinstance(value, Decimal) else parse_decimal(value)
    except ValueError:
        msg = f"the budget must be a number of dollars, not {value!r}"
        raise InputError(msg, hint="e.g. --budget 200") from None
    if not amount.is_finite():
        msg = f"the budget must be a number of dollars, not {value!r}"
        raise InputError(msg, hint="e.g. --budget 200")
    if amount <= 0:
        msg = f"the budget must be more than $0, not {amount}"
        raise InputError(msg, hint="e.g. --budget 200")
    if amount > MAX_BUDGET_USD:
        msg = f"a budget of ${amount:,} is more than costguard accepts ($1,000,000,000)"
        raise InputError(msg, hint="check for a typo in --budget")
    if amount.as_tuple().exponent < -2:  # type: ignore[operator]
        msg = f"the budget has more than cents: {amount}"
        raise InputError(msg, hint="round it to cents, e.g. --budget 199.99")
    return amount


def _thresholds(value: str | Sequence[Decimal]) -> tuple[Decimal, ...]:
    items: Sequence[str | Decimal]
    items = [t for t in value.split(",") if t.strip()] if isinstance(value, str) else value
    if not items:
        msg = "no thresholds given"
        raise InputError(msg, hint="e.g. --thresholds 50,80,100")
    percents = []
    for item in items:
        try:
            percent = item if isinstance(item, Decimal) else parse_decimal(item)
        except ValueError:
            msg = f"threshold {item!r} is not a number"
            hint = "percent of the budget, e.g. --thresholds 50,80,100"
            raise InputError(msg, hint=hint) from None
        if not 0 < percent <= 1000:
            msg = f"threshold {percent}% is outside (0, 1000]"
            raise InputError(msg, hint="percent of the budget, e.g. --thresholds 50,80,100")
        percents.append(percent)
    return tuple(sorted(set(percents)))


def _emails(emails: Iterable[str], limit: int, provider: str) -> tuple[str, ...]:
    addresses = tuple(dict.fromkeys(e.strip() for e in emails if e.strip()))
    for address in addresses:
        if not _EMAIL.match(address):
            msg = f"{address!r} is not an email address"
            raise InputError(msg, hint="e.g. --email me@uni.edu")
    if len(addresses) > limit:
        msg = f"{provider} allows {limit} email addresses per alert; this gives {len(addresses)}"
        raise InputError(msg, hint="use a mailing list address for more people")
    return addresses


def _name(name: str) -> str:
    bare = name.removeprefix(NAME_PREFIX)
    if not _NAME.match(bare):
        msg = f"budget name {name!r} must be letters, digits, '.', '_' or '-' (up to 63)"
        raise InputError(msg, hint="e.g. --name thesis")
    return NAME_PREFIX + bare


def _billing_account(account: str) -> str:
    bare = account.removeprefix("billingAccounts/")
    if not re.fullmatch(r"[0-9A-Fa-f]{6}-[0-9A-Fa-f]{6}-[0-9A-Fa-f]{6}", bare):
        msg = f"billing account {account!r} is not of the form XXXXXX-XXXXXX-XXXXXX"
        raise InputError(msg, hint="gcloud billing accounts list shows yours")
    return bare.upper()


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


# --- AWS ---------------------------------------------------------------------------------

AWS_TOPIC = "costguard-budget-alerts"
HARD_STOP_POLICY = "costguard-deny-run-instances"
AWS_BILLING_REGION = "us-east-1"  # AWS/Billing metrics exist only there
BILLING_PERIOD_S = 21600  # EstimatedCharges is published about every 6 hours


@dataclass(frozen=True)
class ObservedAwsBudget:
    """What AWS has for one budget. ``subscribers`` is ``None`` when it cannot be read."""

    amount_usd: Decimal
    time_unit: str
    notifications: frozenset[Notification]
    subscribers: Mapping[Notification, frozenset[tuple[str, str]]] | None = None


@dataclass(frozen=True)
class ObservedAws:
    """What exists in the account that costguard manages."""

    account_id: str
    partition: str = "aws"
    budget: ObservedAwsBudget | None = None
    topic_exists: bool = False
    topic_policy_allows_budgets: bool = False
    topic_email_subscriptions: frozenset[str] = frozenset()
    alarm_threshold_usd: Decimal | None = None
    alarm_actions: tuple[str, ...] = ()
    billing_metrics_enabled: bool = True
    #: --hard-stop: whether the deny policy exists, and the budget's actions
    #: (``None`` when this endpoint cannot list them).
    hard_stop_policy_exists: bool = False
    budget_actions: tuple[Mapping[str, Any], ...] | None = ()


def aws_topic_arn(account_id: str, partition: str = "aws") -> str:
    """The ARN of costguard's alert topic (SNS topic ARNs are deterministic)."""
    return f"arn:{partition}:sns:{AWS_BILLING_REGION}:{account_id}:{AWS_TOPIC}"


def aws_topic_policy(account_id: str, topic_arn: str) -> dict[str, Any]:
    """Least privilege: AWS Budgets (and CloudWatch) of this account may publish, no one else."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "CostguardBudgetsPublish",
                "Effect": "Allow",
                "Principal": {"Service": ["budgets.amazonaws.com", "cloudwatch.amazonaws.com"]},
                "Action": "SNS:Publish",
                "Resource": topic_arn,
                "Condition": {"StringEquals": {"aws:SourceAccount": account_id}},
            }
        ],
    }


def hard_stop_policy_document() -> dict[str, Any]:
    """What a hard stop applies: no new or restarted instances. Running ones keep running."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "CostguardBudgetExhausted",
                "Effect": "Deny",
                "Action": ["ec2:RunInstances", "ec2:StartInstances"],
                "Resource": "*",
            }
        ],
    }


def _hard_stop_definition(spec: AlarmSpec, policy_arn: str) -> dict[str, Any]:
    kinds: dict[str, list[str]] = {"Users": [], "Roles": [], "Groups": []}
    for target in spec.hard_stop_targets:
        kind, _, name = target.partition("/")
        kinds[f"{kind.title()}s"].append(name)
    return {
        "IamActionDefinition": {"PolicyArn": policy_arn, **{k: v for k, v in kinds.items() if v}}
    }


def _plan_hard_stop(
    spec: AlarmSpec, observed: ObservedAws, topic_arn: str, notes: list[str]
) -> list[ApiCall]:
    if spec.hard_stop_role_arn is None:
        if observed.budget_actions:
            notes.append("a hard-stop action exists on this budget and was left as it is")
        return []
    account = observed.account_id
    policy_arn = f"arn:{observed.partition}:iam::{account}:policy/{HARD_STOP_POLICY}"
    calls = []
    if not observed.hard_stop_policy_exists:
        calls.append(
            ApiCall(
                "iam",
                "create_policy",
                {
                    "PolicyName": HARD_STOP_POLICY,
                    "PolicyDocument": hard_stop_policy_document(),
                    "Description": "costguard --hard-stop: deny ec2:RunInstances/StartInstances",
                },
                "the deny policy a hard stop attaches",
            )
        )
    definition = _hard_stop_definition(spec, policy_arn)
    wanted = (definition, spec.hard_stop_role_arn)
    if observed.budget_actions is None:
        notes.append("this endpoint cannot list budget actions; the hard stop was not checked")
        return calls
    if any(
        (a.get("Definition"), a.get("ExecutionRoleArn")) == wanted for a in observed.budget_actions
    ):
        return calls
    calls.append(
        ApiCall(
            "budgets",
            "create_budget_action",
            {
                "AccountId": account,
                "BudgetName": spec.name,
                "NotificationType": "ACTUAL",
                "ActionType": "APPLY_IAM_POLICY",
                "ActionThreshold": {
                    "ActionThresholdValue": 100.0,
                    "ActionThresholdType": "PERCENTAGE",
                },
                "Definition": definition,
                "ExecutionRoleArn": spec.hard_stop_role_arn,
                "ApprovalModel": "AUTOMATIC",
                "Subscribers": aws_subscribers(spec, topic_arn),
            },
            f"hard stop: at 100% deny launches to {', '.join(spec.hard_stop_targets)}",
        )
    )
    return calls


def aws_alarm_name(budget_name: str) -> str:
    """The CloudWatch billing alarm that backs the budget ``budget_name`` up."""
    return f"{budget_name}-estimated-charges"


def _aws_notification(n: Notification) -> dict[str, Any]:
    return {
        "NotificationType": str(n.basis),
        "ComparisonOperator": "GREATER_THAN",
        "Threshold": float(n.threshold_percent),
        "ThresholdType": "PERCENTAGE",
    }


def aws_subscribers(spec: AlarmSpec, topic_arn: str) -> list[dict[str, str]]:
    """Who each budget alert goes to: the emails directly, and the SNS topic."""
    subscribers = [{"SubscriptionType": "EMAIL", "Address": e} for e in spec.emails]
    subscribers.append({"SubscriptionType": "SNS", "Address": topic_arn})
    return subscribers


def _aws_budget(spec: AlarmSpec) -> dict[str, Any]:
    return {
        "BudgetName": spec.name,
        "BudgetLimit": {"Amount": f"{spec.budget_usd:f}", "Unit": "USD"},
        "TimeUnit": "MONTHLY",
        "BudgetType": "COST",
    }


def aws_create_budget(spec: AlarmSpec, account: str, topic_arn: str) -> ApiCall:
    """The one call that creates the budget with all its alerts and subscribers."""
    subscribers = aws_subscribers(spec, topic_arn)
    return ApiCall(
        "budgets",
        "create_budget",
        {
            "AccountId": account,
            "Budget": _aws_budget(spec),
            "NotificationsWithSubscribers": [
                {"Notification": _aws_notification(n), "Subscribers": subscribers}
                for n in spec.notifications
            ],
        },
        f"monthly cost budget of ${spec.budget_usd:f} with {len(spec.notifications)} alerts",
    )


def plan_aws(spec: AlarmSpec, observed: ObservedAws) -> Plan:
    """The calls that make AWS match ``spec``; none when it already does.

    Budgets first notify the SNS topic (and the emails directly); the CloudWatch
    ``EstimatedCharges`` alarm is a second, independent layer on the same topic.
    """
    account = observed.account_id
    topic_arn = aws_topic_arn(account, observed.partition)
    calls: list[ApiCall] = []
    notes: list[str] = []
    if not observed.topic_exists:
        calls.append(
            ApiCall(
                "sns",
                "create_topic",
                {"Name": AWS_TOPIC},
                "a topic for budget and billing-alarm alerts",
            )
        )
    if not observed.topic_policy_allows_budgets:
        calls.append(
            ApiCall(
                "sns",
                "set_topic_attributes",
                {
                    "TopicArn": topic_arn,
                    "AttributeName": "Policy",
                    "AttributeValue": aws_topic_policy(account, topic_arn),
                },
                "let AWS Budgets and CloudWatch of this account publish to it",
            )
        )
    for email in spec.emails:
        if email not in observed.topic_email_subscriptions:
            calls.append(
                ApiCall(
                    "sns",
                    "subscribe",
                    {"TopicArn": topic_arn, "Protocol": "email", "Endpoint": email},
                    f"billing-alarm emails to {email} (AWS sends a confirmation link)",
                )
            )
    calls.extend(_plan_aws_budget(spec, observed.budget, account, topic_arn, notes))
    calls.extend(_plan_hard_stop(spec, observed, topic_arn, notes))
    if observed.alarm_threshold_usd != spec.budget_usd or tuple(observed.alarm_actions) != (
        topic_arn,
    ):
        calls.append(
            ApiCall(
                "cloudwatch",
                "put_metric_alarm",
                {
                    "AlarmName": aws_alarm_name(spec.name),
                    "AlarmDescription": f"costguard: estimated charges reached the {spec.name} "
                    f"budget of ${spec.budget_usd:f}",
                    "Namespace": "AWS/Billing",
                    "MetricName": "EstimatedCharges",
                    "Dimensions": [{"Name": "Currency", "Value": "USD"}],
                    "Statistic": "Maximum",
                    "Period": BILLING_PERIOD_S,
                    "EvaluationPeriods": 1,
                    "Threshold": float(spec.budget_usd),
                    "ComparisonOperator": "GreaterThanOrEqualToThreshold",
                    "TreatMissingData": "notBreaching",
                    "AlarmActions": [topic_arn],
                },
                "second layer: CloudWatch billing alarm at 100% of the budget",
            )
        )
    if not observed.billing_metrics_enabled:
        notes.append(
            "AWS/Billing metrics are not enabled in this account, so the CloudWatch billing "
            "alarm stays in INSUFFICIENT_DATA: enable 'Receive CloudWatch billing alerts' in "
            "Billing > Billing preferences (payer account); the budget alerts work without it"
        )
    return Plan(tuple(calls), tuple(notes))


def _plan_aws_budget(
    spec: AlarmSpec,
    budget: ObservedAwsBudget | None,
    account: str,
    topic_arn: str,
    notes: list[str],
) -> list[ApiCall]:
    desired = set(spec.notifications)
    subscribers = aws_subscribers(spec, topic_arn)
    create = aws_create_budget(spec, account, topic_arn)
    if budget is None:
        return [create]
    calls: list[ApiCall] = []
    if budget.time_unit != "MONTHLY":
        notes.append(f"{spec.name} was {budget.time_unit}: it is recreated as MONTHLY")
        return [
            ApiCall(
                "budgets",
                "delete_budget",
                {"AccountId": account, "BudgetName": spec.name},
                "recreate as a monthly budget",
            ),
            create,
        ]
    if budget.amount_usd != spec.budget_usd:
        calls.append(
            ApiCall(
                "budgets",
                "update_budget",
                {"AccountId": account, "NewBudget": _aws_budget(spec)},
                f"budget ${budget.amount_usd:f} -> ${spec.budget_usd:f}",
            )
        )
    wanted_subscribers = frozenset((s["SubscriptionType"], s["Address"]) for s in subscribers)
    for notification in sorted(budget.notifications - desired):
        calls.append(
            ApiCall(
                "budgets",
                "delete_notification",
                {
                    "AccountId": account,
                    "BudgetName": spec.name,
                    "Notification": _aws_notification(notification),
                },
                f"alert {notification} is no longer asked for",
            )
        )
    for notification in sorted(desired - budget.notifications):
        calls.append(
            ApiCall(
                "budgets",
                "create_notification",
                {
                    "AccountId": account,
                    "BudgetName": spec.name,
                    "Notification": _aws_notification(notification),
                    "Subscribers": subscribers,
                },
                f"add alert {notification}",
            )
        )
    kept = sorted(desired & budget.notifications)
    if budget.subscribers is None:
        if kept:
            notes.append(
                "the subscribers of existing alerts could not be read from this endpoint; "
                "they were left as they are"
            )
        return calls
    for notification in kept:
        have = budget.subscribers.get(notification, frozenset())
        for kind, address in sorted(wanted_subscribers - have):
            calls.append(
                ApiCall(
                    "budgets",
                    "create_subscriber",
                    {
                        "AccountId": account,
                        "BudgetName": spec.name,
                        "Notification": _aws_notification(notification),
                        "Subscriber": {"SubscriptionType": kind, "Address": address},
                    },
                    f"alert {notification} also to {address}",
                )
            )
        for kind, address in sorted(have - wanted_subscribers):
            calls.append(
                ApiCall(
                    "budgets",
                    "delete_subscriber",
                    {
                        "AccountId": account,
                        "BudgetName": spec.name,
                        "Notification": _aws_notification(notification),
                        "Subscriber": {"SubscriptionType": kind, "Address": address},
                    },
                    f"alert {notification} no longer to {address}",
                )
            )
    return calls


def aws_notification_key(raw: Mapping[str, Any]) -> Notification | None:
    """An AWS notification as costguard's value; ``None`` for kinds costguard doesn't manage."""
    if raw.get("ThresholdType", "PERCENTAGE") != "PERCENTAGE":
        return None
    if raw.get("ComparisonOperator") != "GREATER_THAN":
        return None
    try:
        basis = Basis(raw["NotificationType"])
    except (KeyError, ValueError):
        return None
    return Notification(basis, Decimal(str(raw["Threshold"])).normalize())


# --- GCP ---------------------------------------------------------------------------------


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


# --- Azure -------------------------------------------------------------------------------


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
