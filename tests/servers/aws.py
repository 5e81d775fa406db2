"""Helpers for the AWS side of the suites: moto (the real EC2 API over HTTP) needs no fake,
only an account set up the way ``infra/aws`` describes, a spot reclaim (moto has no API
for one) and a look at what the SDK sent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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

        client.meta.events.register("before-send.ec2.RunInstances", keep)
        return client

    return make
