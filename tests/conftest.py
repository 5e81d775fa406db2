"""Shared fixtures: the bundled catalog and a CLI runner that keeps stdout and stderr apart."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from click.testing import CliRunner

from costguard.cli import cli
from costguard.pricing.catalog import Catalog, load_catalog


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
    for name in ("COSTGUARD_PRICING_DIR", "COSTGUARD_DEBUG", "COSTGUARD_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", "/nonexistent-costguard-test")

    def invoke(*args: str) -> Run:
        result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
        return Run(result.exit_code, result.stdout, result.stderr)

    return invoke
