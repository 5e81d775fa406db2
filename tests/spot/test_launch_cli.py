"""`costguard launch` refuses bad input with exit 2 before anything exists; the launch guard
refuses a cloud launch without a budget alarm; `costguard jobs status` reads job.json."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from costguard.checkpoint.store import Store
from costguard.spot.job import Job, load_job, save_job
from tests.spot.test_offers_and_job import spec

TRAIN = ("--", "python", "train.py")
LOCAL_A10G = ("--gpu", "a10g", "--provider", "local")


@pytest.fixture
def local_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "local-state"
    monkeypatch.setenv("COSTGUARD_LOCAL_DIR", str(folder))
    return folder


def assert_refused(result: Any, message: str, *nothing_in: Path) -> None:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()  # the estimate may come first
    assert lines[-2].startswith("Error: "), result.stderr
    assert message in lines[-2], result.stderr
    assert lines[-1].startswith("Hint: ")
    assert sum(line.startswith("Error: ") for line in lines) == 1
    assert "Traceback" not in result.stderr
    for folder in nothing_in:
        assert not folder.exists() or not any(folder.rglob("*")), list(folder.rglob("*"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--gpu", "a10q", "--provider", "local", "--checkpoint", "{ckpt}"), "unknown GPU 'a10q'"),
        ((*LOCAL_A10G, "--gpus-per-instance", "3", "--checkpoint", "{ckpt}"), "no spot offer"),
        ((*LOCAL_A10G, "--max-price", "0.01", "--checkpoint", "{ckpt}"), "--max-price"),
        (("--gpu", "a10g", "--provider", "aws", "--checkpoint", "{ckpt}"), "local folder"),
        (LOCAL_A10G, "--checkpoint is required: a spot instance"),
        (("--gpu", "a10g", "--checkpoint", "s3://b/r", "--preempt-every", "5"), "only apply to"),
        ((*LOCAL_A10G, "--checkpoint", "{ckpt}", "--preempt-at", "9,3"), "increasing"),
        ((*LOCAL_A10G, "--checkpoint", "{ckpt}", "--max-total", "0.001"), "max-total"),
        ((*LOCAL_A10G, "--checkpoint", "{ckpt}"), "confirmation"),
        ((*LOCAL_A10G, "--checkpoint", "{ckpt}", "--sync-dir", "s3://b/out"), "is a URL"),
        ((*LOCAL_A10G, "--checkpoint", "{ckpt}", "--sync-dir", "{ckpt}/../x/../.."), "leaves"),
    ],
)
def test_bad_input_exits_2_before_anything_is_launched(
    run_cli: Callable[..., Any],
    tmp_path: Path,
    local_dir: Path,
    args: tuple[str, ...],
    message: str,
) -> None:
    ckpt = tmp_path / "ckpt"
    argv = [a.format(ckpt=ckpt) for a in args]
    result = run_cli("launch", *argv, *TRAIN)
    assert_refused(result, message, local_dir)
    assert not (ckpt / "job").exists()


def test_an_unwritable_checkpoint_store_is_refused(
    run_cli: Callable[..., Any], tmp_path: Path, local_dir: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = run_cli(
        "launch", "--provider", "local", "--gpu", "t4", "--checkpoint", str(blocker / "ckpt"),
        "--yes", *TRAIN,
    )  # fmt: skip
    assert_refused(result, "cannot write checkpoints", local_dir)


def test_a_missing_bucket_is_refused_before_any_instance(
    run_cli: Callable[..., Any], aws_env: str, local_dir: Path
) -> None:
    import boto3

    result = run_cli(
        "launch", "--provider", "aws", "--gpu", "a10g", "--checkpoint", "s3://no-such-bucket/r",
        "--yes", *TRAIN,
    )  # fmt: skip
    assert_refused(result, "does not exist")
    ec2 = boto3.client("ec2", region_name="us-east-1")
    assert ec2.describe_instances()["Reservations"] == []


def test_a_bad_sync_dir_is_refused_before_the_store_is_opened(
    run_cli: Callable[..., Any], aws_env: str
) -> None:
    # The bucket does not exist: the --sync-dir refusal comes before the store is probed.
    result = run_cli(
        "launch", "--provider", "aws", "--gpu", "a10g", "--checkpoint", "s3://no-such-bucket/r",
        "--sync-dir", "../out", "--yes", *TRAIN,
    )  # fmt: skip
    assert_refused(result, "--sync-dir '../out' leaves the folder it names")
    assert "does not exist" not in result.stderr


def test_the_sync_dir_reaches_the_instances_user_data(
    run_cli: Callable[..., Any], aws_launch_options: dict[str, str], aws_env: str
) -> None:
    """End to end on moto: ``launch --sync-dir`` is in the plan, in job.json (so every
    relaunch and --attach keep it) and in the boot script's ``costguard run`` line."""
    import base64

    import boto3

    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="ckpt")
    options = [x for k, v in aws_launch_options.items() for x in ("--option", f"{k}={v}")]
    result = run_cli(
        "launch", "--provider", "aws", "--gpu", "a10g", "--region", "us-east-1",
        "--checkpoint", "s3://ckpt/run1", *options, "--option", "package=costguard[train]",
        "--sync-dir", "out dir/", "--every-steps", "50", "--no-alarm-check", "--yes",
        "--timeout-hours", "0.0003", "--poll-seconds", "0.05", *TRAIN,
    )  # fmt: skip
    assert result.exit_code == 1, result.stderr  # it timed out: no instance ever reports
    assert "--sync-dir out dir/ on the instance (under its workdir" in result.stderr
    job = load_job(Store.open("s3://ckpt/run1"))
    assert job.spec.sync_dir == "out dir/"
    ec2 = boto3.client("ec2", region_name="us-east-1")
    (reservation,) = ec2.describe_instances()["Reservations"]
    instance_id = reservation["Instances"][0]["InstanceId"]
    attribute = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    user_data = base64.b64decode(attribute["UserData"]["Value"]).decode()
    assert (
        "costguard run --checkpoint s3://ckpt/run1 --cloud aws --every-steps 50 "
        "--sync-dir 'out dir/' -- python train.py"
    ) in user_data


