"""`costguard launch --array`: the controller's CPU while it supervises many local tasks,
`costguard jobs status` of a big array on S3, and the describes of a cloud array's polls,
each measured side by side in one run.

``cpu``: ``--tasks`` local tasks (each ``costguard run`` around a command that waits, on
the simulator's on-demand offer: no preemption, the steady state) all running at once
under one :class:`~costguard.spot.sweep.Sweep` in this process, at the CLI's default poll
(0.5 s). Once every task runs, the process's CPU time (user + system, every thread: the
sweep and the tasks' metadata emulators, not the tasks themselves) is read over
``--window`` seconds and divided by the wall time: the share of one core the controller
takes. Target (issue 46): <= 5% of one core for 100 tasks.

``status``: an array of ``--tasks`` tasks on a moto S3 server (started here, loopback):
a third succeeded, a third running with a recorded pace, a third pending. ``costguard jobs
status URL --format json`` runs in a fresh process, as a user runs it, twice: before the
sweep's roll-up (``job/array-rollup.json``) is stored, reading every task's job.json
(what status did before it: a GET each, ``READ_WORKERS`` at once), and after, reading the
roll-up and one listing instead (the roll-up holds the running tasks' paces too, as the
sweep last read them). Target
(issue 46): <= 2 s for 1,000 tasks. ``--store azure``: the same on Azurite (started here
from .ci-work, as the suite starts it), whose listing gives each blob's Content-MD5.

``polls``: ``--tasks`` tasks all running on EC2 (the moto server, started here) under
one :class:`~costguard.spot.sweep.Sweep`, each task's instance running for three polls:
the ``DescribeInstances`` calls EC2 saw and the sweep's time per poll, side by side in one
run, with the AWS launcher's ``statuses`` (one call, filtered by instance id, for every
running task) and with the base's per-instance default (one call per task: what every
poll sent before, about 100 calls a second for 1,000 tasks at a 10 s poll).

    python benchmarks/sweep.py cpu [--tasks 100] [--window 20]
    python benchmarks/sweep.py status [--tasks 1000] [--store s3|azure]
    python benchmarks/sweep.py polls [--tasks 100]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

CPU_TARGET = 0.05
STATUS_TARGET_S = 2.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def record_of(url: str, count: int, created: float) -> Any:
    from costguard.spot import array

    return array.ArrayRecord(
        "cg-bench-20261206-000000-abc123", url, f"0-{count - 1}", tuple(range(count)), count,
        created,
    )  # fmt: skip


def template(url: str, command: tuple[str, ...], created: float) -> Any:
    from datetime import UTC, datetime, timedelta

    from costguard.spot.job import JobSpec

    return JobSpec(
        job_id="cg-bench-20261206-000000-abc123", provider="local", gpu="A10G", gpu_count=1,
        regions=("aws:us-east-1",), spot=False, checkpoint_url=url, command=command,
        owner="bench", created_unix=created,
        expires_at=datetime.now(UTC) + timedelta(hours=2), total_steps=1000,
    )  # fmt: skip


# -- cpu --------------------------------------------------------------------------------


def cpu(tasks: int, window_s: float) -> None:
    from costguard.checkpoint.store import Store
    from costguard.pricing.catalog import Market
    from costguard.spot import array
    from costguard.spot.job import Job, save_job
    from costguard.spot.launcher.base import Offer
    from costguard.spot.launcher.local import LocalLauncher
    from costguard.spot.simulator import Simulation
    from costguard.spot.sweep import Sweep, Task, task_specs

    offer = Offer(
        "local", "aws:us-east-1", "g5.xlarge", Market.ON_DEMAND, Decimal("1.006"), "A10G", 1
    )
    with tempfile.TemporaryDirectory(prefix="costguard-sweep-") as tmp:
        url = str(Path(tmp) / "sweep")
        now = time.time()
        # Each task waits for the benchmark's word (a file) to exit 0: they all run
        # however long the machine takes to start them, then end together.
        over = Path(tmp) / "over"
        wait = f"import os, time\nwhile not os.path.exists({str(over)!r}): time.sleep(1)"
        command = (sys.executable, "-c", wait)
        record = record_of(url, tasks, now)
        made = []
        for index, spec in zip(record.indexes, task_specs(template(url, command, now), record),
                               strict=True):  # fmt: skip
            store = Store.open(spec.checkpoint_url)
            made.append(Task(index, store, save_job(store, Job(spec))))
        state = Path(tmp) / "state"
        env = {**os.environ, "COSTGUARD_LOCAL_DIR": str(state)}

        def make_launcher(_: object) -> LocalLauncher:  # as launch --array makes them
            launcher = LocalLauncher(Simulation(), job_started_unix=now, state_dir=state, env=env)
            launcher.notice_poll_max_s = array.notice_poll_max_s(record.concurrency)
            return launcher

        marks: dict[str, tuple[float, float]] = {}

        def sleep(seconds: float) -> None:
            time.sleep(seconds)
            running = sum(1 for t in sweep.tasks if t.job.current is not None)
            if running == tasks and "start" not in marks:
                marks["start"] = (time.process_time(), time.monotonic())
            elif (
                "start" in marks
                and "end" not in marks
                and time.monotonic() - marks["start"][1] >= window_s
            ):
                marks["end"] = (time.process_time(), time.monotonic())
                over.touch()

        sweep = Sweep(record, Store.open(url), made, [offer], make_launcher,
                      task_estimate_usd=Decimal(1), poll_s=0.5, sleep=sleep)  # fmt: skip
        started = time.monotonic()
        sweep.run()
        took = time.monotonic() - started
    if "end" not in marks:
        sys.exit(f"the {tasks} tasks never all ran for {window_s:.0f} s at once")
    (cpu0, wall0), (cpu1, wall1) = marks["start"], marks["end"]
    share = (cpu1 - cpu0) / (wall1 - wall0)
    print(f"controller of {tasks} local tasks, all running, poll 0.5 s:")
    print(f"  cpu {cpu1 - cpu0:.2f} s in {wall1 - wall0:.1f} s wall = {share:.1%} of one core "
          f"(the whole run took {took:.0f} s)")  # fmt: skip
    print(
        f"  target: <= {CPU_TARGET:.0%} of one core: {'met' if share <= CPU_TARGET else 'NOT met'}"
    )


# -- status -----------------------------------------------------------------------------


def seed(url: str, count: int) -> Any:
    """The array's record and its tasks (succeeded, running with a pace, pending), and
    their jobs as stored."""
    from costguard.checkpoint.pace import Pace, write_pace
    from costguard.checkpoint.store import Store
    from costguard.pricing.catalog import Market
    from costguard.spot import array
    from costguard.spot.job import Job, save_job
    from costguard.spot.launcher.base import Handle, Offer
    from costguard.spot.recovery import Attempt, AttemptOutcome
    from costguard.spot.sweep import task_specs

    now = time.time()
    record = record_of(url, count, now - 3600)
    offer = Offer("local", "aws:us-east-1", "g5.xlarge", Market.SPOT, Decimal("0.45"), "A10G", 1)
    specs = task_specs(template(url, ("python", "train.py"), now - 3600), record)

    base = Store.open(url)

    def write(index: int) -> tuple[int, Job]:
        spec = specs[index]
        store = base.child(array.task_name(index))
        handle = Handle("local", "aws:us-east-1", f"local-{index}")
        if index % 3 == 0:
            attempt = Attempt(
                1, offer, now - 3000, handle=handle, ended_unix=now - 600,
                outcome=AttemptOutcome.SUCCEEDED, exit_code=0, last_step=1000,
            )  # fmt: skip
            job = Job(spec, (attempt,), status="succeeded", reason="exit 0")
        elif index % 3 == 1:
            write_pace(store, Pace(400, 800.0, 400, now - 60, now - 900))
            job = Job(spec, (Attempt(1, offer, now - 900, handle=handle),))
        else:
            job = Job(spec)
        return index, save_job(store, job)

    with ThreadPoolExecutor(16) as pool:
        jobs = list(pool.map(write, range(count)))
    array.write_record(base, record)
    return record, jobs


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    """A moto server in a process of its own (in this one it would share the GIL with the
    reads it answers), once it answers."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):  # a minute at most
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return process, url
        time.sleep(0.2)
    process.kill()
    sys.exit("moto server did not start")


