"""The Launcher contract, on every cloud: moto (AWS), the Compute fake (GCP), the ARM fake
(Azure), each through its real SDK client.

Every case is the same story: the offers as the price tables give them (a region, no
zone); the controller reads the region's zones and launches in one; the cloud takes the
instance back; the controller relaunches in another zone of the region with the same
checkpoint URL; the job exits 0; nothing of the job is left running. What each cloud must
also show on the wire (its request bodies, tags, price caps) is the case's ``check``.
"""

from __future__ import annotations

import base64
import functools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from costguard.checkpoint.store import Store
from costguard.clouds import aws as aws_clouds
from costguard.pricing.catalog import Market
from costguard.settings import Settings
from costguard.spot.controller import Controller
from costguard.spot.job import (
    ExitRecord,
    Job,
    JobSpec,
    Simulation,
    load_job,
    save_job,
    write_exit_record,
)
from costguard.spot.launcher.aws import AwsLauncher
from costguard.spot.launcher.azure import AzureLauncher
from costguard.spot.launcher.base import Handle, Launcher, Offer, State
from costguard.spot.launcher.gcp import GcpLauncher
from costguard.spot.launcher.local import LocalLauncher
from costguard.spot.recovery import AttemptOutcome
from costguard.tags import ATTEMPT_TAG, JOB_TAG
from tests.servers.aws import launch_account, reclaim_aws_instance, recording_clients
from tests.servers.azure import GROUP, SUBSCRIPTION, ArmServer
from tests.servers.azure import LAUNCH_OPTIONS as AZURE_OPTIONS
from tests.servers.gcp import LAUNCH_OPTIONS as GCP_OPTIONS
from tests.servers.gcp import PROJECT, ComputeServer
from tests.servers.http import FakeTokenCredential, azure_client_options

EXPIRES = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
CLOUDS = ("aws", "gcp", "azure")


@dataclass
class LauncherCase:
    """One implementation, ready for the contract."""

    launcher: Launcher
    #: The offers as the price tables give them: per region, no zone.
    offers: list[Offer]
    #: The job (its checkpoint URL is the case's store).
    job: JobSpec
    #: The cloud takes the instance back (a spot reclaim, preemption or eviction).
    preempt: Callable[[Handle], None]
    #: What the cloud must show after the relaunch story: ``check(final, events)``.
    check: Callable[[Job, list[str]], None]
    #: The cloud stops offering the offer's type in one zone of its region: that zone.
    lack: Callable[[], str] | None = None


def _job(provider: str, gpu: str, count: int, region: str, url: str, **extra: Any) -> JobSpec:
    return JobSpec(
        job_id="run-1", provider=provider, gpu=gpu, gpu_count=count, regions=(region,),
        spot=True, checkpoint_url=url, command=("python", "train.py"), owner="alice",
        created_unix=time.time(), expires_at=EXPIRES, **extra,
    )  # fmt: skip


