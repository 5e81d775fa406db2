"""GCP and Azure budgets through the real SDK clients, against local REST servers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from costguard.clouds import azure as azure_clouds
from costguard.clouds import gcp as gcp_clouds
from tests.servers.azure import ConsumptionFake as FakeAzure
from tests.servers.gcp import BudgetsFake as FakeGcp
from tests.servers.http import JsonServer, azure_test_kwargs

ACCOUNT = "012345-6789AB-CDEF01"
SUBSCRIPTION = "00000000-0000-0000-0000-000000000001"
#: The number Resource Manager gives the project ``thesis-1``.
THESIS_NUMBER = "731902451868"


@pytest.fixture
def gcp_cli(gcp_server: tuple[JsonServer, FakeGcp], monkeypatch: pytest.MonkeyPatch):
    from google.auth.credentials import AnonymousCredentials

    server, fake = gcp_server
    fake.projects["thesis-1"] = THESIS_NUMBER
    monkeypatch.setenv("COSTGUARD_GCP_ENDPOINT", server.url)
    monkeypatch.setattr(gcp_clouds, "default_credentials", AnonymousCredentials)
    return server, fake


@pytest.fixture
def azure_cli(azure_server: tuple[JsonServer, FakeAzure], monkeypatch: pytest.MonkeyPatch):
    server, fake = azure_server
    monkeypatch.setenv("COSTGUARD_AZURE_ENDPOINT", server.url)
    real_client = azure_clouds.client

    def test_client(*args: Any, **kwargs: Any) -> Any:
        return real_client(*args, **{**kwargs, **azure_test_kwargs()})

    monkeypatch.setattr(azure_clouds, "client", test_client)
    return server, fake


GCP_ARGS = ("alarm", "--provider", "gcp", "--billing-account", ACCOUNT, "--project", "thesis-1")


def test_gcp_create_rerun_update_status_delete(run_cli: Callable[..., Any], gcp_cli) -> None:
    server, fake = gcp_cli
    created = run_cli(*GCP_ARGS, "--budget", "200", "--email", "me@uni.edu")
    assert created.exit_code == 0, created.stderr
    (budget,) = fake.budgets.values()
    assert budget["displayName"] == "costguard-monthly"
    assert budget["amount"]["specifiedAmount"]["currencyCode"] == "USD"
    assert str(budget["amount"]["specifiedAmount"]["units"]) == "200"
    # Sent by number, as the API answers it: the rerun below compares like with like.
    assert budget["budgetFilter"]["projects"] == [f"projects/{THESIS_NUMBER}"]
    rules = {(r["spendBasis"], r["thresholdPercent"]) for r in budget["thresholdRules"]}
    assert len(rules) == 4
    assert {basis for basis, _ in rules} == {"CURRENT_SPEND", "FORECASTED_SPEND"} or {
        basis for basis, _ in rules
    } == {1, 2}  # enum names or numbers, both are valid JSON
    (channel,) = fake.channels.values()
    assert channel["type"] == "email"
    assert channel["labels"] == {"email_address": "me@uni.edu"}
    assert budget["notificationsRule"]["monitoringNotificationChannels"] == [channel["name"]]

    writes_before = len(server.writes())
    again = run_cli(*GCP_ARGS, "--budget", "200", "--email", "me@uni.edu")
    assert again.exit_code == 0, again.stderr
    assert again.stdout.startswith("No changes")
    assert len(server.writes()) == writes_before

    updated = run_cli(*GCP_ARGS, "--budget", "250.50", "--email", "me@uni.edu")
    assert updated.exit_code == 0, updated.stderr
    assert "update_budget" in updated.stdout
    (budget,) = fake.budgets.values()
    money = budget["amount"]["specifiedAmount"]
    assert (str(money["units"]), money["nanos"]) == ("250", 500000000)
    patch = server.writes()[-1]
    assert patch.method == "PATCH"
    assert "updateMask" in patch.query

    status = run_cli(*GCP_ARGS[:1], "status", *GCP_ARGS[1:5], "--format", "json")
    assert status.exit_code == 0, status.stderr
    (row,) = status.json()["budgets"]
    assert (row["name"], row["amount_usd"]) == ("costguard-monthly", "250.5")

    preview = run_cli("alarm", "delete", *GCP_ARGS[1:5])
    assert "Would delete" in preview.stdout
    assert fake.budgets
    gone = run_cli("alarm", "delete", *GCP_ARGS[1:5], "--yes")
    assert gone.exit_code == 0, gone.stderr
    assert fake.budgets == {}


def test_gcp_leaves_other_budgets_alone(run_cli: Callable[..., Any], gcp_cli) -> None:
    _server, fake = gcp_cli
    fake.budgets[f"billingAccounts/{ACCOUNT}/budgets/other"] = {
        "name": f"billingAccounts/{ACCOUNT}/budgets/other",
        "displayName": "team budget",
        "amount": {"specifiedAmount": {"currencyCode": "USD", "units": "9"}},
    }
    assert run_cli(*GCP_ARGS, "--budget", "200").exit_code == 0
    assert run_cli("alarm", "delete", *GCP_ARGS[1:5], "--yes").exit_code == 0
    assert list(fake.budgets) == [f"billingAccounts/{ACCOUNT}/budgets/other"]


def test_gcp_dry_run_makes_no_call(run_cli: Callable[..., Any], gcp_cli) -> None:
    server, _fake = gcp_cli
    result = run_cli(*GCP_ARGS, "--budget", "200", "--email", "me@uni.edu", "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert "billing_budgets.create_budget" in result.stdout
    assert server.requests == []


AZURE_ARGS = ("alarm", "--provider", "azure", "--subscription", SUBSCRIPTION)


def test_azure_create_rerun_update_status_delete(run_cli: Callable[..., Any], azure_cli) -> None:
    server, fake = azure_cli
    created = run_cli(*AZURE_ARGS, "--budget", "200", "--email", "me@uni.edu")
    assert created.exit_code == 0, created.stderr
    (key,) = fake.budgets
    assert key == (
        f"/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Consumption/budgets/costguard-monthly"
    )
    props = fake.budgets[key]["properties"]
    assert props["category"] == "Cost"
    assert props["amount"] == 200
    assert props["timeGrain"] == "Monthly"
    assert props["timePeriod"]["startDate"].endswith("-01T00:00:00.000Z") or props["timePeriod"][
        "startDate"
    ].endswith("-01T00:00:00Z")
    kinds = sorted((n["thresholdType"], n["threshold"]) for n in props["notifications"].values())
    assert kinds == [("Actual", 50), ("Actual", 80), ("Actual", 100), ("Forecasted", 100)]
    assert all(n["contactEmails"] == ["me@uni.edu"] for n in props["notifications"].values())
    assert all(n["operator"] == "GreaterThan" for n in props["notifications"].values())
    put = server.writes()[-1]
    assert put.method == "PUT"
    assert "api-version" in put.query

    writes_before = len(server.writes())
    again = run_cli(*AZURE_ARGS, "--budget", "200", "--email", "me@uni.edu")
    assert again.stdout.startswith("No changes"), again.stdout + again.stderr
    assert len(server.writes()) == writes_before

    updated = run_cli(
        *AZURE_ARGS, "--budget", "400", "--email", "me@uni.edu", "--email", "pi@uni.edu"
    )
    assert updated.exit_code == 0, updated.stderr
    props = fake.budgets[key]["properties"]
    assert props["amount"] == 400
    assert all(
        sorted(n["contactEmails"]) == ["me@uni.edu", "pi@uni.edu"]
        for n in props["notifications"].values()
    )

    status = run_cli("alarm", "status", *AZURE_ARGS[1:], "--format", "json").json()
    assert [(b["name"], b["amount_usd"]) for b in status["budgets"]] == [
        ("costguard-monthly", "400")
    ]
    assert run_cli("alarm", "delete", *AZURE_ARGS[1:], "--yes").exit_code == 0
    assert fake.budgets == {}


def test_azure_resource_group_scope(run_cli: Callable[..., Any], azure_cli) -> None:
    _server, fake = azure_cli
    result = run_cli(
        *AZURE_ARGS, "--resource-group", "gpu-rg", "--budget", "50", "--email", "me@uni.edu"
    )
    assert result.exit_code == 0, result.stderr
    (key,) = fake.budgets
    assert key.startswith(f"/subscriptions/{SUBSCRIPTION}/resourceGroups/gpu-rg/providers/")


# ------------------------------------------ what the real services refuse (issue 19)


def test_azure_update_in_a_later_month_keeps_the_start_date(azure_server) -> None:
    """Azure refuses to change a budget's start date ("Start date of budgets cannot be
    updated"): a rerun in a later month sends the start date the budget was created with."""
    from datetime import date

    from costguard.alarms.azure import CONSUMPTION, AzureAlarms
    from costguard.alarms.spec import alarm_spec
    from costguard.settings import Settings

    server, fake = azure_server
    client = azure_clouds.client(
        *CONSUMPTION, SUBSCRIPTION, Settings(azure_endpoint=server.url), **azure_test_kwargs()
    )

    def alarms(today: date) -> AzureAlarms:
        return AzureAlarms(Settings(), SUBSCRIPTION, client=client, today=lambda: today)

    spec = alarm_spec(budget="200", provider="azure", subscription=SUBSCRIPTION,
                      emails=["me@uni.edu"])  # fmt: skip
    november = alarms(date(2026, 11, 17))
    november.apply(spec, november.plan(spec))
    (budget,) = fake.budgets.values()
    assert budget["properties"]["timePeriod"]["startDate"].startswith("2026-11-01")

    bigger = alarm_spec(budget="300", provider="azure", subscription=SUBSCRIPTION,
                        emails=["me@uni.edu"])  # fmt: skip
    december = alarms(date(2026, 12, 3))
    made = december.apply(bigger, december.plan(bigger))
    assert len(made) == 1
    (budget,) = fake.budgets.values()
    assert budget["properties"]["amount"] == 300
    assert budget["properties"]["timePeriod"]["startDate"].startswith("2026-11-01")


