"""Fixtures for the checkpoint suite: local metadata servers for AWS/GCP/Azure
(:mod:`tests.helpers.metadata`) and the training script's environment. The stores
(``backend``, ``azurite``, ``gcs_emulator``) are the plugin :mod:`tests.helpers.stores`,
shared with the Store contract in tests/contract.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers.faults import Faults, fault_proxy
from tests.helpers.metadata import (
    AckingMetadataHandler,
    AckState,
    MetadataHandler,
    MetadataState,
    serving,
)
from tests.helpers.stores import make_s3_bucket
from tests.helpers.training import child_env


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
        return child_env(tmp_path, **{"COSTGUARD_CLOUD": "none", **extra})

    return make


@pytest.fixture
def watched_env(
    train_env: Callable[..., dict[str, str]], metadata_server: tuple[str, MetadataState]
) -> Callable[[str], dict[str, str]]:
    """The training environment on ``cloud``, its notices from :func:`metadata_server`
    (polled every 0.2 s)."""
    base, _ = metadata_server

    def make(cloud: str) -> dict[str, str]:
        return train_env(
            COSTGUARD_CLOUD=cloud,
            COSTGUARD_NOTICE_POLL_S="0.2",
            **{f"COSTGUARD_{cloud.upper()}_METADATA_URL": base},
        )

    return make


@pytest.fixture
def acking_metadata_server() -> Iterator[tuple[str, AckState]]:
    """:func:`metadata_server` whose Azure Scheduled Events also take acknowledgements."""
    state = AckState()
    with serving(AckingMetadataHandler, state) as url:
        yield url, state


@pytest.fixture
def flaky_s3(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Faults]:
    """The moto bucket ``flaky`` behind the fault proxy (:mod:`tests.helpers.faults`)."""
    make_s3_bucket(aws_env, "flaky")
    faults = Faults()
    with fault_proxy(aws_env, faults) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy)
        yield faults


@pytest.fixture
def one_rank() -> Iterator[None]:
    """A gloo process group of one rank in this process (torn down afterwards)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
