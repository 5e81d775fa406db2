"""The shared client factories: lazy imports, endpoints, error translation."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from costguard.clouds import aws, require
from costguard.errors import CostguardError, InputError, MissingDependencyError


def test_missing_sdk_names_the_extra() -> None:
    with pytest.raises(MissingDependencyError) as info:
        require("costguard_no_such_sdk", "gcp")
    assert str(info.value.hint).startswith('in the costguard checkout: pip install ".[gcp]"')
    assert "[gcp] extra" in info.value.message


@pytest.mark.parametrize(
    "args",
    [
        ("alarm", "--budget", "200", "--email", "me@uni.edu"),
        ("alarm", "status"),
        ("burn",),
    ],
)
def test_without_the_aws_extra_the_error_names_the_extra(tmp_path: Path, args) -> None:
    """A real `costguard` process where boto3 and botocore cannot be imported."""
    for module in ("boto3", "botocore"):
        (tmp_path / module).mkdir()
        (tmp_path / module / "__init__.py").write_text(
            f"raise ModuleNotFoundError('No module named {module}', name={module!r})\n"
        )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "costguard", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    error, hint = result.stderr.splitlines()[:2]
    assert error == (
        "Error: this needs costguard's [aws] extra (the AWS SDK, boto3), which is not installed"
    )
    assert hint.startswith('Hint: in the costguard checkout: pip install ".[aws]"')


def test_aws_client_reaches_moto_through_the_standard_endpoint(aws_env: str) -> None:
    sts = aws.client("sts")
    assert sts.meta.endpoint_url == aws_env
    assert sts.get_caller_identity()["Account"]


@pytest.mark.usefixtures("fresh_aws_models")
def test_a_session_for_a_new_environment_reads_no_model_again(
    aws_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from botocore.loaders import JSONFileLoader

    read: list[str] = []
    load_file = JSONFileLoader.load_file
    caller = threading.current_thread()

    def counted(self: JSONFileLoader, file_path: str) -> object:
        if threading.current_thread() is caller:  # not moto's server threads: its own reads
            read.append(file_path)
        return load_file(self, file_path)

    monkeypatch.setattr(JSONFileLoader, "load_file", counted)
    first = aws.client("ec2", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDSECOND")  # a new session, its own keys
    second = aws.client("ec2", "us-east-1")
    assert second is not first
    assert second._request_signer._credentials.access_key == "AKIDSECOND"
    assert second.describe_instances()["Reservations"] == []
    assert any("/ec2/" in path for path in read), read
    assert sorted(read) == sorted(set(read)), read  # the EC2 model: about 0.3 s of CPU
    paths = aws.session()._session.get_component("data_loader").search_paths
    assert len(paths) == len(set(paths)), paths


def test_aws_errors_are_translated(aws_env: str) -> None:
    budgets = aws.client("budgets", attempts=1)
    with pytest.raises(aws.errors()) as info:
        budgets.describe_budget(AccountId="123456789012", BudgetName="costguard-none")
    translated = aws.translate(info.value, "reading the budget")
    assert isinstance(translated, CostguardError)
    assert "reading the budget" in translated.message


def test_aws_no_credentials_is_explained(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    sts = aws.client("sts", attempts=1)
    with pytest.raises(aws.errors()) as info:
        sts.get_caller_identity()
    translated = aws.translate(info.value, "checking the account")
    assert "no AWS credentials" in translated.message
    # Access keys, a profile, SSO, and the least-privilege policies: not only the AWS CLI.
    for needle in ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "aws sso login", "infra/aws/"):
        assert needle in (translated.hint or ""), needle


def test_input_errors_exit_2() -> None:
    assert InputError("x").exit_code == 2


@pytest.mark.parametrize(
    ("response", "code"),
    [
        ({"Error": {"Code": "InsufficientInstanceCapacity"}}, "InsufficientInstanceCapacity"),
        ({"Error": {"Code": 501}}, "501"),  # an S3-compatible store's bare status
        ({"Error": {"Code": "X" * 500}}, "X" * aws.MAX_CODE_CHARS),  # the service's text, bounded
        ({"Error": {"Message": "no code"}}, ""),
        ({}, ""),
    ],
)
def test_one_reader_of_aws_error_codes_for_every_caller(response: dict, code: str) -> None:
    """The launcher (capacity, NotFound), the price refresh (region not enabled,
    throttling) and :func:`aws.is_unsupported` read the code through it."""
    from botocore.exceptions import ClientError

    assert aws.error_code(ClientError(response, "RunInstances")) == code


def test_gcp_timestamps_are_utc_whatever_offset_google_writes() -> None:
    from datetime import UTC, datetime

    from costguard.clouds import gcp

    pacific = gcp.timestamp("2026-11-30T19:30:00.000000001-08:00")
    assert pacific == datetime(2026, 12, 1, 3, 30, tzinfo=UTC)
    assert pacific.tzinfo is UTC
    assert gcp.last_segment("projects/p/zones/us-central1-a") == "us-central1-a"