def test_the_launch_guard_refuses_a_cloud_launch_without_a_budget(
    run_cli: Callable[..., Any], aws_env: str
) -> None:
    import boto3

    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="ckpt")
    result = run_cli(
        "launch", "--provider", "aws", "--gpu", "a10g", "--region", "us-east-1",
        "--checkpoint", "s3://ckpt/run1", "--option", "image=ami-0123456789abcdef0",
        "--option", "instance_profile=costguard-instance", "--max-price", "5", "--yes", *TRAIN,
    )  # fmt: skip
    assert result.exit_code == 1, result.stderr
    assert "no costguard budget alarm on aws" in result.stderr
    assert "--no-alarm-check" in result.stderr
    # The estimate came first (saying how zones are priced and where the cap goes), and
    # nothing was created.
    assert "g5.xlarge spot in us-east-1" in result.stderr
    assert "zones: picked at launch among us-east-1's zones" in result.stderr
    assert "the price tables are per region" in result.stderr
    assert "sent as the spot MaxPrice" in result.stderr
    ec2 = boto3.client("ec2", region_name="us-east-1")
    assert ec2.describe_instances()["Reservations"] == []
    listing = boto3.client("s3", region_name="us-east-1").list_objects_v2(Bucket="ckpt")
    assert listing.get("KeyCount", 0) == 0


def test_a_price_cap_given_twice_must_agree(run_cli: Callable[..., Any], aws_env: str) -> None:
    import boto3

    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="ckpt")
    result = run_cli(
        "launch", "--provider", "aws", "--gpu", "a10g", "--region", "us-east-1",
        "--checkpoint", "s3://ckpt/run1", "--option", "image=ami-0123456789abcdef0",
        "--option", "instance_profile=costguard-instance", "--max-price", "5",
        "--option", "max_price=4", "--yes", *TRAIN,
    )  # fmt: skip
    assert_refused(result, "--max-price 5 and the max_price option 4 disagree")
    ec2 = boto3.client("ec2", region_name="us-east-1")
    assert ec2.describe_instances()["Reservations"] == []


