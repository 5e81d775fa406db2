"""One rule for missing credentials on every cloud's commands: one `Error:` naming what is
missing, one `Hint:` how to provide it, exit 2, no SDK log lines. The SDKs' own credential
chains run for real; every endpoint they would ask (instance metadata) is a closed loopback
port."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.processes import free_port


@pytest.fixture
def nowhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No credentials in the environment or the home folder; metadata services closed."""
    closed = f"127.0.0.1:{free_port()}"
    for name in (
        "GOOGLE_APPLICATION_CREDENTIALS",
        "AZURE_CLIENT_ID",
        "AZURE_TENANT_ID",
        "AZURE_CLIENT_SECRET",
        "AZURE_FEDERATED_TOKEN_FILE",
        "MSI_ENDPOINT",
        "COSTGUARD_GCP_ENDPOINT",
        "COSTGUARD_AZURE_ENDPOINT",
        "STORAGE_EMULATOR_HOST",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("GCE_METADATA_HOST", closed)
    monkeypatch.setenv("GCE_METADATA_IP", closed)
    monkeypatch.setenv("IDENTITY_ENDPOINT", f"http://{closed}/msi/token")
    monkeypatch.setenv("IDENTITY_HEADER", "x")
    monkeypatch.setenv("PATH", str(tmp_path))  # no az, azd or pwsh to ask


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ("burn", "--provider", "gcp", "--project", "my-lab", "--budget", "10"),
            "Error: no Google Cloud credentials found",
        ),
        (
            ("reap", "--provider", "gcp", "--project", "my-lab"),
            "Error: no Google Cloud credentials found",
        ),
        (
            (
                "reap",
                "--provider",
                "azure",
                "--subscription",
                "00000000-0000-0000-0000-000000000000",
            ),
            "Error: no Azure credentials while listing",
        ),
        (
            (
                "burn",
                "--provider",
                "azure",
                "--subscription",
                "00000000-0000-0000-0000-000000000000",
                "--budget",
                "10",
            ),
            "Error: no Azure credentials while listing",
        ),
        (  # issue 49 item 2: these three said "unexpected ClientAuthenticationError" (exit 1)
            (
                "alarm",
                "--provider",
                "azure",
                "--subscription",
                "00000000-0000-0000-0000-000000000000",
                "--budget",
                "10",
                "--email",
                "me@uni.edu",
            ),
            "Error: no Azure credentials while",
        ),
        (
            (
                "alarm",
                "status",
                "--provider",
                "azure",
                "--subscription",
                "00000000-0000-0000-0000-000000000000",
            ),
            "Error: no Azure credentials while",
        ),
        (
            (
                "alarm",
                "delete",
                "--provider",
                "azure",
                "--subscription",
                "00000000-0000-0000-0000-000000000000",
                "--yes",
            ),
            "Error: no Azure credentials while",
        ),
        (  # it retried a DNS name for 19 s and never named credentials
            (
                "launch",
                "--provider",
                "gcp",
                "--gpu",
                "l4",
                "--region",
                "us-central1",
                "--option",
                "project=my-lab",
                "--checkpoint",
                "gs://my-bucket/run1",
                "--yes",
                "--",
                "python",
                "train.py",
            ),
            "Error: no Google Cloud credentials found",
        ),
    ],
)
def test_one_error_and_hint_exit_2(args: tuple[str, ...], error: str, nowhere: None) -> None:
    """A real process: an SDK's log line would reach its stderr (pytest catches in-process)."""
    result = subprocess.run(
        [sys.executable, "-m", "costguard", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "XDG_CONFIG_HOME": "/nonexistent-costguard-test"},
    )
    assert result.returncode == 2, result.stderr
    first, hint = result.stderr.splitlines()  # nothing else: no SDK log lines
    assert first.startswith(error)
    assert hint.startswith("Hint: run `")
