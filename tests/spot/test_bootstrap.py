"""The boot script: valid bash, the user's command arrives intact, no secret, size limits."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from costguard import proof
from costguard.errors import InputError
from costguard.spot import bootstrap
from costguard.spot.launcher.base import LaunchSpec

NASTY = (
    "python",
    "train.py",
    "--note",
    'it\'s "$HOME" `id` $(reboot); rm -rf / #',
    "--multi\nline",
    "--glob=*",
    "--empty",
    "",
    "--unicode=λ→✓",
    "--template={{ job_id }}",
)


def spec(command: tuple[str, ...] = NASTY, **options: str) -> LaunchSpec:
    return LaunchSpec(
        job_id="run-1",
        checkpoint_url="s3://ckpt/costguard/run-1",
        command=command,
        owner="alice",
        expires_at=datetime(2026, 12, 2, tzinfo=UTC),
        every_steps=500,
        every_minutes=7.5,
        options=options,
        job_key="ab" * 32,
    )


def test_the_script_is_valid_bash_with_every_placeholder_filled() -> None:
    text = bootstrap.render(spec(), 3, "aws", environ={})
    assert text.startswith("#!/bin/bash\n")
    # Only the user's own braces are left, inside their quotes: words are never rescanned.
    assert text.count("{{") == text.count("}}") == 1
    assert "'--template={{ job_id }}'" in text
    subprocess.run(["bash", "-n"], input=text, text=True, check=True, timeout=30)


def test_the_command_and_the_job_identity_arrive_intact(tmp_path: Path) -> None:
    """Run the exports and the `costguard run` line with a `costguard` that prints its argv."""
    text = bootstrap.render(spec(), 3, "gcp", environ={})
    exports = [line for line in text.splitlines() if line.startswith("export COSTGUARD_")]
    # The run "line" spans lines where an argument holds a newline: cut it from the text.
    run_line = text[text.index("${RUN[@]+") : text.index("\nstatus=$?")]
    stub = tmp_path / "costguard"
    stub.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "env = {k: v for k, v in os.environ.items() if k.startswith('COSTGUARD_')}\n"
        "print(json.dumps({'argv': sys.argv[1:], 'env': env}))\n"
    )
    stub.chmod(0o755)
    script = "\n".join(["RUN=()", *exports, run_line])
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    out = subprocess.run(
        ["bash", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
        check=True, timeout=30,
    )  # fmt: skip
    seen = json.loads(out.stdout)
    assert seen["argv"] == [
        "run", "--checkpoint", "s3://ckpt/costguard/run-1", "--cloud", "gcp",
        "--every-steps", "500", "--every-minutes", "7.5", "--", *NASTY,
    ]  # fmt: skip
    assert seen["env"] == {
        "COSTGUARD_JOB_ID": "run-1",
        "COSTGUARD_JOB_ATTEMPT": "3",
        # The attempt's stop check (a hash of the proof only the job's key makes), never
        # the key: an instance's user-data is read by whoever may describe it.
        "COSTGUARD_STOP_CHECK": proof.stop_check(bytes.fromhex("ab" * 32), "run-1", 3),
        "COSTGUARD_CLOUD": "gcp",
    }
    assert not (tmp_path / "reboot").exists()


def test_pip_or_pixi_and_the_options_reach_the_script() -> None:
    text = bootstrap.render(
        spec(("python", "t.py"), git_repo="https://github.com/me/thesis.git", git_ref="v1.2",
             package="costguard[train]==0.1.0", workdir="/srv/job", shutdown_minutes="never"),
        1, "azure", environ={},
    )  # fmt: skip
    assert "GIT_REPO=https://github.com/me/thesis.git" in text
    assert "GIT_REF=v1.2" in text
    assert "PACKAGE='costguard[train]==0.1.0'" in text
    assert "WORKDIR=/srv/job" in text
    assert "SHUTDOWN_MINUTES=never" in text
    assert "if [ -f pixi.toml ]; then" in text
    assert "pixi install" in text
    assert 'install_costguard "$VENV/bin/python"' in text
    assert "install_costguard pixi run python" in text
    default = bootstrap.render(spec(("python", "t.py")), 1, "aws", environ={})
    assert "PACKAGE=''" in default  # nothing by name: launch ships its wheel
    assert "SHUTDOWN_MINUTES=10" in default


def test_credentials_in_the_environment_never_reach_the_script() -> None:
    environ = {
        "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "AWS_SESSION_TOKEN": "IQoJb3JpZ2luX2VjEXAMPLETOKEN",
        "AZURE_CLIENT_SECRET": "azure-client-secret-value",
        "GOOGLE_APPLICATION_CREDENTIALS": "/home/me/key.json",
        "COSTGUARD_STORAGE_OPTIONS": '{"key": "k", "secret": "s"}',
        "HF_TOKEN": "hf_abcdefghijklmnop",
    }
    text = bootstrap.render(spec(), 1, "aws", environ=environ)
    for value in environ.values():
        assert value not in text
    assert "STORAGE_OPTIONS" not in text


def test_the_jobs_key_never_reaches_the_script() -> None:
    """The user-data is read by anyone allowed to describe the instance: it carries the
    attempt's stop check, from which no stop request can be made, never the job's key (a
    key there let such a reader stop the job at will)."""
    text = bootstrap.render(spec(), 3, "aws", environ={})
    assert "ab" * 32 not in text
    check = proof.stop_check(bytes.fromhex("ab" * 32), "run-1", 3)
    assert f"export COSTGUARD_STOP_CHECK={check}" in text
    assert not proof.stop_holds(check, check)


@pytest.mark.parametrize(
    ("command", "environ", "fragment"),
    [
        (("python", "t.py", "--token", "hf_abcdefghijklmnop"), {"HF_TOKEN": "hf_abcdefghijklmnop"},
         "HF_TOKEN"),
        (("python", "t.py", "AKIAIOSFODNN7EXAMPLE"), {}, "AWS access key"),
        (("python", "t.py", "DefaultEndpointsProtocol=https;AccountKey=abc"), {}, "account key"),
    ],
)  # fmt: skip
def test_a_secret_in_the_command_is_refused(
    command: tuple[str, ...], environ: dict[str, str], fragment: str
) -> None:
    with pytest.raises(InputError, match=fragment) as caught:
        bootstrap.render(spec(command), 1, "aws", environ=environ)
    assert "hunter" not in str(caught.value)  # the message names, never shows


@pytest.mark.parametrize(
    "url",
    [
        "https://me:hunter2@store.example/ckpt",
        "az://ckpt/run-1?sv=2024-11-04&sig=abc",
        "checkpoints/run-1",
    ],
)
def test_checkpoint_urls_with_credentials_or_local_paths_are_refused(url: str) -> None:
    bad = LaunchSpec("run-1", url, ("python", "t.py"), "alice", datetime(2026, 12, 2, tzinfo=UTC))
    with pytest.raises(InputError) as caught:
        bootstrap.render(bad, 1, "aws", environ={})
    assert caught.value.hint
    assert "hunter2" not in str(caught.value)


def test_size_limits_per_provider() -> None:
    long_command = ("python", "t.py", "--config", "x" * 20_000)
    with pytest.raises(InputError, match="aws accepts at most 16384"):
        bootstrap.render(spec(long_command), 1, "aws", environ={})
    assert len(bootstrap.render(spec(long_command), 1, "gcp", environ={})) > 20_000
    assert len(bootstrap.render(spec(long_command), 1, "azure", environ={})) > 20_000
    huge = ("python", "t.py", "--config", "x" * 70_000)
    with pytest.raises(InputError, match="azure accepts at most 65535"):
        bootstrap.render(spec(huge), 1, "azure", environ={})
    assert bootstrap.render(spec(huge), 1, "gcp", environ={})


def test_template_ships_with_the_package_or_the_checkout() -> None:
    where = bootstrap.template_dir()
    assert (where / bootstrap.TEMPLATE).is_file()
    placeholders = set(re.findall(r"\{\{ (\w+) \}\}", (where / bootstrap.TEMPLATE).read_text()))
    assert placeholders == {
        "job_id", "attempt", "stop_check", "cloud", "workdir", "git_repo", "git_ref", "package",
        "shutdown_minutes", "checkpoint_url", "run_options", "command", "wheel_url",
        "wheel_sha256", "wheel_file", "fetcher", "index_url", "array_task",
    }  # fmt: skip


@pytest.mark.parametrize(
    "repo", ["git@github.com:me/thesis.git", "http://github.com/me/thesis.git",
             "https://me:ghp_token@github.com/me/thesis.git"],
)  # fmt: skip
def test_git_repo_must_be_https_without_credentials(repo: str) -> None:
    with pytest.raises(InputError, match="git_repo"):
        bootstrap.render(spec(("python", "t.py"), git_repo=repo), 1, "aws", environ={})


def test_the_package_mirror_reaches_pip(tmp_path: Path) -> None:
    """The index_url option: pip on the instance asks the mirror, never the public index."""
    from tests.slurm.test_big_jobs import PIP_PROBE, mirror_requests

    url_of = "http://127.0.0.1:{port}/simple/"

    def boot(url: str) -> str:
        text = bootstrap.render(spec(("python", "t.py"), index_url=url), 1, "aws", environ={})
        head = text[text.index("export PIP_DISABLE") : text.index("\nWORKDIR=")]
        return f"{head}\n{shlex.join(PIP_PROBE)}\n"

    asked = mirror_requests(tmp_path, lambda port: boot(url_of.format(port=port)))
    assert asked == ["/simple/costguard-mirror-probe/"]
    assert "\nINDEX_URL=''\n" in bootstrap.render(spec(("python", "t.py")), 1, "aws", environ={})


@pytest.mark.parametrize(
    "url", ["ftp://mirror/simple", "https://me:pw@mirror.example/simple", "mirror.example",
            "https://mirror.example/simple?token=abc", "https://mirror.example/a b"],
)  # fmt: skip
def test_a_bad_index_url_is_refused(url: str) -> None:
    with pytest.raises(InputError, match="index_url"):
        bootstrap.render(spec(("python", "t.py"), index_url=url), 1, "aws", environ={})
