"""The Store contract: one behaviour for every store backend (local folder, moto S3,
Azurite, gcp-storage-emulator), each the ``backend`` fixture of :mod:`tests.helpers.stores`."""

from __future__ import annotations

from pathlib import Path

import pytest

from costguard.checkpoint.store import Store, StoreError
from costguard.errors import InputError
from tests.helpers.stores import Backend, open_store


def test_put_get_list_delete(backend: Backend) -> None:
    store = open_store(backend)
    store.check_writable()
    assert store.listing() == {}
    store.put("ckpt-a/state.pt", b"x" * 1000)
    store.put("ckpt-a/manifest.json", b"{}")
    store.put("ckpt-b/state.pt", b"y")
    assert store.listing() == {
        "ckpt-a/state.pt": 1000,
        "ckpt-a/manifest.json": 2,
        "ckpt-b/state.pt": 1,
    }
    assert store.get("ckpt-a/state.pt") == b"x" * 1000
    store.put("ckpt-a/state.pt", b"z")  # overwrite is whole
    assert store.get("ckpt-a/state.pt") == b"z"
    store.delete(["ckpt-a/manifest.json", "ckpt-a/state.pt", "ckpt-a/missing"])
    assert store.listing() == {"ckpt-b/state.pt": 1}


def test_a_large_object_round_trips(backend: Backend) -> None:
    store = open_store(backend)
    data = bytes(range(256)) * (24 * 1024 * 4)  # 24 MiB: multipart on S3
    store.put("big/state.pt", data)
    assert store.get("big/state.pt") == data


def test_a_bounded_read_of_an_empty_object_is_empty(backend: Backend) -> None:
    """A record read within its bound asks for its first bytes, a range S3 and GCS cannot
    satisfy for an empty object (HTTP 416): it is empty, not unreadable (issue 43)."""
    store = open_store(backend)
    store.put("job/empty.json", b"")
    assert store.get("job/empty.json", max_bytes=64) == b""
    assert store.get("job/empty.json") == b""


def test_missing_object_is_a_store_error(backend: Backend) -> None:
    with pytest.raises(StoreError, match="not found"):
        open_store(backend).get("nothing/here")


def test_missing_bucket_is_an_input_error_before_anything_runs(
    backend: Backend, tmp_path: Path
) -> None:
    if backend.name == "local":
        (tmp_path / "a-file").write_text("not a folder")
        url = str(tmp_path / "a-file" / "run")  # a folder that cannot be created
    else:
        scheme, rest = backend.url.split("://")
        url = f"{scheme}://no-such-bucket-{abs(hash(rest)) % 10**6}/run"
    with pytest.raises(InputError, match=r"does not exist|cannot write"):
        Store.open(url).check_writable()
