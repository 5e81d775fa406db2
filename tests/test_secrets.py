"""The table of secret shapes: none reaches a boot script, a SLURM script, a log line or an
error, and each refusal says where it was found (issue 14).

The samples are made up in each issuer's documented format (AWS's own documentation
example key, AKIAIOSFODNN7EXAMPLE; the rest random). ``core`` is the part that must never
be shown: the credential itself, not the harmless prefix that names its kind.
"""

from __future__ import annotations

import logging
import os
import string
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costguard.errors import InputError
from costguard.secrets import find_in_words, find_shape, mask_words, redact
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
    # A costguard module's logger (made by get_logger), and from then on any costguard.*
    # logger: the masking is set up with the first one.
    from costguard.checkpoint.store import logger

    with caplog.at_level(logging.INFO, logger="costguard"):
        logger.warning("put failed: %s", secret.value)
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


# -- issue 28: the shapes a researcher's command line carries, and credentials known only by
# the flag or name before them. Samples made up in each issuer's documented format.

WANDB_KEY = "0123456789abcdef0123456789abcdef01234567"  # W&B: 40 hex digits, no prefix
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"  # AWS's documentation example
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkphbmUifQ"
    ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
SHAPES_28 = [
    Secret("Google OAuth token", "ya29.a0AfB_byC1d2E3f4G5h6I7j8K9l0", "a0AfB_byC1d2E3f4G5"),
    Secret(
        "PyPI token", "pypi-AgEIcHlwaS5vcmcCJGI4ZDk5NmVlLTQxYzEtNGM5NS1iNjQ5", "AgEIcHlwaS5vcmcCJG"
    ),
    Secret("npm token", "npm_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8", "a1B2c3D4e5F6g7H8"),
    Secret("Stripe key", "sk_live_" + "51HxYz2eZvKYlo2C0a1b2c3d4e5f", "51HxYz2eZvKYlo2C"),
    Secret("Replicate token", "r8_" + "Xy9Wv8Ut7Sr6Qp5On4Ml3Kj2Ih1Gf0Ed9Cb8A", "Xy9Wv8Ut7Sr6Qp5On"),
    Secret("Databricks token", "dapi" + "0123456789abcdef0123456789abcdef", "0123456789abcdef01"),
    Secret("JSON web token", JWT, "SflKxwRJSMeKKF2QT4fw"),
    Secret("bearer token", "Authorization: Bearer a9F3kLmN0pQrS7tUvWx", "a9F3kLmN0pQrS7tUvWx"),
    Secret("password=", "password=Tr0ub4dor&3", "Tr0ub4dor"),
    Secret("GitHub token", "ghp_" + "Zz1Yy2Xx3Ww4Vv5Uu6Tt7Ss8Rr9Qq0Pp1Oo2", "Zz1Yy2Xx3Ww4Vv5"),
    Secret("OpenAI project key", "sk-proj-" + "Qw12Er34Ty56Ui78Op90As12Df34", "Qw12Er34Ty56Ui78"),
]
#: Credentials recognisable only by the flag or name they follow: (words, the credential).
FLAGGED = [
    (["--wandb-key", WANDB_KEY], WANDB_KEY),
    (["--aws-secret", AWS_SECRET], AWS_SECRET),
    (["--key", AWS_SECRET], AWS_SECRET),
    (["--api_key=" + WANDB_KEY], WANDB_KEY),
    (["WANDB_API_KEY=" + WANDB_KEY], WANDB_KEY),
    (["--db-password", "hunter2x"], "hunter2x"),
    (["--clientSecret", "s3cr3t-value"], "s3cr3t-value"),
    (["--hf-token", "Zq9XwY7vU5tS3rQ1pO0nZq9X"], "Zq9XwY7vU5tS3rQ1pO0nZq9X"),
    (["--credentials", "alice:pa55"], "alice:pa55"),
]
#: Flags of ordinary training commands that say key or token and carry none.
HARMLESS = [
    "python", "train.py", "--max-tokens", "4096", "--label-key", "labels", "--tokenizer",
    "meta-llama/Llama-2-7b-hf", "--key-file", "/run/secrets/key.pem", "--use-auth-token",
    "--dataset", "wikitext-103-raw-v1", "--secret-name", "prod-db", "--lr", "3e-4",
    "--resume-from", "0123456789abcdef0123456789abcdef01234567",
]  # fmt: skip
ALL_28 = [w for s in SHAPES_28 for w in s.value.split(" ")] + [w for f in FLAGGED for w in f[0]]
CORES_28 = [s.core for s in SHAPES_28] + [core for _, core in FLAGGED]