def moto_env(endpoint: str) -> dict[str, str]:
    """This process's environment reaching the moto server at ``endpoint`` (set here too)."""
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    os.environ.update(env)
    return env


def start_azurite() -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """Azurite's blob service (the suite's, under .ci-work) in a process of its own, once
    it answers, with a container ``bench``; this process's environment reaching it."""
    import adlfs  # type: ignore[import-untyped]
    from tests.helpers.stores import AZURITE_BIN, AZURITE_KEY, wait_for_http

    port = free_port()
    folder = tempfile.mkdtemp(prefix="costguard-azurite-")
    argv = [str(AZURITE_BIN), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location",
            folder, "--silent", "--skipApiVersionCheck", "--loose"]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_http(f"http://127.0.0.1:{port}/devstoreaccount1?comp=list")
    connection = (
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
        f"AccountKey={AZURITE_KEY};BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;"
    )
    adlfs.AzureBlobFileSystem(connection_string=connection).mkdir("bench")
    os.environ["AZURE_STORAGE_CONNECTION_STRING"] = connection
    return process, {**os.environ}


def status(count: int, where: str) -> None:
    if where == "azure":
        server, env = start_azurite()
        url, named = "az://bench/sweep", "Azurite (Azure Blob)"
    else:
        server, endpoint = start_moto()
        env = moto_env(endpoint)
        url, named = "s3://bench/sweep", "moto S3"
    try:
        if where == "s3":
            import boto3

            boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="bench")
        started = time.perf_counter()
        record, jobs = seed(url, count)
        print(f"seeded {count} tasks in {time.perf_counter() - started:.1f} s")
        before_s = cli_status(url, env)
        from costguard import contract
        from costguard.checkpoint.store import Store
        from costguard.spot.sweep import write_rollup

        base = Store.open(url)  # the running tasks' paces read, as the sweep does
        paces = {i: base.child(f"task-{i}").get(contract.PACE_FILE).decode() for i in
                 range(1, count, 3)}  # fmt: skip
        write_rollup(base, record.array_id, jobs, paces)
        after_s = cli_status(url, env)
    finally:
        server.kill()
        server.wait()
    running = (count + 1) // 3
    print(f"jobs status --format json of a {count}-task array on {named}, a fresh process:")
    print(f"  without the roll-up ({count} job.json + {running} pace GETs): {before_s:.2f} s")
    verdict = "met" if after_s <= STATUS_TARGET_S else "NOT met"
    print(f"  with the roll-up (2 GETs and a listing): {after_s:.2f} s, "
          f"{before_s / after_s:.2f}x faster")  # fmt: skip
    print(f"  target <= {STATUS_TARGET_S:.0f} s with the roll-up: {verdict}")


