"""The Azure launcher with the real azure-mgmt-compute client against a local server
speaking the documented ARM shapes: PUT ``virtualMachines`` (201 + ``Azure-AsyncOperation``
polled to ``Succeeded``/``Failed``), GET with ``$expand=instanceView``, DELETE (202, 204 when
absent) and the resource group listing."""

from __future__ import annotations

import base64
import time
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from costguard.checkpoint.store import Store
from costguard.errors import InputError
from costguard.settings import Settings
from costguard.spot.controller import Controller
from costguard.spot.job import ExitRecord, Job, JobSpec, load_job, save_job, write_exit_record
from costguard.spot.launcher.azure import AzureLauncher
from costguard.spot.launcher.base import CapacityError, Handle, LaunchSpec, Market, Offer, State
from tests.servers.azure import GROUP, IDENTITY, NETWORK, SUBSCRIPTION, ArmServer
from tests.servers.azure import LAUNCH_OPTIONS as OPTIONS
from tests.servers.http import FakeTokenCredential, azure_client_options

EXPIRES = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.fixture
def server(arm_server: ArmServer) -> ArmServer:
    return arm_server


def make(server: ArmServer, **kwargs: Any) -> AzureLauncher:
    return AzureLauncher(
        Settings(azure_endpoint=server.url),
        credential=FakeTokenCredential(),
        client_options=azure_client_options(),
        **kwargs,
    )


@pytest.fixture
def launcher(server: ArmServer) -> AzureLauncher:
    return make(server, subscription_id=SUBSCRIPTION, resource_group=GROUP)


def spec(job_id: str = "run-1", **options: str) -> LaunchSpec:
    return LaunchSpec(
        job_id=job_id,
        checkpoint_url=f"az://ckpt/costguard/{job_id}",
        command=("python", "train.py"),
        owner="alice",
        expires_at=EXPIRES,
        idle_minutes=45,
        every_minutes=10,
        sync_dir="/mnt/resource/out",
        options={**OPTIONS, **options},
    )


def offer(market: Market = Market.SPOT, size: str = "Standard_NC4as_T4_v3",
          zone: str = "") -> Offer:  # fmt: skip
    return Offer("azure", "eastus", size, market, Decimal("0.15"), "T4", 1, zone)


def put_body(server: ArmServer) -> dict[str, Any]:
    (call,) = server.calls("PUT", "/virtualMachines/")
    return dict(call.body)


def test_launch_creates_a_spot_vm_with_identity_tags_and_custom_data(
    server: ArmServer, launcher: AzureLauncher
) -> None:
    handle = launcher.launch(offer(zone="1"), spec(), attempt=2)
    assert handle == Handle("azure", "eastus", "costguard-run-1-2", "1",
                            {"subscription": SUBSCRIPTION, "resource_group": GROUP,
                             "priority": "Spot", "attempt": "2"})  # fmt: skip
    body = put_body(server)
    properties = body["properties"]
    assert properties["priority"] == "Spot"
    assert properties["evictionPolicy"] == "Delete"
    assert properties["billingProfile"] == {"maxPrice": -1}
    assert properties["hardwareProfile"] == {"vmSize": "Standard_NC4as_T4_v3"}
    assert body["zones"] == ["1"]
    assert body["tags"] == {
        "costguard:job": "run-1",
        "costguard:owner": "alice",
        "costguard:attempt": "2",
        "costguard:expires-at": "2026-12-02T12:00:00+00:00",
        "costguard:idle-minutes": "45",
    }
    assert body["identity"] == {"type": "UserAssigned", "userAssignedIdentities": {IDENTITY: {}}}
    os_profile = properties["osProfile"]
    assert os_profile["linuxConfiguration"]["disablePasswordAuthentication"] is True
    assert "adminPassword" not in os_profile
    script = base64.b64decode(os_profile["customData"]).decode()
    assert script.startswith("#!/bin/bash\n")
    assert "--cloud azure" in script
    assert "--every-minutes 10.0 --sync-dir /mnt/resource/out -- python train.py" in script
    (nic,) = properties["networkProfile"]["networkInterfaceConfigurations"]
    assert nic["properties"]["deleteOption"] == "Delete"
    assert properties["storageProfile"]["osDisk"]["deleteOption"] == "Delete"
    assert properties["storageProfile"]["imageReference"] == {
        "publisher": "microsoft-dsvm", "offer": "ubuntu-hpc", "sku": "2204", "version": "latest",
    }  # fmt: skip
    # The long-running operation was polled until it succeeded.
    assert len(server.calls("GET", "/operations/")) >= 2
    assert server.vms["costguard-run-1-2"].provisioning == "Succeeded"


