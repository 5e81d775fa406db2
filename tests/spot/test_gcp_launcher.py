"""The GCP launcher with the real google-cloud-compute client (REST) against a local server
speaking the documented Compute Engine shapes: ``instances.insert`` / ``get`` / ``delete``
/ ``aggregatedList`` (label filter), ``zoneOperations.get`` / ``list`` (system events)."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from costguard.checkpoint.checkpointer import Checkpointer
from costguard.checkpoint.store import Store
from costguard.errors import CostguardError, InputError
from costguard.settings import Settings
from costguard.spot.controller import Controller
from costguard.spot.job import Job
from costguard.spot.launcher.base import CapacityError, Handle, LaunchSpec, Market, Offer, State
from costguard.spot.launcher.gcp import GcpLauncher
from costguard.spot.recovery import AttemptOutcome, Launch
from costguard.spot.report import summary_lines
from tests.contract.test_launcher import _job as contract_job
from tests.servers.gcp import LAUNCH_OPTIONS as OPTIONS
from tests.servers.gcp import PROJECT, ComputeServer, ComputeVm

EXPIRES = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.fixture
def server(compute_server: ComputeServer) -> ComputeServer:
    return compute_server


@pytest.fixture
def launcher(gcp_launcher: GcpLauncher) -> GcpLauncher:
    return gcp_launcher


def spec(job_id: str = "Run-1", **options: str) -> LaunchSpec:
    return LaunchSpec(
        job_id=job_id,
        checkpoint_url=f"gs://ckpt/costguard/{job_id}",
        command=("python", "train.py", "--lr", "3e-4"),
        owner="alice@uni.edu",
        expires_at=EXPIRES,
        idle_minutes=45,
        sync_dir="out",
        options={**OPTIONS, **options},
    )


def offer(instance_type: str = "n1-highmem-8", gpu: str = "T4", count: int = 2,
          market: Market = Market.SPOT, zone: str = "us-central1-b") -> Offer:  # fmt: skip
    return Offer("gcp", "us-central1", instance_type, market, Decimal("0.5"), gpu, count, zone)


def inserted(server: ComputeServer) -> dict[str, Any]:
    (call,) = server.calls("POST", "/instances")
    return dict(call.body)


def test_launch_inserts_a_labelled_spot_vm_with_its_gpus(
    server: ComputeServer, launcher: GcpLauncher
) -> None:
    handle = launcher.launch(offer(), spec(), attempt=2)
    vm_id = server.vms["costguard-run-1-2"].id
    assert handle == Handle("gcp", "us-central1", "costguard-run-1-2", "us-central1-b",
                            {"project": PROJECT, "id": vm_id, "attempt": "2"})  # fmt: skip
    body = inserted(server)
    assert body["machineType"] == "zones/us-central1-b/machineTypes/n1-highmem-8"
    assert body["scheduling"] == {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
    }
    assert body["guestAccelerators"] == [
        {"acceleratorType": "zones/us-central1-b/acceleratorTypes/nvidia-tesla-t4",
         "acceleratorCount": 2}
    ]  # fmt: skip
    assert body["labels"] == {
        "costguard-job": "run-1",
        "costguard-owner": "alice-uni-edu",
        "costguard-attempt": "2",
        "costguard-expires-at": str(int(EXPIRES.timestamp())),
        "costguard-idle-minutes": "45",
    }
    (disk,) = body["disks"]
    assert disk["autoDelete"] is True
    assert disk["boot"] is True
    assert disk["initializeParams"]["labels"] == body["labels"]
    assert body["serviceAccounts"] == [
        {"email": OPTIONS["service_account"],
         "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}
    ]  # fmt: skip
    (item,) = body["metadata"]["items"]
    assert item["key"] == "startup-script"
    assert "export COSTGUARD_JOB_ATTEMPT=2" in item["value"]
    assert "--cloud gcp --sync-dir out -- python train.py" in item["value"]
    # The insert was waited for: its operation was polled until DONE.
    assert server.calls("GET", "/operations/operation-")
    (call,) = server.calls("POST", "/instances")
    assert call.query["requestId"]


def test_built_in_gpus_and_on_demand(server: ComputeServer, launcher: GcpLauncher) -> None:
    launcher.launch(offer("a2-highgpu-1g", "A100", 1, Market.ON_DEMAND), spec(), attempt=1)
    body = inserted(server)
    assert "guestAccelerators" not in body or body["guestAccelerators"] == []
    assert body["scheduling"]["provisioningModel"] == "STANDARD"
    assert "instanceTerminationAction" not in body["scheduling"]
    assert body["scheduling"]["onHostMaintenance"] == "TERMINATE"


def test_status_tells_a_preemption_from_a_deletion(
    server: ComputeServer, launcher: GcpLauncher
) -> None:
    handle = launcher.launch(offer(), spec(), attempt=1)
    status = launcher.status(handle)
    assert status.state is State.RUNNING
    assert status.launched_at == datetime(2026, 12, 1, 3, 0, tzinfo=UTC)
    server.preempt(handle.instance_id)  # termination action DELETE: the VM is gone
    status = launcher.status(handle)
    assert status.state is State.PREEMPTED
    assert status.detail == "Instance was preempted."
    other = launcher.launch(offer(), spec("run-2"), attempt=1)
    launcher.terminate(other)
    assert launcher.status(other).state is State.MISSING


def test_a_stopped_spot_vm(server: ComputeServer, launcher: GcpLauncher) -> None:
    handle = launcher.launch(offer(), spec(termination_action="stop"), attempt=1)
    assert inserted(server)["scheduling"]["instanceTerminationAction"] == "STOP"
    server.preempt(handle.instance_id)
    assert launcher.status(handle).state is State.PREEMPTED
    other = launcher.launch(offer(), spec("run-2", termination_action="STOP"), attempt=1)
    server.vms[other.instance_id].status = "TERMINATED"  # stopped by a person or the reaper
    assert launcher.status(other).state is State.STOPPED


def test_find_and_idempotent_terminate(server: ComputeServer, launcher: GcpLauncher) -> None:
    first = launcher.launch(offer(), spec(), attempt=1)
    launcher.launch(offer(), spec("run-2"), attempt=1)
    assert launcher.find("run-1") == [
        replace(first, extra={**first.extra, "owner": "alice-uni-edu"})
    ]
    (call,) = server.calls("GET", "/aggregated/instances")
    assert call.query["filter"] == ['labels.costguard-job = "run-1"']
    launcher.terminate(first)
    assert first.instance_id not in server.vms
    launcher.terminate(first)  # already gone: fine
    assert launcher.find("run-1") == []
    # Issue 28: "Run-1" and "run-1" would be one label value, so one job's controller
    # would take the other's VMs for its strays; only the strict grammar is asked for.
    with pytest.raises(InputError, match="not a costguard job id"):
        launcher.find("Run-1")
    assert len(server.calls("GET", "/aggregated/instances")) == 2


def test_a_retried_launch_reuses_the_vm(server: ComputeServer, launcher: GcpLauncher) -> None:
    first = launcher.launch(offer(), spec(), attempt=1)
    again = launcher.launch(offer(), spec(), attempt=1)
    assert again.instance_id == first.instance_id
    assert len(server.vms) == 1


def test_a_full_zone_is_a_capacity_error(server: ComputeServer, launcher: GcpLauncher) -> None:
    server.full_zones.add("us-central1-b")
    with pytest.raises(CapacityError) as caught:
        launcher.launch(offer(), spec(), attempt=1)
    assert caught.value.code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert caught.value.place == "gcp/us-central1/us-central1-b"


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"project": ""}, "needs the project option"),
        ({"project": "My Lab"}, "not a GCP project id"),
        ({"image": ""}, "needs the image option"),
        ({"service_account": ""}, "needs the service_account option"),
        ({"service_account": "me@gmail.com"}, "not a service account"),
        ({"zone": "us-central1"}, "not a GCP zone"),
        ({"termination_action": "hibernate"}, "termination_action"),
        ({"disk_gb": "5"}, "disk_gb"),
    ],
)
def test_bad_options_fail_before_any_call(
    server: ComputeServer, options: dict[str, str], fragment: str
) -> None:
    from google.auth.credentials import AnonymousCredentials

    launcher = GcpLauncher(Settings(gcp_endpoint=server.url), credentials=AnonymousCredentials())
    with pytest.raises(InputError, match=fragment) as caught:
        launcher.launch(offer(), spec(**options), attempt=1)
    assert caught.value.hint
    assert server.requests == []


def test_gpus_that_cannot_be_attached(server: ComputeServer, launcher: GcpLauncher) -> None:
    with pytest.raises(InputError, match="no L4 accelerator"):
        launcher.launch(offer("n1-standard-8", "L4", 1), spec(), attempt=1)
    with pytest.raises(InputError, match="TPU"):
        launcher.launch(offer("tpu-v3-8", "tpu-v3-8", 1), spec(), attempt=1)
    with pytest.raises(InputError, match="not in region"):
        launcher.launch(offer(zone="europe-west4-a"), spec(), attempt=1)
    assert server.requests == []


def test_zones_come_from_the_region(server: ComputeServer, launcher: GcpLauncher) -> None:
    assert launcher.zones("us-central1", "n1-highmem-8") == [
        "us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f",
    ]  # fmt: skip
    (call,) = server.calls("GET", "/regions/us-central1")
    assert call.path == f"/compute/v1/projects/{PROJECT}/regions/us-central1"
    assert launcher.zones("mars-north1") == []  # unknown region: the provider places it
    server.regions["us-central1"] = ("DOWN", ["us-central1-a"])
    assert launcher.zones("us-central1") == []
    # A zone option pins the zone.
    from google.auth.credentials import AnonymousCredentials

    pinned = GcpLauncher(Settings(gcp_endpoint=server.url), project=PROJECT,
                         credentials=AnonymousCredentials(),
                         options={"zone": "us-central1-f"})  # fmt: skip
    assert pinned.zones("us-central1") == ["us-central1-f"]
    assert pinned.zones("europe-west4") == []


def test_no_price_cap_reaches_gcp(server: ComputeServer, launcher: GcpLauncher) -> None:
    """GCP Spot VMs have no maximum price: --max-price filters offers only, and the insert
    is the same with or without it."""
    from dataclasses import replace

    launcher.launch(offer(), replace(spec(), max_usd_per_hour=Decimal("0.2")), attempt=1)
    capped = inserted(server)
    server.reset()
    launcher.launch(offer(), spec(), attempt=1)
    assert capped == inserted(server)
    assert "price" not in str(capped["scheduling"]).lower()


# ------------------------------------------ what the real service does (issue 19)


def test_an_immediate_quota_refusal_is_no_capacity(
    server: ComputeServer, launcher: GcpLauncher
) -> None:
    """Compute Engine refuses an insert over quota at once with HTTP 403 (reason
    ``quotaExceeded``); the SDK raises Forbidden. That is a place without room, so recovery
    moves on, not a permissions failure."""
    server.quota_exceeded = True
    with pytest.raises(CapacityError) as caught:
        launcher.launch(offer(), spec(), attempt=1)
    assert caught.value.code == "QUOTA_EXCEEDED"
    assert "GPUS_ALL_REGIONS" in str(caught.value)
    assert caught.value.place == "gcp/us-central1/us-central1-b"


def test_any_other_403_stops_and_says_so(
    server: ComputeServer, launcher: GcpLauncher, monkeypatch: pytest.MonkeyPatch
) -> None:
    def forbid(request: Any, match: Any) -> Any:
        message = "Required 'compute.instances.create' permission for 'projects/lab-project'"
        errors = [{"message": message, "domain": "global", "reason": "forbidden"}]
        error = {"code": 403, "message": message, "status": "PERMISSION_DENIED", "errors": errors}
        return 403, {"error": error}, {}

    monkeypatch.setattr(server, "insert", forbid)
    with pytest.raises(CostguardError, match="refused") as caught:
        launcher.launch(offer(), spec(), attempt=1)
    assert not isinstance(caught.value, CapacityError)
    assert caught.value.hint
    assert "infra/gcp" in caught.value.hint


def test_a_reused_job_id_gets_a_new_vm(server: ComputeServer, launcher: GcpLauncher) -> None:
    """Compute Engine answers a request id it has seen with that request's old operation
    and creates nothing: a job id used again (after its VM is gone) must still get a VM."""
    first = launcher.launch(offer(), spec(), attempt=1)
    launcher.terminate(first)
    assert server.vms == {}
    again = launcher.launch(offer(), spec(), attempt=1)
    assert again.instance_id in server.vms
    ids = [c.query["requestId"][0] for c in server.calls("POST", "/instances")]
    assert len(ids) == 2
    assert len(set(ids)) == 2


@pytest.mark.parametrize("event", ["terminateOnHostMaintenance", "hostError"])
@pytest.mark.parametrize("market", [Market.SPOT, Market.ON_DEMAND])
def test_a_vm_stopped_by_the_host_is_taken_by_the_provider_not_stopped(
    server: ComputeServer, launcher: GcpLauncher, event: str, market: Market
) -> None:
    # GPU VMs run with onHostMaintenance=TERMINATE: host maintenance (or a failed host)
    # stops them, and Compute Engine logs it as a system event.
    handle = launcher.launch(offer(market=market), spec(), attempt=1)
    assert inserted(server)["scheduling"]["onHostMaintenance"] == "TERMINATE"
    server.host_maintenance(handle.instance_id, event)
    status = launcher.status(handle)
    assert status.state is State.PREEMPTED
    assert "host" in status.detail
    (call,) = [c for c in server.calls("GET", "/operations") if "filter" in c.query]
    assert f'"compute.instances.{event}"' in call.query["filter"][0]


def test_zones_lacking_the_machine_type_are_left_out(
    server: ComputeServer, launcher: GcpLauncher
) -> None:
    server.lacking |= {("us-central1-a", "a3-highgpu-8g"), ("us-central1-f", "a3-highgpu-8g")}
    assert launcher.zones("us-central1", "a3-highgpu-8g") == ["us-central1-b", "us-central1-c"]
    (call,) = server.calls("GET", "/aggregated/machineTypes")
    assert call.query["filter"] == ['name = "a3-highgpu-8g"']
    assert launcher.zones("us-central1", "n1-highmem-8") == [
        "us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f",
    ]  # fmt: skip
    server.lacking |= {(f"us-central1-{z}", "g2-standard-4") for z in "abcf"}
    assert launcher.zones("us-central1", "g2-standard-4") == []


@pytest.mark.parametrize("missing", ["n1-highmem-8", "nvidia-tesla-t4"])
def test_a_zone_without_the_type_is_a_capacity_error_of_that_zone(
    server: ComputeServer, launcher: GcpLauncher, missing: str
) -> None:
    # Compute Engine answers 400 invalid at once; another zone may well have the type.
    server.lacking.add(("us-central1-b", missing))
    with pytest.raises(CapacityError) as caught:
        launcher.launch(offer(), spec(), attempt=1)
    assert caught.value.place == "gcp/us-central1/us-central1-b"
    assert "does not exist in zone" in caught.value.message
    assert server.vms == {}
    handle = launcher.launch(offer(zone="us-central1-c"), spec(), attempt=1)
    assert handle.zone == "us-central1-c"


# -- a VM stopped by the provider keeps billing its disk: deleted once a checkpoint holds the work


def stopped_job(
    server: ComputeServer, launcher: GcpLauncher, tmp_path: Path, *, checkpoint: bool,
    take: str = "maintenance", **options: str,
) -> tuple[Job, list[str], str]:  # fmt: skip
    """A job whose attempt 1 ran in the fake and was stopped by Compute Engine (``take``:
    host maintenance, or a preemption of a VM whose termination action is STOP), with a
    complete checkpoint in its store or none; the job after the controller's reconcile,
    its events, and the VM's name."""
    url = f"file://{tmp_path / 'ckpt'}"
    if checkpoint:
        saver = Checkpointer(url)
        saver.save(40, block=True, extra={"x": 1})
        saver.close()
    job_spec = contract_job("gcp", "T4", 2, "us-central1", url, options={**OPTIONS, **options})
    store = Store.open(url)
    events: list[str] = []
    controller = Controller(
        store, launcher, [offer()], on_event=lambda e: events.append(f"{e.kind}: {e.message}")
    )
    job = controller.launch(Job(job_spec), Launch(offer(), 1, "cheapest"))
    assert job.attempts[0].handle is not None, events
    name = job.attempts[0].handle.instance_id
    {"maintenance": server.host_maintenance, "preempt": server.preempt}[take](name)
    return controller.reconcile(job), events, name


