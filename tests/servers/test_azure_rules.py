"""Each rule of ``definitions/azure.json``, sent wrong through the real Azure SDK clients:
the strict fakes must refuse it the way the service does (status, error code, message),
and answer the right request as the definitions describe."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.servers.azure import (
    RULES,
    SUBSCRIPTION,
    ArmServer,
    AzureServer,
    AzureVm,
    ConsumptionFake,
)
from tests.servers.http import FakeTokenCredential, JsonServer, azure_client_options

GROUP = "costguard-jobs"
EAST_SUBNET = (
    f"/subscriptions/{SUBSCRIPTION}/resourceGroups/net/providers/Microsoft.Network/"
    "virtualNetworks/lab/subnets/jobs"
)


@pytest.fixture
def arm(arm_server: ArmServer) -> ArmServer:
    """The session's ARM fake (tests/conftest.py), reset for this test."""
    return arm_server


@pytest.fixture
def compute(arm: ArmServer) -> Any:
    from azure.mgmt.compute import ComputeManagementClient

    return ComputeManagementClient(
        FakeTokenCredential(), SUBSCRIPTION, base_url=arm.url, **azure_client_options()
    )


def vm_body(location: str = "eastus", subnet: str = EAST_SUBNET, **os_profile: Any) -> Any:
    profile = {
        "computerName": "vm-1",
        "adminUsername": "azureuser",
        "customData": base64.b64encode(b"#!/bin/bash\ntrue\n").decode(),
        "linuxConfiguration": {"disablePasswordAuthentication": True},
        **os_profile,
    }
    nic = {"name": "vm-1-nic", "properties": {"primary": True, "ipConfigurations": [
        {"name": "ipconfig1", "properties": {"subnet": {"id": subnet}}}]}}  # fmt: skip
    return {
        "location": location,
        "tags": {"costguard:job": "run-1"},
        "properties": {
            "hardwareProfile": {"vmSize": "Standard_NC4as_T4_v3"},
            "osProfile": profile,
            "networkProfile": {"networkInterfaceConfigurations": [nic]},
        },
    }


def create(compute: Any, body: Any, name: str = "vm-1") -> Any:
    return compute.virtual_machines.begin_create_or_update(GROUP, name, body).result(timeout=30)


def refused(call: Any) -> Any:
    from azure.core.exceptions import HttpResponseError

    with pytest.raises(HttpResponseError) as caught:
        call()
    return caught.value


def test_listing_a_group_with_instance_views_needs_a_scale_set_filter(compute: Any) -> None:
    create(compute, vm_body())
    error = refused(lambda: list(compute.virtual_machines.list(GROUP, expand="instanceView")))
    rule = RULES["list_expand_needs_filter"]
    assert (error.status_code, error.error.code) == (rule["status"], rule["code"])
    assert error.error.message == rule["message"]
    assert [vm.name for vm in compute.virtual_machines.list(GROUP)] == ["vm-1"]
    scale_set = (f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}/providers/"
                 "Microsoft.Compute/virtualMachineScaleSets/pool")  # fmt: skip
    listed = compute.virtual_machines.list(
        GROUP, expand="instanceView", filter=f"'virtualMachineScaleSet/id' eq '{scale_set}'"
    )
    assert isinstance(list(listed), list)


def test_a_subnet_of_another_region_is_an_invalid_reference(compute: Any) -> None:
    error = refused(lambda: create(compute, vm_body(location="westus")))
    assert (error.status_code, error.error.code) == (400, "InvalidResourceReference")
    assert EAST_SUBNET in error.error.message
    assert create(compute, vm_body()).name == "vm-1"


def test_more_than_50_tags_are_refused(compute: Any) -> None:
    body = vm_body()
    body["tags"] = {f"t{n}": "v" for n in range(RULES["max_tags"]["limit"] + 1)}
    error = refused(lambda: create(compute, body))
    assert error.status_code == 400
    body["tags"] = {f"t{n}": "v" for n in range(RULES["max_tags"]["limit"])}
    create(compute, body)