def test_gcp_budget_is_in_the_billing_accounts_currency(
    run_cli: Callable[..., Any], gcp_cli
) -> None:
    """A budget's currency must match the billing account's: a EUR account gets a EUR
    budget, and the plan says the amount is not USD."""
    _server, fake = gcp_cli
    fake.currency = "EUR"
    created = run_cli(*GCP_ARGS, "--budget", "200")
    assert created.exit_code == 0, created.stderr
    (budget,) = fake.budgets.values()
    assert budget["amount"]["specifiedAmount"]["currencyCode"] == "EUR"
    assert "EUR" in created.stdout
    again = run_cli(*GCP_ARGS, "--budget", "250")
    assert again.exit_code == 0, again.stderr
    (budget,) = fake.budgets.values()
    assert str(budget["amount"]["specifiedAmount"]["units"]) == "250"
    assert budget["amount"]["specifiedAmount"]["currencyCode"] == "EUR"


def test_gcp_budget_names_longer_than_60_are_refused_before_any_call(
    run_cli: Callable[..., Any], gcp_cli
) -> None:
    server, _fake = gcp_cli
    result = run_cli(*GCP_ARGS, "--budget", "200", "--name", "n" * 51)
    assert result.exit_code == 2
    assert "60" in result.stderr
    assert "Hint:" in result.stderr
    assert server.requests == []
    fits = run_cli(*GCP_ARGS, "--budget", "200", "--name", "n" * 50)
    assert fits.exit_code == 0, fits.stderr


