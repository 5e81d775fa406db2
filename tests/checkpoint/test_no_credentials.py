"""No credentials for a store: one `Error:` naming what is missing, one `Hint:` saying how
to provide it, exit 2, no retries and no SDK log lines; the same on every command that
reads or writes a store (moto server without credentials), and on every cloud."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from costguard.checkpoint import backends
from costguard.checkpoint.store import Store
from costguard.errors import MissingCredentialsError

URL = "s3://my-bucket/run1"
COMMANDS = [
    ("checkpoint", "ls", URL),
    ("checkpoint", "verify", URL),
    ("jobs", "status", URL),
    ("launch", "--attach", URL),
    ("run", "--checkpoint", URL, "--", "python", "-c", "pass"),
    (
        "launch",
        "--provider",
        "local",
        "--gpu",
        "a10g",
        "--checkpoint",
        URL,
        "--yes",
        "--",
        "python",
        "-c",
        "pass",
    ),
]


@pytest.fixture
def no_aws_credentials(aws_env: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COSTGUARD_JOBS_DIR", str(tmp_path / "jobs"))


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_every_command_says_which_credentials_are_missing(
    args: tuple[str, ...], no_aws_credentials: None, run_cli: Callable[..., Any]
) -> None:
    result = run_cli(*args)
    assert result.exit_code == 2, result.stderr
    error, hint = result.stderr.splitlines()  # no retry lines, no SDK lines
    assert error.startswith("Error: no AWS credentials while ")
    assert error.endswith(f" on {URL}")
    assert hint.startswith("Hint: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_a_profile_that_does_not_exist_is_missing_credentials(
    args: tuple[str, ...],
    no_aws_credentials: None,
    run_cli: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_PROFILE", "nope")  # the config files are empty
    result = run_cli(*args)
    assert result.exit_code == 2, result.stderr
    error, hint = result.stderr.splitlines()  # no retries of what no retry can fix
    assert error.startswith("Error: no AWS credentials while "), error
    assert hint.startswith("Hint: set AWS_ACCESS_KEY_ID"), hint
    assert "AWS_PROFILE for a profile in ~/.aws/config" in hint


def test_aws_calls_report_a_missing_profile_as_missing_credentials() -> None:
    from botocore.exceptions import ProfileNotFound

    from costguard.clouds.aws import translate

    error = translate(ProfileNotFound(profile="nope"), "creating the budget")
    assert isinstance(error, MissingCredentialsError)
    assert error.exit_code == 2


def test_the_store_does_not_retry_missing_credentials(no_aws_credentials: None) -> None:
    store = Store.open(URL)
    waits: list[float] = []
    store._sleep = waits.append
    with pytest.raises(MissingCredentialsError) as info:
        store.check_exists()
    assert info.value.exit_code == 2
    assert waits == []


def test_azure_without_an_account_is_missing_credentials(
    monkeypatch: pytest.MonkeyPatch, run_cli: Callable[..., Any]
) -> None:
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME"):
        monkeypatch.delenv(name, raising=False)
    result = run_cli("checkpoint", "ls", "az://runs/r1")
    assert result.exit_code == 2, result.stderr
    assert result.stderr.splitlines() == [
        "Error: no Azure Storage account or credentials",
        f"Hint: {backends.CREDENTIALS['azure'][1]}",
    ]


def test_each_sdks_missing_credentials_is_recognised() -> None:
    """The real exception classes of botocore, google-auth and azure-identity."""
    from azure.core.exceptions import ClientAuthenticationError
    from azure.identity import CredentialUnavailableError
    from botocore.exceptions import NoCredentialsError, PartialCredentialsError
    from google.auth.exceptions import DefaultCredentialsError

    chained = RuntimeError("Failed to upload block")
    chained.__cause__ = CredentialUnavailableError("no managed identity endpoint")
    missing = [
        NoCredentialsError(),
        PartialCredentialsError(provider="env", cred_var="AWS_SECRET_ACCESS_KEY"),
        DefaultCredentialsError("Could not automatically determine credentials."),
        ClientAuthenticationError(
            "DefaultAzureCredential failed to retrieve a token from the included credentials."
        ),
        chained,
    ]
    for exc in missing:
        assert backends.no_credentials(exc), exc
        assert not backends.is_transient(exc), exc
    refused = ClientAuthenticationError("Server failed to authenticate the request.")
    assert not backends.no_credentials(refused)  # signed in, and refused: another error


def test_azure_identity_says_nothing_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    logger = logging.getLogger("azure.identity")
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "devstoreaccount1")
    Store.open("az://runs/r1")
    assert not logger.isEnabledFor(logging.WARNING)
    logger.setLevel(logging.DEBUG)  # one the user set stays
    Store.open("az://runs/r1")
    assert logger.level == logging.DEBUG