def test_custom_data_over_65535_bytes_is_refused(compute: Any) -> None:
    limit = RULES["custom_data_max_bytes"]["limit"]
    too_big = base64.b64encode(b"x" * (limit + 1)).decode()
    error = refused(lambda: create(compute, vm_body(customData=too_big)))
    assert (error.status_code, error.error.code) == (400, "InvalidParameter")
    create(compute, vm_body(customData=base64.b64encode(b"x" * limit).decode()))


@pytest.mark.parametrize("user", [*RULES["admin_username"]["disallowed"][:6], "Root", "x" * 65])
def test_disallowed_admin_usernames_are_refused(compute: Any, user: str) -> None:
    error = refused(lambda: create(compute, vm_body(adminUsername=user)))
    assert (error.status_code, error.error.code) == (400, "InvalidParameter")


@pytest.mark.parametrize(
    ("field", "value"),
    [("customData", base64.b64encode(b"#!/bin/bash\nfalse\n").decode()), ("adminUsername", "bob")],
)
def test_custom_data_and_admin_username_cannot_change(compute: Any, field: str, value: str) -> None:
    create(compute, vm_body())
    error = refused(lambda: create(compute, vm_body(**{field: value})))
    assert (error.status_code, error.error.code) == (409, "PropertyChangeNotAllowed")
    assert field in error.error.message
    create(compute, vm_body())  # the same body again is an update ARM accepts


def test_sku_restrictions_come_as_location_and_zone(arm: ArmServer, compute: Any) -> None:
    arm.location_restricted.add(("eastus", "Standard_NC4as_T4_v3"))
    kinds = {
        str(getattr(r.type, "value", r.type))
        for sku in compute.resource_skus.list(filter="location eq 'eastus'")
        for r in sku.restrictions or []
    }
    assert kinds == set(RULES["sku_restriction_types"]["values"])


# ------------------------------------------------------------- reaper: listAll, metrics


@pytest.fixture
def fleet(azure_server: AzureServer) -> AzureServer:
    """The session's reaper fake (tests/conftest.py), reset for this test."""
    return azure_server


def clients(server: AzureServer) -> tuple[Any, Any]:
    from azure.mgmt.compute import ComputeManagementClient
    from azure.mgmt.monitor import MonitorManagementClient

    options = azure_client_options()
    credential = FakeTokenCredential()
    return (
        ComputeManagementClient(credential, SUBSCRIPTION, base_url=server.url, **options),
        MonitorManagementClient(credential, SUBSCRIPTION, base_url=server.url, **options),
    )


def test_status_only_listing_carries_no_model(fleet: AzureServer) -> None:
    fleet.add(AzureVm("gpu", "Standard_NC4as_T4_v3", tags={"costguard:keep": "true"}))
    compute, _monitor = clients(fleet)
    (status,) = compute.virtual_machines.list_all(status_only="true")
    assert status.instance_view.statuses[1].code == "PowerState/running"
    assert status.tags is None
    assert status.hardware_profile is None
    (model,) = compute.virtual_machines.list_all()
    assert model.tags == {"costguard:keep": "true"}
    assert model.hardware_profile.vm_size == "Standard_NC4as_T4_v3"
    error = refused(lambda: list(compute.virtual_machines.list_all(expand="instanceView")))
    assert error.error.code == RULES["list_expand_needs_filter"]["code"]


def minutes(value: float, now: datetime) -> list[tuple[datetime, float]]:
    return [(now - timedelta(seconds=30 + 60 * k), value) for k in range(10)]


def test_subscription_metrics_spell_the_resource_id_as_the_spec_and_keep_no_order(
    fleet: AzureServer,
) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    busy = fleet.add(AzureVm("b-busy", "Standard_D4s_v5"))
    idle = fleet.add(AzureVm("a-idle", "Standard_D4s_v5"))
    fleet.put("Microsoft.Compute/virtualMachines", "Percentage CPU", busy, minutes(90.0, now))
    fleet.put("Microsoft.Compute/virtualMachines", "Percentage CPU", idle, minutes(1.0, now))
    _compute, monitor = clients(fleet)
    reply = monitor.metrics.list_at_subscription_scope(
        region="eastus",
        timespan=f"{(now - timedelta(minutes=15)).isoformat()}/{now.isoformat()}",
        interval="PT1M",
        metricnames="Percentage CPU",
        aggregation="Maximum",
        filter="Microsoft.ResourceId eq '*'",
        metricnamespace="Microsoft.Compute/virtualMachines",
        top=1,
    )
    (metric,) = reply.value
    (series,) = metric.timeseries  # top=1: one series, not necessarily the busiest
    (owner,) = series.metadatavalues
    assert owner.name.value == RULES["metrics_resource_id_dimension"]["spelling"]
    assert owner.value == idle.resource_id.lower()
    point = series.data[0]
    assert point.maximum is not None
    assert point.total is None  # only the aggregations asked for


