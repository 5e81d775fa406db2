"""`costguard burn` on GCP and Azure, through the reaper's cloud adapters and the same
local REST servers (conftest): the real google and azure clients, prices from the tables."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from costguard.pricing.catalog import Catalog, Market
from costguard.reaper import azure
from tests.servers.azure import AZURE_SUBSCRIPTION, AzureServer, AzureVm
from tests.servers.gcp import GCP_PROJECT, GcpServer, GcpVm
from tests.servers.http import with_test_auth


def price(
    catalog: Catalog,
    provider: str,
    region: str,
    kind: str,
    market: Market,
    accelerator: str | None = None,
) -> Decimal:
    (row,) = [
        i
        for i in catalog.instances
        if (i.provider, i.region, i.instance_type) == (provider, region, kind)
        and (accelerator is None or i.accelerator == accelerator)
    ]
    value = row.usd_per_hour(market)
    assert value is not None
    return value


def test_burn_on_gcp(
    gcp_server: GcpServer,
    run_cli: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    catalog: Catalog,
) -> None:
    from google.auth.credentials import AnonymousCredentials

    from costguard.clouds import gcp as gcp_clouds

    monkeypatch.setattr(gcp_clouds, "default_credentials", AnonymousCredentials)
    monkeypatch.setenv("COSTGUARD_GCP_ENDPOINT", gcp_server.url)
    gcp_server.add(GcpVm("l4", "us-central1-a", "g2-standard-4", "201", "nvidia-l4", 1))
    gcp_server.add(
        GcpVm("l4-spot", "us-central1-b", "g2-standard-4", "202", "nvidia-l4", 1, spot=True)
    )
    gcp_server.add(
        GcpVm("off", "us-central1-a", "g2-standard-4", "203", "nvidia-l4", 1, status="TERMINATED")
    )
    result = run_cli(
        "burn", "--provider", "gcp", "--project", GCP_PROJECT, "--budget", "100", "--format", "json"
    )
    assert result.exit_code == 1, result.stderr  # two L4s for a month pass $100
    doc = result.json()
    assert sorted(i["instance_id"] for i in doc["instances"]) == ["201", "202"]
    expected = price(catalog, "gcp", "us-central1", "g2-standard-4", Market.ON_DEMAND) + price(
        catalog, "gcp", "us-central1", "g2-standard-4", Market.SPOT
    )
    assert Decimal(doc["usd_per_hour"]) == expected
    assert Decimal(doc["spent_this_month_usd"]) > 0  # launched three hours ago
    assert "over the budget of $100.00" in result.stderr


def test_burn_gives_gcp_launch_times_in_utc_as_on_the_other_clouds(
    gcp_server: GcpServer, run_cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compute Engine writes its timestamps in Pacific time (``-08:00``); burn's launch
    times are UTC on every cloud, so its rows sort and read alike."""
    from google.auth.credentials import AnonymousCredentials

    from costguard.clouds import gcp as gcp_clouds

    monkeypatch.setattr(gcp_clouds, "default_credentials", AnonymousCredentials)
    monkeypatch.setenv("COSTGUARD_GCP_ENDPOINT", gcp_server.url)
    started = datetime(2026, 12, 1, 3, 30, tzinfo=UTC)
    gcp_server.add(
        GcpVm("l4", "us-central1-a", "g2-standard-4", "201", "nvidia-l4", 1, started=started)
    )
    result = run_cli("burn", "--provider", "gcp", "--project", GCP_PROJECT, "--format", "json")
    (instance,) = result.json()["instances"]
    assert instance["launched_at"] == "2026-12-01T03:30:00+00:00"
    table = run_cli("burn", "--provider", "gcp", "--project", GCP_PROJECT)
    assert "2026-12-01 03:30" in table.stdout


def test_burn_on_azure(
    azure_server: AzureServer,
    run_cli: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    catalog: Catalog,
) -> None:
    monkeypatch.setattr(azure, "AzureFleet", with_test_auth(azure.AzureFleet))
    monkeypatch.setenv("COSTGUARD_AZURE_ENDPOINT", azure_server.url)
    azure_server.add(AzureVm("t4", "Standard_NC4as_T4_v3"))
    azure_server.add(AzureVm("parked", "Standard_NC4as_T4_v3", power="deallocated"))
    result = run_cli(
        "burn",
        "--provider",
        "azure",
        "--subscription",
        AZURE_SUBSCRIPTION,
        "--budget",
        "100000",
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert [i["instance_type"] for i in doc["instances"]] == ["Standard_NC4as_T4_v3"]
    assert Decimal(doc["usd_per_hour"]) == price(
        catalog, "azure", "eastus", "Standard_NC4as_T4_v3", Market.ON_DEMAND
    )
    assert doc["over_budget"] is False


def test_burn_gcp_needs_a_project(run_cli: Callable[..., Any]) -> None:
    result = run_cli("burn", "--provider", "gcp", "--budget", "10")
    assert result.exit_code == 2
    assert "--project" in result.stderr
