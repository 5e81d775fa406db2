"""`costguard launch --array` on a cloud: each task a job of its own on its own instance,
through the AWS launcher against moto over HTTP (behind the EC2 fault layer of
tests/servers/aws.py), tagged with the array's id and its index and told
``COSTGUARD_ARRAY_TASK_ID`` by its boot script; the launches paced, a throttling answer
backed off (costguard.retry) without counting as a capacity failure, a full zone
failing no task, and each poll reading every running task's instance in one call
(DescribeInstances; GCP's aggregated list; Azure's status listing) on moto and the GCP and
Azure servers."""

from __future__ import annotations

import base64
import itertools
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from costguard import contract
from costguard.checkpoint import pace as pace_module
from costguard.checkpoint.pace import Pace, read_pace_or_warn, write_pace
from costguard.checkpoint.store import Store
from costguard.clouds import aws as aws_clouds
from costguard.pricing.catalog import Market
from costguard.spot import array
from costguard.spot import sweep as sweep_module
from costguard.spot.controller import Controller, Event
from costguard.spot.job import ExitRecord, Job, JobSpec, load_job, save_job, write_exit_record
from costguard.spot.launcher.aws import AwsLauncher
from costguard.spot.launcher.azure import AzureLauncher
from costguard.spot.launcher.base import Handle, Launcher, Offer, State
from costguard.spot.launcher.gcp import GcpLauncher
from costguard.spot.recovery import Attempt, AttemptOutcome
from costguard.spot.sweep import Sweep, Task, load_tasks, rollup_copy, task_specs, write_rollup
from costguard.tags import ARRAY_TAG, ARRAY_TASK_TAG, ATTEMPT_TAG, JOB_TAG
from tests.servers.aws import Ec2Faults, reclaim_aws_instance

URL = "s3://ckpt/sweep"
SPOT = Offer("aws", "us-east-1", "g5.xlarge", Market.SPOT, Decimal("0.45"), "A10G", 1)
#: Every test here ends well within this many rounds of its world (a bound, not a figure).
MAX_ROUNDS = 400