def test_on_demand_and_a_price_cap(server: ArmServer, launcher: AzureLauncher) -> None:
    launcher.launch(offer(Market.ON_DEMAND), spec(), attempt=1)
    properties = put_body(server)["properties"]
    assert properties["priority"] == "Regular"
    assert "evictionPolicy" not in properties
    assert "billingProfile" not in properties
    body = launcher.request(offer(), spec(max_price="0.25", eviction_policy="Deallocate"), 1)
    assert body["properties"]["billingProfile"] == {"maxPrice": 0.25}
    assert body["properties"]["evictionPolicy"] == "Deallocate"


def test_max_price_reaches_the_billing_profile(server: ArmServer, launcher: AzureLauncher) -> None:
    from dataclasses import replace

    launcher.launch(offer(), replace(spec(), max_usd_per_hour=Decimal("0.31")), attempt=1)
    assert put_body(server)["properties"]["billingProfile"] == {"maxPrice": 0.31}
    server.reset()
    with pytest.raises(InputError, match="at most 5 decimals"):
        launcher.launch(offer(), replace(spec(), max_usd_per_hour=Decimal("0.123456")), 1)
    with pytest.raises(InputError, match="disagree"):
        launcher.launch(
            offer(), replace(spec(max_price="0.3"), max_usd_per_hour=Decimal("0.31")), 1
        )
    assert server.requests == []


def test_status_through_an_eviction(server: ArmServer, launcher: AzureLauncher) -> None:
    handle = launcher.launch(offer(), spec(), attempt=1)
    status = launcher.status(handle)
    assert status.state is State.RUNNING
    assert status.launched_at == datetime(2026, 12, 1, 3, 0, 0, 123456, tzinfo=UTC)
    server.evict(handle.instance_id)
    status = launcher.status(handle)
    assert status.state is State.PREEMPTED
    assert "evicted" in status.detail
    kept = launcher.launch(offer(), spec("run-2", eviction_policy="Deallocate"), attempt=1)
    server.evict(kept.instance_id)
    assert launcher.status(kept).state is State.PREEMPTED


def test_a_regular_vm_that_vanishes_is_missing(server: ArmServer, launcher: AzureLauncher) -> None:
    handle = launcher.launch(offer(Market.ON_DEMAND), spec(), attempt=1)
    server.vms[handle.instance_id].power = "deallocated"  # the reaper deallocated it
    assert launcher.status(handle).state is State.STOPPED
    del server.vms[handle.instance_id]
    assert launcher.status(handle).state is State.MISSING


def test_terminate_is_idempotent_and_not_an_eviction(
    server: ArmServer, launcher: AzureLauncher
) -> None:
    handle = launcher.launch(offer(), spec(), attempt=1)
    launcher.terminate(handle)
    assert handle.instance_id not in server.vms
    assert launcher.status(handle).state is State.MISSING
    launcher.terminate(handle)  # gone already: 204
    assert [r.method for r in server.requests if r.method == "DELETE"] == ["DELETE", "DELETE"]


def test_find_sees_live_vms_of_the_job(server: ArmServer, launcher: AzureLauncher) -> None:
    first = launcher.launch(offer(), spec(), attempt=1)
    launcher.launch(offer(), spec("run-2"), attempt=1)
    assert launcher.find("run-1") == [replace(first, extra={**first.extra, "owner": "alice"})]
    server.vms[first.instance_id].power = "deallocated"
    assert launcher.find("run-1") == []


