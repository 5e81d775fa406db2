"""Fixtures for the checkpoint suite: local metadata servers for AWS/GCP/Azure
(:mod:`tests.helpers.metadata`) and the training script's environment. The stores
(``backend``, ``azurite``, ``gcs_emulator``) are the plugin :mod:`tests.helpers.stores`,
shared with the Store contract in tests/contract.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers.metadata import (
    AckingMetadataHandler,
    AckState,
    MetadataHandler,
    MetadataState,
    serving,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def metadata_server() -> Iterator[tuple[str, MetadataState]]:
    """A loopback server that plays all three clouds' metadata services."""
    state = MetadataState()
    with serving(MetadataHandler, state) as url:
        yield url, state


# -- training through `costguard run` ---------------------------------------------------


@pytest.fixture
def train_env(tmp_path: Path) -> Callable[..., dict[str, str]]:
    """The environment for a training child: no cloud, no stray costguard settings."""

    def make(**extra: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("COSTGUARD_", "AWS_", "AZURE_", "STORAGE_EMULATOR"))
        }
        env.update(
            {
                "COSTGUARD_CLOUD": "none",
                "XDG_CONFIG_HOME": str(tmp_path / "no-config"),
                "PYTHONPATH": str(REPO),
                "OMP_NUM_THREADS": "1",
            }
        )
        env.update(extra)
        return env

    return make


@pytest.fixture
def acking_metadata_server() -> Iterator[tuple[str, AckState]]:
    """:func:`metadata_server` whose Azure Scheduled Events also take acknowledgements."""
    state = AckState()
    with serving(AckingMetadataHandler, state) as url:
        yield url, state