def test_custom_namespaces_only_at_a_resources_scope(fleet: AzureServer) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    vm = fleet.add(AzureVm("gpu", "Standard_NC4as_T4_v3"))
    fleet.put("Telegraf/nvidia_smi", "utilization_gpu", vm, minutes(55.0, now))
    _compute, monitor = clients(fleet)
    timespan = f"{(now - timedelta(minutes=15)).isoformat()}/{now.isoformat()}"
    error = refused(
        lambda: monitor.metrics.list_at_subscription_scope(
            region="eastus",
            timespan=timespan,
            metricnames="utilization_gpu",
            aggregation="Maximum",
            filter="Microsoft.ResourceId eq '*'",
            metricnamespace="Telegraf/nvidia_smi",
        )
    )
    assert (error.status_code, error.error.code) == (400, "BadRequest")
    reply = monitor.metrics.list(
        vm.resource_id.lstrip("/"), timespan=timespan, metricnames="utilization_gpu",
        aggregation="Maximum", metricnamespace="Telegraf/nvidia_smi",
    )  # fmt: skip
    assert {d.maximum for d in reply.value[0].timeseries[0].data} == {55.0}


# ------------------------------------------------------------------ consumption budgets


@pytest.fixture
def budgets() -> Iterator[Any]:
    from azure.mgmt.consumption import ConsumptionManagementClient

    server = JsonServer(ConsumptionFake())
    try:
        yield ConsumptionManagementClient(
            FakeTokenCredential(), SUBSCRIPTION, base_url=server.url, **azure_client_options()
        )
    finally:
        server.stop()


def budget(start: str, amount: float = 200) -> dict[str, Any]:
    return {"properties": {"category": "Cost", "amount": amount, "timeGrain": "Monthly",
                           "timePeriod": {"startDate": start}}}  # fmt: skip


def test_a_budgets_start_date_never_changes(budgets: Any) -> None:
    scope = f"/subscriptions/{SUBSCRIPTION}"
    budgets.budgets.create_or_update(scope, "b", budget("2026-11-01T00:00:00Z"))
    error = refused(
        lambda: budgets.budgets.create_or_update(scope, "b", budget("2026-12-01T00:00:00Z", 300))
    )
    rule = RULES["budget_start_date_immutable"]
    assert (error.status_code, error.error.message) == (rule["status"], rule["message"])
    budgets.budgets.create_or_update(scope, "b", budget("2026-11-01T00:00:00Z", 300))


def test_a_budget_starts_on_the_first_of_a_month(budgets: Any) -> None:
    scope = f"/subscriptions/{SUBSCRIPTION}"
    error = refused(
        lambda: budgets.budgets.create_or_update(scope, "b", budget("2026-11-17T00:00:00Z"))
    )
    assert error.status_code == RULES["budget_start_date_first_of_month"]["status"]


def test_a_linux_computer_name_over_64_characters_is_refused(compute: Any) -> None:
    error = refused(lambda: create(compute, vm_body(computerName="n" * 65)))
    assert (error.status_code, error.error.code) == (400, "InvalidParameter")


def test_a_budget_has_at_most_five_notifications(budgets: Any) -> None:
    scope = f"/subscriptions/{SUBSCRIPTION}"
    body = budget("2026-11-01T00:00:00Z")
    note = {"enabled": True, "operator": "GreaterThan", "contactEmails": ["me@uni.edu"]}
    body["properties"]["notifications"] = {f"n{k}": {**note, "threshold": 10 * k}
                                           for k in range(1, 7)}  # fmt: skip
    error = refused(lambda: budgets.budgets.create_or_update(scope, "b", body))
    assert error.status_code == 400
    body["properties"]["notifications"].pop("n6")
    budgets.budgets.create_or_update(scope, "b", body)
