"""A gang (``--nodes``) on GCP: one zonal ``instances.bulkInsert`` with ``count`` and
``minCount`` the gang's size, a firewall rule by the job's network tag, each node told its
rank in its own metadata; against the Compute fake of tests/servers/gcp.py with the real
google-cloud-compute client (rules bulk_insert_min_count, set_metadata_fingerprint)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from costguard import proof
from costguard.errors import CostguardError
from costguard.spot import bootstrap
from costguard.spot.launcher.base import CapacityError, LaunchSpec, Market, Offer
from costguard.spot.launcher.gcp import GcpLauncher
from costguard.tags import NODE_PROOF_TAG, NODE_RANK_TAG, RENDEZVOUS_TAG, gcp_label
from tests.servers.gcp import LAUNCH_OPTIONS, ComputeServer, ComputeVm

ZONE = "us-central1-b"
TAG = "costguard-cg-alice-gang-1"


@pytest.fixture
def launcher(gcp_launcher: GcpLauncher) -> GcpLauncher:
    return gcp_launcher


def gang(nodes: int = 2, **options: str) -> LaunchSpec:
    return LaunchSpec(
        job_id="cg-alice-gang-1",
        checkpoint_url="gs://ckpt/costguard/alice/cg-alice-gang-1",
        command=("train.py", "--lr", "3e-4"),
        owner="alice",
        expires_at=datetime(2026, 12, 2, 12, 0, tzinfo=UTC),
        options={**LAUNCH_OPTIONS, **options},
        nodes=nodes,
        procs_per_node=1,
    )


def offer(market: Market = Market.SPOT) -> Offer:
    return Offer("gcp", "us-central1", "a2-highgpu-1g", market, Decimal("1.1"), "A100", 1, ZONE)


def metadata(vm: ComputeVm) -> dict[str, str]:
    return {i["key"]: i["value"] for i in vm.body.get("metadata", {}).get("items", [])}


def test_each_vm_is_told_its_values_signed_for_its_own_name(
    compute_server: ComputeServer, launcher: GcpLauncher
) -> None:
    """What the node proves (costguard.spot.node): the signature in its metadata holds for
    its own name (``instance/name``) and nowhere else."""
    spec = replace(gang(), job_key=proof.job_key(bytes(32), "cg-alice-gang-1").hex())
    handles = launcher.launch_gang(offer(), spec, attempt=1)
    key = spec.told_public(1)
    for rank, handle in enumerate(handles):
        told = metadata(compute_server.vms[handle.instance_id])
        signed = (told[gcp_label(NODE_PROOF_TAG)], spec.job_id, 1)
        rendezvous = told[gcp_label(RENDEZVOUS_TAG)]
        assert proof.told_holds(key, *signed, handle.instance_id, rank, rendezvous)
        other = handles[1 - rank].instance_id
        assert not proof.told_holds(key, *signed, other, rank, rendezvous)


def test_two_nodes_are_one_bulk_insert_of_two_vms_in_one_zone_told_their_ranks(
    compute_server: ComputeServer, launcher: GcpLauncher
) -> None:
    handles = launcher.launch_gang(offer(), gang(), attempt=1)

    names = ["costguard-cg-alice-gang-1-1-n0", "costguard-cg-alice-gang-1-1-n1"]
    assert [h.instance_id for h in handles] == names
    assert sorted(compute_server.vms) == names
    assert {vm.zone for vm in compute_server.vms.values()} == {ZONE}
    (call,) = compute_server.calls("POST", "/instances/bulkInsert")
    assert call.path.endswith(f"/zones/{ZONE}/instances/bulkInsert")
    assert call.body["count"] == "2"
    assert call.body["minCount"] == "2"
    assert sorted(call.body["perInstanceProperties"]) == names
    assert call.body["instanceProperties"]["tags"] == {"items": [TAG]}
    assert call.body["instanceProperties"]["scheduling"]["provisioningModel"] == "SPOT"
    assert not compute_server.calls("POST", f"/zones/{ZONE}/instances?")
    first = compute_server.vms[names[0]].address
    for rank, name in enumerate(names):
        told = metadata(compute_server.vms[name])
        assert told[gcp_label(NODE_RANK_TAG)] == str(rank)
        assert told[gcp_label(RENDEZVOUS_TAG)] == f"{first}:{bootstrap.RDZV_PORT}"
        assert "startup-script" in told  # the rest of the metadata is kept
        assert handles[rank].extra["node"] == str(rank)


def test_the_firewall_rule_opens_the_ports_only_between_the_jobs_vms(
    compute_server: ComputeServer, launcher: GcpLauncher
) -> None:
    launcher.launch_gang(offer(), gang(), attempt=1)
    rule = compute_server.firewalls[TAG]
    low, high = bootstrap.COLLECTIVE_PORTS
    assert rule["direction"] == "INGRESS"
    assert rule["sourceTags"] == [TAG]
    assert rule["targetTags"] == [TAG]
    assert "sourceRanges" not in rule
    assert rule["allowed"] == [
        {"IPProtocol": "tcp", "ports": [str(bootstrap.RDZV_PORT), f"{low}-{high}"]}
    ]


def test_no_room_for_the_minimum_makes_no_vm(
    compute_server: ComputeServer, launcher: GcpLauncher
) -> None:
    compute_server.room[ZONE] = 2  # two fit, the gang needs three
    with pytest.raises(CapacityError) as caught:
        launcher.launch_gang(offer(), gang(nodes=3), attempt=1)
    assert caught.value.code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert caught.value.place == f"gcp/us-central1/{ZONE}"
    assert compute_server.vms == {}


def test_a_bulk_insert_that_made_fewer_than_the_gang_leaves_none(
    compute_server: ComputeServer, launcher: GcpLauncher
) -> None:
    compute_server.broken_min_count = True  # the service breaks its own minCount
    with pytest.raises(CapacityError, match="made 2 of the 3 VMs"):
        launcher.launch_gang(offer(), gang(nodes=3), attempt=1)
    assert compute_server.vms == {}
    assert len(compute_server.calls("DELETE", "/instances/")) == 2


def test_a_vm_the_rollback_cannot_delete_is_named_and_the_others_deleted(
    compute_server: ComputeServer, launcher: GcpLauncher
) -> None:
    """A bulk insert short of the gang, and the first of its two VMs refused a delete: the
    rollback still deletes the other, and says which VM may still bill and how to delete
    it (the first refusal stopped it, leaving the second VM unsaid)."""
    from tests.servers.gcp import PROJECT

    compute_server.broken_min_count = True
    compute_server.refuse_deletes = 1
    with pytest.raises(CostguardError) as ended:
        launcher.launch_gang(offer(), gang(nodes=3), attempt=1)
    assert not isinstance(ended.value, CapacityError)  # not a place to move on from
    (kept,) = compute_server.vms
    assert f"Google Cloud did not delete {kept}: they may still run" in ended.value.message
    assert f"gcloud compute instances delete {kept} --zone {ZONE} --project {PROJECT} --quiet" in (
        ended.value.hint or ""
    )
    assert len(compute_server.calls("DELETE", "/instances/")) == 2  # both tried


def test_a_repeated_launch_of_the_attempt_uses_its_vms(
    compute_server: ComputeServer, launcher: GcpLauncher
) -> None:
    first = launcher.launch_gang(offer(), gang(), attempt=1)
    again = launcher.launch_gang(offer(), gang(), attempt=1)
    assert [h.instance_id for h in again] == [h.instance_id for h in first]
    assert len(compute_server.vms) == 2


def test_a_vm_of_a_gang_name_that_is_not_the_jobs_is_refused_and_left_alone(
    compute_server: ComputeServer, launcher: GcpLauncher
) -> None:
    stranger = ComputeVm({"name": "costguard-cg-alice-gang-1-1-n1", "labels": {}}, ZONE, "9")
    compute_server.vms[stranger.body["name"]] = stranger
    with pytest.raises(CostguardError):
        launcher.launch_gang(offer(), gang(), attempt=1)
    assert list(compute_server.vms) == ["costguard-cg-alice-gang-1-1-n1"]


def test_release_deletes_the_jobs_firewall_rule_only(
    compute_server: ComputeServer, launcher: GcpLauncher
) -> None:
    for handle in launcher.launch_gang(offer(), gang(), attempt=1):
        launcher.terminate(handle)
    launcher.release(gang())
    launcher.release(gang())  # idempotent
    assert TAG not in compute_server.firewalls
    # A rule of that name that opens more than the job's own tag is someone else's.
    compute_server.firewalls[TAG] = {"name": TAG, "sourceRanges": ["0.0.0.0/0"],
                                     "targetTags": [TAG], "direction": "INGRESS"}  # fmt: skip
    launcher.release(gang())
    assert TAG in compute_server.firewalls
    with pytest.raises(CostguardError, match="is not this job's"):
        launcher.launch_gang(offer(), gang(), attempt=2)
    assert len(compute_server.calls("POST", "/instances/bulkInsert")) == 1  # the first only


def test_compact_placement_puts_the_gang_under_the_jobs_policy_until_release(
    compute_server: ComputeServer, launcher: GcpLauncher
) -> None:
    handles = launcher.launch_gang(offer(), gang(placement="compact"), attempt=1)
    policy = compute_server.policies[("us-central1", TAG)]
    assert policy["groupPlacementPolicy"]["collocation"] == "COLLOCATED"
    (call,) = compute_server.calls("POST", "/instances/bulkInsert")
    assert call.body["instanceProperties"]["resourcePolicies"] == [TAG]
    again = launcher.launch_gang(offer(), gang(placement="compact"), attempt=2)  # reused
    for handle in (*handles, *again):
        launcher.terminate(handle)
    launcher.release(gang(placement="compact"))
    assert compute_server.policies == {}
    assert compute_server.firewalls == {}


def test_find_names_each_nodes_rank(launcher: GcpLauncher) -> None:
    handles = launcher.launch_gang(offer(), gang(nodes=3), attempt=1)
    found = {h.instance_id: h.extra.get("node") for h in launcher.find("cg-alice-gang-1")}
    assert found == {h.instance_id: str(rank) for rank, h in enumerate(handles)}
