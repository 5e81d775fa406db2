"""Shared fixtures: the bundled catalog and a CLI runner that keeps stdout and stderr apart."""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from click.testing import CliRunner

from costguard.cli import cli
from costguard.pricing.catalog import Catalog
from costguard.pricing.tables import load_catalog
from tests.helpers.processes import server_port
from tests.helpers.startup.sitecustomize import collect_old_objects_rarely
from tests.helpers.training import SharedRuns

#: The checkpoint stores, one fixture set for the checkpoint suite and the Store contract;
#: what doctest collection leaves unimported (for src/ too, hence a plugin).
pytest_plugins = ["tests.helpers.stores", "tests.helpers.collection"]

#: Property tests draw the same examples on every run, here and in CI (a test's examples
#: follow from its own code), so a run fails only on a change, never on a new random draw;
#: no deadline (tests check behaviour, not speed). ``pytest --hypothesis-profile wide``
#: searches with fresh random draws on purpose, and more examples where a test sets none;
#: a failure it finds is printed with the ``@example`` that keeps it as a regression case.
# Input generation's speed is the machine's load, not the code's behaviour: a busy CI
# machine once failed an alarm property on HealthCheck.too_slow (56 s for one draw).
hypothesis.settings.register_profile(
    "repeatable",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
)
hypothesis.settings.register_profile(
    "wide", derandomize=False, max_examples=1000, deadline=None, print_blob=True
)
hypothesis.settings.load_profile("repeatable")

#: A ``sitecustomize`` for every Python process the tests start (its docstring says why).
STARTUP = Path(__file__).parent / "helpers" / "startup"


def pytest_configure(config: pytest.Config) -> None:
    """The tests' Python processes collect their oldest objects rarely: this one, and
    through ``PYTHONPATH`` the pytest-xdist workers (started after this) and every process
    a test starts with this environment."""
    collect_old_objects_rarely()
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(STARTUP) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(STARTUP), *filter(None, paths)])


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported (torch, the SDKs, every test module) lives as long as the
    process: the collector need never walk it again."""
    gc.freeze()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each pytest-xdist worker starts on its share of the slow tests.

    worksteal hands the workers the collection in even contiguous blocks and an idle worker
    takes tests from the end of a busy one's block, so each block is laid out here as its
    round-robin share of the slow tests followed by short ones: the slow tests run at once,
    side by side, and short ones fill the end of the run. Every worker computes the same
    order (xdist checks it); without xdist, the slow tests simply come first.
    """
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    short = [item for item in items if item.get_closest_marker("slow") is None]
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    ordered: list[pytest.Item] = []
    for worker in range(workers):
        size = (len(items) - len(ordered)) // (workers - worker)  # worksteal's own split
        mine = slow[worker::workers]
        ordered += mine + short[: max(0, size - len(mine))]
        del short[: max(0, size - len(mine))]
    items[:] = ordered + short


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return load_catalog()


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory: pytest.TempPathFactory) -> SharedRuns:
    """Reference runs made once per test run: under pytest-xdist every worker's temporary
    folder sits in the run's own, which they share."""
    base = tmp_path_factory.getbasetemp()
    return SharedRuns((base.parent if "PYTEST_XDIST_WORKER" in os.environ else base) / "shared")


@dataclass
class Run:
    exit_code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


#: The signals whose handling a process passes to the processes it starts: one ignored
#: here is ignored by each of them (exec keeps it so).
INHERITED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


@pytest.fixture(autouse=True)
def _signal_handlers_kept() -> Iterator[None]:
    """No test leaves this process's signal handlers changed: a SIGTERM left ignored by
    an in-process `costguard run` made each script a later test started ignore it too, and
    that test hung for minutes, far from the cause. Put back, and the test fails."""
    before = {s: signal.getsignal(s) for s in INHERITED_SIGNALS}
    yield
    after = {s: signal.getsignal(s) for s in INHERITED_SIGNALS}
    changed = [s.name for s in INHERITED_SIGNALS if after[s] is not before[s]]
    for s in INHERITED_SIGNALS:
        signal.signal(s, before[s])
    assert not changed, f"the test left the handlers of {changed} changed: {after}"


