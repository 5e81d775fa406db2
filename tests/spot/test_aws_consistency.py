"""EC2's eventual consistency (moto behind the fault layer of ``tests/servers/aws.py``):
right after ``RunInstances`` the new instance may be unknown to ``DescribeInstances`` and
``TerminateInstances`` (``InvalidInstanceID.NotFound``), and after a terminate a describe
may still show it running. EC2's documentation: such a NotFound "does not mean the
instance does not exist". None of it may start a second instance or leave one running."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from costguard.checkpoint.store import Store
from costguard.clouds import aws as aws_clouds
from costguard.spot.controller import Controller
from costguard.spot.job import ExitRecord, Job, load_job, save_job, write_exit_record
from costguard.spot.launcher import aws as aws_launcher
from costguard.spot.launcher.aws import VISIBLE_WITHIN_S, AwsLauncher
from costguard.spot.launcher.base import Handle, State
from costguard.tags import JOB_TAG
from tests.contract.test_launcher import _job as contract_job
from tests.servers.aws import AWS_LAUNCH_OPTIONS, Ec2Faults
from tests.spot.test_aws_launcher import offer, spec


def moto_ec2(moto: str) -> Any:
    """EC2 as moto holds it, around the fault layer: what really runs."""
    import boto3

    return boto3.client("ec2", "us-east-1", endpoint_url=moto)


def instances_of(moto: str, job_id: str) -> list[dict[str, Any]]:
    pages = moto_ec2(moto).describe_instances(
        Filters=[{"Name": f"tag:{JOB_TAG}", "Values": [job_id]}]
    )
    return [i for r in pages["Reservations"] for i in r["Instances"]]


class Clock:
    """The launcher's clock and sleep: sleeping moves the clock, nothing waits."""

    def __init__(self) -> None:
        self.now = 1_000_000.0
        self.slept: list[float] = []

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def launcher(
    aws_launch_options: dict[str, str], ec2_faults: Ec2Faults, clock: Clock
) -> AwsLauncher:
    return AwsLauncher(
        regions=["us-east-1"],
        clients=lambda region: aws_clouds.client("ec2", region, attempts=1),
        clock=clock.time,
        sleep=clock.sleep,
    )


def test_a_fresh_instance_ec2_does_not_show_yet_is_pending_not_missing(
    launcher: AwsLauncher, ec2_faults: Ec2Faults, clock: Clock
) -> None:
    ec2_faults.hidden_calls = 6
    handle = launcher.launch(offer(), spec(), attempt=1)
    first = launcher.status(handle)  # NotFound 4 times: described again with backoff
    assert first.state is State.PENDING, first
    assert ec2_faults.not_found == 4
    assert 0 < sum(clock.slept) < 5
    assert launcher.status(handle).state is State.RUNNING  # visible at the 7th request
    assert launcher.find("run-1") == [
        Handle("aws", "us-east-1", handle.instance_id, handle.zone,
               {"market": "spot", "attempt": "1"})
    ]  # fmt: skip


def test_a_notfound_long_after_the_launch_is_missing(
    launcher: AwsLauncher, ec2_faults: Ec2Faults, clock: Clock
) -> None:
    ec2_faults.hidden_calls = 100
    handle = launcher.launch(offer(), spec(), attempt=1)
    clock.now += VISIBLE_WITHIN_S
    assert launcher.status(handle).state is State.MISSING
    assert ec2_faults.not_found == 1  # no retry: EC2 would have shown it by now


def test_a_filtered_listing_leaves_a_fresh_instance_out(
    launcher: AwsLauncher, ec2_faults: Ec2Faults
) -> None:
    ec2_faults.hidden_calls = 1
    handle = launcher.launch(offer(), spec(), attempt=1)
    assert launcher.find("run-1") == []  # the fault layer is as eventual as EC2
    launcher.status(handle)
    assert [h.instance_id for h in launcher.find("run-1")] == [handle.instance_id]


def test_terminating_a_fresh_instance_is_confirmed_by_its_state(
    launcher: AwsLauncher, ec2_faults: Ec2Faults, aws_env: str, clock: Clock
) -> None:
    """A terminate answered NotFound was taken as done, and the instance ran on."""
    ec2_faults.hidden_calls = 3
    ec2_faults.stale_calls = 2
    handle = launcher.launch(offer(), spec(), attempt=1)
    launcher.terminate(handle)
    assert ec2_faults.actions.count("TerminateInstances") == 4
    (instance,) = instances_of(aws_env, "run-1")
    assert instance["State"]["Name"] == "terminated"
    # A describe right after still shows it running: the terminate stands, sent again.
    assert launcher.status(handle).state is State.RUNNING
    launcher.terminate(handle)
    assert ec2_faults.stale_views == 1
    assert instances_of(aws_env, "run-1")[0]["State"]["Name"] == "terminated"