@pytest.mark.parametrize(
    "topic",
    ["budget-alerts", "projects/thesis-1/budget-alerts", "projects/thesis-1/topics/goog-x",
     "projects/Thesis_1/topics/budget-alerts", "topics/budget-alerts",
     "projects/thesis-1/topics/ab"],
)  # fmt: skip
def test_gcp_pubsub_topic_must_be_a_full_topic_name(
    run_cli: Callable[..., Any], gcp_cli, topic: str
) -> None:
    """The Budget API takes ``projects/{p}/topics/{t}`` only: anything else exits 2 with a
    hint before any call (it used to reach the budget create, which the API rejects)."""
    server, fake = gcp_cli
    result = run_cli(*GCP_ARGS, "--budget", "200", "--pubsub-topic", topic)
    assert result.exit_code == 2, result.stderr
    assert "projects/PROJECT/topics/TOPIC" in result.stderr
    assert "Hint:" in result.stderr
    assert server.requests == []
    assert fake.budgets == {}


def test_gcp_pubsub_topic_in_full_reaches_the_budget(run_cli: Callable[..., Any], gcp_cli) -> None:
    _server, fake = gcp_cli
    topic = "projects/thesis-1/topics/budget-alerts"
    created = run_cli(*GCP_ARGS, "--budget", "200", "--pubsub-topic", topic)
    assert created.exit_code == 0, created.stderr
    (budget,) = fake.budgets.values()
    assert budget["notificationsRule"]["pubsubTopic"] == topic


def test_a_pubsub_topic_on_aws_is_refused(run_cli: Callable[..., Any], aws_env: str) -> None:
    topic = "projects/thesis-1/topics/budget-alerts"
    result = run_cli("alarm", "--provider", "aws", "--budget", "200", "--pubsub-topic", topic)
    assert result.exit_code == 2, result.stderr
    assert "GCP" in result.stderr
