"""`costguard reap` input handling: bad input exits 2 before any cloud client exists."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from costguard.clouds import aws as aws_clouds
from costguard.clouds import azure as azure_clouds
from costguard.clouds import gcp as gcp_clouds


@pytest.fixture
def reap(run_cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """`costguard reap ARGS`, where building any cloud client fails the test (exit 1)."""

    def no_client(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a cloud client was built for bad input")

    for module in (aws_clouds, gcp_clouds, azure_clouds):
        monkeypatch.setattr(module, "client", no_client)
    monkeypatch.setattr(gcp_clouds, "default_credentials", no_client)
    monkeypatch.setattr(azure_clouds, "default_credential", no_client)
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    monkeypatch.delenv("AZURE_SUBSCRIPTION_ID", raising=False)
    return lambda *args: run_cli("reap", *args)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--idle-minutes", "-5"], "--idle-minutes"),
        (["--idle-minutes", "0"], "--idle-minutes"),
        (["--grace-minutes", "-1"], "--grace-minutes"),
        (["--gpu-threshold", "101"], "--gpu-threshold"),
        (["--cpu-threshold", "-0.5"], "--cpu-threshold"),
        (["--network-threshold-mbps", "-1"], "--network-threshold-mbps"),
        (["--gpu-threshold", "nan"], "--gpu-threshold"),
        (["--max-actions", "-1"], "--max-actions"),
        (["--max-percent", "120"], "--max-percent"),
        (["--action", "delete"], "--action"),
        (["--provider", "oracle"], "--provider"),
        (["--format", "xml"], "--format"),
        (["--region", "us-east-9"], "unknown AWS region 'us-east-9'"),
        (["--region", "us-east-1", "--all-regions"], "--all-regions"),
        (["--zone", "us-central1-a"], "--zone is for --provider gcp"),
        (["--provider", "gcp"], "needs --project"),
        (["--provider", "gcp", "--project", "p", "--region", "us-central1-a"], "GCP region"),
        (["--provider", "gcp", "--project", "p", "--zone", "uscentral1"], "GCP zone"),
        (["--provider", "azure"], "needs --subscription"),
        (
            [
                "--provider",
                "azure",
                "--subscription",
                "00000000-0000-0000-0000-000000000000",
                "--region",
                "East US",
            ],
            "--region",
        ),
        (
            [
                "--provider",
                "azure",
                "--subscription",
                "00000000-0000-0000-0000-000000000000",
                "--region",
                "mars",
            ],
            "unknown Azure region 'mars'",
        ),
        (
            ["--provider", "gcp", "--project", "p", "--region", "mars-central1"],
            "unknown GCP region 'mars-central1'",
        ),
        (
            ["--provider", "gcp", "--project", "p", "--zone", "mars-central1-a"],
            "unknown GCP zone 'mars-central1-a'",
        ),
        (["--resource-group", "ml"], "--resource-group is for --provider azure"),
        (["--protect-tag", "=x"], "protect tag needs a key"),
    ],
)
def test_bad_input_exits_2_before_any_cloud_call(
    reap: Callable[..., Any], args: list[str], says: str
) -> None:
    result = reap(*args)
    assert result.exit_code == 2, result.stderr
    assert says in result.stderr
    assert "Error:" in result.stderr
    assert "\nHint: " in result.stderr


@pytest.mark.parametrize(
    ("args", "suggestion"),
    [
        (["--region", "eu-centrl-1"], "eu-central-1"),
        (["--provider", "gcp", "--project", "p", "--region", "us-centrl1"], "us-central1"),
        (["--provider", "gcp", "--project", "p", "--zone", "europe-wst4-a"], "europe-west4"),
        (
            [
                "--provider",
                "azure",
                "--subscription",
                "00000000-0000-0000-0000-000000000000",
                "--region",
                "westeuropa",
            ],
            "westeurope",
        ),
    ],
)
def test_unknown_region_suggests_a_close_one(
    reap: Callable[..., Any], args: list[str], suggestion: str
) -> None:
    result = reap(*args)
    assert result.exit_code == 2
    assert f"Hint: did you mean {suggestion}" in result.stderr


def test_help_has_an_example(reap: Callable[..., Any]) -> None:
    result = reap("--help")
    assert result.exit_code == 0
    assert "Examples:" in result.stdout
    assert "costguard reap --idle-minutes 90 --execute" in result.stdout
    assert "costguard:keep (any value but false/no/0/off)" in result.stdout
    assert "GCP: Local SSD contents are discarded" in " ".join(result.stdout.split())


def test_the_commands_load_no_cloud_sdk_until_they_run() -> None:
    code = (
        "import sys, costguard.cli.reap, costguard.cli.agent, costguard.reaper.aws, "
        "costguard.reaper.gcp, costguard.reaper.azure, costguard.reaper.agent\n"
        "heavy = ('boto3', 'botocore', 'google', 'azure', 'torch')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