def test_a_fresh_instance_ec2_never_shows_is_terminated_again_through_the_window(
    launcher: AwsLauncher, ec2_faults: Ec2Faults, clock: Clock
) -> None:
    """Bounded: the terminate is sent again until the visibility window has passed (then
    a NotFound means gone), not forever and not just once."""
    ec2_faults.hidden_calls = 10_000
    handle = launcher.launch(offer(), spec(), attempt=1)
    launcher.terminate(handle)
    sent = ec2_faults.actions.count("TerminateInstances")
    assert 10 < sent < 100
    assert VISIBLE_WITHIN_S <= sum(clock.slept) < VISIBLE_WITHIN_S + 60


def test_twenty_controlled_jobs_start_one_instance_each_while_ec2_catches_up(
    launcher: AwsLauncher, ec2_faults: Ec2Faults, aws_env: str, tmp_path: Path
) -> None:
    """Acceptance (issue 27), 20 trials: the controller and its AWS launcher (the job's
    store a local folder, to keep trials cheap), with the new instance hidden for ``n``
    requests (``n`` = 1..20) and the job's exit record arriving at a different poll each
    trial: the status right after the launch, the polls and the terminate at the end all
    meet the NotFound window. Each job runs on exactly one instance, terminated at the end.
    """
    for n in range(1, 21):
        ec2_faults.hidden_calls = n
        before = len(ec2_faults.launched)
        url = f"s3://ckpt/trial-{n}"
        job = contract_job("aws", "A10G", 1, "us-east-1", url, options=dict(AWS_LAUNCH_OPTIONS))
        job_spec = replace(job, job_id=f"trial-{n}")
        store = Store.open(tmp_path / f"trial-{n}")
        save_job(store, Job(job_spec))
        polls: list[int] = []

        def sleep(_: float, polls: list[int] = polls, store: Store = store, n: int = n) -> None:
            polls.append(1)
            assert len(polls) < 50
            if len(polls) == n % 5 + 1:  # what `costguard run` writes when the script exits 0
                write_exit_record(store, ExitRecord(1, 0, 10, time.time(), job_id=f"trial-{n}"))

        final = Controller(store, launcher, [offer()], poll_s=0.0, sleep=sleep).run(load_job(store))
        assert final.status == "succeeded", (n, final.reason)
        assert len(final.attempts) == 1, (n, [a.outcome for a in final.attempts])
        assert len(ec2_faults.launched) == before + 1, n
        (instance,) = instances_of(aws_env, f"trial-{n}")
        assert instance["State"]["Name"] in ("shutting-down", "terminated"), n
    assert ec2_faults.not_found >= 20


@pytest.mark.parametrize("hidden", [1, 40])
def test_launch_starts_one_instance_while_ec2_catches_up(
    run_cli: Any, aws_launch_options: dict[str, str], ec2_faults: Ec2Faults, aws_env: str,
    monkeypatch: pytest.MonkeyPatch, hidden: int,
) -> None:  # fmt: skip
    """Acceptance (issue 27), end to end: ``costguard launch`` with the new instance hidden
    for ``hidden`` requests (40: from the first status after the launch to past the
    terminate at the end) starts one instance and leaves none running."""
    monkeypatch.setattr(aws_launcher, "DESCRIBE_BACKOFF_S", (0.01, 0.01, 0.01))
    monkeypatch.setattr(aws_launcher, "TERMINATE_BACKOFF_S", (0.01,))
    aws_clouds.client("s3", attempts=1).create_bucket(Bucket="ckpt")
    ec2_faults.hidden_calls = hidden
    url = "s3://ckpt/run"
    options = [x for k, v in aws_launch_options.items() for x in ("--option", f"{k}={v}")]
    result = run_cli(
        "launch", "--provider", "aws", "--gpu", "a10g", "--region", "us-east-1",
        "--checkpoint", url, *options, "--no-alarm-check", "--yes",
        "--timeout-hours", "0.0003", "--poll-seconds", "0.05", "--", "python", "train.py",
    )  # fmt: skip
    assert result.exit_code == 1, result.stderr  # it timed out: no instance ever reports
    assert ec2_faults.not_found >= 1
    job = load_job(Store.open(url))
    assert len(job.attempts) == 1, [a.outcome for a in job.attempts]
    assert len(ec2_faults.launched) == 1
    (instance,) = instances_of(aws_env, job.spec.job_id)
    assert instance["State"]["Name"] == "terminated"  # and the timeout left none running
