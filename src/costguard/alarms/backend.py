"""What a command needs from a provider's alarm backend, and how it gets one.

The backends (:mod:`costguard.alarms.aws`, ``gcp``, ``azure``) are the ``alarm`` entries
of :data:`costguard.providers.ADAPTERS`; :func:`alarm_backend` imports one (and its SDK)
only when a command asks for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol

from costguard.errors import InputError
from costguard.providers import adapter_class

if TYPE_CHECKING:
    from costguard.alarms.plan import ApiCall, BudgetStatus, Plan
    from costguard.alarms.spec import AlarmSpec
    from costguard.settings import Settings


@dataclass(frozen=True)
class Scope:
    """Where a provider keeps the budgets: GCP's billing account (and project), Azure's
    subscription (and resource group); AWS needs none (the account of the credentials)."""

    billing_account: str | None = None
    project: str | None = None
    subscription: str | None = None
    resource_group: str | None = None

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Scope:
        """The scope among command options (or ``--option`` values); other keys ignored.

        >>> Scope.of({"project": "lab", "budget": "200"})
        Scope(billing_account=None, project='lab', subscription=None, resource_group=None)
        """
        return cls(**{field.name: values.get(field.name) for field in fields(cls)})

    def need(self, name: str, budgets: str, hint: str) -> str:
        """The scope's ``name``, or an InputError: its flag is needed for ``budgets``.

        >>> Scope().need("subscription", "Azure budgets", "az account show")
        Traceback (most recent call last):
        ...
        costguard.errors.InputError: --subscription is needed for Azure budgets
        """
        value: str | None = getattr(self, name)
        if not value:
            msg = f"--{name.replace('_', '-')} is needed for {budgets}"
            raise InputError(msg, hint=hint)
        return value


class AlarmBackend(Protocol):
    """One provider's budgets, as ``costguard alarm`` and the launch guard use them."""

    def plan(self, spec: AlarmSpec) -> Plan: ...

    def dry_run_plan(self, spec: AlarmSpec) -> Plan: ...

    def apply(self, spec: AlarmSpec, plan: Plan) -> list[ApiCall]: ...

    def status(self) -> list[BudgetStatus]: ...

    def plan_delete(self, names: Sequence[str] | None = None) -> Plan: ...

    def delete(self, plan: Plan) -> list[ApiCall]: ...

    def has_alarm(self) -> bool: ...


def alarm_backend(provider: str, settings: Settings, scope: Scope) -> AlarmBackend:
    """The provider's alarm backend for ``scope``, its SDK imported only now.

    A scope the provider needs and lacks is an :class:`~costguard.errors.InputError`.
    """
    backend: AlarmBackend = adapter_class("alarm", provider).for_scope(settings, scope)
    return backend
