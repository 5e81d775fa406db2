"""Instances install the costguard the controller runs, shipped through the checkpoint
store; never the bare name from the public index, which is someone else's (issue 14)."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from costguard.checkpoint.store import Store
from costguard.errors import InputError
from costguard.spot import bootstrap, wheel
from costguard.spot.launcher.base import LaunchSpec

BUCKET = "ckpt-bucket"


def launch_spec(url: str, **options: str) -> LaunchSpec:
    return LaunchSpec("run-1", url, ("python", "train.py"), "alice",
                      datetime(2026, 12, 2, tzinfo=UTC), options=options)  # fmt: skip


def pip_requirements(script: str) -> list[str]:
    """Every requirement the script hands to pip, as written (variables unexpanded)."""
    found = []
    for line in script.splitlines():
        if "pip install" in line:
            words = line.split("pip install", 1)[1].split()
            found += [w.strip('"') for w in words if w not in ("--quiet", "-r", "||", "\\")]
    return found


@pytest.mark.parametrize(
    "options",
    [{}, {"package": "costguard[train] @ git+https://github.com/me/costguard@v1"}],
)
@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_the_boot_script_never_installs_costguard_by_bare_name(
    options: dict[str, str], cloud: str
) -> None:
    built = wheel.build()
    for extra in ({}, wheel.options(built)):
        text = bootstrap.render(launch_spec("s3://b/run-1", **options, **extra), 1, cloud,
                                environ={})  # fmt: skip
        for requirement in pip_requirements(text):
            assert not re.fullmatch(r"costguard(\[[a-z,]+\])?([<>=!~].*)?", requirement), text
        assert "costguard[train]" not in re.sub(r"PACKAGE=.*", "", text)
        package = re.search(r"^PACKAGE=(.*)$", text, re.MULTILINE)
        assert package is not None
        assert package[1] in ("''", f"'{options.get('package', '')}'")


def test_the_wheel_is_the_running_code_and_installs(tmp_path: Path) -> None:
    built = wheel.build()
    assert built.name.startswith("costguard-")
    assert built.name.endswith("-py3-none-any.whl")
    assert built.sha256 == hashlib.sha256(built.data).hexdigest()
    assert wheel.build().data == built.data  # the same files make the same bytes
    path = tmp_path / built.name
    path.write_bytes(built.data)
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
    assert "costguard/spot/wheel.py" in names
    assert "costguard/_bootstrap/user-data.sh" in names
    assert any(n.startswith("costguard/_tables/") for n in names)
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--target", str(target), str(path)],
        check=True, timeout=300,
    )  # fmt: skip
    probe = "import costguard, costguard.spot.bootstrap as b; print(costguard.__file__)"
    done = subprocess.run(
        [sys.executable, "-c", probe], env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    assert done.stdout.startswith(str(target))
    assert (target / "bin" / "costguard").exists()  # the console script came with it


STUB_PYTHON = """#!/bin/sh
# pip is stubbed (no index here): it records what it was asked to install.
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
    shift 2
    echo "$*" >> "{log}"
    exit 0
