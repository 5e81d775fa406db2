"""Shared fixtures: the bundled catalog and a CLI runner that keeps stdout and stderr apart."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from costguard.cli import cli
from costguard.pricing.catalog import Catalog
from costguard.pricing.tables import load_catalog

#: The checkpoint stores, one fixture set for the checkpoint suite and the Store contract.
pytest_plugins = ["tests.helpers.stores"]


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return load_catalog()


@dataclass
class Run:
    exit_code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


@pytest.fixture
def run_cli(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Run]:
    """Invoke ``costguard ARGS`` in-process; no config file or COSTGUARD_* leaks in."""
    for name in (
        "COSTGUARD_PRICING_DIR",
        "COSTGUARD_DEBUG",
        "COSTGUARD_CONFIG",
        "COSTGUARD_STALE_WARNING",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", "/nonexistent-costguard-test")
    # A developer's own refreshed price cache must not leak into the tests.
    monkeypatch.setenv("COSTGUARD_CACHE_DIR", "/nonexistent-costguard-test/cache")

    def invoke(*args: str) -> Run:
        result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
        return Run(result.exit_code, result.stdout, result.stderr)

    return invoke


WIDTHS = (80, 100, 120)


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """Make the CLI believe stdout is a terminal of the given width (rich's own Console)."""
    from rich.console import Console

    from costguard.cli import render

    def at_width(width: int) -> None:
        def console(*, stderr: bool = False) -> Console:
            return Console(
                file=sys.stderr if stderr else sys.stdout,
                width=width,
                force_terminal=True,
                color_system=None,
                highlight=False,
            )

        monkeypatch.setattr(render, "console", console)

    return at_width


def assert_fits(text: str, width: int, cells: Iterable[str]) -> None:
    """No line wider than ``width``, nothing cut with an ellipsis, every cell shown whole.

    ``cells`` are the money figures, names and regions the output must show: each must
    appear on one line, as it is (a cell wrapped over two lines or cut is not found).
    """
    from rich.cells import cell_len

    lines = text.splitlines()
    too_wide = [line for line in lines if cell_len(line) > width]
    assert not too_wide, f"{len(too_wide)} line(s) wider than {width}: {too_wide[:3]}"
    assert "\u2026" not in text, "a cell was cut (ellipsis)"
    missing = sorted({cell for cell in cells if not any(cell in line for line in lines)})
    assert not missing, f"not shown whole at {width} columns: {missing[:10]}"


@dataclass(frozen=True)
class Png:
    """A PNG as the tests look at it: its size and its RGB pixels, row by row."""

    width: int
    height: int
    rows: list[list[tuple[int, int, int]]]

    def count(self, colour: tuple[int, int, int], tolerance: int = 40) -> int:
        """How many pixels are within ``tolerance`` of ``colour`` in every channel."""
        return sum(1 for row in self.rows for px in row if _near(px, colour, tolerance))

    def rows_with(self, colour: tuple[int, int, int], least: int, tolerance: int = 40) -> list[int]:
        """The rows holding at least ``least`` pixels of ``colour``: horizontal lines."""
        return [
            y
            for y, row in enumerate(self.rows)
            if sum(1 for px in row if _near(px, colour, tolerance)) >= least
        ]


def _near(px: tuple[int, int, int], colour: tuple[int, int, int], tolerance: int) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(px, colour, strict=True))


def read_png(path: Path) -> Png:
    """Check ``path`` is a PNG (signature, then a full decode) and read its pixels."""
    from PIL import Image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    with Image.open(path) as image:
        assert image.format == "PNG"
        rgb = image.convert("RGB")
        width, height = rgb.size
        data = rgb.tobytes()
    flat = [(data[i], data[i + 1], data[i + 2]) for i in range(0, len(data), 3)]
    return Png(width, height, [flat[y * width : (y + 1) * width] for y in range(height)])


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_process(proc: subprocess.Popen[Any], grace_s: float = 10.0) -> None:
    """Stop an emulator: SIGTERM, then SIGKILL if it has not exited after ``grace_s``.

    Azurite (node) sometimes takes longer than that to close its servers on a busy machine;
    a slow goodbye must not fail the run.
    """
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace_s)


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """One moto server (real HTTP, loopback) for the whole run; fails loudly if it can't start."""
    from moto.server import ThreadedMotoServer

    port = free_port()
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
def aws_env(moto_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> str:
    """A clean moto account reached through the standard AWS_ENDPOINT_URL, and nothing else."""
    request = urllib.request.Request(f"{moto_server}/moto-api/reset", method="POST")
    with urllib.request.urlopen(request, timeout=10):
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
