"""The AlarmBackend contract, on every cloud, each backend found through the provider
table (``costguard.providers``) as the commands find it: AWS Budgets on moto, GCP Billing
Budgets and Azure Consumption on their strict fakes (``tests/servers``).

The story is the one ``costguard alarm`` tells: no budget (the launch guard refuses); a
budget made from the plan; the same request again plans no change; the status shows it;
the delete plan removes only it; and the guard refuses again.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from costguard.alarms.backend import AlarmBackend, Scope, alarm_backend
from costguard.alarms.spec import alarm_spec
from costguard.clouds import azure as azure_clouds
from costguard.clouds import gcp as gcp_clouds
from costguard.settings import Settings
from tests.servers.azure import ConsumptionFake
from tests.servers.gcp import BudgetsFake
from tests.servers.http import JsonServer, azure_test_kwargs

ACCOUNT = "012345-6789AB-CDEF01"
SUBSCRIPTION = "00000000-0000-0000-0000-000000000001"
SCOPES = {
    "aws": Scope(),
    "gcp": Scope(billing_account=ACCOUNT, project="thesis-1"),  # emails go through its channels
    "azure": Scope(subscription=SUBSCRIPTION),
}


@pytest.fixture(params=sorted(SCOPES))
def provider(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The provider's budgets, empty, and the settings that reach them."""
    name: str = request.param
    if name == "aws":
        request.getfixturevalue("aws_env")
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
        yield name
        return
    if name == "gcp":
        from google.auth.credentials import AnonymousCredentials

        fake = BudgetsFake()
        fake.projects["thesis-1"] = "731902451868"  # the number Resource Manager gives it
        server = JsonServer(fake)
        monkeypatch.setenv("COSTGUARD_GCP_ENDPOINT", server.url)
        monkeypatch.setattr(gcp_clouds, "default_credentials", AnonymousCredentials)
    else:
        server = JsonServer(ConsumptionFake())
        monkeypatch.setenv("COSTGUARD_AZURE_ENDPOINT", server.url)
        real_client = azure_clouds.client

        def test_client(*args: Any, **kwargs: Any) -> Any:
            return real_client(*args, **{**kwargs, **azure_test_kwargs()})

        monkeypatch.setattr(azure_clouds, "client", test_client)
    try:
        yield name
    finally:
        server.stop()


def backend(provider: str) -> AlarmBackend:
    return alarm_backend(provider, Settings.load(), SCOPES[provider])


def test_a_budget_is_made_once_shown_and_deleted(provider: str) -> None:
    cloud = backend(provider)
    assert cloud.has_alarm() is False
    scope = SCOPES[provider]
    spec = alarm_spec(
        budget="200",
        provider=provider,
        emails=["me@uni.edu"],
        billing_account=scope.billing_account,
        project=scope.project,
        subscription=scope.subscription,
    )
    plan = cloud.plan(spec)
    assert plan.changes
    made = cloud.apply(spec, plan)
    assert made
    assert all(not call.read_only for call in made)

    again = backend(provider)  # a new process: nothing cached
    assert again.has_alarm() is True
    assert again.plan(spec).changes == ()
    (status,) = again.status()
    assert (status.provider, status.name) == (provider, "costguard-monthly")
    assert status.amount_usd == Decimal(200)

    removal = again.plan_delete()
    assert removal.changes
    again.delete(removal)
    assert backend(provider).has_alarm() is False
    assert backend(provider).status() == []
