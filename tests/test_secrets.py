"""The table of secret shapes: none reaches a boot script, a SLURM script, a log line or an
error, and each refusal says where it was found (issue 14).

The samples are made up in each issuer's documented format (AWS's own documentation
example key, AKIAIOSFODNN7EXAMPLE; the rest random). ``core`` is the part that must never
be shown: the credential itself, not the harmless prefix that names its kind.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from costguard.errors import InputError
from costguard.secrets import find_shape, redact
from costguard.slurm.batch import BatchJob
from costguard.spot import bootstrap
from costguard.spot.launcher.base import LaunchSpec

PEM_BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7Vh3k9Lq"


@dataclass(frozen=True)
class Secret:
    what: str
    value: str
    core: str


SECRETS = [
    Secret("AWS access key id", "AKIAIOSFODNN7EXAMPLE", "IOSFODNN7EXAMPLE"),
    Secret(
        "AWS secret key",
        "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "wJalrXUtnFEMI/K7MDENG",
    ),
    Secret("Hugging Face token", "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567", "AbCdEfGhIjKlMnOp"),
    Secret("GitHub token", "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8", "a1B2c3D4e5F6g7"),
    Secret(
        "GitHub fine-grained token",
        "github_pat_11ABCDEFG0" + "x" * 20 + "_" + "Y" * 50,
        "11ABCDEFG0xxxxxxxxxx",
    ),
    Secret("GitLab token", "glpat-" + "Zq9XwY7vU5tS3rQ1pO0n", "Zq9XwY7vU5tS3rQ1"),
    Secret(
        "GCS signed URL",
        "https://storage.googleapis.com/bkt/obj?X-Goog-Algorithm=GOOG4-RSA-SHA256"
        "&X-Goog-Credential=sa%40p.iam.gserviceaccount.com%2F20261201&X-Goog-Signature=3f9a8b7c6d",
        "3f9a8b7c6d",
    ),
    Secret(
        "S3 presigned URL",
        "https://bkt.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256"
        "&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20261201&X-Amz-Signature=9e8d7c6b5a",
        "9e8d7c6b5a",
    ),
    Secret("password in a URL", "https://alice:Tr0ub4dor3x@git.example.com/r.git", "Tr0ub4dor3x"),
    Secret("SAS string", "sig=Zm9vYmFyYmF6cXV4%2Bqq%3D", "Zm9vYmFyYmF6cXV4"),
    Secret(
        "SAS query",
        "sv=2024-05-04&ss=b&srt=sco&sp=rl&se=2026-12-31&sig=QmFzZTY0U2lnbmF0dXJl%3D",
        "QmFzZTY0U2lnbmF0dXJl",
    ),
    Secret("Slack bot token", "xoxb-1234567890-0987654321-AbCdEfGhIjKlMnOp", "AbCdEfGhIjKlMnOp"),
    Secret(
        "Slack webhook",
        "https://hooks.slack.com/services/T0AAAAAAA/B0BBBBBBB/cccccccccccccccccccccccc",
        "cccccccccccccccccccccccc",
    ),
    Secret("OpenAI key", "sk-proj-" + "Ab12Cd34Ef56Gh78Ij90Kl12Mn34Op56", "Ab12Cd34Ef56Gh78"),
    Secret("Google API key", "AIza" + "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q", "SyA1b2C3d4E5f6G7"),
    Secret(
        "GCP service account key file",
        '{"type": "service_account", "project_id": "p", "private_key_id": "0a1b2c3d4e5f", '
        f'"private_key": "-----BEGIN PRIVATE KEY-----\\n{PEM_BODY}\\n'
        '-----END PRIVATE KEY-----\\n"}',
        PEM_BODY,
    ),
    Secret(
        "Azure storage connection string",
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey="
        + "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
        + ";EndpointSuffix=core.windows.net",
        "Eby8vdM02xNOcqFlqUwJ",
    ),
    Secret(
        "Azure storage key",
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==",
        "Eby8vdM02xNOcqFlqUwJ",
    ),
    Secret("Azure client secret", "Abc8Q~dEf.ghIjkLmnOpq_RstUvwXyz0123456789", "dEf.ghIjkLmnOpq"),
    Secret(
        "private key",
        f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n-----END RSA PRIVATE KEY-----",
        PEM_BODY,
    ),
]
IDS = [s.what for s in SECRETS]


def launch_spec(command: tuple[str, ...], **options: str) -> LaunchSpec:
    return LaunchSpec(
        "run-1", "s3://ckpt/costguard/run-1", command, "alice", datetime(2026, 12, 2, tzinfo=UTC),
        options=options,
    )  # fmt: skip


@pytest.mark.parametrize("secret", SECRETS, ids=IDS)
def test_every_shape_is_recognised_and_masked(secret: Secret) -> None:
    assert find_shape(secret.value) is not None
    masked = redact(f"failed with {secret.value} (attempt 2)")
    assert secret.core not in masked
    assert masked.startswith("failed with ")
    assert masked.endswith(" (attempt 2)")


@pytest.mark.parametrize("secret", SECRETS, ids=IDS)
def test_the_boot_script_refuses_it_and_says_where(secret: Secret) -> None:
    command = ("python", "train.py", "--token", secret.value)
    with pytest.raises(InputError) as caught:
        bootstrap.render(launch_spec(command), 1, "aws", environ={})
    assert caught.value.message.startswith("argument 4 of the command carries ")
    assert secret.core not in caught.value.message + str(caught.value.hint)
    with pytest.raises(InputError, match="the git_ref option carries"):
        bootstrap.render(launch_spec(("true",), git_ref=secret.value), 1, "gcp", environ={})


@pytest.mark.parametrize("secret", SECRETS, ids=IDS)
def test_the_slurm_script_refuses_it_and_says_where(secret: Secret, run_cli: Any) -> None:
    with pytest.raises(InputError) as caught:
        BatchJob.build(
            command=["python", "train.py", secret.value], checkpoint="s3://b/run1", time="1:00:00",
            environ={},
        )  # fmt: skip
    assert caught.value.message.startswith("argument 3 of the command carries ")
    assert secret.core not in caught.value.message
    result = run_cli(
        "slurm", "script", "--time", "1:00:00", "--checkpoint", "s3://b/run1",
        "--", "python", "train.py", secret.value,
    )  # fmt: skip
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "argument 3 of the command carries" in result.stderr
    assert secret.core not in result.stderr


@pytest.mark.parametrize("secret", SECRETS, ids=IDS)
def test_no_log_line_shows_it(secret: Secret, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="costguard"):
        logging.getLogger("costguard.checkpoint.store").warning("put failed: %s", secret.value)
        logging.getLogger("costguard").info(f"retrying {secret.value}")
    assert len(caplog.records) == 2
    assert secret.core not in caplog.text
    assert "put failed: " in caplog.text


@pytest.mark.parametrize("secret", SECRETS, ids=IDS)
def test_no_error_shows_it(secret: Secret, run_cli: Any) -> None:
    """Whatever error quotes it (an unknown name, a bad option, a refused URL)."""
    for args in (
        ("estimate", "--gpu", secret.value, "--hours", "1"),
        ("slurm", "script", "--time", secret.value, "--checkpoint", "b/", "--", "true"),
        ("slurm", "script", "--time", "1:00:00", "--checkpoint", secret.value, "--", "true"),
        ("estimate", "--instance-type", secret.value.replace(" ", ""), "--hours", "1"),
    ):
        result = run_cli(*args)
        assert result.exit_code == 2, result.stderr
        assert result.stderr.startswith("Error: ")
        assert secret.core not in result.stderr + result.stdout


def test_an_environment_secret_with_a_quote_is_found_in_the_words() -> None:
    """Shell quoting turns ' into '"'"', so the rendered script never contains the value
    as it is; the words are searched before quoting."""
    value = "it's-a-s3cret-value"
    command = ("python", "train.py", "--key", value)
    with pytest.raises(InputError, match="argument 4 of the command carries the value of HF_T"):
        bootstrap.render(launch_spec(command), 1, "aws", environ={"HF_TOKEN": value})


def test_launch_refuses_a_token_before_any_store_or_cloud_call(run_cli: Any, tmp_path: Any) -> None:
    ckpt = tmp_path / "ckpt"
    token = SECRETS[2].value
    result = run_cli(
        "launch", "--provider", "local", "--gpu", "a10g", "--checkpoint", str(ckpt), "--yes",
        "--", "python", "train.py", "--token", token,
    )  # fmt: skip
    assert result.exit_code == 2
    assert "argument 4 of the command carries a Hugging Face token" in result.stderr
    assert token not in result.stderr
    assert not ckpt.exists()  # nothing opened, nothing written