@pytest.mark.parametrize("secret", SHAPES_28, ids=[s.what for s in SHAPES_28])
def test_each_shape_of_a_researchers_command_line_is_found_and_masked(secret: Secret) -> None:
    words = ["python", "train.py", *secret.value.split(" ")]
    assert find_in_words(words) is not None
    assert secret.core not in " ".join(mask_words(words))
    assert secret.core not in redact(f"running {' '.join(words)} (attempt 2)")


@pytest.mark.parametrize(("words", "core"), FLAGGED, ids=[f[0][0][:16] for f in FLAGGED])
def test_a_value_after_a_flag_or_name_that_says_secret_is_found_and_masked(
    words: list[str], core: str
) -> None:
    command = ["python", "train.py", "--lr", "3e-4", *words, "--epochs", "3"]
    found = find_in_words(command)
    assert found is not None
    assert found[0] == 3 + len(words)  # the credential's own word, not its flag
    shown = mask_words(command)
    assert core not in " ".join(shown)
    assert shown[:4] == command[:4]
    assert shown[-2:] == ["--epochs", "3"]
    assert core not in redact(" ".join(command))


def test_ordinary_flags_that_say_key_or_token_are_neither_refused_nor_masked() -> None:
    assert find_in_words(HARMLESS) is None
    assert mask_words(HARMLESS) == HARMLESS
    assert redact(" ".join(HARMLESS)) == " ".join(HARMLESS)
    bootstrap.render(launch_spec(tuple(HARMLESS)), 1, "aws", environ={})


@pytest.mark.parametrize(("words", "core"), FLAGGED, ids=[f[0][0][:16] for f in FLAGGED])
def test_boot_and_slurm_scripts_refuse_a_value_after_a_flag(words: list[str], core: str) -> None:
    command = ("python", "train.py", "--lr", "3e-4", *words)
    where = f"^argument {4 + len(words)} of the command carries "
    with pytest.raises(InputError, match=where) as caught:
        bootstrap.render(launch_spec(command), 1, "aws", environ={})
    assert core not in caught.value.message
    with pytest.raises(InputError, match=where):
        BatchJob.build(command=command, checkpoint="s3://b/run1", time="1:00:00", environ={})
    name, _, value = words[0].partition("=")
    option = {name.lstrip("-").replace("-", "_"): value or words[-1]}
    with pytest.raises(InputError, match=" option carries "):
        bootstrap.render(launch_spec(("true",), **option), 1, "aws", environ={})


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--container", "docker://alice:ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8@ghcr.io/x"),
        ("--torchrun", f"torchrun --rdzv-conf key={WANDB_KEY}"),
        ("--torchrun", f"env WANDB_API_KEY={WANDB_KEY} torchrun"),
        ("--costguard", f"costguard --hf-token {WANDB_KEY}"),
        ("--job-name", "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"),
        ("--account", "hf_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"),
    ],
)
def test_slurm_script_checks_what_it_ships_besides_the_command(
    flag: str, value: str, run_cli: Any
) -> None:
    result = run_cli(
        "slurm", "script", "--time", "1:00:00", "--checkpoint", "s3://b/run1", "--nodes", "1",
        flag, value, "--", "train.py",
    )  # fmt: skip
    assert result.exit_code == 2, result.stderr
    assert result.stdout == ""
    assert f"{flag} carries " in result.stderr
    assert "a1B2c3D4e5F6" not in result.stderr
    assert WANDB_KEY not in result.stderr