def test_no_capacity_is_a_capacity_error(server: ArmServer, launcher: AzureLauncher) -> None:
    server.full_sizes.add("Standard_NC4as_T4_v3")
    with pytest.raises(CapacityError) as caught:
        launcher.launch(offer(), spec(), attempt=1)
    assert caught.value.code == "SkuNotAvailable"
    assert caught.value.place == "azure/eastus"


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"subscription": ""}, "needs the subscription option"),
        ({"subscription": "my-sub"}, "not an Azure subscription id"),
        ({"resource_group": ""}, "needs the resource_group option"),
        ({"image": ""}, "needs the image option"),
        ({"image": "ubuntu"}, "publisher:offer:sku:version"),
        ({"subnet": "jobs"}, "subnet resource id"),
        ({"subnet_westus": "jobs"}, "subnet_westus option must be a subnet resource id"),
        ({"identity": ""}, "needs the identity option"),
        ({"ssh_public_key": "hunter2"}, "not an OpenSSH public key"),
        ({"admin_username": "root"}, "admin_username"),
        ({"eviction_policy": "Stop"}, "eviction_policy"),
        ({"max_price": "-2"}, "max_price"),
    ],
)
def test_bad_options_fail_before_any_call(
    server: ArmServer, options: dict[str, str], fragment: str
) -> None:
    with pytest.raises(InputError, match=fragment) as caught:
        make(server).launch(offer(), spec(**options), attempt=1)
    assert caught.value.hint
    assert "hunter2" not in str(caught.value)
    assert server.requests == []


def test_zones_are_the_sizes_zones_less_restrictions(
    server: ArmServer, launcher: AzureLauncher
) -> None:
    assert launcher.zones("eastus", "Standard_NC4as_T4_v3") == ["1", "2", "3"]
    (call,) = server.calls("GET", "/providers/Microsoft.Compute/skus")
    assert call.query["$filter"] == ["location eq 'eastus'"]
    assert launcher.zones("eastus", "Standard_NC24ads_A100_v4") == ["1", "3"]
    assert launcher.zones("westus", "Standard_NC4as_T4_v3") == []  # no zones there
    assert launcher.zones("eastus", "Standard_ND96asr_v4") == []  # not sold there
    assert launcher.zones("eastus") == []  # zones belong to a size


# ------------------------------------------ what the real service refuses (issue 19)


def test_find_never_asks_the_listing_for_instance_views(
    server: ArmServer, launcher: AzureLauncher
) -> None:
    """``virtualMachines.list`` with ``$expand=instanceView`` and no scale-set ``$filter`` is
    a 400 from ARM; find (Controller.adopt's first call) lists plainly and reads each VM
    of the job with its instance view."""
    first = launcher.launch(offer(), spec(), attempt=1)
    launcher.launch(offer(), spec("run-2"), attempt=1)
    server.requests.clear()
    assert launcher.find("run-1") == [replace(first, extra={**first.extra, "owner": "alice"})]
    (listing,) = server.calls("GET", f"/resourceGroups/{GROUP}/providers/Microsoft.Compute/"
                                     "virtualMachines")[:1]  # fmt: skip
    assert "$expand" not in listing.query
    reads = [c for c in server.calls("GET", "/virtualMachines/") if c.query.get("$expand")]
    assert [c.path.rsplit("/", 1)[-1] for c in reads] == [first.instance_id]


def test_a_second_region_uses_its_own_subnet(server: ArmServer, launcher: AzureLauncher) -> None:
    west = f"{NETWORK}/virtualNetworks/lab-west/subnets/jobs"
    west_offer = Offer("azure", "westus", "Standard_NC4as_T4_v3", Market.SPOT,
                       Decimal("0.15"), "T4", 1)  # fmt: skip
    # Subnets are regional: the eastus subnet cannot serve westus (InvalidResourceReference),
    # which is a reason to move on to another place, not to fail the job.
    with pytest.raises(CapacityError) as caught:
        launcher.launch(west_offer, spec(), attempt=1)
    assert caught.value.code == "InvalidResourceReference"
    assert caught.value.place == "azure/westus"
    handle = launcher.launch(west_offer, spec(subnet_westus=west), attempt=2)
    assert handle.region == "westus"
    subnets = [
        body["properties"]["networkProfile"]["networkInterfaceConfigurations"][0]["properties"][
            "ipConfigurations"][0]["properties"]["subnet"]["id"]
        for body in (c.body for c in server.calls("PUT", "/virtualMachines/"))
    ]  # fmt: skip
    assert subnets == [OPTIONS["subnet"], west]
    # Only per-region subnets, none for this region: a clear input error, no call.
    server.reset()
    only_west = {**spec().options, "subnet": "", "subnet_westus": west}
    with pytest.raises(InputError, match="no subnet for eastus"):
        launcher.launch(offer(), spec(**only_west), attempt=1)
    assert server.requests == [] or not server.calls("PUT", "/virtualMachines/")


