"""S3 allows 10,000 parts of 5 MiB to 5 GiB and objects of 5 TiB: parts are sized from the
object (or grow along a stream) so that no object needs more parts, and an object past
the limit is refused before a byte is sent. The real uploads run on stores given lower
limits (``Store.open(parts=PartLimits(...))``; moto takes any part number, so the fault
proxy enforces the lowered one as S3 does)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest

from costguard.checkpoint import backends
from costguard.checkpoint.store import Store, StoreError
from costguard.checkpoint.uploads import (
    MAX_OBJECT_BYTES,
    MAX_PART_BYTES,
    MAX_PARTS,
    PART_BYTES,
    PartLimits,
    part_size,
    streamed_part_size,
)
from costguard.errors import InputError
from tests.checkpoint.test_store_multipart import (
    BUCKET,
    FAST,
    ONE_LAYER,
    incomplete_uploads,
    is_part,
    payload,
)
from tests.helpers.faults import Faults, fault_proxy
from tests.helpers.stores import Backend, make_s3_bucket, open_store

GiB = 2**30


@pytest.mark.parametrize(
    "size",
    [PART_BYTES + 1, 156 * GiB, 156 * GiB + 1, 208 * 10**9, 2**40, MAX_OBJECT_BYTES - 1,
     MAX_OBJECT_BYTES],
)  # fmt: skip
def test_a_known_size_fits_in_s3s_parts(size: int) -> None:
    """16 MiB parts held 156 GiB at most: a 13B model with Adam state (~208 GB) failed."""
    part = part_size(size, "state.pt")
    assert -(-size // part) <= MAX_PARTS
    assert PART_BYTES <= part <= MAX_PART_BYTES
    assert part % 2**20 == 0  # whole MiB (GCS wants multiples of 256 KiB)


def test_an_object_past_5_tib_is_refused_with_the_limit_named() -> None:
    with pytest.raises(StoreError, match=r"at most 5\.0 TiB") as refused:
        part_size(MAX_OBJECT_BYTES + 1, "state.pt")
    assert refused.value.hint


def test_a_stream_of_unknown_size_reaches_5_tib_within_10000_parts() -> None:
    sizes = [streamed_part_size(n) for n in range(1, MAX_PARTS + 1)]
    assert sum(sizes) >= MAX_OBJECT_BYTES
    assert max(sizes) <= MAX_PART_BYTES
    assert sizes == sorted(sizes)
    assert sizes[0] == PART_BYTES  # small checkpoints keep small parts


#: 4 parts at most, of 5 MiB at least: S3's limits scaled down to test objects.
FOUR = PartLimits(part_bytes=5 * 2**20, max_parts=4)


@pytest.fixture
def four_parts(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Faults]:
    """S3 that refuses part 5 (the fault proxy, as S3 refuses part 10,001), for stores
    opened with :data:`FOUR`."""
    make_s3_bucket(aws_env, BUCKET)
    faults = Faults(eligible=lambda method, path: True, max_part_number=4)
    with fault_proxy(aws_env, faults) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy)
        yield faults


def part_numbers(faults: Faults) -> list[int]:
    return [
        int(p.split("partNumber=")[1].split("&")[0]) for m, p, _ in faults.seen if is_part(m, p)
    ]


def test_a_put_larger_than_the_parts_allow_goes_up_in_larger_parts(four_parts: Faults) -> None:
    data = payload(33 * 2**20)  # 7 parts of 5 MiB: more than the 4 allowed
    store = Store.open(f"s3://{BUCKET}/run", ONE_LAYER, retry=FAST, parts=FOUR)
    assert store.put_hashed("ckpt/state.pt", data) == hashlib.sha256(data).hexdigest()
    assert store.get("ckpt/state.pt") == data
    assert sorted(part_numbers(four_parts)) == [1, 2, 3, 4]


def test_a_stream_grows_its_parts_to_stay_within_the_limit(four_parts: Faults) -> None:
    data = payload(40 * 2**20)
    store = Store.open(f"s3://{BUCKET}/run", ONE_LAYER, retry=FAST, parts=FOUR)
    with store.upload("ckpt/stream.pt") as upload:
        for start in range(0, len(data), 2**20):
            upload.write(data[start : start + 2**20])
    assert upload.sha256 == hashlib.sha256(data).hexdigest()
    assert store.get("ckpt/stream.pt") == data
    assert sorted(part_numbers(four_parts)) == [1, 2, 3, 4]  # 5, 10, 20, then 5 MiB


def test_an_object_past_the_limit_is_refused_before_anything_is_sent(four_parts: Faults) -> None:
    limits = PartLimits(part_bytes=5 * 2**20, max_parts=4, max_object_bytes=12 * 2**20)
    store = Store.open(f"s3://{BUCKET}/run", ONE_LAYER, retry=FAST, parts=limits)
    with pytest.raises(StoreError, match="TiB"):
        store.put_hashed("ckpt/big.pt", payload(13 * 2**20))
    assert four_parts.seen == []

    def stream(upload: Any) -> None:
        for _ in range(13):
            upload.write(payload(2**20))

    with pytest.raises(StoreError, match="TiB"):
        store.write_stream("ckpt/stream.pt", stream)
    assert incomplete_uploads() == []  # the stream's upload was aborted
    assert "ckpt/stream.pt" not in store.listing()


@pytest.mark.parametrize("backend", ["gcs", "azure"], indirect=True)
def test_blocks_elsewhere_keep_within_the_backends_limits(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GCS and Azure write a large object in blocks too: past the object limit nothing is
    written; within it the blocks are sized from the object."""
    name = backends.backend_name(backend.url)
    limits = PartLimits(part_bytes=2**20, max_parts=4, max_object_bytes=12 * 2**20)
    store = open_store(backend, parts=limits)
    with pytest.raises(StoreError, match=name.upper()):
        store.put_hashed("ckpt/big.pt", payload(13 * 2**20))
    assert "ckpt/big.pt" not in store.listing()
    data = payload(11 * 2**20)
    opened: list[Any] = []
    real_open = store.fs.open

    def watching_open(path: str, mode: str = "rb", **kwargs: Any) -> Any:
        opened.append(kwargs.get("block_size"))
        return real_open(path, mode, **kwargs)

    monkeypatch.setattr(store.fs, "open", watching_open)
    assert store.put_hashed("ckpt/fits.pt", data) == hashlib.sha256(data).hexdigest()
    assert opened == [3 * 2**20]  # 11 MiB in 4 blocks at most


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"part_bytes": 1000}, "not a multiple of 256 KiB"),
        ({"part_bytes": 0}, "above 0"),
        ({"part_bytes": 6 * GiB}, "over the largest part"),
        ({"max_parts": 0}, "above 0"),
        ({"max_parts": 2.5}, "whole number"),
        ({"max_object_bytes": -1}, "above 0"),
        ({"max_parts": True}, "whole number"),
    ],
)
def test_limits_that_cannot_be_are_refused_with_a_hint(given: dict[str, Any], says: str) -> None:
    with pytest.raises(InputError, match=says) as refused:
        PartLimits(**given)
    assert refused.value.hint
    assert refused.value.exit_code == 2


@pytest.mark.parametrize(
    ("url", "given", "says"),
    [
        ("s3://b/run", {"part_bytes": 2**20}, "below S3's smallest part"),
        ("s3://b/run", {"max_parts": 10_001}, "more than S3 allows"),
        ("s3://b/run", {"max_parts": None}, "more than S3 allows"),
        ("az://c/run", {"max_parts": 50_001}, "more than AZURE allows"),
        ("gs://b/run", {"max_object_bytes": MAX_OBJECT_BYTES + 1}, "more than GCS allows"),
    ],
)
def test_limits_above_the_backends_are_refused_before_the_store_is_reached(
    url: str, given: dict[str, Any], says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing answers at this endpoint: the refusal comes before any call."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    with pytest.raises(InputError, match=says):
        Store.open(url, parts=PartLimits(**given))


def test_a_store_keeps_its_backends_limits_unless_given_lower_ones(tmp_path: Any) -> None:
    assert Store.open(str(tmp_path)).parts.part_bytes == PART_BYTES
    local = Store.open(str(tmp_path), parts=PartLimits(part_bytes=2**20))
    assert local.child("task-1").parts == local.parts
    assert local.parts.part_bytes == 2**20
