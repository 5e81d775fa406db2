"""A gang (``--nodes``) on Azure: N VMs in one zone and the job's proximity placement
group, each told its rank and node 0's private address in its tags; if any VM fails, the
ones that were made are deleted (their NIC and disk with them). Against the ARM fake of
tests/servers/azure.py with the real azure-mgmt-compute client."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from costguard import proof
from costguard.errors import CostguardError
from costguard.spot import bootstrap
from costguard.spot.launcher.azure import AzureLauncher
from costguard.spot.launcher.base import CapacityError, LaunchSpec, Market, Offer
from costguard.tags import (
    ATTEMPT_TAG,
    JOB_TAG,
    NODE_PROOF_TAG,
    NODE_RANK_TAG,
    OWNER_TAG,
    RENDEZVOUS_TAG,
)
from tests.servers.azure import GROUP, LAUNCH_OPTIONS, ArmServer, ArmVm
from tests.spot.test_azure_launcher import make

SIZE = "Standard_NC4as_T4_v3"
PLACEMENT = "costguard-cg-alice-gang-1-eastus"


@pytest.fixture
def launcher(arm_server: ArmServer) -> AzureLauncher:
    from tests.servers.azure import SUBSCRIPTION

    return make(arm_server, subscription_id=SUBSCRIPTION, resource_group=GROUP)


def gang(nodes: int = 2) -> LaunchSpec:
    return LaunchSpec(
        job_id="cg-alice-gang-1",
        checkpoint_url="az://ckpt/costguard/alice/cg-alice-gang-1",
        command=("train.py",),
        owner="alice",
        expires_at=datetime(2026, 12, 2, 12, 0, tzinfo=UTC),
        options=dict(LAUNCH_OPTIONS),
        nodes=nodes,
        procs_per_node=1,
    )


def offer(zone: str = "eastus-2") -> Offer:
    return Offer("azure", "eastus", SIZE, Market.SPOT, Decimal("0.15"), "T4", 1, zone)


def test_two_nodes_are_two_vms_in_one_zone_and_placement_group_told_their_ranks(
    arm_server: ArmServer, launcher: AzureLauncher
) -> None:
    handles = launcher.launch_gang(offer(), gang(), attempt=1)

    names = ["costguard-cg-alice-gang-1-1-n0", "costguard-cg-alice-gang-1-1-n1"]
    assert [h.instance_id for h in handles] == names
    assert sorted(arm_server.vms) == names
    group = arm_server.placement_groups[(GROUP, PLACEMENT)]
    assert group["tags"] == {JOB_TAG: "cg-alice-gang-1", OWNER_TAG: "alice"}
    first = arm_server.vms[names[0]].address
    for rank, name in enumerate(names):
        body = arm_server.vms[name].body
        assert body["zones"] == ["2"]
        assert body["properties"]["proximityPlacementGroup"]["id"] == group["id"]
        assert body["properties"]["osProfile"]["computerName"] == name
        nic = body["properties"]["networkProfile"]["networkInterfaceConfigurations"][0]
        assert nic["name"] == f"{name}-nic"
        assert nic["properties"]["deleteOption"] == "Delete"
        assert body["properties"]["storageProfile"]["osDisk"]["deleteOption"] == "Delete"
        assert body["tags"][NODE_RANK_TAG] == str(rank)
        assert body["tags"][RENDEZVOUS_TAG] == f"{first}:{bootstrap.RDZV_PORT}"
        assert body["tags"][JOB_TAG] == "cg-alice-gang-1"  # the job's tags are kept
        assert body["tags"][ATTEMPT_TAG] == "1"


def test_each_vm_is_told_its_values_signed_for_its_own_name(
    arm_server: ArmServer, launcher: AzureLauncher
) -> None:
    """What the node proves (costguard.spot.node): the signature in its tags holds for its
    own name (IMDS ``compute/name``) and nowhere else."""
    spec = replace(gang(), job_key=proof.job_key(bytes(32), "cg-alice-gang-1").hex())
    handles = launcher.launch_gang(offer(), spec, attempt=1)
    key = spec.told_public(1)
    for rank, handle in enumerate(handles):
        tags = arm_server.vms[handle.instance_id].body["tags"]
        signed = (tags[NODE_PROOF_TAG], spec.job_id, 1)
        assert proof.told_holds(key, *signed, handle.instance_id, rank, tags[RENDEZVOUS_TAG])
        other = handles[1 - rank].instance_id
        assert not proof.told_holds(key, *signed, other, rank, tags[RENDEZVOUS_TAG])


def test_the_nodes_nics_admit_the_ports_from_the_jobs_nodes_only(
    arm_server: ArmServer, launcher: AzureLauncher
) -> None:
    launcher.launch_gang(offer(), gang(), attempt=1)
    security = arm_server.network[("networkSecurityGroups", GROUP, PLACEMENT)]
    nodes = arm_server.network[("applicationSecurityGroups", GROUP, PLACEMENT)]
    for item in (security, nodes):
        assert item["tags"] == {JOB_TAG: "cg-alice-gang-1", OWNER_TAG: "alice"}
    allow, deny = sorted(security["properties"]["securityRules"],
                         key=lambda r: r["properties"]["priority"])  # fmt: skip
    low, high = bootstrap.COLLECTIVE_PORTS
    assert allow["properties"]["access"] == "Allow"
    assert allow["properties"]["protocol"] == "Tcp"
    assert allow["properties"]["destinationPortRanges"] == [str(bootstrap.RDZV_PORT),
                                                            f"{low}-{high}"]  # fmt: skip
    assert allow["properties"]["sourceApplicationSecurityGroups"] == [{"id": nodes["id"]}]
    assert "sourceAddressPrefix" not in allow["properties"]
    assert deny["properties"]["access"] == "Deny"
    assert deny["properties"]["sourceAddressPrefix"] == "VirtualNetwork"
    for vm in arm_server.vms.values():
        (nic,) = vm.body["properties"]["networkProfile"]["networkInterfaceConfigurations"]
        assert nic["properties"]["networkSecurityGroup"] == {"id": security["id"]}
        (ip,) = nic["properties"]["ipConfigurations"]
        assert ip["properties"]["applicationSecurityGroups"] == [{"id": nodes["id"]}]


def test_when_one_vm_fails_the_ones_made_are_deleted(
    arm_server: ArmServer, launcher: AzureLauncher
) -> None:
    arm_server.room[SIZE] = 2  # two of the three fit
    with pytest.raises(CapacityError) as caught:
        launcher.launch_gang(offer(), gang(nodes=3), attempt=1)
    assert caught.value.code == "SkuNotAvailable"
    assert caught.value.place == "azure/eastus/eastus-2"
    assert arm_server.vms == {}  # deleted, and with them their NICs and OS disks
    deleted = {c.path.rsplit("/", 1)[1] for c in arm_server.calls("DELETE", "/virtualMachines/")}
    assert len(deleted) >= 2


def test_no_room_at_all_leaves_nothing(arm_server: ArmServer, launcher: AzureLauncher) -> None:
    arm_server.full_sizes.add(SIZE)
    with pytest.raises(CapacityError):
        launcher.launch_gang(offer(), gang(), attempt=1)
    assert arm_server.vms == {}


def test_a_vm_of_a_gang_name_that_is_not_the_jobs_is_left_alone(
    arm_server: ArmServer, launcher: AzureLauncher
) -> None:
    name = "costguard-cg-alice-gang-1-1-n1"
    properties = {"hardwareProfile": {"vmSize": SIZE}, "osProfile": {"computerName": name},
                  "networkProfile": {"networkInterfaceConfigurations": []}}  # fmt: skip
    stranger = ArmVm({"location": "eastus", "tags": {}, "properties": properties}, GROUP, name)
    arm_server.vms[name] = stranger
    with pytest.raises(CostguardError, match="is not this attempt's"):
        launcher.launch_gang(offer(), gang(), attempt=1)
    assert list(arm_server.vms) == [name]
    assert not arm_server.calls("PUT", "/virtualMachines/")  # refused before any VM


def test_release_deletes_the_jobs_placement_group_only(
    arm_server: ArmServer, launcher: AzureLauncher
) -> None:
    for handle in launcher.launch_gang(offer(), gang(), attempt=1):
        launcher.terminate(handle)
    other = "costguard-someone-else-eastus"
    arm_server.placement_groups[(GROUP, other)] = {"name": other, "tags": {}}
    launcher.release(gang())
    assert list(arm_server.placement_groups) == [(GROUP, other)]
    assert arm_server.network == {}


def test_a_repeated_launch_of_the_attempt_adopts_its_vms(
    arm_server: ArmServer, launcher: AzureLauncher
) -> None:
    first = launcher.launch_gang(offer(), gang(), attempt=1)
    puts = len(arm_server.calls("PUT", "/virtualMachines/"))
    again = launcher.launch_gang(offer(), gang(), attempt=1)
    assert [h.instance_id for h in again] == [h.instance_id for h in first]
    assert len(arm_server.calls("PUT", "/virtualMachines/")) == puts  # none PUT again
    assert len(arm_server.vms) == 2


def test_find_names_each_nodes_rank(arm_server: ArmServer, launcher: AzureLauncher) -> None:
    handles = launcher.launch_gang(offer(), gang(nodes=3), attempt=1)
    found = {h.instance_id: h.extra.get("node") for h in launcher.find("cg-alice-gang-1")}
    assert found == {h.instance_id: str(rank) for rank, h in enumerate(handles)}


# -- deletes ARM refuses for now: a busy VM, a NIC deleted after its VM, a VM in the group


def test_a_partial_gang_is_deleted_through_busy_answers_and_released_through_in_use_ones(
    arm_server: ArmServer,
) -> None:
    """One node does not fit; the other's VM delete is refused twice as another operation is
    in progress, and its NIC, deleted after it, keeps the job's security groups in use for
    two more deletes: each delete is sent again after a back-off, and nothing is left."""
    from tests.servers.azure import SUBSCRIPTION

    waits: list[float] = []
    launcher = make(arm_server, subscription_id=SUBSCRIPTION, resource_group=GROUP,
                    sleep=waits.append)  # fmt: skip
    arm_server.room[SIZE] = 1
    arm_server.busy_deletes = 2
    arm_server.nic_lingers = 2
    with pytest.raises(CapacityError):
        launcher.launch_gang(offer(), gang(), attempt=1)
    assert arm_server.vms == {}
    assert waits == [0.5, 1.0]
    launcher.release(gang())
    assert arm_server.network == {}
    assert arm_server.placement_groups == {}
    assert waits == [0.5, 1.0, 0.5, 1.0]  # the security group, while the NIC lingered


def test_what_azure_will_not_delete_is_named_with_its_command(arm_server: ArmServer) -> None:
    """The VM that fitted stays busy: the rollback gives up after its bounded back-off and says
    which VM may still bill and how to delete it, instead of a capacity refusal that would
    leave it unsaid; release then names each group that VM still uses."""
    from costguard.spot.launcher.azure import DELETE_BACKOFF_S
    from tests.servers.azure import SUBSCRIPTION

    waits: list[float] = []
    launcher = make(arm_server, subscription_id=SUBSCRIPTION, resource_group=GROUP,
                    sleep=waits.append)  # fmt: skip
    arm_server.room[SIZE] = 1
    arm_server.busy_deletes = 10**6
    with pytest.raises(CostguardError) as ended:
        launcher.launch_gang(offer(), gang(), attempt=1)
    assert not isinstance(ended.value, CapacityError)
    (node,) = arm_server.vms  # the node that fitted (the creates are polled at once)
    assert f"Azure did not delete {node}: they may still run" in ended.value.message
    assert f"az vm delete --resource-group {GROUP} --name {node} --yes" in str(ended.value.hint)
    assert waits == list(DELETE_BACKOFF_S)  # bounded
    with pytest.raises(CostguardError) as kept:
        launcher.release(gang())
    said = kept.value.message
    for kind in ("networkSecurityGroups", "applicationSecurityGroups"):
        assert f"az resource delete --ids /subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}/" \
            f"providers/Microsoft.Network/{kind}/{PLACEMENT}" in said  # fmt: skip
        # Each one tried, and again after each back-off.
        assert len(arm_server.calls("DELETE", f"/{kind}/")) == len(DELETE_BACKOFF_S) + 1
    assert f"az ppg delete --resource-group {GROUP} --name {PLACEMENT}" in said
    assert "still refused after" in said


def test_the_controller_says_which_node_of_a_partial_gang_may_still_bill(
    arm_server: ArmServer, tmp_path: Path
) -> None:
    """Through the controller: the node of a gang that did not start whole cannot be
    deleted; the attempt fails naming it, the controller tries it once more, and says it
    may still bill and how to delete it (a failed end was suppressed unsaid)."""
    from costguard.checkpoint.store import Store
    from costguard.spot.controller import Controller, Event
    from costguard.spot.job import Job
    from costguard.spot.recovery import AttemptOutcome, Launch
    from tests.contract.test_launcher import _job
    from tests.servers.azure import SUBSCRIPTION

    launcher = make(arm_server, subscription_id=SUBSCRIPTION, resource_group=GROUP,
                    sleep=lambda _s: None)  # fmt: skip
    arm_server.room[SIZE] = 1
    arm_server.busy_deletes = 10**6
    events: list[Event] = []
    controller = Controller(Store.open(tmp_path / "ckpt"), launcher, [offer()],
                            on_event=events.append)  # fmt: skip
    spec = _job("azure", "T4", 1, "eastus", "az://ckpt/run-1", options=dict(LAUNCH_OPTIONS),
                nodes=2)  # fmt: skip
    job = controller.launch(Job(replace(spec, command=("train.py",))), Launch(offer(), 1, "x"))
    (node,) = arm_server.vms  # the node that fitted (the creates are polled at once)
    assert job.status == "failed"
    assert job.attempts[0].outcome is AttemptOutcome.FAILED
    assert f"Azure did not delete {node}" in job.reason
    said = [e.message for e in events if e.kind == "cleanup"]
    kept = [m for m in said if m.startswith("not terminated, may still bill")]
    assert kept, said
    assert node in kept[0]
    assert f"az vm delete --resource-group {GROUP} --name {node} --yes" in kept[0]
