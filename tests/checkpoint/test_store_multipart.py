"""S3 multipart uploads through moto server: parts go up concurrently and checked, the
sha256 comes out of the same pass, a failed part is retried alone, an upload that fails
is aborted, and uploads a killed writer left behind are aborted after a grace period."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import signal
import subprocess
import sys
import zlib
from collections.abc import Iterator
from datetime import datetime
from typing import IO, Any, cast

import pytest

from costguard.checkpoint import RetryPolicy, uploads
from costguard.checkpoint.store import Store, StoreError
from tests.helpers.faults import Faults, fault_proxy
from tests.helpers.output import on_terminal
from tests.helpers.stores import Backend, make_s3_bucket, open_store
from tests.helpers.training import repository_path
from tests.helpers.waiting import wait_for

FAST = RetryPolicy(attempts=4, base_delay_s=0.05, max_delay_s=0.2)
PART = 5 * 2**20  # S3's smallest part: small test objects still come in several parts
PARTS = uploads.PartLimits(part_bytes=PART)
BUCKET = "parts"
#: One retry layer in these tests, ours: botocore's own would resend each failed part.
ONE_LAYER = {"config_kwargs": {"read_timeout": 30, "retries": {"max_attempts": 1}}}


def s3_client() -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client("s3", config=Config(retries={"max_attempts": 1}))


def is_part(method: str, path: str) -> bool:
    return method == "PUT" and "partNumber=" in path


def payload(size: int) -> bytes:
    return (bytes(range(251)) * (size // 251 + 1))[:size]


@pytest.fixture
def parts_proxy(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Faults]:
    """moto behind the fault proxy (for stores opened with :data:`PARTS`: 5 MiB parts);
    faults apply to part uploads."""
    make_s3_bucket(aws_env, BUCKET)
    faults = Faults(eligible=is_part)
    with fault_proxy(aws_env, faults) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy)
        yield faults


def incomplete_uploads() -> list[dict[str, Any]]:
    return list(s3_client().list_multipart_uploads(Bucket=BUCKET).get("Uploads", []))


def test_put_hashed_returns_the_sha256_on_every_backend(backend: Backend) -> None:
    store = open_store(backend)
    for size in (0, 1000, 24 * 2**20):  # 24 MiB: a multipart upload on S3
        data = payload(size)
        assert store.put_hashed(f"h/{size}.bin", data) == hashlib.sha256(data).hexdigest()
        assert store.get(f"h/{size}.bin") == data


@pytest.mark.slow
def test_parts_go_up_concurrently_with_checksums(parts_proxy: Faults) -> None:
    parts_proxy.delay_s = 0.3  # long enough for the next parts to arrive meanwhile
    data = payload(6 * PART + 123)
    store = Store.open(f"s3://{BUCKET}/run", ONE_LAYER, retry=FAST, parts=PARTS)
    digest = store.put_hashed("ckpt/state.pt", data)
    assert digest == hashlib.sha256(data).hexdigest()
    assert store.get("ckpt/state.pt") == data
    assert len(parts_proxy.seen) == 7
    assert 1 < parts_proxy.max_inflight <= uploads.PARTS_IN_FLIGHT
    # Every part carries the CRC32 of its bytes, which S3 checks before accepting it
    # (moto does not: a wrong one would pass unnoticed there).
    for _, path, headers in parts_proxy.seen:
        number = int(re.search(r"partNumber=(\d+)", path)[1])  # type: ignore[index]
        part = data[(number - 1) * PART : number * PART]
        crc = {k.lower(): v for k, v in headers.items()}["x-amz-checksum-crc32"]
        assert crc == base64.b64encode(zlib.crc32(part).to_bytes(4, "big")).decode()
    assert incomplete_uploads() == []


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_botocore_hashes_no_part_twice(scheme: str) -> None:
    """The CRC32 computed on the hashing thread goes with a part where botocore signs
    the body anyway (plain http); over https botocore streams its own CRC32 as a trailer
    and signs no body (a given CRC32 would make it sha256 every part on the loop)."""
    import boto3
    from botocore.awsrequest import AWSResponse

    client = boto3.client(
        "s3",
        endpoint_url=f"{scheme}://127.0.0.1:9",  # nothing is sent: before-send answers
        aws_access_key_id="test",
        aws_secret_access_key="test",
        region_name="us-east-1",
    )
    sent: dict[str, str] = {}

    class Empty:
        def stream(self, **_: Any) -> Iterator[bytes]:
            return iter([b""])

    def answer(request: Any, **_: Any) -> AWSResponse:
        for name, value in request.headers.items():
            sent[name.lower()] = value.decode() if isinstance(value, bytes) else value
        return AWSResponse(request.url, 200, {"ETag": '"e"'}, Empty())

    client.meta.events.register("before-send.s3.UploadPart", answer)
    body = payload(PART)
    crc32 = base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode()
    given = uploads.part_checksum(client.meta.endpoint_url, crc32)
    client.upload_part(Bucket=BUCKET, Key="k", UploadId="u", PartNumber=1, Body=body, **given)
    if scheme == "http":
        assert sent["x-amz-checksum-crc32"] == crc32
        assert sent["x-amz-content-sha256"] == hashlib.sha256(body).hexdigest()
    else:
        assert sent["x-amz-trailer"] == "x-amz-checksum-crc32"
        assert sent["x-amz-content-sha256"] == "STREAMING-UNSIGNED-PAYLOAD-TRAILER"


@pytest.mark.slow
def test_a_failed_part_is_resent_alone(parts_proxy: Faults) -> None:
    parts_proxy.fail_puts = 2
    data = payload(4 * PART)
    store = Store.open(f"s3://{BUCKET}/run", ONE_LAYER, retry=FAST, parts=PARTS)
    store.put("ckpt/state.pt", data)
    assert store.get("ckpt/state.pt") == data
    assert parts_proxy.failed == 2
    assert len(parts_proxy.seen) == 4 + 2  # the two failed parts again, not the object
    assert incomplete_uploads() == []


@pytest.mark.slow
def test_an_upload_that_fails_is_aborted_and_nothing_else_changes(parts_proxy: Faults) -> None:
    store = Store.open(f"s3://{BUCKET}/run", ONE_LAYER, retry=FAST, parts=PARTS)
    store.put("old/state.pt", b"earlier checkpoint")
    parts_proxy.fail_puts = 10**6  # every part fails, every time
    with pytest.raises(StoreError, match=r"uploading part \d+ of new/state.pt"):
        store.put("new/state.pt", payload(3 * PART))
    assert incomplete_uploads() == []  # the parts sent are not left billing
    assert store.listing() == {"old/state.pt": len(b"earlier checkpoint")}
    assert store.get("old/state.pt") == b"earlier checkpoint"


def test_stale_uploads_under_the_root_are_aborted_after_the_grace_period(aws_env: str) -> None:
    make_s3_bucket(aws_env, BUCKET)
    s3 = s3_client()
    for key in ("run/ckpt-000000000001-00000000/state.pt", "other/state.pt"):
        upload = s3.create_multipart_upload(Bucket=BUCKET, Key=key)
        s3.upload_part(
            Bucket=BUCKET, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=b"x" * 100
        )
    # moto reports the same Initiated time for every upload; the clock is set from it.
    initiated: datetime = incomplete_uploads()[0]["Initiated"]
    store = Store.open(f"s3://{BUCKET}/run")
    assert store.abort_stale_uploads(900, now_unix=initiated.timestamp() + 60) == []
    assert len(incomplete_uploads()) == 2
    aborted = store.abort_stale_uploads(900, now_unix=initiated.timestamp() + 901)
    assert aborted == ["run/ckpt-000000000001-00000000/state.pt"]
    assert [u["Key"] for u in incomplete_uploads()] == ["other/state.pt"]  # not ours


def test_stale_uploads_is_a_no_op_off_s3(tmp_path: Any) -> None:
    assert Store.open(str(tmp_path)).abort_stale_uploads(0) == []


WRITER = """
import sys
from costguard.checkpoint import store, uploads
s = store.Store.open("s3://parts/run", parts=uploads.PartLimits(part_bytes=5 * 2**20))
s.put("ckpt-000000000007-0000abcd/state.pt", bytes(40 * 2**20))
print("finished")
"""


@pytest.mark.slow
def test_the_upload_of_a_writer_killed_mid_save_is_aborted(parts_proxy: Faults) -> None:
    parts_proxy.delay_s = 0.5  # a slow store: the kill lands while parts are on the wire
    env = {**os.environ, "PYTHONPATH": repository_path()}
    writer = subprocess.Popen([sys.executable, "-c", WRITER], env=env)
    try:

        def writing() -> None:
            assert writer.poll() is None, "the writer ended before its upload began"

        wait_for(lambda: parts_proxy.seen, "a part of the upload", alive=writing)
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(timeout=10)
    finally:
        if writer.poll() is None:
            writer.kill()
    assert writer.returncode == -signal.SIGKILL
    assert [u["Key"] for u in incomplete_uploads()] == ["run/ckpt-000000000007-0000abcd/state.pt"]
    store = Store.open(f"s3://{BUCKET}/run")
    assert store.listing() == {}  # invisible to a listing, yet stored and billed
    assert store.abort_stale_uploads(0) == ["run/ckpt-000000000007-0000abcd/state.pt"]
    assert incomplete_uploads() == []


# -- streaming: Store.upload ------------------------------------------------------------


def test_a_stream_written_in_pieces_round_trips_on_every_backend(backend: Backend) -> None:
    store = open_store(backend)
    data = payload(18 * 2**20 + 7)  # more than one part on S3
    with store.upload("s/state.pt") as upload:
        for start in range(0, len(data), 3 * 2**20 + 1):  # writes that straddle parts
            upload.write(data[start : start + 3 * 2**20 + 1])
    assert (upload.size, upload.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert store.get("s/state.pt") == data
    with store.upload("s/small") as small:
        small.write(b"tiny")
    assert (small.size, store.get("s/small")) == (4, b"tiny")


def test_torch_save_streams_into_the_store(backend: Backend) -> None:
    import io

    import torch

    state = {"w": torch.arange(3 * 2**20, dtype=torch.float32), "step": 3}
    expected = io.BytesIO()
    torch.save(state, expected)
    store = open_store(backend)
    with store.upload("t/state.pt") as upload:
        torch.save(state, cast("IO[bytes]", upload))  # any .write() will do
    assert store.get("t/state.pt") == expected.getvalue()
    assert upload.sha256 == hashlib.sha256(expected.getvalue()).hexdigest()


@pytest.mark.slow
def test_parts_go_up_while_the_stream_is_still_written(parts_proxy: Faults) -> None:
    store = Store.open(f"s3://{BUCKET}/run", ONE_LAYER, retry=FAST, parts=PARTS)
    data = payload(5 * PART)
    with store.upload("ckpt/state.pt") as upload:
        upload.write(data[: 2 * PART + 1])  # two full parts: they leave now
        wait_for(lambda: parts_proxy.seen, "a part going up while the stream is written")
        upload.write(data[2 * PART + 1 :])
    assert store.get("ckpt/state.pt") == data
    assert len(parts_proxy.seen) == 5
    assert incomplete_uploads() == []


@pytest.mark.slow
def test_a_long_stream_reuses_a_few_part_buffers(
    parts_proxy: Faults, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory of a streamed upload is bounded by the parts in flight, not by the object:
    a sent and hashed part's buffer is filled again (never while a resend may need it)."""
    parts_proxy.delay_s = 0.05
    parts_proxy.fail_puts = 2  # two parts are sent twice, from the same buffer
    bodies: list[bytes | bytearray] = []  # kept alive: a freed buffer's id could recur
    send = uploads.S3Upload._send

    async def recording(self: Any, number: int, body: Any, crc32: Any) -> dict[str, Any]:
        bodies.append(body)
        return await send(self, number, body, crc32)

    monkeypatch.setattr(uploads.S3Upload, "_send", recording)
    store = Store.open(f"s3://{BUCKET}/run", ONE_LAYER, retry=FAST, parts=PARTS)
    data = payload(20 * PART + 4321)
    with store.upload("ckpt/state.pt") as upload:
        for start in range(0, len(data), 3 * 2**20 + 17):  # writes that straddle parts
            upload.write(data[start : start + 3 * 2**20 + 17])
    assert store.get("ckpt/state.pt") == data
    assert upload.sha256 == hashlib.sha256(data).hexdigest()
    assert len(bodies) == 21
    buffers = {id(body) for body in bodies if isinstance(body, bytearray)}
    assert len(buffers) <= uploads.PARTS_IN_FLIGHT + 2


