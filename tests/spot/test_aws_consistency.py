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
from costguard.errors import CostguardError
from costguard.spot.controller import Controller
from costguard.spot.job import ExitRecord, Job, load_job, save_job, write_exit_record
from costguard.spot.launcher import aws as aws_launcher
from costguard.spot.launcher.aws import TERMINATE_WAIT_S, VISIBLE_WITHIN_S, AwsLauncher
from costguard.spot.launcher.base import Handle, LaunchSpec, Offer, State, launch_token
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


def ec2_client(region: str) -> Any:
    """EC2 through the fault layer, one attempt per call (the layer's faults stay counted)."""
    return aws_clouds.client("ec2", region, attempts=1)


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
               {"market": "spot", "attempt": "1", "owner": "alice",
                "client_token": "costguard-run-1-1"})
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


@pytest.mark.parametrize("wait", [None, 5.0])
def test_terminating_a_fresh_instance_ec2_never_shows_is_bounded_and_says_so(
    aws_launch_options: dict[str, str], ec2_faults: Ec2Faults, clock: Clock, wait: float | None
) -> None:
    """Issue 27: the terminate of an instance EC2 does not show was sent again through the
    whole visibility window (600 s: a command hung for 10 minutes), then taken as done.
    Now it is sent again for at most ``terminate_wait_s`` (default ``TERMINATE_WAIT_S``),
    and then an error says that the instance may still run and how to finish."""
    ec2_faults.hidden_calls = 10_000
    launcher = AwsLauncher(
        regions=["us-east-1"], clients=lambda region: aws_clouds.client("ec2", region, attempts=1),
        clock=clock.time, sleep=clock.sleep, terminate_wait_s=wait,
    )  # fmt: skip
    handle = launcher.launch(offer(), spec(), attempt=1)
    limit = TERMINATE_WAIT_S if wait is None else wait
    told = f"did not confirm terminating {handle.instance_id}.*does not show the instance yet"
    with pytest.raises(CostguardError, match=told + ", and it may still run") as raised:
        launcher.terminate(handle)
    assert "costguard launch --attach" in str(raised.value.hint)
    sent = ec2_faults.actions.count("TerminateInstances")
    assert 2 < sent < 20
    assert f"({sent} requests in {limit:.0f} s)" in raised.value.message
    assert limit / 2 < sum(clock.slept) <= limit


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


def launch_briefly(run_cli: Any, aws_launch_options: dict[str, str]) -> tuple[str, Any]:
    """``costguard launch`` of a job that times out after about a second (no instance
    ever reports on moto); its checkpoint URL and the run."""
    aws_clouds.client("s3", attempts=1).create_bucket(Bucket="ckpt")
    url = "s3://ckpt/run"
    options = [x for k, v in aws_launch_options.items() for x in ("--option", f"{k}={v}")]
    result = run_cli(
        "launch", "--provider", "aws", "--gpu", "a10g", "--region", "us-east-1",
        "--checkpoint", url, *options, "--no-alarm-check", "--yes",
        "--timeout-hours", "0.0003", "--poll-seconds", "0.05", "--", "python", "train.py",
    )  # fmt: skip
    return url, result


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
    ec2_faults.hidden_calls = hidden
    url, result = launch_briefly(run_cli, aws_launch_options)
    assert result.exit_code == 1, result.stderr  # it timed out: no instance ever reports
    assert ec2_faults.not_found >= 1
    job = load_job(Store.open(url))
    assert len(job.attempts) == 1, [a.outcome for a in job.attempts]
    assert len(ec2_faults.launched) == 1
    (instance,) = instances_of(aws_env, job.spec.job_id)
    assert instance["State"]["Name"] == "terminated"  # and the timeout left none running


# -- a launch whose answer never reached job.json: found again by its ClientToken ------------


class Crash(BaseException):
    """The controller's process dying: nothing after the raise runs, no handler catches it."""


class DyingLauncher(AwsLauncher):
    """An AWS launcher whose process dies right after ``RunInstances`` succeeded, before the
    controller could write the instance id to ``job.json``."""

    def launch(self, offer: Offer, spec: LaunchSpec, attempt: int) -> Handle:
        super().launch(offer, spec, attempt)
        raise Crash


def test_the_fault_layer_answers_a_repeated_client_token_as_ec2_does(
    launcher: AwsLauncher, ec2_faults: Ec2Faults, aws_env: str
) -> None:
    """EC2's idempotency, which moto lacks: the same token and parameters answer the first
    instance and launch nothing; other parameters are ``IdempotentParameterMismatch``; the
    ``client-token`` filter lists the instance (once visible)."""
    first = launcher.launch(offer(), spec(), attempt=1)
    again = launcher.launch(offer(), spec(), attempt=1)
    assert again.instance_id == first.instance_id
    assert ec2_faults.replayed == 1
    assert len(instances_of(aws_env, "run-1")) == 1
    with pytest.raises(CostguardError, match="client token costguard-run-1-1"):
        launcher.launch(offer(), spec(disk_gb="200"), attempt=1)
    assert ec2_faults.mismatched == 1
    listed = aws_clouds.client("ec2", "us-east-1", attempts=1).describe_instances(
        Filters=[{"Name": "client-token", "Values": [launch_token("run-1", 1)]}]
    )
    assert [i["InstanceId"] for r in listed["Reservations"] for i in r["Instances"]] == [
        first.instance_id
    ]
    assert len(instances_of(aws_env, "run-1")) == 1


