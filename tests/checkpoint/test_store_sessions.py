"""Each S3 store gets a session of its own (its credentials, profile and endpoint are read
when it opens), but botocore's service models are read from disk once per process: the
second store a process opens costs a fraction of the first (moto server over HTTP)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from costguard.checkpoint import backends
from costguard.checkpoint.store import Store
from tests.helpers.stores import make_s3_bucket


def loader(store: Store) -> Any:
    return store.fs.session.get_component("data_loader")


@pytest.mark.usefixtures("fresh_aws_models")
def test_stores_share_the_service_models_and_nothing_else(
    aws_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_s3_bucket(aws_env, "sessions")
    stores = [Store.open("s3://sessions/run1"), Store.open("s3://sessions/run2")]
    assert stores[0].fs is not stores[1].fs
    assert stores[0].fs.session is not stores[1].fs.session
    assert loader(stores[0]) is loader(stores[1])
    # A store opened after the credentials change signs with the new ones.
    stores[0].put("a", b"1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDCHANGED")
    third = Store.open("s3://sessions/run3")
    third.put("b", b"2")
    assert third.fs.s3._request_signer._credentials.access_key == "AKIDCHANGED"
    assert stores[0].fs.s3._request_signer._credentials.access_key != "AKIDCHANGED"
    assert loader(third) is loader(stores[0])


@pytest.mark.usefixtures("fresh_aws_models")
def test_three_stores_read_each_of_botocores_files_once(
    aws_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from botocore.loaders import JSONFileLoader

    make_s3_bucket(aws_env, "sessions")
    read: list[str] = []
    load_file = JSONFileLoader.load_file

    def counted(self: JSONFileLoader, file_path: str) -> Any:
        # Not moto's: its server answers in threads of its own, and reads models too.
        if "process_request_thread" not in threading.current_thread().name:
            read.append(file_path)
        return load_file(self, file_path)

    monkeypatch.setattr(JSONFileLoader, "load_file", counted)
    for run in ("run1", "run2", "run3"):
        Store.open(f"s3://sessions/{run}").put("x", b"1")  # the client is made on first use
    # The S3 model, its endpoint rules, the partitions: each file once, where each store
    # read them all (about 0.15 s of CPU a store).
    assert any("/s3/" in path for path in read), read
    assert sorted(read) == sorted(set(read)), read


@pytest.mark.usefixtures("fresh_aws_models")
def test_a_profile_in_the_storage_options_is_the_sessions_profile(
    aws_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_s3_bucket(aws_env, "sessions")
    config = tmp_path / "config"
    config.write_text("[profile lab]\nregion = eu-west-1\n")
    credentials = tmp_path / "credentials"
    credentials.write_text("[lab]\naws_access_key_id = AKIDLAB\naws_secret_access_key = s\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    store = Store.open("s3://sessions/run1", {"profile": "lab"})
    store.put("x", b"1")
    assert store.fs.session.profile == "lab"
    assert store.fs.s3._request_signer._credentials.access_key == "AKIDLAB"


def test_options_s3fs_would_hand_to_a_session_of_its_own_are_left_to_it() -> None:
    # A session given, or a session argument other than the profile: s3fs makes the
    # session from them as it always did.
    given = {"session": object()}
    assert backends.s3_session_options(given) is given
    hooks = {"event_hooks": None}
    assert backends.s3_session_options(hooks) is hooks