def test_a_vm_stopped_by_host_maintenance_is_deleted_once_a_checkpoint_holds_its_work(
    server: ComputeServer, launcher: GcpLauncher, tmp_path: Path
) -> None:
    """Issue 27: host maintenance stops a GPU VM (status TERMINATED) and its boot disk
    bills on; the next attempt runs elsewhere. Once the store's latest checkpoint is
    complete, the stopped VM (provably the job's: its label and id) is deleted."""
    job, events, name = stopped_job(server, launcher, tmp_path, checkpoint=True)
    assert job.attempts[0].outcome is AttemptOutcome.PREEMPTED
    assert server.vms == {}
    assert len(server.calls("DELETE", f"/instances/{name}")) == 1
    assert any(e.startswith(f"cleanup: deleted {name}") for e in events), events
    assert job.kept_stopped == ()


def test_a_stopped_vm_without_a_checkpoint_is_kept_and_reported_with_its_disk_cost(
    server: ComputeServer, launcher: GcpLauncher, tmp_path: Path
) -> None:
    """No complete checkpoint holds the attempt's work: the VM is kept (its disk may be
    all there is), and job.json, the events and ``jobs status`` say what it bills."""
    job, events, name = stopped_job(server, launcher, tmp_path, checkpoint=False)
    assert server.vms[name].status == "TERMINATED"
    assert server.calls("DELETE", "/instances/") == []
    (kept,) = job.kept_stopped
    # 100 GB of pd-balanced at the bundled $0.10 per GiB-month: 93.13 GiB
    assert f"{name} in us-central1-b: 100 GB of disk, about $9.31/month" in kept
    assert f"gcloud compute instances delete {name} --zone us-central1-b" in kept
    assert any(e.startswith(f"kept: {name}") for e in events), events
    lines = summary_lines(job, [offer()], time.time(), None)
    assert any(kept in line for line in lines), lines


