"""The AWS budget alarm plan: AWS Budgets, the SNS topic, the billing alarm, the hard stop.

Pure: :func:`plan_aws` diffs an :class:`~costguard.alarms.spec.AlarmSpec` against an
:class:`ObservedAws` read by :mod:`costguard.alarms.aws`. The AWS alarm is several
resources that must agree (a budget, a topic and its policy, a CloudWatch billing alarm,
and the optional hard-stop action with its IAM policy), so the plan diffs each of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from costguard.alarms.plan import ApiCall, Plan
from costguard.alarms.spec import AlarmSpec, Basis, Notification

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