@pytest.fixture(scope="session", autouse=True)
def _jobs_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """`costguard run` registers its pid in COSTGUARD_JOBS_DIR, by default the system's
    /run/costguard/jobs: every test's, and every process it starts, get a temporary one."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COSTGUARD_JOBS_DIR", str(tmp_path_factory.mktemp("jobs")))
        # This user's job key (costguard/proof.py): the test run's own, never ~/.config's.
        patch.setenv("COSTGUARD_JOB_KEY_FILE", str(tmp_path_factory.mktemp("key") / "job.key"))
        yield


@pytest.fixture
def run_cli(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., Run]:
    """Invoke ``costguard ARGS`` in-process; no config file or COSTGUARD_* leaks in."""
    for name in (
        "COSTGUARD_PRICING_DIR",
        "COSTGUARD_DEBUG",
        "COSTGUARD_CONFIG",
        "COSTGUARD_STALE_WARNING",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", "/nonexistent-costguard-test")
    # A developer's own refreshed price cache must not leak into the tests: an empty one,
    # beside which the parsed tables are kept (pricing/parsed.py) for the session.
    empty = tmp_path_factory.getbasetemp() / "no-refresh" / "pricing"
    monkeypatch.setenv("COSTGUARD_CACHE_DIR", str(empty))

    def invoke(*args: str) -> Run:
        result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
        return Run(result.exit_code, result.stdout, result.stderr)

    return invoke


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Make the CLI believe stdout is a terminal of the given width (rich's own Console)
    and height (default: taller than any output, so that nothing is left out to fit it)."""
    from rich.console import Console

    from costguard.cli import render

    def at_width(width: int, height: int = 10_000) -> None:
        def console(*, stderr: bool = False) -> Console:
            return Console(
                file=sys.stderr if stderr else sys.stdout,
                width=width,
                height=height,
                force_terminal=True,
                color_system=None,
                highlight=False,
            )

        monkeypatch.setattr(render, "console", console)

    return at_width


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """One moto server (real HTTP, loopback) for the whole run; fails loudly if it can't start."""
    from moto.server import ThreadedMotoServer

    port = server_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        with urllib.request.urlopen(f"{url}/moto-api/", timeout=10):
            pass
        yield url
    finally:
        server.stop()


@pytest.fixture
def fresh_aws_models() -> Iterator[None]:
    """botocore's models as a process that makes its first AWS session finds them: none
    read (``costguard.clouds.aws.LOADERS``), restored after the test."""
    from costguard.clouds import aws

    saved = dict(aws.LOADERS)
    aws.LOADERS.clear()
    yield
    aws.LOADERS.clear()
    aws.LOADERS.update(saved)


@pytest.fixture
def aws_env(moto_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> str:
    """A clean moto account reached through the standard AWS_ENDPOINT_URL, and nothing else."""
    request = urllib.request.Request(f"{moto_server}/moto-api/reset", method="POST")
    # A safety net, not a budget: a reset after a test that left many objects, on a machine
    # busy with other workers, took over 10 s.
    with urllib.request.urlopen(request, timeout=120):
        pass
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return moto_server


@pytest.fixture
def ec2_faults(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """EC2 through the fault layer of ``tests/servers/aws.py`` (``AWS_ENDPOINT_URL_EC2``):
    the test sets what it does (eventual consistency, paging) on the yielded ``Ec2Faults``;
    every other service reaches moto directly."""
    from tests.servers.aws import Ec2FaultLayer, Ec2Faults

    layer = Ec2FaultLayer(aws_env, Ec2Faults())
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", layer.url)
    yield layer.faults
    layer.stop()


# -- the strict GCP and Azure fakes (tests/servers): one of each per session, reset per test


@pytest.fixture(scope="session")
def _servers() -> Iterator[dict[str, Any]]:
    from tests.servers.azure import ArmServer, AzureServer
    from tests.servers.gcp import ComputeServer, GcpServer

    started: dict[str, Any] = {}
    kinds = {"compute": ComputeServer, "arm": ArmServer, "gcp": GcpServer, "azure": AzureServer}
    try:
        yield {"kinds": kinds, "started": started}
    finally:
        for server in started.values():
            server.stop()


def _fresh(servers: dict[str, Any], kind: str) -> Any:
    """The session's server of ``kind``, started on first use, its state reset."""
    started = servers["started"]
    if kind not in started:
        started[kind] = servers["kinds"][kind]()
    started[kind].reset()
    return started[kind]


@pytest.fixture
def compute_server(_servers: dict[str, Any]) -> Any:
    """GCP Compute Engine as the spot launcher calls it (``tests.servers.gcp.ComputeServer``)."""
    return _fresh(_servers, "compute")


@pytest.fixture
def arm_server(_servers: dict[str, Any]) -> Any:
    """Azure Resource Manager as the spot launcher calls it (``tests.servers.azure.ArmServer``)."""
    return _fresh(_servers, "arm")


@pytest.fixture
def gcp_server(_servers: dict[str, Any]) -> Any:
    """GCP Compute and Monitoring as the reaper calls them (``tests.servers.gcp.GcpServer``)."""
    return _fresh(_servers, "gcp")


@pytest.fixture
def azure_server(_servers: dict[str, Any]) -> Any:
    """Azure compute and metrics as the reaper calls them (``tests.servers.azure.AzureServer``)."""
    return _fresh(_servers, "azure")