@pytest.fixture
def bucket(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkpoint bucket; every AWS client of the CLI without botocore's own retries
    (moto answers what it lacks with a 500, and the throttling is costguard's to retry)."""
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    aws_clouds.client("s3", attempts=1).create_bucket(Bucket="ckpt")


def ec2() -> Any:
    return aws_clouds.client("ec2", "us-east-1", attempts=1)


def instances() -> list[dict[str, Any]]:
    """Every instance moto knows, with its tags as a dict under ``tags``."""
    found = []
    for reservation in ec2().describe_instances()["Reservations"]:
        for instance in reservation["Instances"]:
            instance["tags"] = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
            found.append(instance)
    return found


def user_data(instance_id: str) -> str:
    attribute = ec2().describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    return base64.b64decode(attribute["UserData"]["Value"]).decode()


@dataclass
class Instances:
    """What the cloud's instances do, played from outside: each task's attempts, in order,
    are a spot reclaim (``"preempt"``) or the exit code its ``costguard run`` records in
    the task's store; attempts not in the plan exit 0."""

    plan: dict[int, list[int | str]]
    acted: dict[str, tuple[int, int]] = field(default_factory=dict)
    scripts: dict[int, str] = field(default_factory=dict)
    most_running: int = 0

    def act(self) -> None:
        """One look at the cloud: every new running instance of the array does its part."""
        live = [i for i in instances() if i["State"]["Name"] in ("pending", "running")]
        self.most_running = max(self.most_running, len(live))
        for instance in live:
            instance_id = instance["InstanceId"]
            tags = instance["tags"]
            if instance_id in self.acted or ARRAY_TASK_TAG not in tags:
                continue
            index, attempt = int(tags[ARRAY_TASK_TAG]), int(tags[ATTEMPT_TAG])
            self.acted[instance_id] = (index, attempt)
            self.scripts.setdefault(index, user_data(instance_id))
            steps = self.plan.get(index, [])
            outcome = steps[attempt - 1] if attempt <= len(steps) else 0
            if outcome == "preempt":
                reclaim_aws_instance(instance_id)
                continue
            store = Store.open(array.task_url(URL, index))
            write_exit_record(
                store, ExitRecord(attempt, int(outcome), None, time.time(), job_id=tags[JOB_TAG])
            )


@pytest.fixture
def playing() -> Iterator[Callable[[Instances], None]]:
    """Play ``Instances`` in a thread while the test's controller runs (stopped after)."""
    stop = threading.Event()
    threads: list[threading.Thread] = []
    failures: list[BaseException] = []

    def start(world: Instances) -> None:
        def loop() -> None:
            try:
                while not stop.wait(0.05):
                    world.act()
            except BaseException as exc:  # the test reads it
                failures.append(exc)

        threads.append(threading.Thread(target=loop, daemon=True))
        threads[-1].start()

    yield start
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert not failures, failures


@dataclass
class MotoArray:
    """An account to launch an array into (moto behind the EC2 fault layer, the bucket)
    and the player of its instances."""

    options: dict[str, str]
    faults: Ec2Faults
    play: Callable[[Instances], None]


@pytest.fixture
def moto_array(
    bucket: None,
    ec2_faults: Ec2Faults,
    aws_launch_options: dict[str, str],
    playing: Callable[[Instances], None],
) -> MotoArray:
    return MotoArray(aws_launch_options, ec2_faults, playing)


def test_each_task_of_a_cloud_array_is_a_job_on_its_own_tagged_instance(
    moto_array: MotoArray, run_cli: Callable[..., Any]
) -> None:
    """`launch --array 0-3%2 --provider aws --max-failures 1` on moto: task 1 is reclaimed
    once and relaunched, task 2 fails once and is retried, task 3 fails twice and is marked
    failed while the others go on; never more than 2 instances at once; each instance
    tagged with the array and its index, its boot script exporting COSTGUARD_ARRAY_TASK_ID
    and running `costguard run` on the task's own prefix, the one costguard wheel fetched
    from the array's URL."""
    world = Instances(plan={1: ["preempt"], 2: [1], 3: [1, 1]})
    moto_array.play(world)
    options = [x for k, v in moto_array.options.items() for x in ("--option", f"{k}={v}")]
    result = run_cli(
        "launch", "--provider", "aws", "--gpu", "a10g", "--region", "us-east-1",
        "--checkpoint", URL, *options, "--array", "0-3%2", "--max-failures", "1",
        "--no-alarm-check", "--yes", "--poll-seconds", "0.05", "--timeout-hours", "0.05",
        "--", "python", "train.py",
    )  # fmt: skip
    assert result.exit_code == 1, result.stderr  # task 3 failed
    assert "at most 2 task(s) ran at once (--array 0-3%2)" in " ".join(result.stderr.split())
    status = run_cli("jobs", "status", URL, "--format", "json")
    doc = json.loads(status.stdout)
    tasks = {t["index"]: t for t in doc["tasks"]}
    assert [tasks[i]["status"] for i in range(4)] == ["succeeded"] * 3 + ["failed"]
    assert (tasks[1]["preemptions"], tasks[1]["attempts"]) == (1, 2)
    assert (tasks[2]["failures"], tasks[2]["attempts"]) == (1, 2)
    assert (tasks[3]["failures"], tasks[3]["attempts"]) == (2, 2)
    # The sweep's roll-up holds every task's job.json as the sweep last wrote it, byte for
    # byte (what lets jobs status use the copies instead of reading each record).
    base = Store.open(URL)
    rolled = contract.read(base, contract.ROLLUP_FILE, contract.ROLLUP, contract.ROLLUP_BYTES)
    assert rolled is not None
    assert {t["index"]: t["job"].encode() for t in rolled["tasks"]} == {
        i: base.child(array.task_name(i)).get(contract.JOB_FILE) for i in range(4)
    }

    array_id = doc["array_id"]
    seen = instances()
    assert len(seen) == 7  # 1 + 2 + 2 + 2 attempts, one instance each
    assert world.most_running <= 2
    wheels = [
        o["Key"]
        for o in aws_clouds.client("s3", attempts=1).list_objects_v2(Bucket="ckpt")["Contents"]
        if o["Key"].endswith(".whl")
    ]
    assert len(wheels) == 1  # one for the array, not one per task
    assert wheels[0].startswith("sweep/job/costguard-")
    for instance in seen:
        tags = instance["tags"]
        index = int(tags[ARRAY_TASK_TAG])
        assert tags[ARRAY_TAG] == array_id
        assert tags[JOB_TAG] == array.task_job_id(array_id, index)
        assert instance["State"]["Name"] in ("shutting-down", "terminated")  # none left
    for index, script in world.scripts.items():
        assert f"\nARRAY_TASK={index}\n" in script
        assert f"costguard run --checkpoint {URL}/task-{index} --cloud aws" in script
        assert f"WHEEL_URL=s3://ckpt/{wheels[0]}\n" in script
        # The boot script's own lines put the index in the environment of what it runs.
        start = script.index("ARRAY_TASK=")
        block = script[start : script.index("\nfi\n", start) + 4]
        shell = subprocess.run(["bash", "-c", block + "printenv COSTGUARD_ARRAY_TASK_ID"],
                               capture_output=True, text=True, timeout=30, env={})  # fmt: skip
        assert shell.stdout == f"{index}\n", shell


# -- jobs status of a big array: the roll-up -----------------------------------------------


def _stored_array(count: int, url: str = URL) -> tuple[array.ArrayRecord, list[tuple[int, Job]]]:
    """An array of ``count`` tasks at ``url``, each running its first attempt, and
    their jobs as stored."""
    record = array.ArrayRecord(
        "cg-me-20261206-000000-abc123", url, f"0-{count - 1}", tuple(range(count)), count, 1.0
    )
    array.write_record(Store.open(url), record)
    base, jobs = Store.open(url), []
    for index, task in enumerate(task_specs(_template({}), record)):
        job = Job(task, (Attempt(1, SPOT, time.time() - 60),))
        jobs.append((index, save_job(base.child(array.task_name(index)), job)))
    return record, jobs


@pytest.fixture(params=["s3", "azure"])
def array_url(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, aws_env: str) -> str:
    """Where an array is stored: the S3 bucket on moto, or a container on Azurite (whose
    listing gives each blob's Content-MD5, as Azure Blob's does)."""
    if request.param == "s3":
        request.getfixturevalue("bucket")
        return URL
    import adlfs  # type: ignore[import-untyped]

    connection = request.getfixturevalue("azurite")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", connection)
    container = f"c{time.monotonic_ns()}"
    adlfs.AzureBlobFileSystem(connection_string=connection, skip_instance_cache=True).mkdir(
        container
    )
    return f"az://{container}/sweep"


@pytest.fixture
def records_read(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The task prefixes whose job.json (``job``) or pace.json (``pace``) ``jobs status``
    reads from the store itself."""
    read: list[str] = []

    def counted(store: Store) -> Job:
        read.append(f"job {store.url}")
        return load_job(store)

    def counted_pace(store: Store) -> Pace | None:
        read.append(f"pace {store.url}")
        return read_pace_or_warn(store)

    monkeypatch.setattr(sweep_module, "load_job", counted)
    monkeypatch.setattr(pace_module, "read_pace_or_warn", counted_pace)
    return read


def _paces(jobs: list[tuple[int, Job]], url: str = URL) -> dict[int, str]:
    """Each task given a pace (100 of 1,000 steps done), and its text as the sweep reads it."""
    out = {}
    for index, _ in jobs:
        store = Store.open(array.task_url(url, index))
        write_pace(store, Pace(100, 50.0, 100, time.time(), time.time() - 60, total_steps=1000))
        out[index] = store.get(contract.PACE_FILE).decode()
    return out


def test_status_takes_the_tasks_from_the_rollup_and_reads_only_those_changed_since(
    array_url: str, records_read: list[str], run_cli: Callable[..., Any]
) -> None:
    """A 6-task array whose roll-up the sweep wrote: status reads the roll-up and one
    listing, and the record only of task 4, which moved on (finished) after it, and the
    pace only of task 5, which recorded a new one after it."""
    url = array_url
    record, jobs = _stored_array(6, url)
    write_rollup(Store.open(url), record.array_id, jobs, _paces(jobs, url))
    done = replace(jobs[4][1], status="failed", reason="exit 3")
    save_job(Store.open(array.task_url(url, 4)), done)
    moved = Pace(900, 450.0, 900, time.time(), 1.0, total_steps=1000)
    write_pace(Store.open(array.task_url(url, 5)), moved)
    status = run_cli("jobs", "status", url, "--format", "json")
    assert status.exit_code == 0, status.stderr
    assert records_read == [f"job {array.task_url(url, 4)}", f"pace {array.task_url(url, 5)}"]
    shown = json.loads(status.stdout)["tasks"]
    assert [t["status"] for t in shown] == ["running"] * 4 + ["failed", "running"]
    assert all(t["projected_usd"] is not None for t in shown if t["status"] == "running")
    assert shown[5]["left_s"] < shown[0]["left_s"]  # 900 steps of 1,000 done, not 100


def test_a_forged_or_broken_rollup_shows_nothing_the_tasks_records_do_not_say(
    array_url: str, records_read: list[str]
) -> None:
    """The roll-up is trusted for nothing: a copy is used only when its MD5 is the one the
    store lists for the task's own job.json. A roll-up saying every task succeeded (valid
    job documents, the array's id), one of another array, or one that is not JSON: every
    task is read from its record and shows running."""
    record, jobs = _stored_array(3, array_url)
    base = Store.open(array_url)
    forged = [(i, replace(job, status="succeeded", reason="exit 0")) for i, job in jobs]
    _paces(jobs, array_url)  # the tasks' own paces: 100 steps done; the forged copies say 999
    fake = Pace(999, 1.0, 999, time.time(), 1.0, total_steps=1000).to_json().decode()
    for broken in (
        lambda: write_rollup(base, record.array_id, forged, dict.fromkeys(range(3), fake)),
        lambda: write_rollup(base, "cg-me-20261206-000000-other1", jobs),
        lambda: base.put(contract.ROLLUP_FILE, b'{"version": 1, "tasks": ['),
        lambda: base.put(
            contract.ROLLUP_FILE,
            json.dumps(
                {
                    "version": 1,
                    "array_id": record.array_id,
                    "tasks": [{"index": 7, "job": rollup_copy(jobs[0][1])}],
                }
            ).encode(),
        ),
    ):
        broken()
        records_read.clear()
        tasks = load_tasks(record, skip_bad=True)
        assert [t.job.status for t in tasks] == ["running"] * 3
        assert [t.job for t in tasks] == [job for _, job in jobs]
        assert [t.pace_copy for t in tasks] == [None] * 3
        assert len(records_read) == 3


# -- the launches: paced, throttled, a zone full ------------------------------------------


def _template(options: dict[str, str]) -> JobSpec:
    return JobSpec(
        job_id="cg-me-20261206-000000-abc123", provider="aws", gpu="A10G", gpu_count=1,
        regions=("us-east-1",), spot=True, checkpoint_url=URL, command=("python", "train.py"),
        owner="me", created_unix=1_000.0, expires_at=datetime(2026, 12, 9, tzinfo=UTC),
        options=options,
    )  # fmt: skip


@dataclass
class Sweeping:
    """A sweep of ``count`` tasks, all at once, on moto, with this test's clock: every
    wait (a poll, the pace, a backoff) moves the clock, and then each task whose instance
    runs exits 0."""

    sweep: Sweep
    waits: list[float]
    events: list[Event]


def _sweeping(
    count: int,
    options: dict[str, str],
    *,
    interval_s: float,
    template: JobSpec | None = None,
    launcher: Launcher | None = None,
    offers: tuple[Offer, ...] = (SPOT,),
    concurrency: int | None = None,
) -> Sweeping:
    template = template or _template(options)
    record = array.ArrayRecord(
        template.job_id, template.checkpoint_url, f"0-{count - 1}", tuple(range(count)),
        concurrency or count, 1_000.0,
    )  # fmt: skip
    tasks = []
    for index, spec in zip(record.indexes, task_specs(template, record), strict=True):
        store = Store.open(spec.checkpoint_url)
        tasks.append(Task(index, store, save_job(store, Job(spec))))
    now = [1_000.0]
    waits: list[float] = []
    events: list[Event] = []
    launcher = launcher or AwsLauncher(regions=["us-east-1"], clients=lambda region: ec2())

    def sleep(seconds: float) -> None:
        assert len(waits) < MAX_ROUNDS, events
        waits.append(seconds)
        now[0] += seconds
        for task in sweep.tasks:
            current = task.job.current
            if current is not None and current.handle is not None:
                record = ExitRecord(current.number, 0, None, now[0], job_id=task.job.spec.job_id)
                write_exit_record(task.store, record)

    sweep = Sweep(record, Store.open(record.url), tasks, offers, lambda spec: launcher,
                  task_estimate_usd=Decimal("0.45"), poll_s=1.0, on_event=events.append,
                  clock=lambda: now[0], sleep=sleep, launch_interval_s=interval_s)  # fmt: skip
    return Sweeping(sweep, waits, events)


def test_an_arrays_launches_are_spread_at_the_providers_rate(
    bucket: None, ec2_faults: Ec2Faults, aws_launch_options: dict[str, str]
) -> None:
    """Six tasks that may all run at once are launched one every 0.5 s of the sweep's
    clock (EC2's RunInstances refill rate), not all in the same instant."""
    interval = array.LAUNCH_INTERVAL_S["aws"]
    sweeping = _sweeping(6, aws_launch_options, interval_s=interval)
    jobs = sweeping.sweep.run()
    assert [j.status for j in jobs] == ["succeeded"] * 6
    launched = sorted(a.launched_unix for j in jobs for a in j.attempts)
    assert len(launched) == 6
    gaps = [b - a for a, b in itertools.pairwise(launched)]
    assert min(gaps) >= interval - 1e-9, gaps
    assert sweeping.sweep.peak_running == 6  # spread out, not held back


def test_a_throttled_launch_backs_off_and_is_no_capacity_failure(
    bucket: None, ec2_faults: Ec2Faults, aws_launch_options: dict[str, str]
) -> None:
    """EC2 answers the first three RunInstances with RequestLimitExceeded: the controller
    sends the launch again after costguard.retry's backoff (waits that grow, within
    API_RETRY's caps), and the job runs in the first place it picked, with one attempt: no
    launch_failed attempt, no place backed off from, no failure."""
    from costguard.retry import API_RETRY

    ec2_faults.throttle_runs = 3
    store = Store.open(URL)
    spec = _template(aws_launch_options)
    save_job(store, Job(spec))
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        assert len(waits) < MAX_ROUNDS
        waits.append(seconds)
        current = load_job(store).current
        if current is not None and current.handle is not None:
            write_exit_record(store, ExitRecord(current.number, 0, None, time.time(),
                                                job_id=spec.job_id))  # fmt: skip

    events: list[Event] = []
    launcher = AwsLauncher(regions=["us-east-1"], clients=lambda region: ec2())
    final = Controller(store, launcher, [SPOT], poll_s=0.0, sleep=sleep,
                       on_event=events.append).run(load_job(store))  # fmt: skip
    assert final.status == "succeeded", final.reason
    (attempt,) = final.attempts
    assert attempt.outcome is AttemptOutcome.SUCCEEDED
    assert attempt.offer.zone == launcher.zones("us-east-1", "g5.xlarge")[0]
    assert ec2_faults.throttled == 3
    backoffs = waits[:3]
    assert all(0 <= w <= API_RETRY.max_delay_s for w in backoffs), waits
    assert len(ec2_faults.run_times) == 4


def test_throttled_past_the_retries_the_task_waits_uncounted_and_starts_later(
    bucket: None, ec2_faults: Ec2Faults, aws_launch_options: dict[str, str]
) -> None:
    """Throttled more times than one launch retries (API_RETRY.attempts), a task's launch
    is given up for that poll with no attempt recorded (it stays pending: not a capacity
    failure, not a failure), the others wait, and at a later poll every task starts."""
    from costguard.retry import API_RETRY

    ec2_faults.throttle_runs = API_RETRY.attempts + 1
    sweeping = _sweeping(3, aws_launch_options, interval_s=0.0)
    jobs = sweeping.sweep.run()
    assert [j.status for j in jobs] == ["succeeded"] * 3
    assert [len(j.attempts) for j in jobs] == [1, 1, 1]
    assert all(a.outcome is AttemptOutcome.SUCCEEDED for j in jobs for a in j.attempts)
    messages = [e.message for e in sweeping.events if e.kind == "throttled"]
    retried = [m for m in messages if "launching again in" in m]
    assert len(retried) >= API_RETRY.attempts - 1  # each backoff said
    assert any("asking again later" in m for m in messages)  # given up for this poll
    assert any("the others wait a poll" in m for m in messages)  # and the array held


def test_a_full_zone_fails_no_task_of_the_array(
    bucket: None, ec2_faults: Ec2Faults, aws_launch_options: dict[str, str]
) -> None:
    """The first zone has no capacity: each task's launch there is refused (a
    launch_failed attempt, as for a single job), it moves to another zone, and every task
    succeeds."""
    launcher = AwsLauncher(regions=["us-east-1"], clients=lambda region: ec2())
    full = launcher.zones("us-east-1", "g5.xlarge")[0]
    ec2_faults.full_zones = {full}
    jobs = _sweeping(3, aws_launch_options, interval_s=0.0).sweep.run()
    assert [j.status for j in jobs] == ["succeeded"] * 3
    for job in jobs:
        refused, ran = job.attempts
        assert (refused.outcome, refused.offer.zone) == (AttemptOutcome.LAUNCH_FAILED, full)
        assert ran.outcome is AttemptOutcome.SUCCEEDED
        assert ran.offer.zone != full


# -- GCP and Azure: their loopback servers, through the real SDK clients ---------------

#: A cloud's launcher on its server, the array's template and offer, and what the server
#: was asked to create (each VM's labels or tags and its boot script).
Made = tuple[Launcher, JobSpec, Offer, Callable[[], list[tuple[dict[str, str], str]]]]


def _gcp_array(request: pytest.FixtureRequest) -> Made:
    from google.auth.credentials import AnonymousCredentials

    from costguard.settings import Settings
    from costguard.spot.launcher.gcp import GcpLauncher
    from tests.servers.gcp import LAUNCH_OPTIONS, PROJECT, ComputeServer

    server: ComputeServer = request.getfixturevalue("compute_server")
    server.rate_limit_inserts = 2
    launcher = GcpLauncher(Settings(gcp_endpoint=server.url), project=PROJECT,
                           credentials=AnonymousCredentials(), poll_interval_s=0.01)  # fmt: skip
    offer = Offer("gcp", "us-central1", "n1-highmem-8", Market.SPOT, Decimal("0.5"), "T4", 2)

    def created() -> list[tuple[dict[str, str], str]]:
        assert server.rate_limited == 2
        bodies = [c.body for c in server.calls("POST", "/instances")][2:]  # past the refused
        return [(b["labels"], b["metadata"]["items"][0]["value"]) for b in bodies]

    return launcher, _cloud_template("gcp", "T4", 2, "us-central1", LAUNCH_OPTIONS), offer, created


def _azure_array(request: pytest.FixtureRequest) -> Made:
    from costguard.settings import Settings
    from costguard.spot.launcher.azure import AzureLauncher
    from tests.servers.azure import GROUP, LAUNCH_OPTIONS, SUBSCRIPTION, ArmServer
    from tests.servers.http import FakeTokenCredential, azure_client_options

    server: ArmServer = request.getfixturevalue("arm_server")
    server.throttle_puts = 2
    # Without the SDK's own retries (ten, on a 429): the throttling is costguard's to retry.
    options = {**azure_client_options(), "retry_total": 0}
    launcher = AzureLauncher(Settings(azure_endpoint=server.url), credential=FakeTokenCredential(),
                             client_options=options, subscription_id=SUBSCRIPTION,
                             resource_group=GROUP)  # fmt: skip
    offer = Offer("azure", "eastus", "Standard_NC4as_T4_v3", Market.SPOT, Decimal("0.15"), "T4", 1)

    def created() -> list[tuple[dict[str, str], str]]:
        assert server.throttled == 2
        bodies = [c.body for c in server.calls("PUT", "/virtualMachines/")][2:]
        return [(b["tags"], base64.b64decode(b["properties"]["osProfile"]["customData"]).decode())
                for b in bodies]  # fmt: skip

    template = _cloud_template("azure", "T4", 1, "eastus", LAUNCH_OPTIONS)
    return launcher, replace(template, max_usd_per_hour=Decimal("0.2")), offer, created


def _cloud_template(
    provider: str, gpu: str, count: int, region: str, options: dict[str, str]
) -> JobSpec:
    return replace(_template(options), provider=provider, gpu=gpu, gpu_count=count,
                   regions=(region,))  # fmt: skip


@pytest.mark.parametrize("cloud", ["gcp", "azure"])
def test_gcp_and_azure_arrays_run_each_task_on_its_own_labelled_vm_through_throttling(
    cloud: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Three tasks, two at a time, through the GCP and Azure launchers and their servers:
    the first two creates are refused for the request rate (GCP 403 rateLimitExceeded,
    Azure 429 with Retry-After), backed off and sent again, and no attempt is counted for
    them; each task then runs on a VM of its own labelled (tagged) with the array and its
    index, whose boot script exports COSTGUARD_ARRAY_TASK_ID and runs on its prefix."""
    launcher, template, offer, created = (_gcp_array if cloud == "gcp" else _azure_array)(request)
    template = replace(template, checkpoint_url=f"file://{tmp_path}/sweep")
    sweeping = _sweeping(3, dict(template.options), interval_s=0.0, template=template,
                         launcher=launcher, offers=(offer,), concurrency=2)  # fmt: skip
    jobs = sweeping.sweep.run()
    assert [j.status for j in jobs] == ["succeeded"] * 3, [j.reason for j in jobs]
    assert [len(j.attempts) for j in jobs] == [1, 1, 1]
    assert sweeping.sweep.peak_running == 2
    assert [e.kind for e in sweeping.events].count("throttled") >= 2
    if cloud == "azure":  # Resource Manager's Retry-After was honoured
        assert 2.0 in sweeping.waits
    key = (lambda tag: tag.replace(":", "-")) if cloud == "gcp" else (lambda tag: tag)
    seen = {}
    for tags, script in created():
        index = int(tags[key(ARRAY_TASK_TAG)])
        assert tags[key(ARRAY_TAG)] == template.job_id
        assert f"\nARRAY_TASK={index}\n" in script
        assert f"costguard run --checkpoint file://{tmp_path}/sweep/task-{index} " in script
        seen[index] = tags[key(JOB_TAG)]
    assert seen == {i: array.task_job_id(template.job_id, i) for i in range(3)}


def test_attach_takes_a_cloud_array_over_and_adopts_its_running_instance(
    moto_array: MotoArray, run_cli: Callable[..., Any]
) -> None:
    """A cloud array whose controller died: task 0's instance runs (its attempt in its
    job.json), tasks 1 and 2 wait. `launch --attach URL` takes the
    array over: it adopts task 0's instance (no second one), starts the others, and every
    task ends succeeded."""
    from costguard import proof
    from costguard.spot.job import sign_spec
    from costguard.spot.launcher.base import launch_token
    from costguard.spot.recovery import Attempt

    key = proof.user_key(create=True)
    assert key is not None
    template = replace(_template(moto_array.options), owner=owner())
    record = array.ArrayRecord(template.job_id, URL, "0-2%2", (0, 1, 2), 2, time.time())
    launcher = AwsLauncher(regions=["us-east-1"], clients=lambda region: ec2())
    base = Store.open(URL)
    for index, spec in zip(record.indexes, task_specs(template, record), strict=True):
        job = Job(sign_spec(spec, key))
        if index == 0:
            offer = replace(SPOT, zone="us-east-1a")
            handle = launcher.launch(offer, spec.launch_spec(), 1)
            job = job.with_attempt(Attempt(1, offer, time.time(), handle=handle,
                                           token=launch_token(spec.job_id, 1)))  # fmt: skip
        save_job(base.child(array.task_name(index)), job)
    array.write_record(base, record)
    world = Instances(plan={})
    moto_array.play(world)
    # Its heartbeat is this process's, just written: --force, as after a controller's death.
    result = run_cli("launch", "--attach", URL, "--yes", "--no-alarm-check", "--force",
                     "--poll-seconds", "0.05", "--timeout-hours", "0.05")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "attached to array" in result.stderr
    jobs = [load_job(base.child(array.task_name(i))) for i in range(3)]
    assert [j.status for j in jobs] == ["succeeded"] * 3
    assert [len(j.attempts) for j in jobs] == [1, 1, 1]
    assert len(instances()) == 3  # task 0's was adopted, not launched again


def owner() -> str:
    """The user the CLI acts for (its controller terminates only instances tagged so)."""
    import getpass

    return getpass.getuser()


# -- one describe per poll for every running task -----------------------------------------


def _polls_of_a_running_array(
    count: int,
    launcher: Launcher,
    template: JobSpec,
    offer: Offer,
    calls: Callable[[], int],
    *,
    polls: int = 3,
    preempt: Callable[[Sweep], None] | None = None,
) -> tuple[list[int], list[Job]]:
    """A sweep of ``count`` tasks at once whose instances run for ``polls`` polls, then
    exit 0 (``preempt``, if given, acts on the cloud after the first of them): the
    provider's status calls (``calls()``, a running count) made in each poll, and the
    tasks' final jobs."""
    record = array.ArrayRecord(
        template.job_id, template.checkpoint_url, f"0-{count - 1}", tuple(range(count)),
        count, 1_000.0,
    )  # fmt: skip
    tasks = []
    for index, spec in zip(record.indexes, task_specs(template, record), strict=True):
        store = Store.open(spec.checkpoint_url)
        tasks.append(Task(index, store, save_job(store, Job(spec))))
    now, seen = [1_000.0], [calls()]
    per_poll: list[int] = []

    def sleep(seconds: float) -> None:
        assert len(per_poll) < MAX_ROUNDS
        now[0] += seconds
        per_poll.append(calls() - seen[0])
        seen[0] = calls()
        if len(per_poll) == 2 and preempt is not None:
            preempt(sweep)
        if len(per_poll) <= polls:
            return
        for task in sweep.tasks:  # every instance's script is done
            current = task.job.current
            if current is not None and current.handle is not None:
                exit_record = ExitRecord(
                    current.number, 0, None, now[0], job_id=task.job.spec.job_id
                )
                write_exit_record(task.store, exit_record)

    sweep = Sweep(record, Store.open(record.url), tasks, (offer,), lambda spec: launcher,
                  task_estimate_usd=Decimal("0.45"), poll_s=1.0, clock=lambda: now[0],
                  sleep=sleep)  # fmt: skip
    return per_poll, sweep.run()


def test_a_poll_describes_every_running_tasks_instance_in_one_call_on_moto(
    bucket: None, ec2_faults: Ec2Faults, aws_launch_options: dict[str, str]
) -> None:
    """Five tasks running at once on moto: each poll sends EC2 one DescribeInstances for
    the five instances (the old sweep sent one per task, five a poll), and the tasks end
    as before: a reclaimed one (the listing shows it ended: it is read alone, its state
    reason says spot) is relaunched, every one succeeds."""
    launcher = AwsLauncher(regions=["us-east-1"], clients=lambda region: ec2())

    def describes() -> int:
        return ec2_faults.actions.count("DescribeInstances")

    def reclaim_task_2(sweep: Sweep) -> None:
        handle = sweep.tasks[2].job.attempts[-1].handle
        assert handle is not None
        reclaim_aws_instance(handle.instance_id)

    per_poll, jobs = _polls_of_a_running_array(
        5, launcher, _template(aws_launch_options), SPOT, describes, preempt=reclaim_task_2
    )
    assert [j.status for j in jobs] == ["succeeded"] * 5, [j.reason for j in jobs]
    assert [len(j.attempts) for j in jobs] == [1, 1, 2, 1, 1]
    assert jobs[2].attempts[0].outcome is AttemptOutcome.PREEMPTED
    # Poll 1 launches; poll 2 describes the five at once; poll 3 also reads the reclaimed
    # one alone (its end is the per-instance rule's to say) and relaunches it; then one a
    # poll again.
    assert per_poll[1] == 1, per_poll
    assert per_poll[2] == 2, per_poll
    assert per_poll[3] == 1, per_poll


def test_a_fresh_instance_the_listing_leaves_out_is_read_alone_and_not_ended(
    bucket: None, ec2_faults: Ec2Faults, aws_launch_options: dict[str, str]
) -> None:
    """EC2's eventual consistency: instances just launched are missing from the filtered
    listing (and answer NotFound to the first describe by id). The batch does not call
    them gone: each is described again alone, with the fresh-instance backoff, and runs."""
    ec2_faults.hidden_calls = 1
    launcher = AwsLauncher(regions=["us-east-1"], clients=lambda region: ec2(),
                           sleep=lambda seconds: None)  # fmt: skip

    def describes() -> int:
        return ec2_faults.actions.count("DescribeInstances")

    per_poll, jobs = _polls_of_a_running_array(
        3, launcher, _template(aws_launch_options), SPOT, describes, polls=2
    )
    assert [j.status for j in jobs] == ["succeeded"] * 3, [j.reason for j in jobs]
    assert [len(j.attempts) for j in jobs] == [1, 1, 1]
    assert ec2_faults.not_found == 3  # each fresh one answered NotFound once, then ran
    # The listing, then each left-out instance twice by id (NotFound, then found).
    assert per_poll[1] == 1 + 3 * 2, per_poll


def test_the_aws_statuses_of_many_instances_in_their_order_a_gone_one_read_alone(
    bucket: None, ec2_faults: Ec2Faults, aws_launch_options: dict[str, str]
) -> None:
    """AwsLauncher.statuses of five running instances, an unknown id (an old attempt's
    instance EC2 forgot) and a forged one (a wildcard, which a filter would match every
    instance with) among them, two ids a call: three DescribeInstances for the six ids,
    then the unknown and the forged one described alone (missing); each status is its own
    handle's, in the order asked."""
    launcher = AwsLauncher(regions=["us-east-1"], clients=lambda region: ec2())
    launcher.describe_ids = 2
    spec = _template(aws_launch_options).launch_spec()
    handles = [launcher.launch(replace(SPOT, zone="us-east-1a"), spec, n) for n in range(1, 6)]
    gone = Handle("aws", "us-east-1", "i-0123456789abcdef0", extra={"launched_unix": "1.0"})
    forged = replace(gone, instance_id="i-*")
    asked = [*handles[:2], gone, forged, *handles[2:]]
    ec2_faults.actions.clear()
    said = launcher.statuses(asked)
    assert [s.handle for s in said] == asked
    missing = [State.MISSING] * 2
    assert [s.state for s in said] == [State.RUNNING] * 2 + missing + [State.RUNNING] * 3
    assert ec2_faults.actions.count("DescribeInstances") == 3 + 2


def _azure_calls(server: Any) -> tuple[Callable[[], int], Callable[[], int]]:
    """Counters of what Resource Manager was asked: the subscription's VM listings, and
    the reads of one VM with its instance view."""

    def listings() -> int:
        return len([r for r in server.requests if r.method == "GET"
                    and r.path.endswith("/providers/Microsoft.Compute/virtualMachines")
                    and "resourceGroups" not in r.path])  # fmt: skip

    def reads() -> int:
        return len([r for r in server.calls("GET", "/virtualMachines/")
                    if r.query.get("$expand") == ["instanceView"]])  # fmt: skip

    return listings, reads


@pytest.mark.parametrize("cloud", ["gcp", "azure"])
def test_a_poll_reads_every_running_tasks_vm_in_one_listing_on_gcp_and_azure(
    cloud: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Four tasks running at once through the GCP and Azure launchers and their servers:
    each poll reads the four VMs in one listing (GCP: an aggregated list filtered by their
    names; Azure: the subscription's status-only listing, over pages of 3) and no VM one
    by one (the old sweep read each task's VM alone: four reads a poll); a reclaimed VM,
    gone from the listing, is read alone, called preempted and relaunched."""
    launcher, template, offer, _ = (_gcp_array if cloud == "gcp" else _azure_array)(request)
    template = replace(template, checkpoint_url=f"file://{tmp_path}/sweep")
    server = request.getfixturevalue("compute_server" if cloud == "gcp" else "arm_server")
    server.requests.clear()
    if cloud == "gcp":
        server.rate_limit_inserts = 0

        def listings() -> int:
            return len(server.calls("GET", "/aggregated/instances"))

        def reads() -> int:
            return len([r for r in server.calls("GET", "/instances/")
                        if "/operations/" not in r.path])  # fmt: skip
    else:
        server.throttle_puts = 0
        server.page_size = 3
        listings, reads = _azure_calls(server)

    def calls() -> int:
        return listings() * 1000 + reads()

    def reclaim_task_1(sweep: Sweep) -> None:
        handle = sweep.tasks[1].job.attempts[-1].handle
        assert handle is not None
        (server.preempt if cloud == "gcp" else server.evict)(handle.instance_id)

    per_poll, jobs = _polls_of_a_running_array(
        4, launcher, template, offer, calls, polls=4, preempt=reclaim_task_1
    )
    assert [j.status for j in jobs] == ["succeeded"] * 4, [j.reason for j in jobs]
    assert [len(j.attempts) for j in jobs] == [1, 2, 1, 1]
    assert jobs[1].attempts[0].outcome is AttemptOutcome.PREEMPTED
    pages = 1 if cloud == "gcp" else 2  # Azure: four VMs over pages of three
    assert per_poll[1] == pages * 1000, per_poll  # one listing, no VM read alone
    # The reclaimed VM (gone: its termination action deletes it) is not in the next
    # listing, and is read alone, whose rules (a system event; a Spot VM gone) say
    # preempted; then one listing a poll again.
    listed, alone = divmod(per_poll[2], 1000)
    assert listed == 1, per_poll
    assert alone >= 1, per_poll
    assert per_poll[4] == pages * 1000, per_poll


def test_gcps_statuses_list_the_vms_by_name_a_few_names_a_call(
    request: pytest.FixtureRequest,
) -> None:
    """Three VMs and a name no VM has (an old attempt's, deleted), two names a call: two
    aggregated lists; the deleted one, not listed, is read alone (404, no preemption
    event: missing); each status its own handle's, in the order asked."""
    launcher, template, offer, _ = _gcp_array(request)
    assert isinstance(launcher, GcpLauncher)
    server = request.getfixturevalue("compute_server")
    server.rate_limit_inserts = 0
    spec = template.launch_spec()
    handles = [launcher.launch(offer, spec, attempt) for attempt in range(1, 4)]
    gone = replace(handles[0], instance_id="costguard-gone-1")
    server.requests.clear()
    launcher.list_names = 2
    asked = [handles[0], gone, *handles[1:]]
    said = launcher.statuses(asked)
    assert [s.handle for s in said] == asked
    assert [s.state for s in said] == [State.RUNNING, State.MISSING, State.RUNNING, State.RUNNING]
    assert len(server.calls("GET", "/aggregated/instances")) == 2
    assert [r.path.rsplit("/", 1)[-1] for r in server.calls("GET", "/instances/")] == [
        "costguard-gone-1"
    ]


def test_azures_status_listing_is_paged_only_until_every_vm_asked_is_seen(
    request: pytest.FixtureRequest,
) -> None:
    """Four VMs listed one a page: the statuses of the first two read two pages, not four;
    with a bound of one page, a VM not seen by then is read alone."""
    launcher, template, offer, _ = _azure_array(request)
    assert isinstance(launcher, AzureLauncher)
    server = request.getfixturevalue("arm_server")
    server.throttle_puts, server.page_size = 0, 1
    spec = template.launch_spec()
    handles = [launcher.launch(offer, spec, attempt) for attempt in range(1, 5)]
    server.requests.clear()
    listings, reads = _azure_calls(server)
    said = launcher.statuses(handles[:2])
    assert [s.state for s in said] == [State.RUNNING] * 2
    assert (listings(), reads()) == (2, 0)
    launcher.list_pages = 1
    server.requests.clear()
    said = launcher.statuses([handles[0], handles[3]])
    assert [(s.handle, s.state) for s in said] == [(h, State.RUNNING) for h in handles[::3]]
    assert (listings(), reads()) == (1, 1)


def test_an_azure_role_on_the_resource_group_only_reads_each_vm_alone(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The launcher's role assigned on the resource group only (infra/azure): Resource
    Manager refuses the subscription's status listing (403 AuthorizationFailed). The sweep
    asks it once, then reads each running task's VM alone at each poll, as before, and
    every task succeeds."""
    launcher, template, offer, _ = _azure_array(request)
    template = replace(template, checkpoint_url=f"file://{tmp_path}/sweep")
    server = request.getfixturevalue("arm_server")
    server.throttle_puts, server.group_scoped_role = 0, True
    server.requests.clear()
    listings, reads = _azure_calls(server)
    per_poll, jobs = _polls_of_a_running_array(3, launcher, template, offer, reads)
    assert [j.status for j in jobs] == ["succeeded"] * 3, [j.reason for j in jobs]
    assert per_poll[1:3] == [3, 3], per_poll
    assert listings() == 1  # refused once, not asked again at every poll
