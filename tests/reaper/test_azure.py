"""The Azure adapter with the real azure-mgmt clients against the local REST server (conftest)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from costguard.reaper import azure
from costguard.reaper.fleet import judge_fleet, reap
from costguard.reaper.policy import Action, IdlePolicy, ReapLimits, format_timestamp
from costguard.settings import Settings
from costguard.tags import MARK_TAG
from tests.helpers.fleets import PRICES, verdicts
from tests.servers.azure import AZURE_SUBSCRIPTION, AzureServer, AzureVm, put_gpu, seed_vm
from tests.servers.http import (
    FakeTokenCredential,
    azure_client_options,
    every_minute,
    with_test_auth,
)

NOW = datetime.now(UTC).replace(microsecond=0)
pytestmark = pytest.mark.usefixtures("live_now")


def minutes(value: float) -> list[tuple[datetime, float]]:
    return every_minute(NOW, value)


def seed(server: AzureServer, vm: AzureVm, gpu: float | None = 1.0, cpu: float = 1.5) -> None:
    seed_vm(server, vm, NOW, gpu=gpu, cpu=cpu)


@pytest.fixture
def fleet(azure_server: AzureServer) -> AzureServer:
    s = azure_server
    seed(s, s.add(AzureVm("idle-t4", "Standard_NC4as_T4_v3")))
    seed(s, s.add(AzureVm("idle-west", "Standard_NC4as_T4_v3", location="westeurope")))
    seed(s, s.add(AzureVm("busy", "Standard_NC24ads_A100_v4")), gpu=91.0)
    seed(s, s.add(AzureVm("keep", "Standard_NC4as_T4_v3", tags={"costguard:keep": "True"})))
    # Created a month ago, started (again) five minutes ago: young.
    seed(s, s.add(AzureVm("young", "Standard_NC4as_T4_v3", created=NOW - timedelta(days=30),
                          started=NOW - timedelta(minutes=5))))  # fmt: skip
    seed(s, s.add(AzureVm("no-agent", "Standard_NC6s_v3")), gpu=None)
    seed(s, s.add(AzureVm("cpu-only", "Standard_D4s_v5")))
    s.add(AzureVm("powered-off", "Standard_NC4as_T4_v3", power="stopped"))
    s.add(AzureVm("deallocated", "Standard_NC4as_T4_v3", power="deallocated"))
    s.add(AzureVm("other-group", "Standard_NC4as_T4_v3", group="web"))
    return s


def make_fleet(server: AzureServer, **kwargs: Any) -> azure.AzureFleet:
    return azure.AzureFleet(
        AZURE_SUBSCRIPTION,
        PRICES,
        Settings(azure_endpoint=server.url),
        credential=FakeTokenCredential(),
        client_options=azure_client_options(),
        **kwargs,
    )


def policy(**kwargs: Any) -> IdlePolicy:
    return azure.SAMPLING.policy(**kwargs)


def test_dry_run_judges_with_one_platform_call_per_region_and_one_gpu_call_per_gpu_vm(
    fleet: AzureServer,
) -> None:
    report = reap([make_fleet(fleet, resource_group="ml")], policy(), ReapLimits(), NOW,
                  execute=False)  # fmt: skip
    assert verdicts(report) == {
        "idle-t4": ("stop", "idle"),
        "idle-west": ("stop", "idle"),
        "busy": ("keep", "busy"),
        "keep": ("keep", "protect-tag"),
        "young": ("keep", "young"),
        "no-agent": ("keep", "no-gpu-metrics"),
        "cpu-only": ("keep", "no-gpu"),
        "powered-off": ("keep", "not-running"),
    }
    by_name = {v.instance.name: v for v in report.plan.verdicts}
    assert "still allocated and billed" in by_name["powered-off"].reason
    assert "Telegraf" in by_name["no-agent"].reason
    assert by_name["idle-t4"].instance.usd_per_hour == Decimal("0.526")
    metric_calls = fleet.calls("GET", "/Microsoft.Insights/metrics")
    platform = [c for c in metric_calls if "region" in c.query]
    assert sorted(c.query["region"][0] for c in platform) == ["eastus", "westeurope"]
    assert all(int(c.query["top"][0]) >= 10 for c in platform)
    # The custom GPU namespace is read at each GPU VM's own scope, never subscription-wide.
    gpu = [c for c in metric_calls if "region" not in c.query]
    assert {c.query["metricnamespace"][0] for c in gpu} == {azure.GPU_NAMESPACE}
    assert all("/virtualMachines/" in c.path for c in gpu)
    assert "cpu-only" not in {c.path.split("/")[-4] for c in gpu}
    # The model listing (tags, size) and the status-only listing (power states).
    listings = [c for c in fleet.calls("GET", "/virtualMachines") if "/metrics" not in c.path]
    assert sorted(c.query.get("statusOnly", [""])[0] for c in listings) == ["", "true"]
    assert not fleet.calls("POST", "/deallocate")


def test_stop_deallocates_never_powers_off_and_rerun_changes_nothing(fleet: AzureServer) -> None:
    report = reap([make_fleet(fleet)], policy(), ReapLimits(), NOW, execute=True)
    assert all(o.ok for o in report.outcomes), report.outcomes
    deallocated = {c.path.split("/")[-2] for c in fleet.calls("POST", "/deallocate")}
    assert deallocated == {"idle-t4", "idle-west"}
    assert not fleet.calls("POST", "/powerOff")
    assert fleet.vms["idle-t4"].power == "deallocated"
    fleet.requests.clear()
    again = reap([make_fleet(fleet)], policy(), ReapLimits(), NOW, execute=True)
    assert again.outcomes == ()
    assert not fleet.calls("POST", "/deallocate")


def test_terminate_deletes_and_regions_narrow_the_run(fleet: AzureServer) -> None:
    fleets = [make_fleet(fleet, regions=["westeurope"])]
    report = reap(fleets, policy(action=Action.TERMINATE), ReapLimits(), NOW, execute=True)
    assert {o.instance.name for o in report.outcomes if o.ok} == {"idle-west"}
    assert "idle-west" not in fleet.vms
    assert "idle-t4" in fleet.vms


def test_grace_counts_from_the_last_start_never_before_creation(
    azure_server: AzureServer,
) -> None:
    created = NOW - timedelta(days=30)
    vms = {
        "restarted": AzureVm("restarted", "Standard_NC4as_T4_v3", created=created,
                             started=NOW - timedelta(minutes=5)),
        "long-up": AzureVm("long-up", "Standard_NC4as_T4_v3", created=created,
                           started=NOW - timedelta(days=2)),
        "odd-clock": AzureVm("odd-clock", "Standard_NC4as_T4_v3",
                             created=NOW - timedelta(minutes=10),
                             started=NOW - timedelta(days=2)),
    }  # fmt: skip
    for vm in vms.values():
        seed(azure_server, azure_server.add(vm))
    fleet = make_fleet(azure_server)
    started = {i.name: i.launched_at for i in fleet.instances()}
    assert started == {
        "restarted": NOW - timedelta(minutes=5),
        "long-up": NOW - timedelta(days=2),
        "odd-clock": NOW - timedelta(minutes=10),  # a state change before creation: creation
    }
    report = reap([fleet], policy(), ReapLimits(), NOW, execute=False)
    assert verdicts(report) == {
        "restarted": ("keep", "young"),
        "long-up": ("stop", "idle"),
        "odd-clock": ("keep", "young"),
    }


def test_marks_touch_only_the_mark_tag(fleet: AzureServer) -> None:
    azure_fleet = make_fleet(fleet)
    judged = judge_fleet(azure_fleet, policy(two_phase=True), NOW)
    marking = [v.instance for v in judged if v.action is Action.MARK]
    assert {i.name for i in marking} == {"idle-t4", "idle-west"}
    # Someone protects a VM after the listing, before the mark is written.
    fleet.vms["idle-t4"].tags["costguard:keep"] = "true"
    outcomes = azure_fleet.apply(Action.MARK, marking, NOW)
    assert all(o.ok for o in outcomes), outcomes
    mark = format_timestamp(NOW)
    assert fleet.vms["idle-t4"].tags == {"costguard:keep": "true", MARK_TAG: mark}
    assert fleet.vms["idle-west"].tags == {MARK_TAG: mark}
    assert not [r for r in fleet.requests if r.method == "PATCH" and r.path.endswith("idle-t4")]
    (call,) = [r for r in fleet.calls("PATCH", "/tags/default") if "/idle-t4/" in r.path]
    assert call.body == {"operation": "Merge", "properties": {"tags": {MARK_TAG: mark}}}
    # Unmarking deletes the mark it saw, and nothing else, whatever changed since.
    listed = {i.name: i for i in azure_fleet.instances()}
    fleet.vms["idle-t4"].tags["owner"] = "ana"
    outcomes = azure_fleet.apply(Action.UNMARK, [listed["idle-t4"]], NOW)
    assert all(o.ok for o in outcomes), outcomes
    assert fleet.vms["idle-t4"].tags == {"costguard:keep": "true", "owner": "ana"}
    assert not fleet.calls("POST", "/deallocate")


def test_two_phase_run_marks_through_the_tags_api(fleet: AzureServer) -> None:
    reap([make_fleet(fleet)], policy(two_phase=True), ReapLimits(), NOW, execute=True)
    assert MARK_TAG in fleet.vms["idle-t4"].tags
    assert fleet.vms["keep"].tags == {"costguard:keep": "True"}
    assert not fleet.calls("POST", "/deallocate")


def test_busy_vms_elsewhere_in_the_region_do_not_crowd_out_the_idle_ones(
    fleet: AzureServer,
) -> None:
    # A subscription-scope query returns the busiest `top` series of every VM in the
    # region; twelve busy VMs of another team must not push ours out of the reply.
    for n in range(12):
        seed(fleet, fleet.add(AzureVm(f"web-{n}", "Standard_D4s_v5", group="web")),
             gpu=90.0, cpu=90.0)  # fmt: skip
    report = reap([make_fleet(fleet, resource_group="ml")], policy(), ReapLimits(), NOW,
                  execute=False)  # fmt: skip
    assert verdicts(report)["idle-t4"] == ("stop", "idle")
    assert verdicts(report)["busy"] == ("keep", "busy")
    eastus = [c for c in fleet.calls("GET", "/Microsoft.Insights/metrics")
              if c.query.get("region") == ["eastus"]]  # fmt: skip
    in_eastus = sum(1 for vm in fleet.vms.values() if vm.location == "eastus")
    assert eastus
    assert all(int(c.query["top"][0]) >= in_eastus for c in eastus)


def test_a_burst_in_the_minute_that_holds_the_window_start_keeps_the_vm(
    azure_server: AzureServer,
) -> None:
    # Azure stamps a minute with its start: the burst stamped 30 s before the window
    # began lasted into it.
    vm = azure_server.add(AzureVm("burst", "Standard_NC4as_T4_v3"))
    seed(azure_server, vm, gpu=None)
    start = NOW - timedelta(minutes=60)
    gpu = [(start - timedelta(seconds=30), 97.0)]
    gpu += [(start + timedelta(seconds=30 + 60 * k), 1.0) for k in range(60)]
    put_gpu(azure_server, vm, 0, gpu)
    report = reap([make_fleet(azure_server)], policy(), ReapLimits(), NOW, execute=False)
    (verdict,) = report.plan.verdicts
    assert (verdict.action, verdict.code) == ("keep", "busy")
    assert "gpu 97%" in verdict.reason


def test_every_gpu_of_a_multi_gpu_vm_is_its_own_witness(azure_server: AzureServer) -> None:
    """Telegraf writes one series per GPU (dimension ``index``); the adapter asks Azure
    Monitor to split by it, so a GPU that went silent 40 minutes ago (busy until then), or
    one never heard from in the window, keeps the VM: the maximum across GPUs, which the
    service returns without a split, filled the window with the other GPU's idle minutes
    (issue 28)."""
    s = azure_server
    two = "Standard_NC48ads_A100_v4"  # two A100s in the price tables
    busy = s.add(AzureVm("one-busy", two))
    seed(s, busy, gpu=None)
    put_gpu(s, busy, 0, minutes(1.0))
    put_gpu(s, busy, 1, minutes(88.0))
    silent = s.add(AzureVm("went-silent", two))
    seed(s, silent, gpu=None)
    put_gpu(s, silent, 0, minutes(1.0))
    put_gpu(s, silent, 1, [(t, v) for t, v in minutes(98.0) if t < NOW - timedelta(minutes=40)])
    unheard = s.add(AzureVm("never-heard", two))
    seed(s, unheard, gpu=None)
    put_gpu(s, unheard, 0, minutes(1.0))
    seed(s, s.add(AzureVm("idle-two", two)))
    report = reap([make_fleet(s)], policy(idle_minutes=30), ReapLimits(), NOW, execute=False)
    assert verdicts(report) == {
        "one-busy": ("keep", "busy"),
        "went-silent": ("keep", "metrics-doubt"),
        "never-heard": ("keep", "metrics-doubt"),
        "idle-two": ("stop", "idle"),
    }
    gpu_calls = [
        c for c in s.calls("GET", "/Microsoft.Insights/metrics") if "region" not in c.query
    ]
    assert {c.query["$filter"][0] for c in gpu_calls} == {f"{azure.GPU_DIMENSION} eq '*'"}


def test_a_gpu_numbered_past_the_size_the_tables_lack_counts(azure_server: AzureServer) -> None:
    """An N-series size the tables lack counts one GPU; GPU 1 publishing says there are two,
    so GPU 0, silent the whole window (not returned at all), is unknown, not absent."""
    vm = azure_server.add(AzureVm("new-size", "Standard_NC8ads_Z1000_v9"))
    seed(azure_server, vm, gpu=None)
    put_gpu(azure_server, vm, 1, minutes(1.0))
    report = reap([make_fleet(azure_server)], policy(), ReapLimits(), NOW, execute=False)
    assert verdicts(report) == {"new-size": ("keep", "metrics-doubt")}


def test_gpu_series_without_the_index_dimension_are_not_judged(
    azure_server: AzureServer,
) -> None:
    """A Telegraf that drops the ``index`` tag publishes series the split cannot name: the
    service refuses the dimension (validateDimensions), and the VM is kept, with the reason."""
    vm = azure_server.add(AzureVm("no-index", "Standard_NC4as_T4_v3"))
    seed(azure_server, vm, gpu=None)
    azure_server.put(azure.GPU_NAMESPACE, azure.GPU_METRIC, vm, minutes(1.0), {"host": "x"})
    report = reap([make_fleet(azure_server)], policy(), ReapLimits(), NOW, execute=False)
    (verdict,) = report.plan.verdicts
    assert (verdict.action, verdict.code) == ("keep", "no-gpu-metrics")
    assert f"{azure.GPU_DIMENSION} dimension" in verdict.reason


def test_missing_gpu_namespace_is_explained(azure_server: AzureServer) -> None:
    seed(azure_server, azure_server.add(AzureVm("lonely", "Standard_NC4as_T4_v3")), gpu=None)
    report = reap([make_fleet(azure_server)], policy(), ReapLimits(), NOW, execute=False)
    (verdict,) = report.plan.verdicts
    assert verdict.code == "no-gpu-metrics"
    assert "namespace does not exist" in verdict.reason


def test_cli_refuses_over_the_limit(
    fleet: AzureServer, run_cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CLI builds clients the production way; only the test's auth override is added.
    monkeypatch.setattr(azure, "AzureFleet", with_test_auth(azure.AzureFleet))
    monkeypatch.setenv("COSTGUARD_AZURE_ENDPOINT", fleet.url)
    args = ("reap", "--provider", "azure", "--subscription", AZURE_SUBSCRIPTION)
    result = run_cli(*args, "--execute", "--max-actions", "1")
    assert result.exit_code == 1
    assert "over the max-actions limit of 1" in result.stderr
    assert not fleet.calls("POST", "/deallocate")


# ------------------------------------------ protection never read from missing data (issue 19)


def test_protection_comes_from_the_model_listing(azure_server: AzureServer) -> None:
    """``listAll?statusOnly=true`` is not trusted for tags (modelled null, as reported): the
    keep tag, the size and the priority come from the model listing."""
    vm = azure_server.add(AzureVm("kept", "Standard_NC4as_T4_v3", spot=True,
                                  tags={"costguard:keep": "true"}))  # fmt: skip
    seed(azure_server, vm)
    report = reap([make_fleet(azure_server)], policy(), ReapLimits(), NOW, execute=False)
    (verdict,) = report.plan.verdicts
    assert (str(verdict.action), str(verdict.code)) == ("keep", "protect-tag")
    assert verdict.instance.instance_type == "Standard_NC4as_T4_v3"
    assert verdict.instance.spot is True


def test_a_vm_seen_by_one_listing_only_is_not_judged(
    azure_server: AzureServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Created or deleted between the two listings: without its model (tags) the VM is
    left alone this run, never judged on missing protection data."""
    seed(azure_server, azure_server.add(AzureVm("listed", "Standard_NC4as_T4_v3")))
    late = azure_server.add(AzureVm("late", "Standard_NC4as_T4_v3"))
    seed(azure_server, late)
    real = azure_server.list_all

    def model_without_late(request: Any, match: Any) -> Any:
        status, body, headers = real(request, match)
        if request.query.get("statusOnly") != ["true"]:
            body = {"value": [v for v in body["value"] if v["name"] != "late"]}
        return status, body, headers

    monkeypatch.setattr(azure_server, "list_all", model_without_late)
    report = reap([make_fleet(azure_server)], policy(), ReapLimits(), NOW, execute=True)
    assert {v.instance.name for v in report.plan.verdicts} == {"listed"}
    assert azure_server.vms["late"].power == "running"
