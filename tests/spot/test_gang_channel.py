"""What each launcher writes on a gang's nodes is what a node reads back: the tags or
metadata a launch leaves on the fakes (moto, the Compute and ARM fakes) served by the
metadata fake to ``costguard.spot.node``, which must find its rank and node 0's private
address as the cloud records them."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from costguard import proof
from costguard.checkpoint import notices
from costguard.clouds import aws as aws_clouds
from costguard.errors import CostguardError
from costguard.spot import bootstrap, node
from costguard.spot.launcher.aws import AwsLauncher
from costguard.spot.launcher.base import LaunchSpec
from costguard.tags import gcp_label
from tests.helpers.clock import Clock
from tests.helpers.metadata import MetadataHandler, MetadataState, serving
from tests.servers.aws import Ec2Faults
from tests.servers.azure import ArmServer
from tests.servers.gcp import ComputeServer

EXPIRES = datetime(2026, 12, 2, tzinfo=UTC)


def signed(spec: LaunchSpec) -> LaunchSpec:
    """``spec`` with a job key, as every launch's: the nodes' values are then signed."""
    return replace(spec, job_key=proof.job_key(bytes(32), spec.job_id).hex())


def read_back(cloud: str, state: MetadataState, spec: LaunchSpec) -> node.Rendezvous:
    """What the node of ``state`` takes, proven with the boot script's key of attempt 1."""
    env = {"COSTGUARD_JOB_ID": spec.job_id, "COSTGUARD_JOB_ATTEMPT": "1"}
    with serving(MetadataHandler, state) as url:
        return node.wait(cloud, 2, {**env, notices.ENDPOINT_ENV[cloud]: url},
                         told_key=spec.told_public(1), wait_s=5)  # fmt: skip


def test_aws_nodes_read_what_the_fleet_launch_tagged(
    ec2_faults: Ec2Faults, aws_launch_options: dict[str, str]
) -> None:
    from tests.spot.test_aws_gang import gang, offer

    def clients(region: str) -> Any:
        return aws_clouds.client("ec2", region, attempts=1)

    launcher = AwsLauncher(regions=["us-east-1"], clients=clients)
    spec = signed(gang())
    handles = launcher.launch_gang(offer(), spec, attempt=1)
    ec2 = aws_clouds.client("ec2", "us-east-1", attempts=1)
    answer = ec2.describe_instances(InstanceIds=[h.instance_id for h in handles])
    found: dict[str, Any] = {i["InstanceId"]: i for r in answer["Reservations"]
                             for i in r["Instances"]}  # fmt: skip
    first = found[handles[0].instance_id]["PrivateIpAddress"]
    for rank, handle in enumerate(handles):
        instance = found[handle.instance_id]
        state = MetadataState(private_address=instance["PrivateIpAddress"],
                              instance_id=handle.instance_id)  # fmt: skip
        state.aws_tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
        assert read_back("aws", state, spec) == node.Rendezvous(rank, first, bootstrap.RDZV_PORT)


def test_gcp_nodes_read_what_the_bulk_insert_set_in_their_metadata(
    compute_server: ComputeServer, gcp_launcher: Any
) -> None:
    from tests.spot.test_gcp_gang import gang, offer

    spec = signed(gang())
    handles = gcp_launcher.launch_gang(offer(), spec, attempt=1)
    first = compute_server.vms[handles[0].instance_id].address
    for rank, handle in enumerate(handles):
        vm = compute_server.vms[handle.instance_id]
        state = MetadataState(private_address=vm.address, gcp_name=handle.instance_id)
        state.gcp_attributes = {i["key"]: i["value"] for i in vm.body["metadata"]["items"]}
        assert gcp_label("costguard:node-rank") in state.gcp_attributes
        assert read_back("gcp", state, spec) == node.Rendezvous(rank, first, bootstrap.RDZV_PORT)


def test_azure_nodes_read_what_the_launch_tagged(arm_server: ArmServer) -> None:
    from tests.servers.azure import GROUP, SUBSCRIPTION
    from tests.spot.test_azure_gang import gang, offer
    from tests.spot.test_azure_launcher import make

    launcher = make(arm_server, subscription_id=SUBSCRIPTION, resource_group=GROUP)
    spec = signed(gang())
    handles = launcher.launch_gang(offer(), spec, attempt=1)
    first = arm_server.vms[handles[0].instance_id].address
    for rank, handle in enumerate(handles):
        vm = arm_server.vms[handle.instance_id]
        state = MetadataState(private_address=vm.address, azure_vm_name=handle.instance_id)
        state.azure_tags = dict(vm.body["tags"])
        assert read_back("azure", state, spec) == node.Rendezvous(rank, first, bootstrap.RDZV_PORT)


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_a_node_of_a_copied_tag_set_is_refused_when_it_claims_node_0(cloud: str) -> None:
    """Tags copied from node 0 onto node 1 (by whoever may write them) make node 1 claim
    rank 0: it is not node 0's address, so the node refuses to start."""
    spec = signed(LaunchSpec("cg-a", "s3://b/cg-a", ("t",), "me", EXPIRES, nodes=2))
    told = node.signed(spec, 1, "node-0", 0, "10.0.0.5")
    state = MetadataState(private_address="10.0.0.6")
    state.aws_tags = dict(told)
    state.gcp_attributes = {gcp_label(k): v for k, v in told.items()}
    state.azure_tags = dict(told)
    with pytest.raises(CostguardError, match="not its own address"):
        read_back(cloud, state, spec)


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_a_node_of_a_copied_tag_set_proves_nothing_on_another_instance(cloud: str) -> None:
    """Node 1's signed values copied onto another node of the gang, where they are well
    formed (a rank that is not 0): signed for node 1's instance only, they are not taken."""
    spec = signed(LaunchSpec("cg-a", "s3://b/cg-a", ("t",), "me", EXPIRES, nodes=3))
    told = node.signed(spec, 1, "node-1", 1, "10.0.0.5")
    state = MetadataState(private_address="10.0.0.7", instance_id="node-2",
                          gcp_name="node-2", azure_vm_name="node-2")  # fmt: skip
    state.aws_tags = dict(told)
    state.gcp_attributes = {gcp_label(k): v for k, v in told.items()}
    state.azure_tags = dict(told)
    env = {"COSTGUARD_JOB_ID": spec.job_id, "COSTGUARD_JOB_ATTEMPT": "1"}
    clock = Clock()
    with (
        serving(MetadataHandler, state) as url,
        pytest.raises(CostguardError, match="not signed by this job's controller"),
    ):
        node.wait(cloud, 3, {**env, notices.ENDPOINT_ENV[cloud]: url},
                  told_key=spec.told_public(1), wait_s=3, poll_s=1, clock=clock,
                  sleep=clock.sleep)  # fmt: skip
    state.instance_id = state.gcp_name = state.azure_vm_name = "node-1"
    with serving(MetadataHandler, state) as url:  # on node 1's own instance: taken
        place = node.wait(cloud, 3, {**env, notices.ENDPOINT_ENV[cloud]: url},
                          told_key=spec.told_public(1), wait_s=3)  # fmt: skip
    assert place.rank == 1
