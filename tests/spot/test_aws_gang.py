"""A gang (``--nodes``) on AWS: one instant ``CreateFleet``, all or none, against moto over
HTTP behind the EC2 fault layer of ``tests/servers/aws.py``, which models what moto does
not: a fleet's ``MinTargetCapacity`` (no room for all: nothing launched), a fleet that
gives fewer than asked, client-token replays, placement groups and a security group still
in use by instances that are not terminated yet."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from costguard import proof
from costguard.checkpoint import notices
from costguard.clouds import aws as aws_clouds
from costguard.errors import CostguardError
from costguard.spot import bootstrap, node
from costguard.spot.launcher import aws
from costguard.spot.launcher.aws import AwsLauncher
from costguard.spot.launcher.base import CapacityError, LaunchSpec, Market, Offer
from costguard.tags import JOB_TAG, NODE_RANK_TAG, OWNER_TAG, RENDEZVOUS_TAG
from tests.helpers.clock import Clock
from tests.helpers.metadata import MetadataHandler, MetadataState, serving
from tests.servers.aws import Ec2Faults

EXPIRES = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def gang(nodes: int = 2, job_id: str = "cg-alice-gang-1", **options: str) -> LaunchSpec:
    return LaunchSpec(
        job_id=job_id,
        checkpoint_url=f"s3://ckpt/costguard/alice/{job_id}",
        command=("train.py", "--lr", "3e-4"),
        owner="alice",
        expires_at=EXPIRES,
        options={"image": "ami-12345678", "instance_profile": "costguard-instance", **options},
        nodes=nodes,
        procs_per_node=2,
    )


def offer(market: Market = Market.SPOT, zone: str = "us-east-1b") -> Offer:
    return Offer("aws", "us-east-1", "g5.12xlarge", market, Decimal("2.10"), "A10G", 4, zone)


@pytest.fixture
def launcher(ec2_faults: Ec2Faults, aws_launch_options: dict[str, str]) -> AwsLauncher:
    clock = Clock()
    return AwsLauncher(
        regions=["us-east-1"],
        clients=lambda region: aws_clouds.client("ec2", region, attempts=1),
        clock=clock,
        sleep=clock.sleep,
    )


def ec2() -> Any:
    return aws_clouds.client("ec2", "us-east-1", attempts=1)


def instances_of(job_id: str, states: tuple[str, ...] = aws.LIVE_STATES) -> list[dict[str, Any]]:
    """The job's instances in ``states``, as EC2 lists them by tag."""
    answer = ec2().describe_instances(
        Filters=[
            {"Name": f"tag:{JOB_TAG}", "Values": [job_id]},
            {"Name": "instance-state-name", "Values": list(states)},
        ]
    )
    return [i for r in answer["Reservations"] for i in r["Instances"]]


def template_data(name: str) -> dict[str, Any]:
    """What the launch template ``name`` holds (its one version)."""
    (template,) = ec2().describe_launch_templates(LaunchTemplateNames=[name])["LaunchTemplates"]
    (version,) = ec2().describe_launch_template_versions(
        LaunchTemplateId=template["LaunchTemplateId"]
    )["LaunchTemplateVersions"]
    return dict(version["LaunchTemplateData"])


def tags_of(item: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in item.get("Tags", [])}