@pytest.mark.parametrize("whose", ["label", "id"])
def test_a_stopped_vm_not_provably_the_jobs_is_left_alone(
    server: ComputeServer, launcher: GcpLauncher, tmp_path: Path, whose: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The name in job.json now belongs to a VM without the job's label, or with another
    id (deleted and created again by someone): never deleted, not reported as the job's."""
    maintenance = server.host_maintenance

    def take(name: str) -> None:
        maintenance(name)
        vm = server.vms[name]
        if whose == "label":
            vm.body["labels"]["costguard-job"] = "someone-else"
        else:
            server.vms[name] = ComputeVm(vm.body, vm.zone, "999", vm.status)

    monkeypatch.setattr(server, "host_maintenance", take)
    job, _, name = stopped_job(server, launcher, tmp_path, checkpoint=True)
    assert server.vms[name].status == "TERMINATED"
    assert server.calls("DELETE", "/instances/") == []
    assert job.kept_stopped == ()


def test_a_spot_vm_whose_termination_action_is_stop_is_kept_as_asked(
    server: ComputeServer, launcher: GcpLauncher, tmp_path: Path
) -> None:
    """``termination_action=STOP`` asks Compute Engine to keep a preempted VM: costguard
    keeps it too, checkpoint or not, and reports what it bills."""
    job, _, name = stopped_job(
        server, launcher, tmp_path, checkpoint=True, take="preempt", termination_action="STOP"
    )
    assert server.vms[name].status == "TERMINATED"
    (kept,) = job.kept_stopped
    assert "termination_action=STOP" in kept