@pytest.mark.parametrize("hidden", [0, 12])
def test_a_launch_whose_answer_never_reached_job_json_is_found_by_its_client_token(
    aws_launch_options: dict[str, str], ec2_faults: Ec2Faults, aws_env: str, clock: Clock,
    tmp_path: Path, hidden: int,
) -> None:  # fmt: skip
    """Issue 27: ``RunInstances`` succeeded, then the controller died before it wrote the
    instance id to ``job.json``. The attempt's client token was written before the call;
    the next controller (``--attach``) finds the instance by it, even while EC2's listings
    do not show the instance yet (``hidden`` requests), and never launches a second."""
    ec2_faults.hidden_calls = hidden
    job = contract_job("aws", "A10G", 1, "us-east-1", "s3://x", options=dict(AWS_LAUNCH_OPTIONS))
    job_spec = replace(job, job_id="crash-1")
    store = Store.open(tmp_path / "job")
    save_job(store, Job(job_spec))

    def launcher(kind: type[AwsLauncher]) -> AwsLauncher:
        return kind(regions=["us-east-1"], clients=ec2_client, clock=clock.time, sleep=clock.sleep)

    dying = launcher(DyingLauncher)
    with pytest.raises(Crash):
        Controller(store, dying, [offer()], poll_s=0.0, sleep=clock.sleep).run(load_job(store))
    (attempt,) = load_job(store).attempts
    assert attempt.handle is None
    assert attempt.token == launch_token("crash-1", 1)  # written before the call
    assert len(instances_of(aws_env, "crash-1")) == 1

    polls: list[int] = []

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        polls.append(1)
        assert len(polls) < 50
        assert len(ec2_faults.launched) == 1, "a second instance"
        if len(polls) == 3:  # what `costguard run` writes when the script exits 0
            write_exit_record(store, ExitRecord(1, 0, 10, time.time(), job_id="crash-1"))

    replacement = launcher(AwsLauncher)
    final = Controller(store, replacement, [offer()], poll_s=0.0, sleep=sleep).run(load_job(store))
    assert final.status == "succeeded", final.reason
    assert [a.number for a in final.attempts] == [1]
    (instance,) = instances_of(aws_env, "crash-1")
    assert final.attempts[0].handle is not None
    assert final.attempts[0].handle.instance_id == instance["InstanceId"]
    assert instance["State"]["Name"] in ("shutting-down", "terminated")


def test_an_old_attempt_no_instance_carries_the_token_of_is_not_launched_again(
    launcher: AwsLauncher, ec2_faults: Ec2Faults, clock: Clock
) -> None:
    """Long after the launch was sent (EC2 shows every instance by then), a token no
    instance carries is a launch that never happened: nothing is sent again."""
    long_ago = clock.now - VISIBLE_WITHIN_S
    assert launcher.resume(offer(), spec(), 1, launch_token("run-1", 1), long_ago) is None
    assert "RunInstances" not in ec2_faults.actions


def test_launch_whose_terminate_ec2_never_confirms_returns_and_says_so(
    run_cli: Any, aws_launch_options: dict[str, str], ec2_faults: Ec2Faults, aws_env: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Issue 27, end to end: ``costguard launch`` reaches its timeout while EC2 never shows
    the new instance; the terminate at the end gives up after its (here short) wait, and
    the command returns: an error naming the instance and how to finish, ``job.json``
    still holding the attempt and its instance for ``--attach``."""
    monkeypatch.setattr(aws_launcher, "DESCRIBE_BACKOFF_S", (0.01,))
    monkeypatch.setattr(aws_launcher, "TERMINATE_BACKOFF_S", (0.05,))
    monkeypatch.setattr(aws_launcher, "TERMINATE_WAIT_S", 0.3)
    ec2_faults.hidden_calls = 10_000
    url, result = launch_briefly(run_cli, aws_launch_options)
    assert result.exit_code == 1, result.stderr
    (launched,) = ec2_faults.launched
    assert f"did not confirm terminating {launched}" in result.stderr
    assert "--attach" in result.stderr
    assert 2 <= ec2_faults.actions.count("TerminateInstances") < 20
    job = load_job(Store.open(url))
    (attempt,) = job.attempts
    assert attempt.handle is not None
    assert attempt.handle.instance_id == launched
    assert job.status == "running"  # --attach takes over and finishes it


def test_a_launch_whose_answer_was_lost_is_the_same_instance_not_a_failed_job(
    launcher: AwsLauncher, ec2_faults: Ec2Faults, aws_env: str, clock: Clock, tmp_path: Path
) -> None:
    """Issue 27: ``RunInstances`` launched the instance but its answer was lost (a
    timeout, a dropped connection, a 503 after EC2 acted). The attempt was closed as
    failed, the job ended, and the instance ran on with nobody supervising it. Now the
    controller asks again by the attempt's token and supervises the one instance."""
    ec2_faults.lost_answers = 1
    ec2_faults.hidden_calls = 3
    job = contract_job("aws", "A10G", 1, "us-east-1", "s3://x", options=dict(AWS_LAUNCH_OPTIONS))
    store = Store.open(tmp_path / "job")
    save_job(store, Job(replace(job, job_id="lost-1")))
    polls: list[int] = []

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        polls.append(1)
        assert len(polls) < 50
        if len(polls) == 2:  # what `costguard run` writes when the script exits 0
            write_exit_record(store, ExitRecord(1, 0, 10, time.time(), job_id="lost-1"))

    final = Controller(store, launcher, [offer()], poll_s=0.0, sleep=sleep).run(load_job(store))
    assert final.status == "succeeded", final.reason
    (instance,) = instances_of(aws_env, "lost-1")
    assert [a.handle.instance_id for a in final.attempts if a.handle] == [instance["InstanceId"]]
    assert instance["State"]["Name"] in ("shutting-down", "terminated")
    assert ec2_faults.replayed == 1