def test_a_malformed_storage_options_variable_is_not_echoed(
    run_cli: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COSTGUARD_STORAGE_OPTIONS", f"key={AWS_SECRET}, secret=x")
    result = run_cli("checkpoint", "ls", str(tmp_path))
    assert result.exit_code == 2
    assert "COSTGUARD_STORAGE_OPTIONS" in result.stderr
    assert "wJalrXUtnFEMI" not in result.stderr + result.stdout


def test_a_run_with_every_shape_shows_and_stores_none(run_cli: Any, tmp_path: Any) -> None:
    """``run``, ``launch --provider local``, the local launcher and ``slurm script`` with all
    the shapes at once; then every output and every file written is searched."""
    import subprocess
    import sys

    from costguard.spot.job import Simulation
    from costguard.spot.launcher.local import LocalLauncher

    command = ["python", "-c", "pass", *ALL_28]
    ckpt, state = tmp_path / "ckpt", tmp_path / "state"
    env = {**os.environ, "COSTGUARD_LOCAL_DIR": str(state)}
    done = subprocess.run(
        [sys.executable, "-m", "costguard", "run", "--checkpoint", str(ckpt), "--", *command],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "running python -c pass" in done.stderr  # the echo is there, masked
    outputs = [done.stdout, done.stderr]
    launched = run_cli(
        "launch", "--provider", "local", "--gpu", "a10g", "--checkpoint", str(ckpt / "job"),
        "--yes", "--", *command,
    )  # fmt: skip
    assert launched.exit_code == 2
    outputs += [launched.stdout, launched.stderr]
    launcher = LocalLauncher(Simulation(), job_started_unix=0.0, state_dir=state, env={})
    with pytest.raises(InputError) as caught:
        launcher.check(launch_spec(tuple(command)))
    outputs += [caught.value.message, str(caught.value.hint)]
    scripted = run_cli(
        "slurm", "script", "--time", "1:00:00", "--checkpoint", str(ckpt), "--", *command
    )
    assert scripted.exit_code == 2
    outputs += [scripted.stdout, scripted.stderr]
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    outputs += [p.read_text(errors="replace") for p in files]
    assert not list(tmp_path.rglob("job.json"))
    everything = "\n".join(outputs)
    leaked = [core for core in CORES_28 if core in everything]
    assert leaked == []


_TOKEN_CHARS = st.text(alphabet=string.ascii_letters + string.digits, min_size=40, max_size=48)


@given(
    prefix=st.sampled_from(
        [
            "hf_",
            "ghp_",
            "github_pat_",
            "sk-proj-",
            "npm_",
            "r8_",
            "sk_live_",
            "pypi-",
            "ya29.",
            "xoxb-",
        ]
    ),
    body=_TOKEN_CHARS.filter(lambda t: any(c.isdigit() for c in t)),
    flag=st.sampled_from(["--token", "--hf-token", "--wandb-key", "--api-key", "--lr", "-x"]),
    glue=st.sampled_from([" ", "="]),
    before=st.lists(st.sampled_from(HARMLESS), max_size=6),
    after=st.lists(st.sampled_from(HARMLESS), max_size=6),
)
@settings(max_examples=200, deadline=None)
def test_property_no_shape_survives_masking_wherever_it_sits(
    prefix: str, body: str, flag: str, glue: str, before: list[str], after: list[str]
) -> None:
    if prefix == "npm_":
        body = body[:36]
    token = prefix + body
    words = [*before, *f"{flag}{glue}{token}".split(" "), *after]
    assert find_in_words(words) is not None
    assert body[:20] not in " ".join(mask_words(words))
    assert body[:20] not in redact(" ".join(words))


@given(
    name=st.sampled_from(
        [
            "--wandb-key",
            "--key",
            "--hf-token",
            "--secret",
            "--password",
            "DB_PASSWORD=",
            "--aws-secret-access-key",
            "--apiKey",
            "API_TOKEN=",
        ]
    ),
    value=st.text(alphabet=string.ascii_letters + string.digits + "+/", min_size=32, max_size=64)
    .filter(lambda v: any(c.isdigit() for c in v) and any(c.isalpha() for c in v))
    .map(lambda v: v.lstrip("/")),  # a leading / is a path, judged segment by segment
)
@settings(max_examples=200, deadline=None)
def test_property_a_random_value_after_a_secret_name_is_caught(name: str, value: str) -> None:
    words = ["python", "t.py", *([name + value] if name.endswith("=") else [name, value])]
    assert find_in_words(words) is not None
    assert value not in " ".join(mask_words(words))
    assert value not in redact(" ".join(words))
