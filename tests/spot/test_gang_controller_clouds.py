"""Issue 47's acceptance on moto, through the controller: `--nodes 2` leaves exactly two
instances of the job, in one zone, and after a capacity fault none (the fleet's
MinTargetCapacity not met launches nothing; a fleet that gives fewer is ended whole)."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest

from costguard.checkpoint.store import Store
from costguard.clouds import aws as aws_clouds
from costguard.spot.controller import Controller
from costguard.spot.job import Job
from costguard.spot.launcher.aws import LIVE_STATES, AwsLauncher
from costguard.spot.launcher.base import Market, Offer
from costguard.spot.recovery import AttemptOutcome, Finish, Launch
from costguard.tags import JOB_TAG
from tests.contract.test_launcher import _job
from tests.servers.aws import Ec2Faults

URL = "s3://ckpt/costguard/run-1"
OFFER = Offer("aws", "us-east-1", "g5.12xlarge", Market.SPOT, Decimal("5.67"), "A10G", 4,
              "us-east-1b")  # fmt: skip


def instances(states: tuple[str, ...] = LIVE_STATES) -> list[dict[str, Any]]:
    """The job's instances in ``states`` (moto, listed by the job's tag)."""
    ec2 = aws_clouds.client("ec2", "us-east-1", attempts=1)
    answer = ec2.describe_instances(
        Filters=[
            {"Name": f"tag:{JOB_TAG}", "Values": ["run-1"]},
            {"Name": "instance-state-name", "Values": list(states)},
        ]
    )
    return [i for r in answer["Reservations"] for i in r["Instances"]]


@pytest.fixture
def controller(ec2_faults: Ec2Faults, aws_launch_options: dict[str, str]) -> Controller:
    aws_clouds.client("s3", attempts=1).create_bucket(Bucket="ckpt")

    def clients(region: str) -> Any:
        return aws_clouds.client("ec2", region, attempts=1)

    launcher = AwsLauncher(regions=["us-east-1"], clients=clients)
    return Controller(Store.open(URL), launcher, [OFFER])


def gang_job(options: dict[str, str]) -> Job:
    spec = _job("aws", "A10G", 4, "us-east-1", URL, options=options, nodes=2)
    return Job(replace(spec, command=("train.py",)))


def test_nodes_2_leaves_exactly_two_instances_of_the_job_in_one_zone(
    controller: Controller, aws_launch_options: dict[str, str]
) -> None:
    job = controller.launch(gang_job(aws_launch_options), Launch(OFFER, 1, "cheapest"))
    (attempt,) = job.attempts
    live = instances()
    assert len(live) == 2
    assert sorted(i["InstanceId"] for i in live) == sorted(h.instance_id for h in attempt.nodes)
    assert len({i["Placement"]["AvailabilityZone"] for i in live}) == 1


@pytest.mark.parametrize("fault", ["no room for the gang", "a fleet short of the gang"])
def test_after_a_capacity_fault_no_instance_of_the_job_is_left(
    controller: Controller, aws_launch_options: dict[str, str], ec2_faults: Ec2Faults,
    fault: str,
) -> None:  # fmt: skip
    if fault == "no room for the gang":
        ec2_faults.fleet_room = 1
    else:
        ec2_faults.short_fleets = 1
    job = controller.launch(gang_job(aws_launch_options), Launch(OFFER, 1, "cheapest"))
    (attempt,) = job.attempts
    assert attempt.outcome is AttemptOutcome.LAUNCH_FAILED
    assert "InsufficientInstanceCapacity" in attempt.detail
    assert instances() == []
    assert instances(("pending", "running", "stopping", "stopped")) == []
    assert len(ec2_faults.launched) == (0 if fault == "no room for the gang" else 1)


def test_a_finished_gang_leaves_no_group_template_or_placement_of_the_job(
    controller: Controller, aws_launch_options: dict[str, str], ec2_faults: Ec2Faults
) -> None:
    job = gang_job({**aws_launch_options, "placement": "cluster"})
    job = controller.launch(job, Launch(OFFER, 1, "cheapest"))
    assert len(instances()) == 2
    ec2 = aws_clouds.client("ec2", "us-east-1", attempts=1)
    by_job = [{"Name": f"tag:{JOB_TAG}", "Values": ["run-1"]}]
    assert ec2.describe_security_groups(Filters=by_job)["SecurityGroups"]
    job = controller.finish(job, Finish("stopped", "--max-total reached"))
    assert job.status == "stopped"
    assert instances() == []
    assert ec2.describe_security_groups(Filters=by_job)["SecurityGroups"] == []
    assert ec2.describe_launch_templates(Filters=by_job)["LaunchTemplates"] == []
    assert ec2_faults.placement_groups == {}


def test_a_polls_reconcile_describes_a_gangs_nodes_in_one_call(
    controller: Controller, aws_launch_options: dict[str, str], ec2_faults: Ec2Faults
) -> None:
    """Both nodes of a running gang are read in one DescribeInstances a poll (the old
    controller described each node alone: two), and the attempt goes on."""
    job = controller.launch(gang_job(aws_launch_options), Launch(OFFER, 1, "cheapest"))
    ec2_faults.actions.clear()
    polled = controller.reconcile(job)
    assert polled.current is not None
    assert polled.current.outcome is None
    assert ec2_faults.actions.count("DescribeInstances") == 1
    controller.finish(polled, Finish("stopped", "the test is over"))