def test_two_nodes_are_exactly_two_instances_of_the_job_in_one_zone(
    launcher: AwsLauncher, ec2_faults: Ec2Faults
) -> None:
    handles = launcher.launch_gang(offer(), gang(), attempt=1)

    live = instances_of("cg-alice-gang-1")
    assert sorted(i["InstanceId"] for i in live) == [h.instance_id for h in handles]
    assert len(live) == 2
    assert len({i["Placement"]["AvailabilityZone"] for i in live}) == 1
    assert {h.zone for h in handles} == {live[0]["Placement"]["AvailabilityZone"]}
    # One instant fleet asked for both, or none, in one zone (EC2's all-or-nothing request).
    (fleet,) = ec2_faults.fleets
    assert fleet["Type"] == "instant"
    assert fleet["TargetCapacitySpecification.TotalTargetCapacity"] == "2"
    assert fleet["TargetCapacitySpecification.DefaultTargetCapacityType"] == "spot"
    assert fleet["SpotOptions.MinTargetCapacity"] == "2"
    assert fleet["SpotOptions.SingleAvailabilityZone"] == "true"
    assert fleet["SpotOptions.SingleInstanceType"] == "true"
    assert fleet["LaunchTemplateConfigs.1.Overrides.1.AvailabilityZone"] == "us-east-1b"
    assert fleet["ClientToken"] == "costguard-cg-alice-gang-1-1"
    assert ec2_faults.actions.count("CreateFleet") == 1
    assert "RunInstances" not in ec2_faults.actions


def test_each_node_is_told_its_rank_and_node_0s_private_address_in_its_own_tags(
    launcher: AwsLauncher,
) -> None:
    handles = launcher.launch_gang(offer(), gang(nodes=3), attempt=1)
    described = {i["InstanceId"]: i for i in instances_of("cg-alice-gang-1")}
    first = described[handles[0].instance_id]["PrivateIpAddress"]
    for rank, handle in enumerate(handles):
        tags = tags_of(described[handle.instance_id])
        assert tags[NODE_RANK_TAG] == str(rank)
        assert tags[RENDEZVOUS_TAG] == f"{first}:{bootstrap.RDZV_PORT}"
        assert tags[JOB_TAG] == "cg-alice-gang-1"
        assert handle.extra["node"] == str(rank)
        assert handle.extra["nodes"] == "3"
    # The nodes read those tags from IMDSv2 only: tokens required, tags exposed there.
    metadata = template_data("costguard-cg-alice-gang-1-1")["MetadataOptions"]
    assert metadata["HttpTokens"] == "required"
    assert metadata["InstanceMetadataTags"] == "enabled"


def test_each_node_proves_what_it_was_told_for_its_own_instance(launcher: AwsLauncher) -> None:
    """The tags the launch wrote on moto, read by each node from the metadata test server
    as IMDSv2 serves them: every node proves its own; node 1's copied onto node 0's
    instance (whoever may call CreateTags could) proves nothing there."""
    spec = replace(gang(), job_key=proof.job_key(bytes(32), "cg-alice-gang-1").hex())
    handles = launcher.launch_gang(offer(), spec, attempt=1)
    described = {i["InstanceId"]: i for i in instances_of("cg-alice-gang-1")}
    env = {"COSTGUARD_JOB_ID": spec.job_id, "COSTGUARD_JOB_ATTEMPT": "1"}

    def place(tags_from: int, on: int) -> node.Rendezvous:
        item = described[handles[on].instance_id]
        state = MetadataState(aws_tags=tags_of(described[handles[tags_from].instance_id]),
                              instance_id=item["InstanceId"],
                              private_address=item["PrivateIpAddress"])  # fmt: skip
        clock = Clock()
        with serving(MetadataHandler, state) as url:
            return node.wait("aws", 2, {**env, notices.ENDPOINT_ENV["aws"]: url},
                             told_key=spec.told_public(1), wait_s=4, poll_s=1, clock=clock,
                             sleep=clock.sleep)  # fmt: skip

    assert [place(rank, rank).rank for rank in range(2)] == [0, 1]
    with pytest.raises(CostguardError, match="not signed by this job's controller"):
        place(1, 0)