def test_the_estimate_says_gcp_takes_no_price_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dataclasses import replace
    from decimal import Decimal

    from costguard.cli.launch import _print_estimate
    from costguard.spot.launcher.base import Market, Offer

    job = replace(spec(str(tmp_path)), provider="gcp", max_usd_per_hour=Decimal("1.5"))
    gcp = Offer("gcp", "us-central1", "g2-standard-4", Market.SPOT, Decimal("0.3"), "L4", 1)
    _print_estimate(job, gcp, None, "2026-11-30")
    err = capsys.readouterr().err
    assert (
        "--max-price $1.50/h (spot): filters the offers only: GCP Spot VMs take no price cap" in err
    )
    assert "zones: picked at launch among us-central1's zones" in err


def test_the_estimate_names_a_cheaper_unverified_offer_it_passed_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dataclasses import replace
    from decimal import Decimal

    from costguard.cli.launch import _print_estimate
    from costguard.spot.launcher.base import Market, Offer

    job = replace(spec(str(tmp_path)), provider="aws")
    listed = Offer("aws", "us-east-2", "p5.48xlarge", Market.SPOT, Decimal("11.2"), "H100", 8)
    placeholder = replace(listed, region="ap-southeast-3", usd_per_hour=Decimal("7.5955"),
                          verified=False)  # fmt: skip
    _print_estimate(job, listed, None, "2026-11-30", [listed, placeholder])
    err = " ".join(capsys.readouterr().err.split())
    assert "a cheaper unverified price exists: p5.48xlarge spot in ap-southeast-3" in err


def test_a_running_job_is_not_launched_twice_and_status_reads_it(
    run_cli: Callable[..., Any], tmp_path: Path, local_dir: Path
) -> None:
    store = Store.open(tmp_path / "ckpt")
    save_job(store, Job(spec(store.url)))
    again = run_cli(
        "launch", "--provider", "local", "--gpu", "t4", "--checkpoint", store.url, "--yes", *TRAIN
    )
    assert_refused(again, "already runs", local_dir)
    assert "--attach" in again.stderr
    status = run_cli("jobs", "status", store.url, "--format", "json")
    assert status.exit_code == 0, status.stderr
    doc = json.loads(status.stdout)
    assert (doc["job_id"], doc["status"], doc["summary"]["attempts"]) == ("cg-test-1", "running", 0)
    table = run_cli("jobs", "status", store.url)
    assert "job cg-test-1: running" in table.stdout
    missing = run_cli("jobs", "status", str(tmp_path / "nothing"))
    assert missing.exit_code == 2
    assert "no costguard job" in missing.stderr
    assert load_job(store).status == "running"
    assert os.environ["COSTGUARD_LOCAL_DIR"] == str(local_dir)


def test_help_has_an_example(run_cli: Callable[..., Any]) -> None:
    result = run_cli("launch", "--help")
    assert result.exit_code == 0
    assert "costguard launch --provider local" in result.stdout
    assert "--preempt-every" in result.stdout
    assert "--attach" in result.stdout


def test_options_reach_only_the_documented_constructor_parameters() -> None:
    from costguard.settings import Settings
    from costguard.spot.launcher import cloud_launcher

    options = {
        "project": "p-1",
        "environ": "AWS_SECRET_ACCESS_KEY=x",
        "poll_interval_s": "0",
        "instances_client": "not-a-client",
    }
    launcher = cloud_launcher("gcp", Settings(), options)

    assert launcher.project == "p-1"  # type: ignore[attr-defined]
    assert launcher.poll_interval_s == 2.0  # type: ignore[attr-defined]
    assert getattr(launcher, "_instances", None) != "not-a-client"


def test_input_errors_come_before_the_checkpoint_store_is_touched(
    run_cli: Callable[..., Any], tmp_path: Path, local_dir: Path
) -> None:
    # Two schedules for the simulator: refused from the command line alone, before the
    # store is opened and write-probed (which would create the checkpoint folder).
    ckpt = tmp_path / "ckpt"
    result = run_cli(
        "launch", "--provider", "local", "--gpu", "t4", "--checkpoint", str(ckpt),
        "--preempt-at", "30", "--preempt-every", "10", "--yes", *TRAIN,
    )  # fmt: skip
    assert_refused(result, "exclude each other", local_dir)
    assert not ckpt.exists()
