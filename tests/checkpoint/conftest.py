"""Fixtures for the checkpoint suite: a store per backend (local, moto S3, Azurite,
gcp-storage-emulator), local metadata servers for AWS/GCP/Azure, and the training script.

Emulators start once per module run and fail the run loudly when they cannot start.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port, stop_process

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
TRAIN_SCRIPT = HERE / "train_script.py"
AZURITE = Path(os.environ.get("COSTGUARD_AZURITE_DIR", REPO / ".ci-work" / "node"))
AZURITE_BIN = AZURITE / "node_modules" / ".bin" / "azurite-blob"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def wait_for(url: str, timeout_s: float = 30.0) -> None:
    """Poll until something answers HTTP at ``url`` (any status), or fail."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Azurite's blob service; the connection string of its well-known dev account."""
    if not AZURITE_BIN.exists():
        pytest.fail(
            f"Azurite is not installed at {AZURITE_BIN}: "
            "npm install --prefix .ci-work/node azurite@3 (or set COSTGUARD_AZURITE_DIR)"
        )
    port = free_port()
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
        wait_for(f"http://127.0.0.1:{port}/devstoreaccount1?comp=list")
        yield (
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
            f"AccountKey={AZURITE_KEY};BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;"
        )
    finally:
        stop_process(proc)


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[str]:
    """gcp-storage-emulator (in memory) with a bucket named ``ckpt-bucket``."""
    port = free_port()
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
        wait_for(f"http://127.0.0.1:{port}/storage/v1/b")
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


# -- metadata servers ------------------------------------------------------------------


@dataclass
class MetadataState:
    """What the fake metadata service answers; tests flip it while training runs."""

    aws_action: dict[str, str] | None = None
    aws_rebalance: dict[str, str] | None = None
    gcp_preempted: bool = False
    azure_events: list[dict[str, Any]] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    tokens: set[str] = field(default_factory=set)


class MetadataHandler(BaseHTTPRequestHandler):
    """The documented shapes of IMDSv2, GCP metadata and Azure Scheduled Events."""

    state: MetadataState

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: str, content_type: str = "text/plain") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        self.state.requests.append(f"PUT {self.path}")
        if self.path == "/latest/api/token" and self.headers.get(
            "X-aws-ec2-metadata-token-ttl-seconds"
        ):
            token = f"token-{len(self.state.tokens)}"
            self.state.tokens.add(token)
            self._send(200, token)
        else:
            self._send(400, "bad token request")

    def do_GET(self) -> None:
        s = self.state
        s.requests.append(f"GET {self.path}")
        if self.path.startswith("/latest/meta-data/"):
            if self.headers.get("X-aws-ec2-metadata-token") not in s.tokens:
                self._send(401, "")
                return
            if self.path.endswith("spot/instance-action") and s.aws_action:
                self._send(200, json.dumps(s.aws_action), "application/json")
            elif self.path.endswith("events/recommendations/rebalance") and s.aws_rebalance:
                self._send(200, json.dumps(s.aws_rebalance), "application/json")
            else:
                self._send(404, "Not Found")
        elif self.path.startswith("/computeMetadata/v1/instance/preempted"):
            if self.headers.get("Metadata-Flavor") != "Google":
                self._send(403, "Missing Metadata-Flavor")
            else:
                self._send(200, "TRUE" if s.gcp_preempted else "FALSE")
        elif self.path.startswith("/metadata/scheduledevents"):
            if self.headers.get("Metadata") != "true":
                self._send(400, "Bad request: Metadata header")
            else:
                doc = {"DocumentIncarnation": len(s.azure_events), "Events": s.azure_events}
                self._send(200, json.dumps(doc), "application/json")
        else:
            self._send(404, "Not Found")


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler], state: Any) -> Iterator[str]:
    """Serve ``handler`` (bound to ``state``) on a loopback port; its base URL."""
    bound = type("Handler", (handler,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), bound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def metadata_server() -> Iterator[tuple[str, MetadataState]]:
    """A loopback server that plays all three clouds' metadata services."""
    state = MetadataState()
    with serving(MetadataHandler, state) as url:
        yield url, state


# -- training through `costguard run` ---------------------------------------------------


def costguard_command() -> list[str]:
    """The installed ``costguard`` script of this interpreter's environment."""
    script = Path(sys.executable).with_name("costguard")
    if not script.exists():
        found = shutil.which("costguard")
        assert found, "costguard is not installed in this environment: pip install -e ."
        script = Path(found)
    return [str(script)]


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


# -- Azure Scheduled Events that take acknowledgements (StartRequests) ------------------


@dataclass
class AckState(MetadataState):
    """:class:`MetadataState` plus the EventIds acknowledged with ``StartRequests``."""

    started: list[str] = field(default_factory=list)
    #: Called with the acknowledged EventIds while the POST is handled (tests record
    #: what was true at that moment, e.g. which checkpoints were committed).
    on_start: Callable[[list[str]], None] | None = None


class AckingMetadataHandler(MetadataHandler):
    """The metadata server plus Scheduled Events' documented POST: ``{"StartRequests":
    [{"EventId": ...}]}`` with ``Metadata: true`` starts those events (EventStatus
    ``Started``); an unknown EventId or a malformed body is a 400."""

    state: AckState

    def do_POST(self) -> None:
        s = self.state
        s.requests.append(f"POST {self.path}")
        if not self.path.startswith("/metadata/scheduledevents"):
            self._send(404, "Not Found")
            return
        if self.headers.get("Metadata") != "true":
            self._send(400, "Bad request: Metadata header")
            return
        length = int(self.headers.get("Content-Length") or 0)
        try:
            doc = json.loads(self.rfile.read(length))
            ids = [str(item["EventId"]) for item in doc["StartRequests"]]
        except (ValueError, KeyError, TypeError):
            self._send(400, "Bad request: StartRequests")
            return
        known = {str(event.get("EventId")) for event in s.azure_events}
        if not ids or not set(ids) <= known:
            self._send(400, "Bad request: unknown EventId")
            return
        if s.on_start is not None:
            s.on_start(ids)
        for event in s.azure_events:
            if str(event.get("EventId")) in ids:
                event["EventStatus"] = "Started"
        s.started.extend(ids)
        self._send(200, "")


@pytest.fixture
def acking_metadata_server() -> Iterator[tuple[str, AckState]]:
    """:func:`metadata_server` whose Azure Scheduled Events also take acknowledgements."""
    state = AckState()
    with serving(AckingMetadataHandler, state) as url:
        yield url, state
