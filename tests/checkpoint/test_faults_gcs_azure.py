"""Faults on GCS (gcp-storage-emulator) and Azure Blob (Azurite): the proxy of
:mod:`test_faults` in front of each answers some uploads with 5xx or throttling, or
stalls them. Saves retry and succeed, or are reported; training goes on; nothing earlier
is lost. A store that refuses every write is the same test on S3 (moto) too."""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from costguard.checkpoint import Checkpointer, RetryPolicy
from costguard.checkpoint.store import Store, StoreError
from costguard.checkpoint.uploads import PartLimits
from tests.helpers.faults import Faults, fault_proxy, train

FAST = RetryPolicy(attempts=4, base_delay_s=0.05, max_delay_s=0.2)


@dataclass
class Flaky:
    """A store URL reached through the fault proxy, and the options to open it."""

    url: str
    options: dict[str, Any]
    faults: Faults


def gcs_upload(method: str, path: str) -> bool:
    return method in ("POST", "PUT") and path.startswith("/upload/")


def azure_put(method: str, path: str) -> bool:
    return method == "PUT" and "comp=" not in path and "restype=" not in path


@pytest.fixture
def flaky_gcs(gcs_emulator: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Flaky]:
    faults = Faults(eligible=gcs_upload)
    with fault_proxy(gcs_emulator, faults) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy)
        monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        url = f"gs://ckpt-bucket/flaky{time.monotonic_ns()}"
        yield Flaky(url, {"token": "anon", "project": "test"}, faults)


@pytest.fixture
def flaky_azure(azurite: str) -> Iterator[Flaky]:
    adlfs = importlib.import_module("adlfs")  # untyped; mypy need not know it
    adlfs.AzureBlobFileSystem(connection_string=azurite, skip_instance_cache=True).mkdir(
        container := f"flaky{time.monotonic_ns()}"
    )
    upstream = azurite.split("BlobEndpoint=", 1)[1].split(";", 1)[0]
    base = upstream.removesuffix("/devstoreaccount1")
    faults = Faults(eligible=azure_put)
    with fault_proxy(base, faults) as proxy:
        connection = azurite.replace(base, proxy)
        yield Flaky(f"az://{container}/run", {"connection_string": connection}, faults)


def gcs_error(code: int, message: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message}}).encode()


AZURE_BUSY = (
    b'<?xml version="1.0" encoding="utf-8"?><Error><Code>ServerBusy</Code>'
    b"<Message>The server is busy.</Message></Error>"
)


def throttle(flaky: Flaky, count: int) -> None:
    """The next ``count`` uploads are throttled, the way each service says so."""
    if flaky.url.startswith("gs://"):
        flaky.faults.status, flaky.faults.error_body = 429, gcs_error(429, "rateLimitExceeded")
        flaky.faults.error_headers = {"Content-Type": "application/json"}
    else:
        flaky.faults.status, flaky.faults.error_body = 503, AZURE_BUSY
        flaky.faults.error_headers = {
            "Content-Type": "application/xml",
            "x-ms-error-code": "ServerBusy",
        }
    flaky.faults.fail_puts = count


def refuse_everything(flaky: Flaky) -> None:
    """From now on every upload fails with a server error (on S3 the proxy's SlowDown)."""
    if flaky.url.startswith("s3://"):
        pass
    elif flaky.url.startswith("gs://"):
        # 507: a server error gcsfs hands straight back; our retries then report it.
        flaky.faults.status, flaky.faults.error_body = 507, gcs_error(507, "Please reduce")
        flaky.faults.error_headers = {"Content-Type": "application/json"}
    else:
        flaky.faults.status = 500
        flaky.faults.error_body = AZURE_BUSY.replace(b"The server is busy", b"Please reduce")
        flaky.faults.error_headers = {
            "Content-Type": "application/xml",
            "x-ms-error-code": "InternalError",
        }
    flaky.faults.fail_puts = 10**6


@pytest.fixture(params=["gcs", "azure"])
def flaky(request: pytest.FixtureRequest) -> Flaky:
    name = "flaky_gcs" if request.param == "gcs" else "flaky_azure"
    result: Flaky = request.getfixturevalue(name)
    return result


@pytest.fixture
def flaky_s3_store(flaky_s3: Faults) -> Flaky:
    """The moto bucket behind the proxy of :mod:`test_faults`, botocore's own retries off."""
    return Flaky("s3://flaky/run", {"config_kwargs": {"retries": {"max_attempts": 1}}}, flaky_s3)


@pytest.fixture(params=["s3", "gcs", "azure"])
def failing_store(request: pytest.FixtureRequest) -> Flaky:
    result: Flaky = request.getfixturevalue(
        f"flaky_{request.param}" + "_store" * (request.param == "s3")
    )
    return result


