"""Each rule of ``definitions/gcp.json``, sent wrong through the real Google clients: the
strict fakes must refuse it the way the service does, and answer the right request as the
definitions describe (Monitoring has no REST client in google-cloud-monitoring, so its
calls go through google-auth's ``AuthorizedSession``, as costguard's own do)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.servers.gcp import (
    GCP_PROJECT,
    PROJECT_NUMBER,
    RULES,
    BudgetsFake,
    ComputeServer,
    GcpServer,
    GcpVm,
)
from tests.servers.http import JsonServer

ACCOUNT = "billingAccounts/012345-6789AB-CDEF01"


def options(url: str) -> dict[str, Any]:
    from google.auth.credentials import AnonymousCredentials

    return {
        "credentials": AnonymousCredentials(),
        "client_options": {"api_endpoint": url},
        "transport": "rest",
    }


# ------------------------------------------------------------------------------ budgets


@pytest.fixture
def budgets() -> Iterator[tuple[Any, BudgetsFake]]:
    from google.cloud.billing.budgets_v1 import BudgetServiceClient

    fake = BudgetsFake()
    server = JsonServer(fake)
    try:
        yield BudgetServiceClient(**options(server.url)), fake
    finally:
        server.stop()


def budget(name: str = "costguard-monthly", currency: str | None = None, **extra: Any) -> Any:
    money: dict[str, Any] = {"units": 200}
    if currency:
        money["currency_code"] = currency
    return {"display_name": name, "amount": {"specified_amount": money}, **extra}


def test_a_display_name_over_60_characters_is_refused(budgets: tuple[Any, BudgetsFake]) -> None:
    from google.api_core.exceptions import BadRequest

    client, _fake = budgets
    limit = RULES["budget_display_name_length"]["limit"]
    with pytest.raises(BadRequest):
        client.create_budget(parent=ACCOUNT, budget=budget("n" * (limit + 1)))
    assert client.create_budget(parent=ACCOUNT, budget=budget("n" * limit)).display_name


def test_the_currency_is_the_billing_accounts(budgets: tuple[Any, BudgetsFake]) -> None:
    from google.api_core.exceptions import BadRequest

    client, fake = budgets
    fake.currency = "EUR"
    with pytest.raises(BadRequest, match="currency"):
        client.create_budget(parent=ACCOUNT, budget=budget(currency="USD"))
    made = client.create_budget(parent=ACCOUNT, budget=budget())  # left out: the account's
    assert made.amount.specified_amount.currency_code == "EUR"  # "provided on output"
    fake.currency = "USD"  # an update must match the budget's, not the account's
    with pytest.raises(BadRequest, match="currency"):
        client.update_budget(
            budget={**budget(currency="USD"), "name": made.name},
            update_mask={"paths": ["amount"]},
        )


def test_projects_come_back_by_number(budgets: tuple[Any, BudgetsFake]) -> None:
    client, _fake = budgets
    made = client.create_budget(
        parent=ACCOUNT, budget=budget(budget_filter={"projects": [f"projects/{GCP_PROJECT}"]})
    )
    assert list(made.budget_filter.projects) == [f"projects/{PROJECT_NUMBER}"]


def test_resource_manager_names_a_project_by_number() -> None:
    from google.auth.credentials import AnonymousCredentials
    from google.auth.transport.requests import AuthorizedSession

    server = JsonServer(BudgetsFake())
    try:
        session = AuthorizedSession(AnonymousCredentials())
        answer = session.get(f"{server.url}/v3/projects/{GCP_PROJECT}", timeout=10).json()
        assert answer["name"] == f"projects/{PROJECT_NUMBER}"
        assert session.get(f"{server.url}/v3/projects/nope", timeout=10).status_code == 403
    finally:
        server.stop()


# ------------------------------------------------------------------------------ compute


@pytest.fixture
def instances(compute_server: ComputeServer) -> Any:
    from google.cloud.compute_v1 import InstancesClient

    return InstancesClient(**options(compute_server.url))


def insert(instances: Any, name: str, request_id: str) -> Any:
    from google.cloud import compute_v1

    instance = compute_v1.Instance(
        name=name,
        machine_type="zones/us-central1-a/machineTypes/n1-standard-4",
        scheduling=compute_v1.Scheduling(instance_termination_action="DELETE"),
    )
    request = compute_v1.InsertInstanceRequest(
        project=GCP_PROJECT,
        zone="us-central1-a",
        instance_resource=instance,
        request_id=request_id,
    )
    return instances.insert_unary(request=request)


def test_a_repeated_request_id_creates_nothing(
    compute_server: ComputeServer, instances: Any
) -> None:
    request_id = str(uuid.uuid4())
    first = insert(instances, "vm-a", request_id)
    again = insert(instances, "vm-b", request_id)  # another body, the same request id
    assert again.name == first.name
    assert set(compute_server.vms) == {"vm-a"}
    insert(instances, "vm-b", str(uuid.uuid4()))
    assert set(compute_server.vms) == {"vm-a", "vm-b"}


def test_a_quota_refusal_is_an_immediate_403(compute_server: ComputeServer, instances: Any) -> None:
    from google.api_core.exceptions import Forbidden

    compute_server.quota_exceeded = True
    with pytest.raises(Forbidden) as caught:
        insert(instances, "vm-a", str(uuid.uuid4()))
    assert "Quota 'GPUS_ALL_REGIONS' exceeded" in caught.value.message
    assert [e.get("reason") for e in caught.value.errors] == ["quotaExceeded"]
    assert compute_server.vms == {}


def bulk_insert(instances: Any, names: list[str], least: int) -> Any:
    from google.cloud import compute_v1

    resource = compute_v1.BulkInsertInstanceResource(
        count=len(names),
        min_count=least,
        instance_properties=compute_v1.InstanceProperties(machine_type="n1-standard-4"),
        per_instance_properties={
            n: compute_v1.BulkInsertInstanceResourcePerInstanceProperties(name=n) for n in names
        },
    )
    request = compute_v1.BulkInsertInstanceRequest(
        project=GCP_PROJECT, zone="us-central1-a", bulk_insert_instance_resource_resource=resource
    )
    return instances.bulk_insert_unary(request=request)


def test_a_bulk_insert_whose_min_count_does_not_fit_creates_nothing(
    compute_server: ComputeServer, instances: Any
) -> None:
    assert RULES["bulk_insert_min_count"]["quote"].startswith("The minimum number")
    compute_server.room["us-central1-a"] = 2
    failed = bulk_insert(instances, ["vm-a", "vm-b", "vm-c"], least=3)
    assert [e.code for e in failed.error.errors] == ["ZONE_RESOURCE_POOL_EXHAUSTED"]
    assert compute_server.vms == {}
    done = bulk_insert(instances, ["vm-a", "vm-b", "vm-c"], least=2)  # as many as fit
    assert not done.error.errors
    assert len(compute_server.vms) == 2


def test_set_metadata_needs_the_current_fingerprint(
    compute_server: ComputeServer, instances: Any
) -> None:
    from google.api_core.exceptions import PreconditionFailed
    from google.cloud import compute_v1

    insert(instances, "vm-a", str(uuid.uuid4()))
    current = instances.get(project=GCP_PROJECT, zone="us-central1-a", instance="vm-a")
    items = [compute_v1.Items(key="k", value="v")]
    stale = compute_v1.Metadata(fingerprint="not-the-current-one", items=items)
    with pytest.raises(PreconditionFailed):
        instances.set_metadata_unary(project=GCP_PROJECT, zone="us-central1-a", instance="vm-a",
                                     metadata_resource=stale)  # fmt: skip
    fresh = compute_v1.Metadata(fingerprint=current.metadata.fingerprint, items=items)
    instances.set_metadata_unary(project=GCP_PROJECT, zone="us-central1-a", instance="vm-a",
                                 metadata_resource=fresh)  # fmt: skip
    assert compute_server.vms["vm-a"].body["metadata"]["items"] == [{"key": "k", "value": "v"}]


def test_a_zone_without_the_type_refuses_at_once_and_lists_it_not(
    compute_server: ComputeServer, instances: Any
) -> None:
    from google.api_core.exceptions import BadRequest
    from google.cloud.compute_v1 import AggregatedListMachineTypesRequest, MachineTypesClient

    compute_server.lacking.add(("us-central1-a", "n1-standard-4"))
    with pytest.raises(BadRequest) as caught:
        insert(instances, "vm-a", str(uuid.uuid4()))
    assert [e.get("reason") for e in caught.value.errors] == [
        RULES["zone_without_the_type"]["reason"]
    ]
    assert "does not exist in zone 'us-central1-a'" in caught.value.message
    assert compute_server.vms == {}
    listing = MachineTypesClient(**options(compute_server.url)).aggregated_list(
        request=AggregatedListMachineTypesRequest(
            project=GCP_PROJECT, filter='name = "n1-standard-4"'
        )
    )
    offered = {scope for scope, scoped in listing if scoped.machine_types}
    assert "zones/us-central1-a" not in offered
    assert "zones/us-central1-b" in offered


def test_a_stop_of_a_vm_with_local_ssds_must_say_what_becomes_of_them(
    gcp_server: GcpServer,
) -> None:
    from google.api_core.exceptions import BadRequest
    from google.cloud.compute_v1 import InstancesClient, StopInstanceRequest

    gcp_server.add(GcpVm("a3", "us-central1-a", "a3-highgpu-8g", "8", local_ssds=16))
    gcp_server.add(GcpVm("g2", "us-central1-a", "g2-standard-4", "9", "nvidia-l4", 1))
    client = InstancesClient(**options(gcp_server.url))
    where = {"project": GCP_PROJECT, "zone": "us-central1-a"}
    with pytest.raises(BadRequest, match="discardLocalSsd"):
        client.stop_unary(request=StopInstanceRequest(**where, instance="a3"))
    assert gcp_server.vms["a3"].status == "RUNNING"
    client.stop_unary(request=StopInstanceRequest(**where, instance="g2"))  # none: optional
    client.stop_unary(request=StopInstanceRequest(**where, instance="a3", discard_local_ssd=True))
    assert gcp_server.vms["a3"].status == "TERMINATED"


# --------------------------------------------------------------------------- monitoring


NOW = datetime.now(UTC).replace(second=0, microsecond=0)


def series(server: GcpServer, metric: str, **aggregation: str) -> Any:
    from google.auth.credentials import AnonymousCredentials
    from google.auth.transport.requests import AuthorizedSession

    params = {
        "filter": f'metric.type = "{metric}" AND resource.type = "gce_instance"',
        "interval.startTime": (NOW - timedelta(minutes=5)).isoformat(),
        "interval.endTime": NOW.isoformat(),
        **{f"aggregation.{k}": v for k, v in aggregation.items()},
    }
    return AuthorizedSession(AnonymousCredentials()).get(
        f"{server.url}/v3/projects/{GCP_PROJECT}/timeSeries", params=params, timeout=10
    )


@pytest.fixture
def monitoring(gcp_server: GcpServer) -> GcpServer:
    """The session's fake (tests/conftest.py), reset, with one A2 VM's metrics."""
    gcp_server.add(GcpVm("vm", "us-central1-a", "a2-highgpu-2g", "7"))
    points = [(NOW - timedelta(seconds=30 + 60 * k), 6000.0) for k in range(4)]
    gcp_server.put("compute.googleapis.com/instance/network/received_bytes_count", "7", points)
    for gpu, value in (("0", 5.0), ("1", 80.0)):
        gcp_server.put(
            "agent.googleapis.com/gpu/utilization",
            "7",
            [(t, value) for t, _ in points],
            label=gpu,
        )
    return gcp_server


def test_align_rate_turns_a_delta_count_into_a_double_rate(monitoring: GcpServer) -> None:
    reply = series(
        monitoring,
        "compute.googleapis.com/instance/network/received_bytes_count",
        alignmentPeriod="60s",
        perSeriesAligner="ALIGN_RATE",
    ).json()
    (only,) = reply["timeSeries"]
    assert only["valueType"] == "DOUBLE"
    assert {p["value"]["doubleValue"] for p in only["points"]} == {100.0}  # 6000 B / 60 s
    raw = series(monitoring, "compute.googleapis.com/instance/network/received_bytes_count")
    (unaligned,) = raw.json()["timeSeries"]
    assert unaligned["valueType"] == "INT64"
    assert unaligned["points"][0]["value"] == {"int64Value": "6000"}


def test_align_rate_is_invalid_on_a_gauge(monitoring: GcpServer) -> None:
    reply = series(
        monitoring,
        "agent.googleapis.com/gpu/utilization",
        alignmentPeriod="60s",
        perSeriesAligner="ALIGN_RATE",
    )
    assert reply.status_code == 400
    assert reply.json()["error"]["status"] == "INVALID_ARGUMENT"


def test_a_reducer_needs_an_aligner(monitoring: GcpServer) -> None:
    reply = series(
        monitoring, "agent.googleapis.com/gpu/utilization", crossSeriesReducer="REDUCE_MAX"
    )
    assert reply.status_code == 400


def test_reduce_max_grouped_by_instance_gives_the_busiest_gpu(monitoring: GcpServer) -> None:
    ungrouped = series(
        monitoring,
        "agent.googleapis.com/gpu/utilization",
        alignmentPeriod="60s",
        perSeriesAligner="ALIGN_MAX",
    ).json()
    assert len(ungrouped["timeSeries"]) == 2  # one per GPU
    grouped = series(
        monitoring,
        "agent.googleapis.com/gpu/utilization",
        alignmentPeriod="60s",
        perSeriesAligner="ALIGN_MAX",
        crossSeriesReducer="REDUCE_MAX",
        groupByFields="resource.label.instance_id",
    ).json()
    (only,) = grouped["timeSeries"]
    assert {p["value"]["doubleValue"] for p in only["points"]} == {80.0}
    ends = [p["interval"]["endTime"] for p in only["points"]]
    assert ends == sorted(ends, reverse=True)  # newest first
    assert ends[0] == NOW.strftime("%Y-%m-%dT%H:%M:%SZ")  # periods end at the interval's end


@pytest.mark.parametrize("name", ["Run-1", "1run", "run-", "r" * 64])
def test_instance_names_follow_rfc1035(instances: Any, name: str) -> None:
    from google.api_core.exceptions import BadRequest

    with pytest.raises(BadRequest):
        insert(instances, name, str(uuid.uuid4()))


@pytest.mark.parametrize(
    "labels", [{"Owner": "x"}, {"owner": "Alice@Uni"}, {f"k{n}": "v" for n in range(65)}]
)
def test_labels_follow_the_documented_limits(
    compute_server: ComputeServer, instances: Any, labels: dict[str, str]
) -> None:
    from google.api_core.exceptions import BadRequest
    from google.cloud import compute_v1

    instance = compute_v1.Instance(
        name="vm-a", machine_type="zones/us-central1-a/machineTypes/n1-standard-4", labels=labels
    )
    request = compute_v1.InsertInstanceRequest(
        project=GCP_PROJECT, zone="us-central1-a", instance_resource=instance
    )
    with pytest.raises(BadRequest):
        instances.insert_unary(request=request)
    assert compute_server.vms == {}


def test_at_most_five_channels_per_budget(budgets: tuple[Any, BudgetsFake]) -> None:
    from google.api_core.exceptions import BadRequest

    client, _fake = budgets
    channels = [f"projects/{GCP_PROJECT}/notificationChannels/{n}" for n in range(6)]
    with pytest.raises(BadRequest):
        client.create_budget(
            parent=ACCOUNT,
            budget=budget(notifications_rule={"monitoring_notification_channels": channels}),
        )
    client.create_budget(
        parent=ACCOUNT,
        budget=budget(notifications_rule={"monitoring_notification_channels": channels[:5]}),
    )
