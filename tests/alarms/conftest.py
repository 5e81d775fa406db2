"""Fixtures for the alarm suite: the strict Billing Budgets / Monitoring channels and
Consumption budget fakes of ``tests/servers``, each on its own loopback server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers.azure import ConsumptionFake
from tests.servers.gcp import BudgetsFake
from tests.servers.http import JsonServer


@pytest.fixture
def gcp_server() -> Iterator[tuple[JsonServer, BudgetsFake]]:
    fake = BudgetsFake()
    server = JsonServer(fake)
    yield server, fake
    server.stop()


@pytest.fixture
def azure_server() -> Iterator[tuple[JsonServer, ConsumptionFake]]:
    fake = ConsumptionFake()
    server = JsonServer(fake)
    yield server, fake
    server.stop()
