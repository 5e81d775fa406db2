"""The GCP adapter with the real google clients against the local REST server (conftest)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from costguard.errors import CostguardError
from costguard.reaper import gcp
from costguard.reaper.fleet import reap
from costguard.reaper.policy import Action, IdlePolicy, ReapLimits, Signal
from costguard.settings import Settings
from tests.helpers.fleets import PRICES, verdicts
from tests.servers.gcp import GCP_PROJECT, GcpServer, GcpVm, seed_vm
from tests.servers.http import every_minute

NOW = datetime.now(UTC).replace(microsecond=0)
pytestmark = pytest.mark.usefixtures("live_now")


def minutes(value: float) -> list[tuple[datetime, float]]:
    return every_minute(NOW, value)


def seed(server: GcpServer, vm: GcpVm, gpu: float | None = 1.0, cpu: float = 0.01) -> None:
    seed_vm(server, vm, NOW, gpu=gpu, cpu=cpu)


@pytest.fixture
def fleet(gcp_server: GcpServer) -> GcpServer:
    s = gcp_server
    seed(s, s.add(GcpVm("idle-l4", "us-central1-a", "g2-standard-4", "101", "nvidia-l4", 1)))
    seed(s, s.add(GcpVm("spot-t4", "us-central1-b", "n1-highmem-8", "102", "nvidia-tesla-t4", 2,
                        spot=True)))  # fmt: skip
    seed(s, s.add(GcpVm("busy-a100", "us-central1-a", "a2-highgpu-1g", "103")), gpu=97.0)
    keep = GcpVm("keep", "us-central1-a", "g2-standard-4", "104", "nvidia-l4", 1,
                 labels={"costguard-keep": "true"})  # fmt: skip
    seed(s, s.add(keep))
    seed(s, s.add(GcpVm("protected", "us-central1-a", "g2-standard-4", "105", "nvidia-l4", 1,
                        deletion_protection=True)))  # fmt: skip
    seed(s, s.add(GcpVm("no-agent", "us-central1-a", "n1-standard-8", "106", "nvidia-tesla-t4",
                        1)), gpu=None)  # fmt: skip
    seed(s, s.add(GcpVm("cpu-only", "us-central1-a", "n1-highmem-8", "107")))
    seed(s, s.add(GcpVm("stopped", "us-central1-a", "g2-standard-4", "108", "nvidia-l4", 1,
                        status="TERMINATED")))  # fmt: skip
    seed(s, s.add(GcpVm("elsewhere", "europe-west4-a", "g2-standard-4", "109", "nvidia-l4", 1)))
    return s


def make_fleet(server: GcpServer, **kwargs: Any) -> gcp.GcpFleet:
    from google.auth.credentials import AnonymousCredentials

    return gcp.GcpFleet(
        GCP_PROJECT,
        PRICES,
        Settings(gcp_endpoint=server.url),
        credentials=AnonymousCredentials(),
        **kwargs,
    )


def policy(**kwargs: Any) -> IdlePolicy:
    return gcp.SAMPLING.policy(**kwargs)


def test_dry_run_judges_with_four_monitoring_calls(fleet: GcpServer) -> None:
    report = reap([make_fleet(fleet)], policy(), ReapLimits(), NOW, execute=False)
    assert verdicts(report) == {
        "idle-l4": ("stop", "idle"),
        "spot-t4": ("stop", "idle"),
        "busy-a100": ("keep", "busy"),
        "keep": ("keep", "protect-tag"),
        "protected": ("keep", "termination-protected"),
        "no-agent": ("keep", "no-gpu-metrics"),
        "cpu-only": ("keep", "no-gpu"),
        "elsewhere": ("stop", "idle"),
    }
    by_name = {v.instance.name: v for v in report.plan.verdicts}
    assert by_name["busy-a100"].instance.accelerator == "A100"  # from the A2 family
    assert by_name["idle-l4"].instance.usd_per_hour == Decimal("0.70683")
    assert by_name["spot-t4"].instance.usd_per_hour == Decimal("0.54196")  # spot, 2 x T4 row
    assert "Ops Agent" in by_name["no-agent"].reason
    # CPU arrives as a fraction of 1 and is shown in percent.
    assert by_name["idle-l4"].peaks[Signal.CPU] == pytest.approx(1.0)
    series_calls = fleet.calls("GET", "/timeSeries")
    assert len(series_calls) == 4
    for call in series_calls:
        assert call.query["aggregation.alignmentPeriod"] == ["60s"]
        if gcp.GPU_METRIC in call.query["filter"][0]:  # one series per GPU (issue 28)
            assert call.query["aggregation.crossSeriesReducer"] == ["REDUCE_NONE"]
            assert "aggregation.groupByFields" not in call.query
        else:
            assert call.query["aggregation.groupByFields"] == ["resource.label.instance_id"]
    assert len(fleet.calls("GET", "/aggregated/instances")) == 1
    assert not fleet.calls("POST", "/stop")
    assert not fleet.calls("DELETE", "/instances/")


def test_execute_stops_then_rerun_changes_nothing(fleet: GcpServer) -> None:
    fleets = [make_fleet(fleet, regions=["us-central1"])]
    report = reap(fleets, policy(), ReapLimits(), NOW, execute=True)
    assert all(o.ok for o in report.outcomes), report.outcomes
    stopped = {c.path.split("/")[-2] for c in fleet.calls("POST", "/stop")}
    assert stopped == {"idle-l4", "spot-t4"}  # not "elsewhere": other region
    assert fleet.vms["idle-l4"].status == "TERMINATED"
    assert report.usd_per_hour_saved == Decimal("0.70683") + Decimal("0.54196")
    fleet.requests.clear()
    again = reap([make_fleet(fleet, regions=["us-central1"])], policy(), ReapLimits(), NOW,
                 execute=True)  # fmt: skip
    assert again.outcomes == ()
    assert not fleet.calls("POST", "/stop")


def test_a_stop_discards_local_ssds_which_the_api_requires(gcp_server: GcpServer) -> None:
    # a3-highgpu-8g comes with 16 Local SSDs: a stop without discardLocalSsd is a 400.
    vm = GcpVm("idle-a3", "us-central1-a", "a3-highgpu-8g", "301", local_ssds=16)
    seed(gcp_server, gcp_server.add(vm))
    report = reap([make_fleet(gcp_server)], policy(), ReapLimits(), NOW, execute=True)
    assert [(o.instance.name, o.ok) for o in report.outcomes] == [("idle-a3", True)], report
    (call,) = gcp_server.calls("POST", "/stop")
    assert call.query["discardLocalSsd"] == ["true"]
    assert vm.status == "TERMINATED"


def test_terminate_deletes_and_zones_limit_the_listing(fleet: GcpServer) -> None:
    fleets = [make_fleet(fleet, zones=["us-central1-a"])]
    report = reap(fleets, policy(action=Action.TERMINATE), ReapLimits(), NOW, execute=True)
    assert {o.instance.name for o in report.outcomes if o.ok} == {"idle-l4"}
    assert "idle-l4" not in fleet.vms
    assert fleet.calls("GET", "/zones/us-central1-a/instances")
    assert not fleet.calls("GET", "/aggregated/instances")


def test_mark_writes_a_label_gcp_accepts(fleet: GcpServer) -> None:
    fleets = [make_fleet(fleet, regions=["us-central1"])]
    reap(fleets, policy(two_phase=True), ReapLimits(), NOW, execute=True)
    label = fleet.vms["idle-l4"].labels["costguard-idle-since"]
    assert label == str(int(NOW.timestamp()))
    assert not fleet.calls("POST", "/stop")


def test_cli_reaches_the_server_through_the_endpoint_setting(
    fleet: GcpServer, run_cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from google.auth.credentials import AnonymousCredentials

    from costguard.clouds import gcp as gcp_clouds

    monkeypatch.setattr(gcp_clouds, "default_credentials", AnonymousCredentials)
    monkeypatch.setenv("COSTGUARD_GCP_ENDPOINT", fleet.url)
    result = run_cli("reap", "--provider", "gcp", "--project", GCP_PROJECT, "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert doc["summary"]["selected"] == 3
    assert not fleet.calls("POST", "/stop")


def test_time_series_pages_are_followed(fleet: GcpServer) -> None:
    fleet.page_size = 2
    report = reap([make_fleet(fleet)], policy(), ReapLimits(), NOW, execute=False)
    assert verdicts(report)["idle-l4"] == ("stop", "idle")
    assert verdicts(report)["busy-a100"] == ("keep", "busy")
    assert len(fleet.calls("GET", "/timeSeries")) > 4


def test_a_page_token_handed_out_twice_ends_the_run(fleet: GcpServer) -> None:
    fleet.stuck_token = "again"
    with pytest.raises(CostguardError, match="page token 'again' twice"):
        reap([make_fleet(fleet)], policy(), ReapLimits(), NOW, execute=False)
    assert len(fleet.calls("GET", "/timeSeries")) == 2
    assert not fleet.calls("POST", "/stop")


@pytest.mark.parametrize(("silent_for", "code"), [(4.5, "too-few-samples"), (2.5, "idle")])
def test_a_point_stands_for_the_minute_that_ends_at_its_end_time(
    fleet: GcpServer, silent_for: float, code: str
) -> None:
    """The Ops Agent stopped writing a while ago; CPU and network go on. Cloud Monitoring
    aligns the raw points into minutes that end at the query's end time and stamps each
    with its end; the newest point's minute ended there, so silence is measured from it
    (a point 4.5 minutes old lies in the minute that ended 4 minutes ago)."""
    vm = fleet.add(GcpVm("agent", "us-central1-a", "g2-standard-4", "110", "nvidia-l4", 1))
    seed(fleet, vm, gpu=None)
    last = NOW - timedelta(minutes=silent_for)
    fleet.put(gcp.GPU_METRIC, "110", [(t, v) for t, v in minutes(1.0) if t <= last])
    report = reap([make_fleet(fleet)], policy(), ReapLimits(), NOW, execute=False)
    verdict = {v.instance.name: v for v in report.plan.verdicts}["agent"]
    assert verdict.code == code
    if code != "idle":
        assert f"newest gpu sample ends {int(silent_for)} min before now" in verdict.reason


def test_operations_are_polled_on_the_configured_endpoint(fleet: GcpServer) -> None:
    """The stop answers RUNNING; the fleet polls zoneOperations.get on the same (local)
    endpoint until DONE. The SDK's own extended-operation polling would go to
    compute.googleapis.com instead, which a private endpoint (or this test) cannot reach."""
    fleet.done_on_poll = 3
    fleets = [make_fleet(fleet, regions=["us-central1"], poll_interval_s=0.01)]
    report = reap(fleets, policy(), ReapLimits(), NOW, execute=True)
    assert {o.instance.name for o in report.outcomes if o.ok} == {"idle-l4", "spot-t4"}
    assert fleet.operation_polls == {"operation-stop-idle-l4": 3, "operation-stop-spot-t4": 3}
    for call in fleet.calls("GET", "/operations/"):
        assert call.path.startswith(f"/compute/v1/projects/{GCP_PROJECT}/zones/us-central1-")


def test_an_operation_that_never_finishes_is_a_failed_outcome_in_bounded_time(
    fleet: GcpServer,
) -> None:
    fleet.done_on_poll = None  # never DONE
    fleets = [
        make_fleet(fleet, zones=["us-central1-a"], poll_interval_s=0.05, operation_timeout_s=0.5)
    ]
    report = reap(fleets, policy(), ReapLimits(), NOW, execute=True)
    (outcome,) = report.outcomes
    assert outcome.instance.name == "idle-l4"
    assert not outcome.ok
    assert "not done after 0.5 s" in outcome.message
    assert 1 <= len(fleet.calls("GET", "/operations/")) <= 10


# ------------------------------------------ the aggregation the adapter asks for (issue 19)


def test_every_gpu_of_a_multi_gpu_vm_is_its_own_witness(gcp_server: GcpServer) -> None:
    """The Ops Agent writes one series per GPU; the adapter reads each (no reducer across
    GPUs), so one busy GPU of two keeps the VM, and so does a GPU whose series went silent:
    with REDUCE_MAX the other GPU's quiet minutes filled the window (issue 28)."""
    busy = gcp_server.add(GcpVm("two-gpus", "us-central1-a", "a2-highgpu-2g", "120"))
    seed(gcp_server, busy, gpu=None)
    gcp_server.put(gcp.GPU_METRIC, "120", minutes(1.0), label="0")
    gcp_server.put(gcp.GPU_METRIC, "120", minutes(88.0), label="1")
    silent = gcp_server.add(GcpVm("silent-gpu", "us-central1-a", "a2-highgpu-2g", "122"))
    seed(gcp_server, silent, gpu=None)
    gcp_server.put(gcp.GPU_METRIC, "122", minutes(1.0), label="0")
    stopped = [(t, v) for t, v in minutes(98.0) if t < NOW - timedelta(minutes=40)]
    gcp_server.put(gcp.GPU_METRIC, "122", stopped, label="1")
    idle = gcp_server.add(GcpVm("idle-two", "us-central1-a", "a2-highgpu-2g", "123"))
    seed(gcp_server, idle, gpu=None)
    for label in ("0", "1"):
        gcp_server.put(gcp.GPU_METRIC, "123", minutes(1.0), label=label)
    report = reap([make_fleet(gcp_server)], policy(idle_minutes=30), ReapLimits(), NOW,
                  execute=False)  # fmt: skip
    assert verdicts(report) == {
        "two-gpus": ("keep", "busy"),
        "silent-gpu": ("keep", "metrics-doubt"),
        "idle-two": ("stop", "idle"),
    }


def test_network_is_a_rate_of_the_byte_counts(gcp_server: GcpServer) -> None:
    """The byte counts are DELTA metrics: ALIGN_RATE turns a minute's count into bytes per
    second (60 MB a minute each way: 1 MB/s, 16 Mbit/s together), which keeps the VM."""
    gcp_server.add(GcpVm("downloading", "us-central1-a", "g2-standard-4", "121",
                              "nvidia-l4", 1))  # fmt: skip
    gcp_server.put(gcp.GPU_METRIC, "121", minutes(1.0))
    gcp_server.put(gcp.CPU_METRIC, "121", minutes(0.01))
    gcp_server.put(gcp.RECEIVED_METRIC, "121", minutes(60_000_000.0))
    gcp_server.put(gcp.SENT_METRIC, "121", minutes(60_000_000.0))
    report = reap([make_fleet(gcp_server)], policy(), ReapLimits(), NOW, execute=False)
    verdict = {v.instance.name: v for v in report.plan.verdicts}["downloading"]
    assert (str(verdict.action), str(verdict.code)) == ("keep", "busy")
    assert "16" in verdict.reason