def test_the_security_group_opens_the_ports_only_to_the_jobs_own_nodes(
    launcher: AwsLauncher,
) -> None:
    launcher.launch_gang(offer(), gang(), attempt=1)
    (group,) = ec2().describe_security_groups(
        Filters=[{"Name": "group-name", "Values": ["costguard-cg-alice-gang-1"]}]
    )["SecurityGroups"]
    assert tags_of(group)[JOB_TAG] == "cg-alice-gang-1"
    assert tags_of(group)[OWNER_TAG] == "alice"
    rules = group["IpPermissions"]
    low, high = bootstrap.COLLECTIVE_PORTS
    ports = sorted((r["FromPort"], r["ToPort"]) for r in rules)
    assert ports == [(bootstrap.RDZV_PORT, bootstrap.RDZV_PORT), (low, high)]
    for rule in rules:
        assert rule["IpProtocol"] == "tcp"
        assert rule["IpRanges"] == []
        assert rule.get("Ipv6Ranges", []) == []
        assert [p["GroupId"] for p in rule["UserIdGroupPairs"]] == [group["GroupId"]]
    assert template_data("costguard-cg-alice-gang-1-1")["SecurityGroupIds"] == [group["GroupId"]]


def test_no_room_for_the_whole_gang_launches_nothing(
    launcher: AwsLauncher, ec2_faults: Ec2Faults
) -> None:
    ec2_faults.fleet_room = 1  # one node fits, the gang needs two
    with pytest.raises(CapacityError) as caught:
        launcher.launch_gang(offer(), gang(), attempt=1)
    assert caught.value.place == "aws/us-east-1/us-east-1b"
    assert caught.value.code == "InsufficientInstanceCapacity"
    assert ec2_faults.launched == []  # never one instance started, so none billed
    assert instances_of("cg-alice-gang-1", ("pending", "running", "stopping", "stopped")) == []


@pytest.mark.parametrize("market", [Market.SPOT, Market.ON_DEMAND])
def test_a_fleet_that_gives_fewer_than_the_gang_leaves_none_running(
    launcher: AwsLauncher, ec2_faults: Ec2Faults, market: Market
) -> None:
    ec2_faults.short_fleets = 1  # EC2 launches 2 of 3 whatever the minimum said
    with pytest.raises(CapacityError) as caught:
        launcher.launch_gang(offer(market), gang(nodes=3), attempt=1)
    assert "EC2 gave 2 of the 3" in str(caught.value)
    assert len(ec2_faults.launched) == 2
    assert instances_of("cg-alice-gang-1") == []
    ended = instances_of("cg-alice-gang-1", ("shutting-down", "terminated"))
    assert sorted(i["InstanceId"] for i in ended) == sorted(ec2_faults.launched)


def test_on_demand_gangs_ask_for_the_same_all_or_nothing(
    launcher: AwsLauncher, ec2_faults: Ec2Faults
) -> None:
    launcher.launch_gang(offer(Market.ON_DEMAND, zone=""), gang(), attempt=1)
    (fleet,) = ec2_faults.fleets
    assert fleet["TargetCapacitySpecification.DefaultTargetCapacityType"] == "on-demand"
    assert fleet["OnDemandOptions.MinTargetCapacity"] == "2"
    assert fleet["OnDemandOptions.SingleAvailabilityZone"] == "true"
    assert not any(k.startswith("SpotOptions") for k in fleet)
    assert len(instances_of("cg-alice-gang-1")) == 2


def test_a_repeated_launch_of_the_attempt_is_answered_by_its_client_token(
    launcher: AwsLauncher, ec2_faults: Ec2Faults
) -> None:
    first = launcher.launch_gang(offer(), gang(), attempt=1)
    again = launcher.launch_gang(offer(), gang(), attempt=1)  # the controller's retry
    assert [h.instance_id for h in again] == [h.instance_id for h in first]
    assert ec2_faults.replayed == 1
    assert len(instances_of("cg-alice-gang-1")) == 2


