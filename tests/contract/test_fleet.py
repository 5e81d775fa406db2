"""The Fleet contract, on every cloud, each fleet listed through the provider table
(``costguard.providers``, ``for_options``) as ``costguard reap`` lists it: moto's EC2 and
CloudWatch (AWS), the Compute and Monitoring fake (GCP), the ARM and Azure Monitor fake
(Azure), each through its real SDK client.

The story: an idle GPU instance and a busy one, an hour of samples each. A dry run judges
both and changes nothing; ``--execute`` stops the idle one only; a second run finds
nothing left to do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from costguard.clouds import aws as aws_clouds
from costguard.providers import adapter_class
from costguard.reaper.fleet import Fleet, FleetRequest, reap
from costguard.reaper.policy import IdlePolicy, ReapLimits
from costguard.settings import Settings
from tests.helpers.fleets import PRICES
from tests.servers.aws import Metrics, launch_instance
from tests.servers.azure import AZURE_SUBSCRIPTION, AzureServer, AzureVm
from tests.servers.azure import seed_vm as seed_azure
from tests.servers.gcp import GCP_PROJECT, GcpServer, GcpVm
from tests.servers.gcp import seed_vm as seed_gcp
from tests.servers.http import with_test_auth

LOCATION = {"regions": (), "all_regions": False, "zones": (), "resource_group": None}


@dataclass
class FleetCase:
    """One implementation, its world holding an ``idle`` and a ``busy`` GPU instance."""

    provider: str
    fleet: Fleet
    #: ``name -> whether the instance still runs``, read from the cloud (not the fleet).
    running: Callable[[], dict[str, bool]]


def _fleet(provider: str, settings: Settings, **options: Any) -> Fleet:
    request = FleetRequest({**LOCATION, **options}, PRICES, settings, ("us-east-1",))
    (fleet,) = adapter_class("fleet", provider).for_options(request)
    return fleet


def _aws(request: pytest.FixtureRequest, now: datetime) -> FleetCase:
    request.getfixturevalue("aws_env")
    ec2 = aws_clouds.client("ec2", "us-east-1", attempts=1)
    metrics = Metrics(now)
    ids = {
        name: launch_instance(ec2, name, at=now - timedelta(hours=3)) for name in ("idle", "busy")
    }
    metrics.seed(ids["idle"])
    metrics.seed(ids["busy"], gpu=93.0)
    metrics.send(aws_clouds.client("cloudwatch", "us-east-1", attempts=1))

    def running() -> dict[str, bool]:
        found = ec2.describe_instances(InstanceIds=list(ids.values()))["Reservations"]
        states = {i["InstanceId"]: i["State"]["Name"] for r in found for i in r["Instances"]}
        return {name: states[i] == "running" for name, i in ids.items()}

    return FleetCase("aws", _fleet("aws", Settings()), running)


def _gcp(request: pytest.FixtureRequest, now: datetime) -> FleetCase:
    from google.auth.credentials import AnonymousCredentials

    from costguard.clouds import gcp as gcp_clouds

    server: GcpServer = request.getfixturevalue("gcp_server")
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    monkeypatch.setattr(gcp_clouds, "default_credentials", AnonymousCredentials)
    # With a Local SSD: a stop must then say what becomes of its data (or 400).
    seed_gcp(server, server.add(GcpVm("idle", "us-central1-a", "g2-standard-4", "101",
                                      "nvidia-l4", 1, local_ssds=1)), now)  # fmt: skip
    seed_gcp(server, server.add(GcpVm("busy", "us-central1-a", "g2-standard-4", "102",
                                      "nvidia-l4", 1)), now, gpu=97.0)  # fmt: skip

    def running() -> dict[str, bool]:
        return {name: vm.status == "RUNNING" for name, vm in server.vms.items()}

    fleet = _fleet("gcp", Settings(gcp_endpoint=server.url), project=GCP_PROJECT)
    return FleetCase("gcp", fleet, running)


def _azure(request: pytest.FixtureRequest, now: datetime) -> FleetCase:
    from costguard.reaper import azure

    server: AzureServer = request.getfixturevalue("azure_server")
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    monkeypatch.setattr(azure, "AzureFleet", with_test_auth(azure.AzureFleet))
    seed_azure(server, server.add(AzureVm("idle", "Standard_NC4as_T4_v3")), now)
    seed_azure(server, server.add(AzureVm("busy", "Standard_NC4as_T4_v3")), now, gpu=91.0)

    def running() -> dict[str, bool]:
        return {name: vm.power == "running" for name, vm in server.vms.items()}

    fleet = _fleet("azure", Settings(azure_endpoint=server.url), subscription=AZURE_SUBSCRIPTION)
    return FleetCase("azure", fleet, running)


CASES = {"aws": _aws, "gcp": _gcp, "azure": _azure}


@pytest.fixture
def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest, now: datetime) -> FleetCase:
    return CASES[request.param](request, now)


def policy(case: FleetCase) -> IdlePolicy:
    """The sampling the provider's metrics API has (what ``costguard reap`` uses)."""
    return case.fleet.sampling.policy()


def test_the_fleet_lists_what_runs_in_scope(case: FleetCase) -> None:
    assert case.fleet.provider == case.provider
    listed = {i.name: i for i in case.fleet.instances()}
    assert set(listed) == {"idle", "busy"}
    assert all(i.running and i.gpu_count >= 1 for i in listed.values())


def test_a_dry_run_judges_and_execute_stops_only_the_idle_one(
    case: FleetCase, now: datetime
) -> None:
    dry = reap([case.fleet], policy(case), ReapLimits(), now, execute=False)
    verdicts = {v.instance.name: (str(v.action), str(v.code)) for v in dry.plan.verdicts}
    assert verdicts == {"idle": ("stop", "idle"), "busy": ("keep", "busy")}
    assert dry.outcomes == ()
    assert case.running() == {"idle": True, "busy": True}

    done = reap([case.fleet], policy(case), ReapLimits(), now, execute=True)
    assert [(o.instance.name, o.ok) for o in done.outcomes] == [("idle", True)]
    assert case.running() == {"idle": False, "busy": True}

    again = reap([case.fleet], policy(case), ReapLimits(), now, execute=True)
    assert again.outcomes == ()
