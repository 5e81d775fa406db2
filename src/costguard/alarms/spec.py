"""A budget alarm request, validated once, before any cloud call. Pure.

:func:`alarm_spec` checks the user's input (amount, thresholds, emails, names, the
provider's own limits) into an :class:`AlarmSpec`; the per-cloud plans
(:mod:`costguard.alarms.plan_aws`, ``plan_gcp``, ``plan_azure``) diff it against what
exists.

>>> spec = alarm_spec(budget="200", emails=["me@uni.edu"], thresholds="50,80,100")
>>> [str(n) for n in spec.notifications]
['ACTUAL > 50%', 'ACTUAL > 80%', 'ACTUAL > 100%', 'FORECASTED > 100%']
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum

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
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[A-Za-z]{2,}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


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
    if pubsub_topic is not None:
        pubsub_topic = _pubsub_topic(provider, pubsub_topic)
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


#: ``projects/{project}/topics/{topic}``: a project id (6-30 characters, optionally with a
#: ``domain:`` prefix) and a topic name (3-255 characters, starting with a letter, not with
#: ``goog``), as the Budget API's ``NotificationsRule.pubsubTopic`` and Pub/Sub name them.
_PUBSUB_TOPIC = re.compile(
    r"projects/(?:[a-z][a-z0-9.-]*[a-z0-9]:)?[a-z][a-z0-9-]{4,28}[a-z0-9]"
    r"/topics/(?!goog)[A-Za-z][A-Za-z0-9_.~+%-]{2,254}"
)


def _pubsub_topic(provider: str, topic: str) -> str:
    """The full resource name of a Pub/Sub topic, or an :class:`InputError`.

    >>> _pubsub_topic("gcp", "projects/my-lab-123/topics/budget-alerts")
    'projects/my-lab-123/topics/budget-alerts'
    >>> _pubsub_topic("gcp", "budget-alerts")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: --pubsub-topic must be projects/PROJECT/topics/TOPIC, not ...
    """
    if provider != "gcp":
        msg = "--pubsub-topic is a GCP budget setting; AWS and Azure budgets do not publish there"
        raise InputError(msg, hint="leave out --pubsub-topic, or use --provider gcp")
    topic = topic.strip()
    if not _PUBSUB_TOPIC.fullmatch(topic):
        msg = f"--pubsub-topic must be projects/PROJECT/topics/TOPIC, not {topic!r}"
        raise InputError(
            msg,
            hint="the topic's full name: gcloud pubsub topics list --format='value(name)', "
            "e.g. projects/my-lab-123/topics/budget-alerts",
        )
    return topic


_ROLE_ARN = re.compile(r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}", re.ASCII)
_TARGET = re.compile(r"(user|role|group)/[\w+=,.@-]{1,128}", re.ASCII)


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
    if role_arn is None or not _ROLE_ARN.fullmatch(role_arn):
        given = "none was given" if role_arn is None else f"not {role_arn!r}"
        msg = f"--hard-stop needs the ARN of the role AWS Budgets assumes, {given}"
        raise InputError(
            msg,
            hint="create it from infra/aws/budgets-action-role-*.json; "
            "--hard-stop-role-arn arn:aws:iam::123456789012:role/costguard-budgets",
        )
    if not targets:
        msg = "--hard-stop needs at least one --hard-stop-target (who may no longer launch)"
        raise InputError(msg, hint="e.g. --hard-stop-target user/alice or role/ResearchRole")
    for target in targets:
        if not _TARGET.fullmatch(target):
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
        if not _EMAIL.fullmatch(address):
            msg = f"{address!r} is not an email address"
            raise InputError(msg, hint="e.g. --email me@uni.edu")
    if len(addresses) > limit:
        msg = f"{provider} allows {limit} email addresses per alert; this gives {len(addresses)}"
        raise InputError(msg, hint="use a mailing list address for more people")
    return addresses


def _name(name: str) -> str:
    from costguard.secrets import find_shape

    bare = name.removeprefix(NAME_PREFIX)
    if not _NAME.fullmatch(bare):
        msg = f"budget name {name!r} must be letters, digits, '.', '_' or '-' (up to 63)"
        raise InputError(msg, hint="e.g. --name thesis")
    what = find_shape(bare)
    if what is not None:  # the name goes into the cloud's resources and every listing
        msg = f"the budget name looks like {what}"
        raise InputError(msg, hint="a plain name, e.g. --name thesis")
    return NAME_PREFIX + bare


def _billing_account(account: str) -> str:
    bare = account.removeprefix("billingAccounts/")
    if not re.fullmatch(r"[0-9A-Fa-f]{6}-[0-9A-Fa-f]{6}-[0-9A-Fa-f]{6}", bare):
        msg = f"billing account {account!r} is not of the form XXXXXX-XXXXXX-XXXXXX"
        raise InputError(msg, hint="gcloud billing accounts list shows yours")
    return bare.upper()
