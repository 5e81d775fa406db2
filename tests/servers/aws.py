"""Helpers for the AWS side of the suites: moto (the real EC2 API over HTTP) needs no fake,
only an account set up the way ``infra/aws`` describes, a spot reclaim (moto has no API
for one) and a look at what the SDK sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from costguard.clouds import aws as aws_clouds

REPO = Path(__file__).resolve().parents[2]
AWS_LAUNCH_OPTIONS = {"image": "ami-12345678", "instance_profile": "costguard-instance"}


def launch_account() -> dict[str, str]:
    """In a clean moto account (``aws_env``): the ``costguard-instance`` role and instance
    profile that ``infra/aws/launcher-instance-role-*.json`` describe; the options that
    launch into it."""

    iam = aws_clouds.client("iam", attempts=1)
    trust = (REPO / "infra" / "aws" / "launcher-instance-role-trust.json").read_text()
    iam.create_role(RoleName="costguard-instance", AssumeRolePolicyDocument=trust)
    iam.create_instance_profile(InstanceProfileName="costguard-instance")
    iam.add_role_to_instance_profile(
        InstanceProfileName="costguard-instance", RoleName="costguard-instance"
    )
    return dict(AWS_LAUNCH_OPTIONS)


def reclaim_aws_instance(instance_id: str, region: str = "us-east-1") -> None:
    """What a spot interruption leaves behind: the instance terminated with the state reason
    ``Server.SpotInstanceTermination``.

    moto cannot interrupt an instance through its API; its server runs in this process
    (``moto_server``), so the instance is terminated in moto's backend and given the reason
    EC2 records for a reclaim.
    """
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends
    from moto.ec2.models.instances import StateReason

    instance = ec2_backends[DEFAULT_ACCOUNT_ID][region].get_instance(instance_id)
    instance.terminate()
    instance.state_reason = StateReason(
        "Server.SpotInstanceTermination: Spot instance termination",
        "Server.SpotInstanceTermination",
    )


def recording_clients(sent: list[bytes]) -> Any:
    """EC2 clients that keep the body of every RunInstances request sent to moto."""

    def make(region: str) -> Any:
        client = aws_clouds.client("ec2", region, attempts=1)

        def keep(request: Any, **_: Any) -> None:
            body = request.body or b""
            sent.append(body.encode() if isinstance(body, str) else bytes(body))

        client.meta.events.register(  # once: the client is shared
            "before-send.ec2.RunInstances", keep, unique_id=f"keep-{id(sent)}"
        )
        return client

    return make


@contextmanager
def moto_clock(at: datetime) -> Iterator[None]:
    """Launch instances as if at ``at`` (moto stamps LaunchTime with its own clock)."""
    from moto.ec2.models import instances as moto_instances

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(moto_instances, "utcnow", lambda: at.astimezone(UTC).replace(tzinfo=None))
        yield


def launch_instance(ec2: Any, name: str, instance_type: str = "g5.xlarge", *, at: datetime,
                    tags: dict[str, str] | None = None) -> str:  # fmt: skip
    """A running instance named ``name``, launched (for moto) at ``at``; its id."""
    all_tags = [{"Key": "Name", "Value": name}] + [
        {"Key": k, "Value": v} for k, v in (tags or {}).items()
    ]
    with moto_clock(at):
        reply = ec2.run_instances(
            ImageId="ami-12c6146b",
            MinCount=1,
            MaxCount=1,
            InstanceType=instance_type,
            TagSpecifications=[{"ResourceType": "instance", "Tags": all_tags}],
        )
    return str(reply["Instances"][0]["InstanceId"])


def every_five_minutes(now: datetime, values: list[float] | float) -> list[tuple[datetime, float]]:
    """Thirteen datapoints, one per 5 minutes back from 2 minutes before ``now`` (covers 60
    minutes)."""
    seq = values if isinstance(values, list) else [values] * 13
    return [(now - timedelta(minutes=2 + 5 * k), v) for k, v in enumerate(seq)]


class Metrics:
    """CloudWatch datapoints up to ``now``, gathered per namespace, sent in a few
    PutMetricData calls."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self.data: dict[str, list[dict[str, Any]]] = {}

    def put(self, namespace: str, metric: str, dims: dict[str, str],
            data: list[tuple[datetime, float]]) -> None:  # fmt: skip
        dimensions = [{"Name": k, "Value": v} for k, v in dims.items()]
        self.data.setdefault(namespace, []).extend(
            {"MetricName": metric, "Dimensions": dimensions, "Timestamp": t, "Value": v}
            for t, v in data
        )

    def seed(self, instance_id: str, *, gpu: list[float] | float | None = 1.0,
             cpu: float = 2.0, net_bytes: float = 1000.0) -> None:  # fmt: skip
        dims = {"InstanceId": instance_id}
        if gpu is not None:
            self.put("CWAgent", "nvidia_smi_utilization_gpu", dims, self.points(gpu))
        self.put("AWS/EC2", "CPUUtilization", dims, self.points(cpu))
        self.put("AWS/EC2", "NetworkIn", dims, self.points(net_bytes))
        self.put("AWS/EC2", "NetworkOut", dims, self.points(net_bytes))

    def points(self, values: list[float] | float) -> list[tuple[datetime, float]]:
        return every_five_minutes(self.now, values)

    def send(self, cloudwatch: Any) -> None:
        for namespace, data in self.data.items():
            for start in range(0, len(data), 1000):  # the PutMetricData limit
                cloudwatch.put_metric_data(
                    Namespace=namespace, MetricData=data[start : start + 1000]
                )