def _aws(request: pytest.FixtureRequest) -> LauncherCase:
    request.getfixturevalue("aws_env")
    options = launch_account()
    aws_clouds.client("s3", attempts=1).create_bucket(Bucket="ckpt")
    url = "s3://ckpt/costguard/run-1"
    sent: list[bytes] = []
    launcher = AwsLauncher(regions=["us-east-1"], clients=recording_clients(sent))
    offer = Offer("aws", "us-east-1", "g5.xlarge", Market.SPOT, Decimal("0.45"), "A10G", 1)
    on_demand = replace(offer, market=Market.ON_DEMAND)
    job = _job("aws", "A10G", 1, "us-east-1", url, options=options,
               max_usd_per_hour=Decimal("0.50"))  # fmt: skip

    def ec2() -> Any:
        return aws_clouds.client("ec2", "us-east-1", attempts=1)

    def describe(instance_id: str) -> dict[str, Any]:
        (reservation,) = ec2().describe_instances(InstanceIds=[instance_id])["Reservations"]
        (instance,) = reservation["Instances"]
        return dict(instance)

    def check(final: Job, events: list[str]) -> None:
        first, second = final.attempts
        zones = launcher.zones("us-east-1", "g5.xlarge")
        assert first.offer.zone in zones
        assert second.offer.zone in zones
        assert first.offer.usd_per_hour == second.offer.usd_per_hour == offer.usd_per_hour
        assert any("priced at the region's" in e for e in events), events
        assert any("another zone of the region" in e for e in events), events
        assert len(sent) == 2
        for body in sent:
            spot = parse_qs(body.decode())["InstanceMarketOptions.SpotOptions.MaxPrice"]
            assert spot == ["0.50"]
        for attempt in (first, second):
            assert attempt.handle is not None
            instance = describe(attempt.handle.instance_id)
            assert instance["MetadataOptions"]["HttpTokens"] == "required"
            tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
            assert tags[JOB_TAG] == "run-1"
            assert tags[ATTEMPT_TAG] == str(attempt.number)
            assert instance["Placement"]["AvailabilityZone"] == attempt.offer.zone
            user_data = ec2().describe_instance_attribute(
                InstanceId=instance["InstanceId"], Attribute="userData"
            )["UserData"]["Value"]
            script = base64.b64decode(user_data).decode()
            assert f"costguard run --checkpoint {url} " in script
            assert f"export COSTGUARD_JOB_ATTEMPT={attempt.number}" in script
        # The finished job's instance was terminated by the controller, not left running.
        assert second.handle is not None
        assert describe(second.handle.instance_id)["State"]["Name"] == "terminated"

    return LauncherCase(
        launcher, [offer, on_demand], job,
        lambda handle: reclaim_aws_instance(handle.instance_id), check,
    )  # fmt: skip


def _gcp(request: pytest.FixtureRequest, take: str = "preempt") -> LauncherCase:
    """``take``: how Compute Engine takes the VM back, a preemption or a host maintenance
    stop (GPU VMs cannot live-migrate)."""
    from google.auth.credentials import AnonymousCredentials

    server: ComputeServer = request.getfixturevalue("compute_server")
    url = f"file://{request.getfixturevalue('tmp_path') / 'ckpt'}"
    launcher = GcpLauncher(
        Settings(gcp_endpoint=server.url),
        project=PROJECT,
        credentials=AnonymousCredentials(),
        poll_interval_s=0.01,
    )
    offer = Offer("gcp", "us-central1", "n1-highmem-8", Market.SPOT, Decimal("0.5"), "T4", 2)

    def check(final: Job, events: list[str]) -> None:
        first, second = final.attempts
        assert ("preempted" if take == "preempt" else "host maintenance") in first.detail
        assert (first.offer.zone, second.offer.zone) == ("us-central1-a", "us-central1-b")
        bodies = [call.body for call in server.calls("POST", "/instances")]
        zones = [b["machineType"].split("/")[1] for b in bodies]
        assert zones == ["us-central1-a", "us-central1-b"]
        assert len(server.calls("GET", "/regions/us-central1")) == 1  # once per controller
        assert [b["labels"]["costguard-attempt"] for b in bodies] == ["1", "2"]
        for body in bodies:
            script = body["metadata"]["items"][0]["value"]
            assert f"costguard run --checkpoint {url} " in script
        # The finished job's VM was deleted; a VM stopped by host maintenance stays stopped
        # (no automatic restart), as Compute Engine leaves it, and with no checkpoint to
        # hold its work costguard keeps it and reports what its disk bills.
        assert first.handle is not None
        left = {name: vm.status for name, vm in server.vms.items()}
        assert left == ({} if take == "preempt" else {first.handle.instance_id: "TERMINATED"})
        assert len(final.kept_stopped) == (take != "preempt")

    def lack() -> str:
        server.lacking.add(("us-central1-a", offer.instance_type))
        return "us-central1-a"

    takes = {"preempt": server.preempt, "maintenance": server.host_maintenance}
    return LauncherCase(
        launcher, [offer], _job("gcp", "T4", 2, "us-central1", url, options=GCP_OPTIONS),
        lambda handle: takes[take](handle.instance_id), check, lack,
    )  # fmt: skip


