"""The checkpoint stores as fixtures: local folder, moto S3, Azurite and
gcp-storage-emulator, one ``backend`` parameter each (a pytest plugin that tests/conftest.py
loads, so the checkpoint suite and the Store contract in tests/contract share one set).

Emulators start once per session and fail the run loudly when they cannot start.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from costguard.checkpoint.store import Store
from costguard.checkpoint.uploads import PartLimits
from tests.helpers.processes import server_port, stop_process
from tests.helpers.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
AZURITE = Path(os.environ.get("COSTGUARD_AZURITE_DIR", REPO / ".ci-work" / "node"))
AZURITE_BIN = AZURITE / "node_modules" / ".bin" / "azurite-blob"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def wait_for_http(
    url: str, proc: subprocess.Popen[Any] | None = None, timeout_s: float = 30.0
) -> None:
    """Poll until something answers HTTP at ``url`` (any status), or fail; at once if
    ``proc``, the server, has exited (it could not bind its port, say)."""

    def alive() -> None:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(
                f"the server for {url} exited ({proc.returncode}) before it answered"
            )

    def answers() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except urllib.error.HTTPError:
            return True  # an answer all the same

    wait_for(
        answers, f"a server at {url}", timeout_s=timeout_s, poll_s=0.2, alive=alive,
        ignoring=(OSError,),
    )  # fmt: skip


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Azurite's blob service; the connection string of its well-known dev account."""
    if not AZURITE_BIN.exists():
        pytest.fail(
            f"Azurite is not installed at {AZURITE_BIN}: "
            "npm install --prefix .ci-work/node azurite@3 (or set COSTGUARD_AZURITE_DIR)"
        )
    port = server_port()
    location = tmp_path_factory.mktemp("azurite")
    proc = subprocess.Popen(
        [
            str(AZURITE_BIN),
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(port),
            "--location",
            str(location),
            "--silent",
            "--skipApiVersionCheck",
            "--loose",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/devstoreaccount1?comp=list", proc)
        yield (
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
            f"AccountKey={AZURITE_KEY};BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;"
        )
    finally:
        stop_process(proc)


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[str]:
    """gcp-storage-emulator (in memory) with a bucket named ``ckpt-bucket``."""
    port = server_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gcp_storage_emulator",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--in-memory",
            "--default-bucket",
            "ckpt-bucket",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/storage/v1/b", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


@dataclass
class Backend:
    """A store URL plus the environment a child process needs to reach it."""

    name: str
    url: str
    env: dict[str, str] = field(default_factory=dict)


def make_s3_bucket(endpoint: str, bucket: str) -> None:
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    s3.create_bucket(Bucket=bucket)


@pytest.fixture(params=["local", "s3", "azure", "gcs"])
def backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Backend:
    """Each storage backend in turn, empty, with its environment set in this process too."""
    name = request.param
    if name == "local":
        return Backend(name, str(tmp_path / "store"))
    if name == "s3":
        request.getfixturevalue("aws_env")
        make_s3_bucket(os.environ["AWS_ENDPOINT_URL"], "ckpt-bucket")
        env = {k: os.environ[k] for k in os.environ if k.startswith("AWS_")}
        return Backend(name, "s3://ckpt-bucket/run1", env)
    if name == "azure":
        connection = request.getfixturevalue("azurite")
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", connection)
        container = f"c{time.monotonic_ns()}"
        adlfs = importlib.import_module("adlfs")  # untyped; mypy need not know it
        adlfs.AzureBlobFileSystem(connection_string=connection, skip_instance_cache=True).mkdir(
            container
        )
        return Backend(
            name, f"az://{container}/run1", {"AZURE_STORAGE_CONNECTION_STRING": connection}
        )
    host = request.getfixturevalue("gcs_emulator")
    env = {
        "STORAGE_EMULATOR_HOST": host,
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "COSTGUARD_STORAGE_OPTIONS": json.dumps({"token": "anon", "project": "test"}),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return Backend(name, f"gs://ckpt-bucket/run{time.monotonic_ns()}", env)


def open_store(backend: Backend, parts: PartLimits | None = None) -> Store:
    """The backend's store, opened with COSTGUARD_STORAGE_OPTIONS as the CLI reads it
    (and the ``parts`` limits, if given)."""
    text = os.environ.get("COSTGUARD_STORAGE_OPTIONS")
    return Store.open(backend.url, json.loads(text) if text else None, parts=parts)
