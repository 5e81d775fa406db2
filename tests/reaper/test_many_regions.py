"""`burn` and `reap` over many AWS regions (moto server): credentials asked once before any
client exists, one boto3 session, one client per region and service, regions listed at
once. Bounded by counts and a barrier, not by the wall clock."""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from costguard.clouds import aws as aws_clouds

REGIONS = ("us-east-1", "us-west-2", "eu-west-1", "ap-south-1")


@pytest.fixture
def made(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Sessions and clients costguard builds while the test runs, by kind (the moto server
    runs in this process and builds its own)."""
    counted: Counter[str] = Counter()
    session_init = boto3.session.Session.__init__
    client = boto3.session.Session.client

    def by_costguard() -> bool:
        return str(sys._getframe(2).f_globals.get("__name__")).startswith("costguard")

    def counting_init(self: Any, *args: Any, **kwargs: Any) -> None:
        counted["session"] += by_costguard()
        session_init(self, *args, **kwargs)

    def counting_client(self: Any, service: str, *args: Any, **kwargs: Any) -> Any:
        counted[service] += by_costguard()
        return client(self, service, *args, **kwargs)

    monkeypatch.setattr(boto3.session.Session, "__init__", counting_init)
    monkeypatch.setattr(boto3.session.Session, "client", counting_client)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    return counted


def region_flags(regions: tuple[str, ...] = REGIONS) -> list[str]:
    return [flag for region in regions for flag in ("--region", region)]


@pytest.mark.parametrize(
    "args",
    [
        ("burn", "--budget", "200"),  # every region in the tables
        ("burn", "--budget", "200", "--all-regions"),
        ("reap",),
        ("reap", "--all-regions"),
        ("reap", *region_flags()),
    ],
)
def test_without_credentials_one_error_before_any_client(
    args: tuple[str, ...],
    made: Counter[str],
    run_cli: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    result = run_cli(*args)
    assert result.exit_code == 2, result.stderr
    error, hint = result.stderr.splitlines()
    assert error == "Error: no AWS credentials while listing instances"
    assert hint.startswith("Hint: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    assert made["session"] <= 1
    assert not {k for k in made if k != "session"}, made  # no client, no call


def test_burn_shares_one_session_and_a_client_per_region(
    made: Counter[str], run_cli: Callable[..., Any]
) -> None:
    """(Over a few regions: moto's reset of every region's backends outlasts its fixture's
    timeout on a loaded machine; what holds for four holds for all.)"""
    result = run_cli("burn", "--budget", "200", *region_flags(), "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["instances"] == []
    assert made["session"] == 1  # one model parse per service, not one per region
    assert made["ec2"] == len(REGIONS)  # a listing needs no CloudWatch client
    assert made["cloudwatch"] == 0
    again = run_cli("burn", "--budget", "200", *region_flags(), "--format", "json")
    assert again.exit_code == 0, again.stderr
    assert (made["session"], made["ec2"]) == (1, len(REGIONS))  # the same, reused


def overlapping(monkeypatch: pytest.MonkeyPatch, operation: str) -> threading.Barrier:
    """A barrier the first two calls of ``operation`` must meet at: regions listed one
    after another never do, and the barrier breaks (the call fails) after 60 s."""
    barrier = threading.Barrier(2, timeout=60)
    met: list[int] = []
    lock = threading.Lock()
    client = aws_clouds.client

    def wait(**_: Any) -> None:
        with lock:
            met.append(1)
            first_two = len(met) <= 2
        if first_two:
            barrier.wait()

    def hooked(service: str, region: str | None = None, **kwargs: Any) -> Any:
        made = client(service, region, **kwargs)
        made.meta.events.register_first(f"before-call.{service}.{operation}", wait, "overlap")
        return made

    monkeypatch.setattr(aws_clouds, "client", hooked)
    return barrier


@pytest.mark.parametrize("command", [("burn", "--budget", "100000"), ("reap",)])
def test_regions_are_listed_at_once(
    command: tuple[str, ...],
    made: Counter[str],
    run_cli: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    barrier = overlapping(monkeypatch, "DescribeInstances")
    boto3.client("ec2", region_name="eu-west-1").run_instances(
        ImageId="ami-12345678", InstanceType="g5.xlarge", MinCount=1, MaxCount=1
    )
    result = run_cli(*command, *region_flags(), "--format", "json")
    assert not barrier.broken
    assert result.exit_code == 0, result.stderr
    ids = [i.get("instance_id") for i in result.json()["instances"]]
    assert len(ids) == 1  # the results of every region, in one report


def test_the_first_failed_region_is_reported(
    made: Counter[str], run_cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    client = aws_clouds.client

    def refusing(service: str, region: str | None = None, **kwargs: Any) -> Any:
        made = client(service, region, **kwargs)
        if region in ("eu-west-1", "ap-south-1"):
            monkeypatch.setattr(made, "describe_instances", refuse)
        return made

    def refuse(**_: Any) -> Any:
        raise ClientError(
            {"Error": {"Code": "UnauthorizedOperation", "Message": "no"}}, "DescribeInstances"
        )

    monkeypatch.setattr(aws_clouds, "client", refusing)
    result = run_cli("burn", "--budget", "200", *region_flags())
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == (
        "Error: AWS refused listing instances in eu-west-1: UnauthorizedOperation (no)"
    )
