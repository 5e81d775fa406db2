"""Fixtures for the reaper suite."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest


@pytest.fixture
def live_now(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test module's ``NOW`` is when each test starts, to the second: the CLI tests
    judge with the real clock (a module asks with ``pytest.mark.usefixtures``)."""
    monkeypatch.setattr(request.module, "NOW", datetime.now(UTC).replace(microsecond=0))