def test_cluster_placement_puts_the_fleet_in_the_jobs_placement_group(
    launcher: AwsLauncher, ec2_faults: Ec2Faults
) -> None:
    launcher.launch_gang(offer(), gang(placement="cluster"), attempt=1)
    (fleet,) = ec2_faults.fleets
    assert fleet["LaunchTemplateConfigs.1.Overrides.1.Placement.GroupName"] == (
        "costguard-cg-alice-gang-1"
    )
    group = ec2_faults.placement_groups[("us-east-1", "costguard-cg-alice-gang-1")]
    assert group["strategy"] == "cluster"
    assert group["tags"] == {JOB_TAG: "cg-alice-gang-1", OWNER_TAG: "alice"}


def test_release_removes_the_group_template_and_placement_once_the_nodes_are_gone(
    launcher: AwsLauncher, ec2_faults: Ec2Faults
) -> None:
    spec = gang(placement="cluster")
    handles = launcher.launch_gang(offer(), spec, attempt=1)
    # While a node runs, the group is in use: release says so (bounded) and deletes no group.
    with pytest.raises(CostguardError, match="still in use"):
        launcher.release(spec)
    assert ec2().describe_security_groups(
        Filters=[{"Name": "group-name", "Values": ["costguard-cg-alice-gang-1"]}]
    )["SecurityGroups"]
    for handle in handles:
        launcher.terminate(handle)
    launcher.release(spec)
    launcher.release(spec)  # idempotent
    assert not ec2().describe_security_groups(
        Filters=[{"Name": "group-name", "Values": ["costguard-cg-alice-gang-1"]}]
    )["SecurityGroups"]
    assert not ec2().describe_launch_templates(
        Filters=[{"Name": f"tag:{JOB_TAG}", "Values": ["cg-alice-gang-1"]}]
    )["LaunchTemplates"]
    assert ec2_faults.placement_groups == {}


def test_release_leaves_what_is_not_the_jobs_alone(
    launcher: AwsLauncher, ec2_faults: Ec2Faults
) -> None:
    launcher.launch_gang(offer(), gang(), attempt=1)
    other = replace(gang(), owner="mallory")  # the same job id, another owner's tags
    for handle in launcher.find("cg-alice-gang-1"):
        launcher.terminate(handle)
    launcher.release(other)
    assert ec2().describe_security_groups(
        Filters=[{"Name": "group-name", "Values": ["costguard-cg-alice-gang-1"]}]
    )["SecurityGroups"]
    assert "DeleteSecurityGroup" not in ec2_faults.actions


def test_a_group_of_the_jobs_name_that_is_not_the_jobs_is_refused_before_any_launch(
    launcher: AwsLauncher, ec2_faults: Ec2Faults
) -> None:
    vpc = ec2().describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0]
    ec2().create_security_group(
        GroupName="costguard-cg-alice-gang-1", Description="someone's", VpcId=vpc["VpcId"]
    )
    with pytest.raises(CostguardError, match=r"is not tagged as this job.s"):
        launcher.launch_gang(offer(), gang(), attempt=1)
    assert "CreateFleet" not in ec2_faults.actions


def test_nodes_ec2_does_not_show_yet_are_described_and_tagged_again(
    launcher: AwsLauncher, ec2_faults: Ec2Faults
) -> None:
    ec2_faults.hidden_calls = 2  # each new instance: NotFound for its first two requests
    handles = launcher.launch_gang(offer(), gang(), attempt=1)
    assert ec2_faults.not_found >= 2
    described = {i["InstanceId"]: i for i in instances_of("cg-alice-gang-1")}
    assert sorted(described) == [h.instance_id for h in handles]
    for rank, handle in enumerate(handles):
        assert tags_of(described[handle.instance_id])[NODE_RANK_TAG] == str(rank)


def test_find_names_each_nodes_rank(launcher: AwsLauncher) -> None:
    """What the controller adopts a gang by after it died before writing the handles."""
    handles = launcher.launch_gang(offer(), gang(nodes=3), attempt=1)
    found = {h.instance_id: h.extra.get("node") for h in launcher.find("cg-alice-gang-1")}
    assert found == {h.instance_id: str(rank) for rank, h in enumerate(handles)}
