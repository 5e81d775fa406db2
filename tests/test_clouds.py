"""The shared client factories: lazy imports, endpoints, error translation."""

from __future__ import annotations

import os
import subprocess
import sys
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
