"""Fixtures for the reaper suite: one strict GCP and one strict Azure fake per session
(``tests/servers``), state reset per test, loopback only."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers.azure import AzureServer
from tests.servers.gcp import GcpServer


@pytest.fixture(scope="session")
def _gcp_server() -> Iterator[GcpServer]:
    server = GcpServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def gcp_server(_gcp_server: GcpServer) -> GcpServer:
    _gcp_server.reset()
    return _gcp_server


@pytest.fixture(scope="session")
def _azure_server() -> Iterator[AzureServer]:
    server = AzureServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def azure_server(_azure_server: AzureServer) -> AzureServer:
    _azure_server.reset()
    return _azure_server