def test_another_refused_reference_stops_the_job(
    server: ArmServer, launcher: AzureLauncher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An InvalidResourceReference that is not about the subnet (say the identity) is not a
    reason to move on: unknown refusals stop and report."""
    server.subnets.clear()  # nothing known: the error names the subnet, still capacity
    with pytest.raises(CapacityError):
        launcher.launch(offer(), spec(), attempt=1)

    def refuse(request: Any, match: Any) -> Any:
        message = f"Resource {IDENTITY} referenced by resource x was not found."
        error = {"code": "InvalidResourceReference", "message": message}
        return 400, {"error": error}, {}

    monkeypatch.setattr(server, "put", refuse)
    with pytest.raises(InputError, match="InvalidResourceReference"):
        launcher.launch(offer(), spec(), attempt=1)


@pytest.mark.parametrize("user", ["user1", "Test", "guest", "support_388945a0", "sys"])
def test_admin_usernames_arm_refuses_are_refused_before_any_call(
    server: ArmServer, user: str
) -> None:
    with pytest.raises(InputError, match="admin_username"):
        make(server).launch(offer(), spec(admin_username=user), attempt=1)
    assert server.requests == []


def test_a_boot_script_over_64_kib_is_refused_before_any_call(server: ArmServer) -> None:
    long_command = ("python", "train.py", "--note", "x" * 70_000)
    from dataclasses import replace

    with pytest.raises(InputError, match="65535"):
        make(server).launch(offer(), replace(spec(), command=long_command), attempt=1)
    assert server.requests == []


def test_a_retried_attempt_adopts_its_vm_instead_of_changing_custom_data(
    server: ArmServer, launcher: AzureLauncher
) -> None:
    """customData and adminUsername cannot change after creation (PropertyChangeNotAllowed):
    a retry of the same attempt whose boot script differs uses the VM that exists."""
    from dataclasses import replace

    first = launcher.launch(offer(), spec(), attempt=1)
    again = launcher.launch(offer(), replace(spec(), command=("python", "other.py")), attempt=1)
    assert again == first
    assert len(server.calls("PUT", "/virtualMachines/")) == 1


def test_a_location_restricted_size_is_no_capacity_before_any_put(
    server: ArmServer, launcher: AzureLauncher
) -> None:
    server.location_restricted.add(("eastus", "Standard_NC4as_T4_v3"))
    with pytest.raises(CapacityError) as caught:
        launcher.launch(offer(), spec(), attempt=1)
    assert caught.value.code == "NotAvailableForSubscription"
    assert not server.calls("PUT", "/virtualMachines/")


def test_the_controller_moves_on_from_a_region_its_subnet_does_not_serve(
    server: ArmServer, launcher: AzureLauncher, tmp_path: Path
) -> None:
    """The cheapest offer is in westus, the only subnet in eastus: the westus PUT is refused
    (InvalidResourceReference), the controller records a capacity refusal and launches in
    eastus, and the job finishes."""
    url = f"file://{tmp_path / 'ckpt'}"
    store = Store.open(url)
    job_spec = JobSpec(
        job_id="run-1", provider="azure", gpu="T4", gpu_count=1, regions=("westus", "eastus"),
        spot=True, checkpoint_url=url, command=("python", "train.py"), owner="alice",
        created_unix=time.time(), expires_at=EXPIRES, options=OPTIONS,
    )  # fmt: skip
    west = Offer("azure", "westus", "Standard_NC4as_T4_v3", Market.SPOT, Decimal("0.10"),
                 "T4", 1)  # fmt: skip
    save_job(store, Job(job_spec))
    rounds: list[int] = []

    def sleep(seconds: float) -> None:
        rounds.append(1)
        assert len(rounds) < 20
        current = load_job(store).current
        if current is not None and current.handle is not None:
            write_exit_record(store, ExitRecord(current.number, 0, 10, time.time(),
                                                job_id="run-1"))  # fmt: skip

    final = Controller(store, launcher, [west, offer(zone="1")], poll_s=0.0, sleep=sleep).run(
        load_job(store)
    )
    assert final.status == "succeeded"
    places = [a.offer.region for a in final.attempts]
    assert places[0] == "westus"
    assert places[-1] == "eastus"
    assert final.attempts[0].handle is None
