"""Fixtures for the price refresh: local API servers answering the fixture price records
(:mod:`tests.refresh.records`), and a clean environment."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.refresh.records import AWS_PRODUCTS, AZURE_ITEMS, GCP_SKUS
from tests.refresh.servers import (
    CatalogServer,
    LocalServer,
    aws_pricing_handler,
    azure_prices_handler,
)


@pytest.fixture
def aws_pricing() -> Iterator[LocalServer]:
    server = LocalServer(aws_pricing_handler(AWS_PRODUCTS))
    yield server
    server.close()


@pytest.fixture
def gcp_catalog() -> Iterator[CatalogServer]:
    """The Cloud Billing Catalog API (gRPC) with the fixture SKUs, four a page."""
    server = CatalogServer(GCP_SKUS)
    yield server
    server.close()


@pytest.fixture
def azure_prices() -> Iterator[LocalServer]:
    server = LocalServer(azure_prices_handler(AZURE_ITEMS))
    yield server
    server.close()


@pytest.fixture
def anonymous_gcp(monkeypatch: pytest.MonkeyPatch) -> None:
    """GCP clients built without credentials: the local catalog server asks for none."""
    from google.auth.credentials import AnonymousCredentials

    monkeypatch.setattr("costguard.clouds.gcp.default_credentials", AnonymousCredentials)


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where refresh writes and estimate looks: a fresh folder per test."""
    folder = tmp_path / "cache" / "costguard" / "pricing"
    monkeypatch.setenv("COSTGUARD_CACHE_DIR", str(folder))
    monkeypatch.delenv("COSTGUARD_STALE_WARNING", raising=False)
    return folder


@pytest.fixture
def refresh_env(
    aws_env: str,
    aws_pricing: LocalServer,
    gcp_catalog: CatalogServer,
    azure_prices: LocalServer,
    anonymous_gcp: None,
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> dict[str, Any]:
    """Every price API on loopback: AWS pricing (local), EC2 (moto), GCP (local gRPC) and
    Azure (local); each has ``requests``, ``script`` and ``always``."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", aws_pricing.url)
    monkeypatch.setenv("COSTGUARD_GCP_ENDPOINT", gcp_catalog.url)
    monkeypatch.setenv("COSTGUARD_AZURE_PRICES_ENDPOINT", azure_prices.url)
    return {"aws": aws_pricing, "gcp": gcp_catalog, "azure": azure_prices}