def cli_status(url: str, env: dict[str, str]) -> float:
    """Seconds ``costguard jobs status URL --format json`` takes in a fresh process."""
    import json

    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "costguard", "jobs", "status", url, "--format", "json"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    took = time.perf_counter() - start
    if done.returncode != 0 or not json.loads(done.stdout)["tasks"]:
        sys.exit(f"jobs status failed: {done.stderr[-2000:]}")
    return took


# -- polls ------------------------------------------------------------------------------


def polls(count: int) -> None:
    import boto3

    from costguard.spot.launcher.aws import AwsLauncher
    from costguard.spot.launcher.base import Launcher

    class PerInstance(AwsLauncher):
        """The AWS launcher describing each instance alone, as every poll did before."""

        statuses = Launcher.statuses

    server, endpoint = start_moto()
    moto_env(endpoint)
    try:
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="bench")
        iam = boto3.client("iam", region_name="us-east-1")
        iam.create_instance_profile(InstanceProfileName="costguard-instance")
        figures: dict[str, tuple[list[int], list[float]]] = {}
        for name, kind in (("one call per task", PerInstance), ("one call", AwsLauncher)):
            figures[name] = one_sweep_of_polls(count, kind, f"s3://bench/{len(figures)}")
    finally:
        server.kill()
        server.wait()
    print(f"a sweep's polls of {count} tasks running on EC2 (moto), 3 polls each:")
    for name, (calls, seconds) in figures.items():
        shown = ", ".join(str(c) for c in calls)
        print(f"  {name}: DescribeInstances per poll {shown}; "
              f"{sum(seconds) / len(seconds):.2f} s a poll")  # fmt: skip