def _azure(request: pytest.FixtureRequest) -> LauncherCase:
    server: ArmServer = request.getfixturevalue("arm_server")
    url = f"file://{request.getfixturevalue('tmp_path') / 'ckpt'}"
    launcher = AzureLauncher(
        Settings(azure_endpoint=server.url),
        credential=FakeTokenCredential(),
        client_options=azure_client_options(),
        subscription_id=SUBSCRIPTION,
        resource_group=GROUP,
    )
    size = "Standard_NC4as_T4_v3"
    offer = Offer("azure", "eastus", size, Market.SPOT, Decimal("0.15"), "T4", 1)
    job = _job("azure", "T4", 1, "eastus", url, options=AZURE_OPTIONS,
               max_usd_per_hour=Decimal("0.2"))  # fmt: skip

    def check(final: Job, events: list[str]) -> None:
        first, second = final.attempts
        assert (first.offer.zone, second.offer.zone) == ("1", "2")
        bodies = [call.body for call in server.calls("PUT", "/virtualMachines/")]
        assert [b["tags"]["costguard:attempt"] for b in bodies] == ["1", "2"]
        assert [b["zones"] for b in bodies] == [["1"], ["2"]]
        assert [b["properties"]["billingProfile"] for b in bodies] == [{"maxPrice": 0.2}] * 2
        for body in bodies:
            script = base64.b64decode(body["properties"]["osProfile"]["customData"]).decode()
            assert f"costguard run --checkpoint {url} " in script
        assert server.vms == {}  # the finished job's VM was deleted

    def lack() -> str:
        zones, restricted = server.skus[("eastus", size)]
        server.skus[("eastus", size)] = ([z for z in zones if z != "1"], restricted)
        return "1"

    return LauncherCase(
        launcher, [offer], job, lambda handle: server.evict(handle.instance_id), check, lack
    )


def _local(request: pytest.FixtureRequest) -> LauncherCase:
    """The simulator: attempts are processes on this machine (``costguard run`` around a
    command that waits), preempted on the simulation's schedule rather than by a call, so
    it takes the find-and-terminate half of the contract; the relaunch story is
    tests/spot/test_launch_local.py's."""
    tmp_path: Path = request.getfixturevalue("tmp_path")
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    monkeypatch.setenv("COSTGUARD_LOCAL_DIR", str(tmp_path / "local"))
    launcher = LocalLauncher(
        Simulation(notice_s=5.0, state_dir=str(tmp_path / "local")),
        job_started_unix=time.time(),
        state_dir=tmp_path / "local",
    )
    request.addfinalizer(launcher.close)
    offer = Offer("local", "aws:us-east-1", "g5.xlarge", Market.ON_DEMAND, Decimal("1"), "A10G", 1)
    job = replace(
        _job("local", "A10G", 1, "aws:us-east-1", str(tmp_path / "ckpt")),
        command=(sys.executable, "-c", "import time; time.sleep(60)"),
    )

    def not_called(*_: Any) -> None:
        raise AssertionError("the local launcher takes no part in the relaunch story")

    return LauncherCase(launcher, [offer], job, not_called, not_called)


CASES: dict[str, Callable[[pytest.FixtureRequest], LauncherCase]] = {
    "aws": _aws,
    "gcp": _gcp,
    "gcp-maintenance": functools.partial(_gcp, take="maintenance"),
    "azure": _azure,
    "local": _local,
}


@pytest.fixture(params=(*CLOUDS, "gcp-maintenance"))
def case(request: pytest.FixtureRequest) -> LauncherCase:
    return CASES[request.param](request)


