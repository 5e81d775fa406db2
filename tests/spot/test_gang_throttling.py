"""Issue 47: a gang's launch refused for the provider's request rate, through the
controller on each cloud's test server: EC2's ``CreateFleet`` answering
``RequestLimitExceeded`` (moto behind the fault layer), Compute Engine's ``bulkInsert``
answering 403 ``rateLimitExceeded`` or 429 ``RESOURCE_EXHAUSTED``, and Resource Manager
answering a gang VM's PUT with 429 and ``Retry-After``.

The controller backs off (:data:`costguard.retry.API_RETRY`, the provider's
``Retry-After`` honoured) and starts the whole gang; at no back-off is any node of the job
left running (all or none, never a partial gang), and the throttling is never a capacity
verdict on the place. Throttled past the retries, a round gives up with nothing left and
no attempt counted, and the controller's timeout bounds the rounds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from costguard.checkpoint.store import Store
from costguard.retry import API_RETRY
from costguard.spot.controller import Controller, Event
from costguard.spot.job import Job, JobSpec
from costguard.spot.launcher.base import Launcher, Market, Offer
from costguard.spot.recovery import Launch
from tests.contract.test_launcher import _job

#: Answers refused for the request rate before the gang starts.
THROTTLED = 3


@dataclass
class Cloud:
    """A provider's launcher on its test server, a gang job there and its offer;
    ``throttle(n)`` makes the next ``n`` launch requests answer for the request rate,
    ``throttled()`` counts those answered so, ``launches()`` counts the launch requests
    (a fleet, a bulk insert, a VM's PUT), ``live()`` the job's instances that exist."""

    launcher: Launcher
    job: Job
    offer: Offer
    throttle: Callable[[int], None]
    throttled: Callable[[], int]
    launches: Callable[[], int]
    live: Callable[[], int]
    #: The wait the provider asks for (``Retry-After``), or None when it names none.
    retry_after_s: float | None = None
    #: Launch requests a round sends (Azure: a PUT a node).
    per_round: int = 1


def gang_job(provider: str, gpu: str, count: int, region: str, url: str, **options: str) -> Job:
    spec: JobSpec = _job(provider, gpu, count, region, url, options=options, nodes=2)
    return Job(replace(spec, command=("train.py",)))


def _aws(request: pytest.FixtureRequest) -> Cloud:
    from costguard.clouds import aws as aws_clouds
    from costguard.spot.launcher.aws import AwsLauncher
    from tests.servers.aws import Ec2Faults
    from tests.spot.test_gang_controller_clouds import OFFER, URL, instances

    faults: Ec2Faults = request.getfixturevalue("ec2_faults")
    options = request.getfixturevalue("aws_launch_options")
    aws_clouds.client("s3", attempts=1).create_bucket(Bucket="ckpt")

    def clients(region: str) -> Any:
        return aws_clouds.client("ec2", region, attempts=1)  # the throttling is costguard's

    def throttle(count: int) -> None:
        faults.throttle_fleets = count

    return Cloud(AwsLauncher(regions=["us-east-1"], clients=clients),
                 gang_job("aws", "A10G", 4, "us-east-1", URL, **options), OFFER, throttle,
                 lambda: faults.throttled, lambda: faults.actions.count("CreateFleet"),
                 lambda: len(instances()))  # fmt: skip


def _gcp(request: pytest.FixtureRequest, status: int) -> Cloud:
    from tests.servers.gcp import LAUNCH_OPTIONS, ComputeServer

    server: ComputeServer = request.getfixturevalue("compute_server")
    server.rate_limit_status = status
    offer = Offer("gcp", "us-central1", "a2-highgpu-1g", Market.SPOT, Decimal("1.1"), "A100", 1,
                  "us-central1-b")  # fmt: skip

    def throttle(count: int) -> None:
        server.rate_limit_inserts = count

    return Cloud(request.getfixturevalue("gcp_launcher"),
                 gang_job("gcp", "A100", 1, "us-central1", "gs://ckpt/run-1", **LAUNCH_OPTIONS),
                 offer, throttle, lambda: server.rate_limited,
                 lambda: len(server.calls("POST", "/instances/bulkInsert")),
                 lambda: len(server.vms))  # fmt: skip


def _azure(request: pytest.FixtureRequest) -> Cloud:
    from costguard.settings import Settings
    from costguard.spot.launcher.azure import AzureLauncher
    from tests.servers.azure import GROUP, LAUNCH_OPTIONS, SUBSCRIPTION, ArmServer
    from tests.servers.http import FakeTokenCredential, azure_client_options

    server: ArmServer = request.getfixturevalue("arm_server")
    # Node 0's VM is made and node 1's refused: a partial gang for the launcher to end.
    server.puts_before_throttle = 1
    # Without the SDK's own retries (ten, on a 429): the throttling is costguard's to retry.
    launcher = AzureLauncher(Settings(azure_endpoint=server.url), credential=FakeTokenCredential(),
                             client_options={**azure_client_options(), "retry_total": 0},
                             subscription_id=SUBSCRIPTION, resource_group=GROUP)  # fmt: skip
    offer = Offer("azure", "eastus", "Standard_NC4as_T4_v3", Market.SPOT, Decimal("0.15"), "T4",
                  1, "eastus-2")  # fmt: skip

    def throttle(count: int) -> None:
        server.throttle_puts = count

    return Cloud(launcher,
                 gang_job("azure", "T4", 1, "eastus", "az://ckpt/run-1", **LAUNCH_OPTIONS),
                 offer, throttle, lambda: server.throttled,
                 lambda: len(server.calls("PUT", "/virtualMachines/")),
                 lambda: len(server.vms), retry_after_s=2.0, per_round=2)  # fmt: skip


@pytest.fixture(params=["aws", "gcp-403", "gcp-429", "azure"])
def cloud(request: pytest.FixtureRequest) -> Cloud:
    if request.param == "aws":
        return _aws(request)
    if request.param == "azure":
        return _azure(request)
    return _gcp(request, int(request.param.split("-")[1]))


def _controller(
    cloud: Cloud, tmp_path: Path, waits: list[tuple[float, int]], **kwargs: Any
) -> tuple[Controller, list[Event]]:
    """The controller of ``cloud``'s job, whose every wait is recorded with how many of
    the job's instances existed then, and not slept."""
    events: list[Event] = []

    def sleep(seconds: float) -> None:
        assert len(waits) < 50, waits  # bounded, whatever the controller does
        waits.append((seconds, cloud.live()))

    controller = Controller(Store.open(tmp_path / "ckpt"), cloud.launcher, [cloud.offer],
                            poll_s=0.0, sleep=sleep, on_event=events.append,
                            **kwargs)  # fmt: skip
    return controller, events


def test_a_throttled_gang_backs_off_and_starts_whole_with_no_node_left_between(
    cloud: Cloud, tmp_path: Path
) -> None:
    cloud.throttle(THROTTLED)
    waits: list[tuple[float, int]] = []
    controller, events = _controller(cloud, tmp_path, waits)
    job = controller.launch(cloud.job, Launch(cloud.offer, 1, "cheapest"))
    (attempt,) = job.attempts  # no refused attempt: no capacity verdict on the place
    assert attempt.outcome is None
    assert len(attempt.nodes) == 2
    assert cloud.live() == 2
    assert cloud.throttled() == THROTTLED
    assert waits, "no back-off"
    # At every back-off no node of the job existed: all or none, never a partial gang.
    assert [live for _, live in waits] == [0] * len(waits)
    for wait_s, _ in waits:
        if cloud.retry_after_s is not None:
            assert wait_s == cloud.retry_after_s  # the provider's Retry-After honoured
        else:
            assert 0 <= wait_s <= API_RETRY.max_delay_s
    said = [e.message for e in events if e.kind == "throttled"]
    assert len(said) == len(waits)
    assert all("launching again in" in m for m in said)


def test_a_gang_throttled_past_the_retries_leaves_nothing_and_the_timeout_ends_it(
    cloud: Cloud, tmp_path: Path
) -> None:
    """Throttled at every answer: one round sends the launch API_RETRY.attempts times,
    then gives up with no attempt kept and no instance left, and the controller's timeout
    (here: already passed) ends the job instead of another round."""
    cloud.throttle(10**6)
    waits: list[tuple[float, int]] = []
    controller, events = _controller(cloud, tmp_path, waits, timeout_s=1e-9)
    final = controller.run(cloud.job)
    assert final.status == "stopped", final.reason
    assert "timeout" in final.reason
    assert final.attempts == ()  # throttled rounds are not attempts
    assert cloud.live() == 0
    assert cloud.launches() == API_RETRY.attempts * cloud.per_round
    assert [live for _, live in waits] == [0] * len(waits)
    assert any("asking again later" in e.message for e in events if e.kind == "throttled")