@pytest.mark.slow
def test_throttled_uploads_are_retried(flaky: Flaky, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="costguard.checkpoint")
    model = torch.nn.Linear(6, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = Checkpointer(flaky.url, every_steps=1, retry=FAST, storage_options=flaky.options)
    throttle(flaky, 2)
    for step in range(3):
        train(model, opt)
        ckpt.step(step, model=model, optimizer=opt)
    ckpt.close()
    assert flaky.faults.failed == 2
    assert [r.ok for r in ckpt.results] == [True, True, True]
    if flaky.url.startswith("az://"):
        # One retry layer, ours (jittered, short): the Azure SDK's own would wait 15 s
        # and more before each attempt, most of the 30 s a Spot eviction gives.
        assert caplog.text.count("ServerBusy") >= 2
        assert "retry 1 of 3" in caplog.text
    fresh = torch.nn.Linear(6, 3)
    assert Checkpointer(flaky.url, storage_options=flaky.options).restore(model=fresh) == 3
    assert torch.equal(fresh.weight, model.weight)


@pytest.mark.slow
def test_a_stalled_upload_times_out_and_is_retried(flaky: Flaky) -> None:
    options = dict(flaky.options)
    if flaky.url.startswith("gs://"):
        options["requests_timeout"] = 1
    else:
        options["read_timeout"] = 1
    model = torch.nn.Linear(6, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = Checkpointer(flaky.url, every_steps=1, retry=FAST, storage_options=options)
    flaky.faults.stall_puts, flaky.faults.stall_s = 1, 3.0
    for step in range(2):
        train(model, opt)
        ckpt.step(step, model=model, optimizer=opt)
    ckpt.close()
    assert flaky.faults.stalled == 1
    assert [r.ok for r in ckpt.results] == [True, True]
    fresh = torch.nn.Linear(6, 3)
    assert Checkpointer(flaky.url, storage_options=flaky.options).restore(model=fresh) == 2
    assert torch.equal(fresh.weight, model.weight)


@pytest.mark.slow
def test_a_store_that_keeps_failing_is_reported_and_loses_nothing(
    failing_store: Flaky,
) -> None:
    flaky = failing_store
    model = torch.nn.Linear(6, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = Checkpointer(flaky.url, every_steps=1, retry=FAST, storage_options=flaky.options)
    train(model, opt)
    ckpt.step(0, model=model, optimizer=opt)
    ckpt.flush()
    saved = model.weight.detach().clone()
    refuse_everything(flaky)
    for step in range(1, 3):
        train(model, opt)
        assert ckpt.step(step, model=model, optimizer=opt) is False  # training goes on
    ckpt.close()  # tries the last step once more, as the final save: it fails too
    assert [(r.ok, r.reason) for r in ckpt.results] == [
        (True, "schedule"),
        (False, "schedule"),
        (False, "schedule"),
        (False, "final"),
    ]
    assert all(r.error for r in ckpt.results[1:])
    if flaky.url.startswith("s3://"):  # S3's SlowDown message reaches the report
        assert all("Please reduce" in (r.error or "") for r in ckpt.results[1:])
    flaky.faults.fail_puts = 0
    fresh = torch.nn.Linear(6, 3)
    assert Checkpointer(flaky.url, storage_options=flaky.options).restore(model=fresh) == 1
    assert torch.equal(fresh.weight, saved)


@pytest.mark.slow
def test_a_large_object_goes_up_in_blocks_retried_and_never_half_visible(flaky: Flaky) -> None:
    if flaky.url.startswith("az://"):  # the staged blocks and their commit, too
        flaky.faults.eligible = lambda method, path: method == "PUT" and "restype=" not in path
    # 5 MiB blocks: several, quickly.
    store = Store.open(flaky.url, flaky.options, retry=FAST, parts=PartLimits(part_bytes=5 * 2**20))
    data = (bytes(range(251)) * (12 * 2**20 // 251 + 1))[: 12 * 2**20 + 7]
    throttle(flaky, 2)
    assert store.put_hashed("ckpt/state.pt", data) == hashlib.sha256(data).hexdigest()
    assert flaky.faults.failed == 2
    assert store.get("ckpt/state.pt") == data
    # It went up a block at a time (GCS: POSTs to one resumable upload; Azure: staged
    # blocks, then their commit), not as one request.
    assert len(flaky.faults.seen) >= 4
    refuse_everything(flaky)
    with pytest.raises(StoreError, match=r"writing ckpt/other\.pt"):
        store.put("ckpt/other.pt", data)
    flaky.faults.fail_puts = 0
    assert store.listing() == {"ckpt/state.pt": len(data)}  # nothing half-written shows