fi
exec "{python}" "$@"
"""


def install_part(script: str, wheel_dir: Path) -> str:
    """The variables and install_costguard() of a rendered boot script, run on its own."""
    start = script.index("PACKAGE=")
    end = script.index("\n}\n", script.index("install_costguard() {")) + 3
    return script[start:end].replace(f"{bootstrap.WHEEL_DIR}/", f"{wheel_dir}/")


def run_install(script: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    log = tmp_path / "pip.log"
    stub = tmp_path / "python"
    stub.write_text(STUB_PYTHON.format(log=log, python=sys.executable))
    stub.chmod(0o755)
    wheel_dir = tmp_path / "opt"
    program = install_part(script, wheel_dir) + f'\ninstall_costguard "{stub}"\n'
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=300)
    return done, log


def test_the_wheel_goes_through_the_store_and_is_installed_if_its_hash_matches(
    aws_env: str, tmp_path: Path
) -> None:
    from costguard.clouds import aws

    aws.client("s3", attempts=1).create_bucket(Bucket=BUCKET)
    url = f"s3://{BUCKET}/costguard/run-1"
    built = wheel.build()
    wheel.upload(Store.open(url), built)  # what costguard launch does after "Launch?"
    script = bootstrap.render(launch_spec(url, **wheel.options(built)), 1, "aws", environ={})

    done, log = run_install(script, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    fetched = tmp_path / "opt" / built.name
    assert fetched.read_bytes() == built.data  # fetched from moto S3 by the boot script
    installs = log.read_text().splitlines()
    assert installs == [
        "install --quiet fsspec>=2026.9 s3fs>=2026.9",
        f"install --quiet {fetched}[train]",
    ]

    # Someone swaps the object in the store: the boot script refuses to install it.
    tampered = bytearray(built.data)
    tampered[-30] ^= 0xFF
    Store.open(url).put(built.store_path, bytes(tampered))
    log.unlink()
    fetched.unlink()
    done, log = run_install(script, tmp_path)
    assert done.returncode == 1
    assert "does not match its sha256" in done.stdout
    assert not any("[train]" in line for line in log.read_text().splitlines())


def test_the_package_option_still_overrides_and_bad_wheel_options_are_refused(
    tmp_path: Path,
) -> None:
    script = bootstrap.render(
        launch_spec("gs://b/run-1", package="costguard[train] @ git+https://example.org/cg"),
        1, "gcp", environ={},
    )  # fmt: skip
    done, log = run_install(script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert log.read_text().splitlines() == [
        "install --quiet costguard[train] @ git+https://example.org/cg"
    ]
    with pytest.raises(InputError, match="wheel_sha256"):
        bootstrap.render(launch_spec("s3://b/r", wheel="costguard-1-py3-none-any.whl",
                                     wheel_sha256="abc"), 1, "aws", environ={})  # fmt: skip
    with pytest.raises(InputError, match="wheel"):
        bootstrap.render(launch_spec("s3://b/r", wheel="../../evil.whl",
                                     wheel_sha256="0" * 64), 1, "aws", environ={})  # fmt: skip


def test_without_a_wheel_or_package_the_boot_script_installs_nothing(tmp_path: Path) -> None:
    script = bootstrap.render(launch_spec("s3://b/run-1"), 1, "aws", environ={})
    done, log = run_install(script, tmp_path)
    assert done.returncode == 1
    assert "no costguard wheel or package given" in done.stdout
    assert not log.exists()


def test_launch_ships_its_wheel_with_the_job_and_the_instance_gets_its_hash(
    run_cli: Any, aws_env: str
) -> None:
    """End to end on moto: the wheel is in the store next to job.json, and the user-data
    of the instance names that object and its sha256 (and nothing by bare name)."""
    import base64

    from costguard.clouds import aws

    s3 = aws.client("s3", attempts=1)
    s3.create_bucket(Bucket=BUCKET)
    iam = aws.client("iam", attempts=1)
    trust = Path(__file__).parents[2] / "infra" / "aws" / "launcher-instance-role-trust.json"
    iam.create_role(RoleName="costguard-instance", AssumeRolePolicyDocument=trust.read_text())
    iam.create_instance_profile(InstanceProfileName="costguard-instance")
    iam.add_role_to_instance_profile(
        InstanceProfileName="costguard-instance", RoleName="costguard-instance"
    )
    result = run_cli(
        "launch", "--provider", "aws", "--gpu", "a10g", "--region", "us-east-1",
        "--checkpoint", f"s3://{BUCKET}/run1", "--option", "image=ami-0123456789abcdef0",
        "--option", "instance_profile=costguard-instance", "--no-alarm-check", "--yes",
        "--timeout-hours", "0.0003", "--poll-seconds", "0.2", "--", "python", "train.py",
    )  # fmt: skip
    assert result.exit_code == 1, result.stderr  # it timed out: no instance ever reports
    built = wheel.build()
    stored = s3.get_object(Bucket=BUCKET, Key=f"run1/{built.store_path}")["Body"].read()
    assert hashlib.sha256(stored).hexdigest() == built.sha256
    ec2 = aws.client("ec2", "us-east-1", attempts=1)
    (reservation, *_) = ec2.describe_instances()["Reservations"]
    instance_id = reservation["Instances"][0]["InstanceId"]
    attribute = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    user_data = base64.b64decode(attribute["UserData"]["Value"]).decode()
    assert f"WHEEL_SHA256={built.sha256}" in user_data
    assert f"WHEEL_URL=s3://{BUCKET}/run1/{built.store_path}" in user_data
    assert "PACKAGE=''" in user_data