@pytest.fixture(params=("gcp", "azure"))
def lacking_case(request: pytest.FixtureRequest) -> LauncherCase:
    """The clouds whose fakes can take a type away from one zone (moto's EC2 offerings
    are its own data: the AWS launcher's filter is tests/spot/test_aws_launcher.py's)."""
    return CASES[request.param](request)


@pytest.fixture(params=(*CLOUDS, "local"))
def any_case(request: pytest.FixtureRequest) -> LauncherCase:
    return CASES[request.param](request)


def test_the_controller_relaunches_a_preempted_job_in_another_zone(case: LauncherCase) -> None:
    store = Store.open(case.job.checkpoint_url)
    save_job(store, Job(case.job))
    world: list[str] = []
    events: list[str] = []

    def sleep(seconds: float) -> None:
        """The cloud and the instance between two polls of the controller."""
        assert len(world) < 20, world
        current = load_job(store).current
        assert current is not None
        assert current.handle is not None
        if current.number == 1:
            case.preempt(current.handle)
            world.append(f"preempted {current.handle.instance_id}")
        else:  # what `costguard run` on the instance writes when the script exits 0
            write_exit_record(store, ExitRecord(2, 0, 500, time.time(), job_id="run-1"))
            world.append("exit 0")

    controller = Controller(store, case.launcher, case.offers, poll_s=0.0, sleep=sleep,
                            on_event=lambda e: events.append(e.message))  # fmt: skip
    final = controller.run(load_job(store))

    assert final.status == "succeeded"
    assert world[-1] == "exit 0"
    first, second = final.attempts
    assert first.outcome is AttemptOutcome.PREEMPTED
    assert second.outcome is AttemptOutcome.SUCCEEDED
    assert first.offer.zone != second.offer.zone  # moved away from the reclaimed zone...
    assert first.offer.region == second.offer.region  # ...in the one region
    case.check(final, events)
    assert case.launcher.find("run-1") == []


def test_find_sees_a_jobs_live_instances_until_they_are_terminated(
    any_case: LauncherCase,
) -> None:
    case = any_case
    spec = case.job.launch_spec()
    zone = case.launcher.zones(case.offers[0].region, case.offers[0].instance_type)[0]
    offer = replace(case.offers[0], zone=zone)
    first = case.launcher.launch(offer, spec, attempt=1)
    other = case.launcher.launch(offer, replace(spec, job_id="run-2"), attempt=1)
    assert [h.instance_id for h in case.launcher.find("run-1")] == [first.instance_id]
    assert case.launcher.status(first).state in (State.PENDING, State.RUNNING)
    case.launcher.terminate(first)
    assert case.launcher.status(first).state in (State.TERMINATED, State.MISSING)
    case.launcher.terminate(first)  # again: fine
    assert case.launcher.find("run-1") == []
    assert [h.instance_id for h in case.launcher.find("run-2")] == [other.instance_id]
    case.launcher.terminate(other)
    assert case.launcher.find("run-2") == []


def test_a_zone_without_the_type_is_not_launched_in(lacking_case: LauncherCase) -> None:
    # A zone that lacks the type refuses at once (GCP: 400 invalid); the zone walk must
    # skip it, by the offering, before any launch.
    case = lacking_case
    assert case.lack is not None
    lacked = case.lack()
    store = Store.open(case.job.checkpoint_url)
    save_job(store, Job(case.job))

    def sleep(seconds: float) -> None:
        current = load_job(store).current
        assert current is not None
        write_exit_record(store, ExitRecord(current.number, 0, 10, time.time(), job_id="run-1"))

    events: list[str] = []
    controller = Controller(store, case.launcher, case.offers, poll_s=0.0, sleep=sleep,
                            on_event=lambda e: events.append(e.message))  # fmt: skip
    final = controller.run(load_job(store))
    assert final.status == "succeeded", events
    (attempt,) = final.attempts
    assert attempt.offer.zone
    assert attempt.offer.zone != lacked
    zones = case.launcher.zones(case.offers[0].region, case.offers[0].instance_type)
    assert lacked not in zones
