"""The AWS launcher against a moto server over HTTP (``aws_env`` in tests/conftest.py)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from costguard.checkpoint.store import Store
from costguard.clouds import aws as aws_clouds
from costguard.errors import InputError
from costguard.spot.job import JOB_FILE, Job, JobSpec, save_job
from costguard.spot.launcher.aws import AwsLauncher
from costguard.spot.launcher.base import Handle, LaunchSpec, Market, Offer, State
from costguard.tags import ATTEMPT_TAG, EXPIRES_TAG, IDLE_MINUTES_TAG, JOB_TAG, OWNER_TAG
from tests.servers.aws import AWS_LAUNCH_OPTIONS, reclaim_aws_instance, recording_clients

EXPIRES = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
OPTIONS = AWS_LAUNCH_OPTIONS


def spec(job_id: str = "run-1", **options: str) -> LaunchSpec:
    return LaunchSpec(
        job_id=job_id,
        checkpoint_url=f"s3://ckpt/costguard/{job_id}",
        command=("python", "train.py", "--note", "it's $HOME"),
        owner="alice",
        expires_at=EXPIRES,
        idle_minutes=45,
        every_steps=500,
        options={**OPTIONS, **options},
    )


def offer(market: Market = Market.SPOT, zone: str = "") -> Offer:
    return Offer("aws", "us-east-1", "g5.xlarge", market, Decimal("0.45"), "A10G", 1, zone)


def ec2() -> Any:
    return aws_clouds.client("ec2", "us-east-1", attempts=1)


@pytest.fixture
def launcher(aws_launch_options: dict[str, str]) -> AwsLauncher:
    return AwsLauncher(
        regions=["us-east-1"], clients=lambda region: aws_clouds.client("ec2", region, attempts=1)
    )


def describe(instance_id: str) -> dict[str, Any]:
    (reservation,) = ec2().describe_instances(InstanceIds=[instance_id])["Reservations"]
    (instance,) = reservation["Instances"]
    return dict(instance)


def test_launch_creates_a_tagged_imdsv2_spot_instance(launcher: AwsLauncher) -> None:
    handle = launcher.launch(offer(zone="us-east-1b"), spec(), attempt=2)
    assert handle.provider == "aws"
    assert handle.region == "us-east-1"
    assert handle.zone == "us-east-1b"
    instance = describe(handle.instance_id)
    assert instance["InstanceType"] == "g5.xlarge"
    assert instance["ImageId"] == "ami-12345678"
    assert instance["InstanceLifecycle"] == "spot"
    assert instance["MetadataOptions"]["HttpTokens"] == "required"
    assert instance["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
    assert instance["IamInstanceProfile"]["Arn"].endswith(":instance-profile/costguard-instance")
    tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
    assert tags[JOB_TAG] == "run-1"
    assert tags[OWNER_TAG] == "alice"
    assert tags[ATTEMPT_TAG] == "2"
    assert tags[EXPIRES_TAG] == "2026-12-02T12:00:00+00:00"
    assert tags[IDLE_MINUTES_TAG] == "45"
    # The volumes carry the same tags (the reaper and the IAM conditions see them).
    volumes = ec2().describe_volumes(
        Filters=[{"Name": "attachment.instance-id", "Values": [handle.instance_id]}]
    )["Volumes"]
    assert volumes
    for volume in volumes:
        assert {t["Key"]: t["Value"] for t in volume["Tags"]}[JOB_TAG] == "run-1"
    # The boot script is the user-data, with the job's identity and the quoted command.
    attribute = ec2().describe_instance_attribute(
        InstanceId=handle.instance_id, Attribute="userData"
    )
    script = base64.b64decode(attribute["UserData"]["Value"]).decode()
    assert "export COSTGUARD_JOB_ID=run-1" in script
    assert "export COSTGUARD_JOB_ATTEMPT=2" in script
    assert "python train.py --note 'it'\"'\"'s $HOME'" in script


def test_no_credential_of_the_launching_shell_reaches_the_instance(
    launcher: AwsLauncher, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = {
        "AZURE_CLIENT_SECRET": "azure-client-secret-value",
        "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwx",
        "AWS_SESSION_TOKEN": "IQoJb3JpZ2luX2VjEXAMPLESESSIONTOKEN",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    handle = launcher.launch(offer(), spec(), attempt=1)
    attribute = ec2().describe_instance_attribute(
        InstanceId=handle.instance_id, Attribute="userData"
    )
    script = base64.b64decode(attribute["UserData"]["Value"]).decode()
    assert "costguard run --checkpoint s3://ckpt/costguard/run-1" in script
    for value in (*secrets.values(), "testing"):
        assert value not in script


def test_on_demand_launch_has_no_spot_options(launcher: AwsLauncher) -> None:
    handle = launcher.launch(offer(Market.ON_DEMAND), spec(), attempt=1)
    assert "InstanceLifecycle" not in describe(handle.instance_id)
    assert "InstanceMarketOptions" not in launcher.request(offer(Market.ON_DEMAND), spec(), 1)
    spot = launcher.request(offer(), spec(max_price="0.90"), 1)["InstanceMarketOptions"]
    assert spot == {
        "MarketType": "spot",
        "SpotOptions": {
            "SpotInstanceType": "one-time",
            "InstanceInterruptionBehavior": "terminate",
            "MaxPrice": "0.90",
        },
    }


def test_status_follows_the_instance_through_a_reclaim(launcher: AwsLauncher) -> None:
    handle = launcher.launch(offer(), spec(), attempt=1)
    status = launcher.status(handle)
    assert status.state in (State.PENDING, State.RUNNING)
    assert status.launched_at is not None
    reclaim_aws_instance(handle.instance_id)
    status = launcher.status(handle)
    assert status.state is State.PREEMPTED
    assert "Spot" in status.detail


def test_a_terminated_instance_is_not_a_preemption(launcher: AwsLauncher) -> None:
    handle = launcher.launch(offer(), spec(), attempt=1)
    ec2().terminate_instances(InstanceIds=[handle.instance_id])  # the reaper, a person
    status = launcher.status(handle)
    assert status.state is State.TERMINATED
    assert "User initiated" in status.detail


def test_find_sees_live_instances_of_the_job_only(launcher: AwsLauncher) -> None:
    first = launcher.launch(offer(), spec(), attempt=1)
    other = launcher.launch(offer(), spec("run-2"), attempt=1)
    assert [h.instance_id for h in launcher.find("run-1")] == [first.instance_id]
    reclaim_aws_instance(first.instance_id)
    assert launcher.find("run-1") == []
    second = launcher.launch(offer(), spec(), attempt=2)
    # The attempt is read back from its tag; the launch time only the launch can know.
    launched = {k: v for k, v in second.extra.items() if k != "launched_unix"}
    # With what proves it the job's: its owner tag and the launch's client token.
    proof = {"owner": "alice", "client_token": "costguard-run-1-2"}
    assert launcher.find("run-1") == [replace(second, extra=launched | proof)]
    assert [h.instance_id for h in launcher.find("run-2")] == [other.instance_id]


def test_terminate_is_idempotent(launcher: AwsLauncher) -> None:
    handle = launcher.launch(offer(), spec(), attempt=1)
    launcher.terminate(handle)
    assert describe(handle.instance_id)["State"]["Name"] == "terminated"
    assert launcher.status(handle).state is State.TERMINATED
    launcher.terminate(handle)  # again: fine
    gone = Handle("aws", "us-east-1", "i-0123456789abcdef0")
    launcher.terminate(gone)  # never existed: fine
    assert launcher.status(gone).state is State.MISSING


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"image": ""}, "needs the image option"),
        ({"image": "ubuntu-22.04"}, "must be an AMI id"),
        ({"instance_profile": ""}, "needs the instance_profile option"),
        ({"subnet": "default"}, "subnet id"),
        ({"security_groups": "sg-0abc1234,web"}, "security_groups"),
        ({"metadata_hop_limit": "0"}, "metadata_hop_limit"),
        ({"max_price": "cheap"}, "max_price"),
        ({"workdir": "work"}, "workdir"),
    ],
)
def test_bad_options_fail_before_any_call(
    launcher: AwsLauncher, options: dict[str, str], fragment: str
) -> None:
    with pytest.raises(InputError, match=fragment) as caught:
        launcher.launch(offer(), spec(**options), attempt=1)
    assert caught.value.hint
    assert ec2().describe_instances()["Reservations"] == []


def test_a_secret_in_the_command_is_refused(
    launcher: AwsLauncher, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "0123456789abcdef")
    leaky = LaunchSpec("run-1", "s3://ckpt/run-1", ("python", "t.py", "--key", "0123456789abcdef"),
                       "alice", EXPIRES, options=OPTIONS)  # fmt: skip
    with pytest.raises(InputError, match="WANDB_API_KEY"):
        launcher.check(leaky)
    assert ec2().describe_instances()["Reservations"] == []


def test_capacity_errors_name_the_place(aws_env: str) -> None:
    from costguard.spot.launcher.base import CapacityError

    class Full:
        meta = None

        def run_instances(self, **params: Any) -> Any:
            from botocore.exceptions import ClientError

            error = {"Code": "InsufficientInstanceCapacity", "Message": "no g5 capacity"}
            raise ClientError({"Error": error}, "RunInstances")

    launcher = AwsLauncher(clients=lambda region: Full())
    with pytest.raises(CapacityError) as caught:
        launcher.launch(offer(zone="us-east-1a"), spec(), attempt=1)
    assert caught.value.place == "aws/us-east-1/us-east-1a"
    assert caught.value.code == "InsufficientInstanceCapacity"


def test_zones_are_the_available_azs_that_offer_the_type(
    launcher: AwsLauncher, aws_launch_options: dict[str, str]
) -> None:
    available = sorted(
        z["ZoneName"] for z in ec2().describe_availability_zones()["AvailabilityZones"]
    )
    offering = {
        o["Location"]
        for o in ec2().describe_instance_type_offerings(
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": ["g5.xlarge"]}],
        )["InstanceTypeOfferings"]
    }
    zones = launcher.zones("us-east-1", "g5.xlarge")
    assert len(zones) >= 2
    assert zones == [z for z in available if z in offering]
    assert launcher.zones("us-east-1") == available
    assert launcher.zones("us-west-2", "g5.xlarge")[0].startswith("us-west-2")
    # A subnet lives in one zone: with it, the launcher names none (EC2 would refuse others).
    pinned = AwsLauncher(
        regions=["us-east-1"],
        options={"subnet": "subnet-0abc12345"},
        clients=lambda region: aws_clouds.client("ec2", region, attempts=1),
    )
    assert pinned.zones("us-east-1", "g5.xlarge") == []


def test_max_price_reaches_the_spot_options(aws_launch_options: dict[str, str]) -> None:
    """--max-price (the job spec's cap) goes out as SpotOptions.MaxPrice on the wire; moto
    records only that the instance is spot, so the request body is what is asserted."""
    sent: list[bytes] = []
    launcher = AwsLauncher(regions=["us-east-1"], clients=recording_clients(sent))
    capped = replace(spec(), max_usd_per_hour=Decimal("0.5"))
    handle = launcher.launch(offer(), capped, attempt=1)
    assert describe(handle.instance_id)["InstanceLifecycle"] == "spot"
    (body,) = sent
    fields = parse_qs(body.decode())
    assert fields["InstanceMarketOptions.MarketType"] == ["spot"]
    assert fields["InstanceMarketOptions.SpotOptions.MaxPrice"] == ["0.5"]
    # The option and the flag must agree; a disagreement is refused before any call.
    with pytest.raises(InputError, match="disagree"):
        launcher.launch(offer(), replace(capped, options={**OPTIONS, "max_price": "0.6"}), 2)
    assert len(sent) == 1
    launcher.launch(offer(Market.ON_DEMAND), capped, attempt=3)
    assert "MaxPrice" not in sent[-1].decode()  # on-demand has no cap


def test_a_wildcard_job_id_in_job_json_terminates_nobody_elses_instance(
    launcher: AwsLauncher, aws_launch_options: dict[str, str], tmp_path: Path,
    run_cli: Callable[..., Any],
) -> None:  # fmt: skip
    # Issue 28: anyone who can write the store's job.json wrote "job_id": "*"; `launch
    # --attach` put it in an EC2 tag filter (where * is a wildcard) and terminated every
    # costguard instance as a stray of this job.
    theirs = [launcher.launch(offer(), spec("cg-theirs-1"), attempt=n).instance_id for n in (1, 2)]
    store = Store.open(str(tmp_path / "ckpt"))
    mine = JobSpec(
        job_id="cg-mine-1", provider="aws", gpu="A10G", gpu_count=1, regions=("us-east-1",),
        spot=True, checkpoint_url=store.url, command=("python", "train.py"), owner="mallory",
        created_unix=time.time(), expires_at=EXPIRES, options=aws_launch_options,
    )  # fmt: skip
    save_job(store, Job(mine))
    for forged in ("*", "cg-*", "cg-theirs-?", "../cg-theirs-1", "cg-theirs-1\n"):
        doc = json.loads(store.get(JOB_FILE))
        doc["spec"]["job_id"] = forged
        store.put(JOB_FILE, json.dumps(doc).encode())
        result = run_cli("launch", "--attach", store.url, "--force")
        assert result.exit_code == 2, (forged, result.stdout, result.stderr)
        assert "is not a costguard record: spec.job_id: not a costguard job id" in result.stderr
        assert "Hint:" in result.stderr
        with pytest.raises(InputError, match="not a costguard job id"):
            launcher.find(forged)
    assert all(describe(i)["State"]["Name"] in ("pending", "running") for i in theirs)
    assert sorted(h.instance_id for h in launcher.find("cg-theirs-1")) == sorted(theirs)