@pytest.mark.slow
def test_a_stream_that_fails_writes_nothing_and_aborts_its_upload(parts_proxy: Faults) -> None:
    store = Store.open(f"s3://{BUCKET}/run", ONE_LAYER, retry=FAST, parts=PARTS)
    store.put("ckpt/state.pt", b"the previous one")

    def save_that_breaks() -> None:
        with store.upload("ckpt/state.pt") as upload:
            upload.write(payload(3 * PART))  # parts are on S3 by now
            raise RuntimeError("serialisation broke")

    with pytest.raises(RuntimeError, match="serialisation broke"):
        save_that_breaks()
    assert store.get("ckpt/state.pt") == b"the previous one"
    assert incomplete_uploads() == []


@pytest.mark.slow
def test_torch_save_into_parts_that_keep_failing_reports_the_store_error(
    parts_proxy: Faults,
) -> None:
    import torch

    store = Store.open(f"s3://{BUCKET}/run", ONE_LAYER, retry=FAST, parts=PARTS)
    parts_proxy.fail_puts = 10**6  # every part fails, every time
    # More parts than may be in flight: a write waits for a slot, then finds a part failed.
    parts = uploads.PARTS_IN_FLIGHT + 3
    state = {"w": torch.zeros(parts * PART // 4, dtype=torch.float32)}
    # torch.save turns that failed write into its own RuntimeError ("unexpected pos"); what
    # reaches the caller is the store's error, which says which part and why.
    with pytest.raises(StoreError, match=r"uploading part \d+ of ckpt/state.pt"):
        store.write_stream("ckpt/state.pt", lambda file: torch.save(state, cast("IO[bytes]", file)))
    assert incomplete_uploads() == []
    assert store.listing() == {}


# -- a long save shows its progress on a terminal ---------------------------------------

SAVER = """
import torch
from costguard.checkpoint import Checkpointer
model = torch.nn.Linear(4200, 4200)  # 70.6 MB of float32: over the 64 MiB of a bar
with Checkpointer("s3://parts/run", every_steps=1) as ckpt:
    ckpt.step(0, model=model)  # saved in the background; the exit waits for it
print("saved")
"""


@pytest.mark.slow
def test_a_long_save_to_s3_shows_its_progress_on_a_terminal_only(
    parts_proxy: Faults, tmp_path: Any
) -> None:
    """Issue 49 item 9: a 302 MB save to S3 was silent for 15 s. On a terminal (a real
    pseudo-terminal) a line says which step is saving and the bytes S3 holds out of
    about its size; on stderr that is a file (a cron log, a batch job's output) or a
    pipe, nothing but what the script prints."""
    parts_proxy.delay_s = 3.0  # each part: the save takes seconds
    script = tmp_path / "train.py"
    script.write_text(SAVER)
    env = {**os.environ, "PYTHONPATH": repository_path(), "COLUMNS": "100"}
    code, screen = on_terminal([sys.executable, str(script)], 100, env)
    assert code == 0, screen
    assert "costguard: saving step 1" in screen, screen
    shown = [tuple(map(float, m)) for m in re.findall(r"(\d+\.\d)/(\d+\.\d) MB", screen)]
    weights = 4200 * 4201 * 4 / 1e6  # out of about the state's size
    assert all(weights <= total <= weights * 1.01 for _, total in shown), shown
    assert any(0 < stored < total for stored, total in shown), shown  # as parts went up
    assert shown[-1][0] >= weights, shown
    assert screen.rstrip().endswith("saved"), screen
    seen = len(parts_proxy.seen)
    assert seen >= 5, seen
    log = tmp_path / "cron.log"
    with log.open("w") as stderr:
        done = subprocess.run(
            [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=stderr,
            text=True, timeout=300, check=True,
        )  # fmt: skip
    assert len(parts_proxy.seen) >= 2 * seen - 1  # as slow, silently
    assert done.stdout == "saved\n"
    assert "saving step" not in log.read_text()
