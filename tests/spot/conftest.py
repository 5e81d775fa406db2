"""Fixtures for the spot suite: the environment for real `costguard launch`/`run` children
(local provider, own state folder, no stray settings) and the moto account AWS launches use.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.training import child_env
from tests.servers.aws import launch_account


@pytest.fixture
def spot_env(tmp_path: Path) -> Callable[..., dict[str, str]]:
    """The environment of a `costguard launch --provider local` child."""

    def make(**extra: str) -> dict[str, str]:
        local = {
            "COSTGUARD_LOCAL_DIR": str(tmp_path / "local-state"),
            "COSTGUARD_CACHE_DIR": str(tmp_path / "no-cache"),
        }
        return child_env(tmp_path, **{**local, **extra})

    return make


# ------------------------------------------------- cloud launchers (moto-backed AWS helpers)


#: Options an AWS launch needs; moto accepts any AMI id.
@pytest.fixture
def aws_launch_options(aws_env: str) -> dict[str, str]:
    """A clean moto account with the launcher's instance profile; the options that launch
    into it (:func:`tests.servers.aws.launch_account`)."""
    return launch_account()


@pytest.fixture
def gcp_launcher(compute_server: Any) -> Any:
    """A GCP launcher with the real client, reaching the Compute fake (``compute_server``)."""
    from google.auth.credentials import AnonymousCredentials

    from costguard.settings import Settings
    from costguard.spot.launcher.gcp import GcpLauncher
    from tests.servers.gcp import PROJECT

    return GcpLauncher(
        Settings(gcp_endpoint=compute_server.url),
        project=PROJECT,
        credentials=AnonymousCredentials(),
        poll_interval_s=0.01,
    )