def one_sweep_of_polls(count: int, kind: type, url: str) -> tuple[list[int], list[float]]:
    """The DescribeInstances calls of each poll while every task runs, and those polls'
    seconds, with a launcher of ``kind``."""
    from dataclasses import replace

    from costguard.checkpoint.store import Store
    from costguard.pricing.catalog import Market
    from costguard.spot.job import ExitRecord, Job, save_job, write_exit_record
    from costguard.spot.launcher.base import Offer
    from costguard.spot.sweep import Sweep, Task, task_specs

    calls: list[int] = []
    launcher = kind(regions=["us-east-1"])
    launcher._ec2("us-east-1").meta.events.register(
        "before-send.ec2.DescribeInstances", lambda **_: calls.append(1)
    )
    offer = Offer("aws", "us-east-1", "g5.xlarge", Market.SPOT, Decimal("0.45"), "A10G", 1)
    options = {"image": "ami-12345678", "instance_profile": "costguard-instance"}
    now = time.time()
    spec = replace(template(url, ("python", "train.py"), now), provider="aws",
                   regions=("us-east-1",), spot=True, options=options)  # fmt: skip
    record = record_of(url, count, now)
    tasks = []
    for index, task in zip(record.indexes, task_specs(spec, record), strict=True):
        store = Store.open(task.checkpoint_url)
        tasks.append(Task(index, store, save_job(store, Job(task))))
    seen: list[int] = []
    seconds: list[float] = []
    mark = [time.monotonic()]
    was_running = [False]  # the poll that launched the last task is not counted

    def sleep(_: float) -> None:
        running = all(t.job.current is not None for t in sweep.tasks)
        if running and was_running[0] and len(seen) < 3:
            seen.append(len(calls))
            seconds.append(time.monotonic() - mark[0])
            calls.clear()
        if len(seen) == 3:  # every instance's script is done
            for task in sweep.tasks:
                current = task.job.current
                if current is not None:
                    exit_record = ExitRecord(current.number, 0, None, time.time(),
                                             job_id=task.job.spec.job_id)  # fmt: skip
                    write_exit_record(task.store, exit_record)
        calls.clear()
        was_running[0] = running
        mark[0] = time.monotonic()

    sweep = Sweep(record, Store.open(url), tasks, [offer], lambda _: launcher,
                  task_estimate_usd=Decimal(1), poll_s=0.0, sleep=sleep)  # fmt: skip
    jobs = sweep.run()
    if any(j.status != "succeeded" for j in jobs):
        sys.exit(f"the sweep did not succeed: {[j.reason for j in jobs if j.reason][:3]}")
    return seen, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    one = sub.add_parser("cpu")
    one.add_argument("--tasks", type=int, default=100)
    one.add_argument("--window", type=float, default=20.0)
    two = sub.add_parser("status")
    two.add_argument("--tasks", type=int, default=1000)
    two.add_argument("--store", choices=("s3", "azure"), default="s3")
    three = sub.add_parser("polls")
    three.add_argument("--tasks", type=int, default=100)
    args = parser.parse_args()
    if args.what == "cpu":
        cpu(args.tasks, args.window)
    elif args.what == "polls":
        polls(args.tasks)
    else:
        status(args.tasks, args.store)


if __name__ == "__main__":
    main()
