"""Every command that reads a job's records, on records an attacker wrote (issue 43's
acceptance): hostile job.json, pace, stop and exit records; each command exits 0 or 2,
never "unexpected", never a traceback, within 10 s, and a huge record is never read
whole (bounded memory). Derandomized: CI sees the same examples every run."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from costguard import contract
from costguard.checkpoint.pace import Pace
from costguard.checkpoint.store import Store
from costguard.spot import array
from costguard.spot.job import Job, job_doc
from costguard.spot.launcher.base import Handle
from costguard.spot.recovery import Attempt
from costguard.spot.sweep import rollup_copy, task_specs
from tests.billing.test_focus import HANDMADE
from tests.helpers.stores import make_s3_bucket
from tests.helpers.training import child_env
from tests.spot.test_hostile_records import running_doc
from tests.spot.test_offers_and_job import spec
from tests.spot.test_simulator import ON_DEMAND

pytestmark = pytest.mark.slow

#: Values an attacker puts in a field. "__BIG__" becomes a 400-digit number in the text.
HOSTILE: list[object] = [
    math.nan, math.inf, -math.inf, 1e308, -1e12, -1, 0, 2**63, 2**64, "__BIG__", "", "-5",
    "abc", "NaN", "1E+400", "\x1b]0;owned\x07", "a\nb", "[/bad]", "x" * 70_000, [], {}, None,
    True, [[[[[[]]]]]], {"a": [1] * 5000}, "2026-13-45T99:99:99",
]  # fmt: skip
#: What is done to a whole file instead of a field.
WHOLE = [b"", b"{", b"\xff\xfe", b"[" * 100_000, b"null", b'{"version": 1}', b"1e999"]


def paths(doc: object, prefix: str = "") -> list[str]:
    """Every field's dotted path in ``doc`` (lists by index)."""
    found = [prefix] if prefix else []
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += paths(value, f"{prefix}.{key}" if prefix else key)
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            found += paths(value, f"{prefix}.{index}" if prefix else str(index))
    return found


def set_path(doc: Any, path: str, value: object) -> None:
    """``value`` at ``path``, unless an earlier change replaced a field on the way (a
    list made ``{}``): that path is gone, and nothing is set."""
    *parents, last = path.split(".")
    for key in parents:
        try:
            doc = doc[int(key)] if isinstance(doc, list) else doc[key]
        except (KeyError, IndexError, TypeError):
            return
    if isinstance(doc, list) and int(last) < len(doc):
        doc[int(last)] = value
    elif isinstance(doc, dict):
        doc[last] = value


def hostile_bytes(
    base: dict[str, Any], changes: list[tuple[str, object]], whole: bytes | None
) -> bytes:
    if whole is not None:
        return whole
    doc = json.loads(json.dumps(base))
    for path, value in changes:
        set_path(doc, path, value)
    return json.dumps(doc).replace('"__BIG__"', "1" + "0" * 400).encode()


NOW = time.time()
JOB = running_doc("STORE")
PACE = json.loads(
    Pace(100, 50.0, 120, NOW, NOW - 100, total_steps=2000, job_id="cg-test-1").to_json()
)
STOP = {"job_id": "cg-test-1", "attempt": 1, "reason": "x", "requested_unix": NOW, "proof": ""}
EXIT = {"attempt": 1, "exit_code": 0, "last_step": 5, "finished_unix": NOW, "job_id": "cg-test-1"}


def record(base: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """A record: the valid one with up to three fields made hostile, or a hostile file."""
    changes = st.lists(
        st.tuples(st.sampled_from(paths(base)), st.sampled_from(HOSTILE)), max_size=3
    )
    whole = st.one_of(st.none(), st.none(), st.none(), st.sampled_from(WHOLE))
    return st.builds(lambda c, w: hostile_bytes(base, c, w), changes, whole)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(str(tmp_path / "ckpt"))


def reproducible(examples: int) -> Any:
    """The same ``examples`` every run (derandomized), reported as found (no shrinking)."""
    return settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


def check(result: Any, started: float, what: str) -> None:
    assert result.exit_code in (0, 2), (what, result.exit_code, result.stderr[-2000:])
    assert "unexpected" not in result.stderr, (what, result.stderr[-2000:])
    assert "Traceback" not in result.stdout + result.stderr, what
    assert time.monotonic() - started < 10, what


@reproducible(25)
@given(job=record(JOB), pace=record(PACE), stop=record(STOP), exit_=record(EXIT))
def test_every_reader_of_job_records_survives_hostile_records(
    run_cli: Callable[..., Any], aws_env: str, store: Store, job: bytes, pace: bytes,
    stop: bytes, exit_: bytes,
) -> None:  # fmt: skip
    store.put("job/job.json", job.replace(b"STORE", store.url.encode()))
    store.put("job/pace.json", pace)
    store.put("job/stop.json", stop)
    store.put("job/attempt-1.exit.json", exit_)
    commands = [
        ("jobs", "status", store.url),
        ("jobs", "status", store.url, "--format", "json"),
        ("launch", "--attach", store.url, "--force"),  # no terminal, no --yes: declined
        ("burn", "--job", store.url, "--region", "us-east-1", "--budget", "1000000"),
        ("estimate", "--from-run", store.url, "--gpu", "a10g", "--speedup", "1"),
        ("spend", str(HANDMADE), "--job", store.url),
        # A pilot whose script records no pace: only the forged one is there to read.
        (
            "pilot",
            "--steps",
            "10",
            "--checkpoint",
            store.url,
            "--gpu",
            "a10g",
            "--speedup",
            "1",
            "--",
            sys.executable,
            "-c",
            "pass",
        ),
    ]
    for command in commands:
        started = time.monotonic()
        check(run_cli(*command), started, " ".join(command[:2]))


@reproducible(4)
@given(stop=record(STOP), exit_=record(EXIT), pace=record(PACE))
def test_costguard_run_under_launch_goes_on_past_hostile_records(
    tmp_path: Path, store: Store, stop: bytes, exit_: bytes, pace: bytes
) -> None:
    """``costguard run`` as an attempt of a launched job (it polls stop.json and writes
    the exit record) resumes and finishes with the script's own exit code."""
    store.put("job/stop.json", stop)
    store.put("job/attempt-1.exit.json", exit_)
    store.put("job/pace.json", pace)
    env = child_env(tmp_path, COSTGUARD_JOB_ID="cg-test-1", COSTGUARD_JOB_ATTEMPT="1",
                    COSTGUARD_JOBS_DIR=str(tmp_path / "jobs"))  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "costguard", "run", "--checkpoint", store.url, "--", sys.executable,
         "-c", "import time; time.sleep(1.5)"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "unexpected" not in done.stderr
    assert "Traceback" not in done.stderr
    assert time.monotonic() - started < 20  # a Python start-up, the script's 1.5 s


def test_a_huge_record_is_never_read_whole(tmp_path: Path) -> None:
    """A 300 MB job.json peaked at 912 MB of memory: every reader stops at its bound."""
    store = Store.open(str(tmp_path / "ckpt"))
    (tmp_path / "ckpt" / "job").mkdir(parents=True)
    for name in ("job.json", "pace.json", "stop.json"):
        with (tmp_path / "ckpt" / "job" / name).open("wb") as file:
            file.write(b'{"version": 1, "x": "')
            for _ in range(64):
                file.write(b"x" * (1024 * 1024))
            file.write(b'"}')
    env = child_env(tmp_path)
    wrapper = (
        "import resource, subprocess, sys\n"
        "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
        "print(done.returncode, peak, 'unexpected' in done.stderr)\n"
    )
    for command in (["jobs", "status", store.url],
                    ["estimate", "--from-run", store.url, "--gpu", "a10g"]):  # fmt: skip
        out = subprocess.run(
            [sys.executable, "-c", wrapper, sys.executable, "-m", "costguard", *command],
            env=env, capture_output=True, text=True, timeout=60, check=True,
        ).stdout.split()  # fmt: skip
        code, peak_kib, unexpected = int(out[0]), int(out[1]), out[2] == "True"
        assert code == 2, command
        assert not unexpected
        assert peak_kib < 200 * 1024, (command, peak_kib)  # the object is 64 MiB
    assert (tmp_path / "ckpt" / "job" / "job.json").stat().st_size > 64 * 1024 * 1024


# -- gangs (launch --nodes) and arrays (launch --array), added since -----------------------


def gang_doc(url: str) -> dict[str, Any]:
    """A running gang's job.json: 2 nodes of one attempt, 600 s old."""
    now = time.time()
    nodes = tuple(
        Handle("local", "aws:us-east-1", f"local-{r}", extra={"pid": str(r)}) for r in range(2)
    )
    attempt = Attempt(1, ON_DEMAND, now - 600, handle=nodes[0], node_count=2, nodes=nodes)
    job = Job(spec(url, spot=False, simulation=None, created_unix=now - 605, total_steps=2000,
                   nodes=2, procs_per_node=2), attempts=(attempt,))  # fmt: skip
    return json.loads(json.dumps(job_doc(job), default=str))


GANG = gang_doc("STORE")
NODE_EXIT = {**EXIT, "node": 1}


def reads(job_url: str) -> list[tuple[str, ...]]:
    """The commands that read the job (or array) at ``job_url``."""
    return [
        ("jobs", "status", job_url),
        ("jobs", "status", job_url, "--format", "json"),
        ("launch", "--attach", job_url, "--force"),  # no terminal, no --yes: declined
        ("burn", "--job", job_url, "--region", "us-east-1", "--budget", "1000000"),
        ("estimate", "--from-run", job_url, "--gpu", "a10g", "--speedup", "1"),
        ("spend", str(HANDMADE), "--job", job_url),
    ]


#: Each record as written, with nothing made hostile (every test's first example).
PLAIN = {"job": GANG, "node0": EXIT, "node1": NODE_EXIT, "pace": PACE, "stop": STOP}


def genuine(**given_: bytes) -> bool:
    """Whether every record given is the plain one (``PLAIN``) as the test writes it."""
    return all(given_[k] == hostile_bytes(PLAIN[k], [], None) for k in given_)


@reproducible(12)
@example(**{k: hostile_bytes(v, [], None) for k, v in PLAIN.items()})
@given(job=record(GANG), node0=record(EXIT), node1=record(NODE_EXIT), pace=record(PACE),
       stop=record(STOP))  # fmt: skip
def test_every_reader_of_a_gangs_records_survives_hostile_records(
    run_cli: Callable[..., Any], aws_env: str, store: Store, job: bytes, node0: bytes,
    node1: bytes, pace: bytes, stop: bytes,
) -> None:  # fmt: skip
    """``launch --nodes``: its job.json (nodes, handles, node count), each node's exit
    record (``job/attempt-1.node-R.exit.json``), its pace and stop request."""
    store.put("job/job.json", job.replace(b"STORE", store.url.encode()))
    store.put(contract.exit_record_path(1, 0), node0)
    store.put(contract.exit_record_path(1, 1), node1)
    store.put("job/pace.json", pace)
    store.put("job/stop.json", stop)
    for command in reads(store.url):
        started = time.monotonic()
        result = run_cli(*command)
        check(result, started, " ".join(command[:2]))
        if command[:2] == ("jobs", "status") and genuine(job=job, node0=node0, node1=node1):
            assert result.exit_code == 0, result.stderr[-2000:]  # the setup is a gang's
            assert "2 nodes" in result.stdout or '"nodes": 2' in result.stdout


def array_base(url: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """An array of 2 tasks at ``url`` as the sweep writes it: its record, task 0's
    job.json (running; task 1's is pending) and the roll-up of both."""
    now = time.time()
    record = array.ArrayRecord("cg-test-1", url, "0-1", (0, 1), 2, now - 605)
    running, pending = task_specs(spec(url, spot=False, simulation=None, total_steps=2000,
                                       created_unix=now - 605), record)  # fmt: skip
    attempt = Attempt(
        1, ON_DEMAND, now - 600, handle=Handle("local", "aws:us-east-1", "l-1", extra={"pid": "1"})
    )
    jobs = [Job(running, attempts=(attempt,)), Job(pending)]
    array_doc = json.loads(contract.dump(record.document(), contract.ARRAY, "array"))
    rollup = {"version": contract.VERSION, "array_id": "cg-test-1",
              "tasks": [{"index": i, "job": rollup_copy(j), "pace": ""}
                        for i, j in enumerate(jobs)]}  # fmt: skip
    return array_doc, json.loads(rollup_copy(jobs[0])), rollup


ARRAY_DOC, TASK_JOB, ROLLUP = array_base("s3://sweep/array")
PLAIN.update(record_=ARRAY_DOC, task=TASK_JOB)


@reproducible(8)
@example(
    **{k: hostile_bytes(PLAIN[k], [], None) for k in ("record_", "task", "pace", "stop")},
    rollup=hostile_bytes(ROLLUP, [], None), exit_=hostile_bytes(EXIT, [], None), copies=True,
)  # fmt: skip
@given(record_=record(ARRAY_DOC), task=record(TASK_JOB), rollup=record(ROLLUP),
       pace=record(PACE), stop=record(STOP), exit_=record(EXIT), copies=st.booleans())  # fmt: skip
def test_every_reader_of_an_arrays_records_survives_hostile_records(
    run_cli: Callable[..., Any], aws_env: str, record_: bytes, task: bytes, rollup: bytes,
    pace: bytes, stop: bytes, exit_: bytes, copies: bool,
) -> None:  # fmt: skip
    """``launch --array`` on S3 (moto), where status takes a task from the roll-up when
    its copy's MD5 is the one listed: the array's record, a task's job.json, pace, exit
    record and the roll-up hostile, and (``copies``) the roll-up holding the very bytes
    of the hostile task records, so that they are used and read through the bounded
    reader."""
    make_s3_bucket(aws_env, "sweep")
    base = Store.open("s3://sweep/array")
    task0 = Store.open("s3://sweep/array/task-0")
    base.put(contract.ARRAY_FILE, record_)
    task0.put("job/job.json", task)
    task0.put("job/pace.json", pace)
    task0.put("job/attempt-1.exit.json", exit_)
    Store.open("s3://sweep/array/task-1").put("job/job.json", ROLLUP["tasks"][1]["job"].encode())
    base.put("job/stop.json", stop)
    if copies:
        copy = {"index": 0, "job": task.decode("latin-1"), "pace": pace.decode("latin-1")}
        rollup = json.dumps({**ROLLUP, "tasks": [copy, ROLLUP["tasks"][1]]}).encode()
    base.put(contract.ROLLUP_FILE, rollup)
    for command in [*reads(base.url), ("jobs", "status", task0.url)]:
        started = time.monotonic()
        result = run_cli(*command)
        check(result, started, " ".join(command[:2]))
        if command[:2] == ("jobs", "status") and genuine(record_=record_, task=task, pace=pace):
            assert result.exit_code == 0, result.stderr[-2000:]  # the setup is an array's


@pytest.mark.parametrize("record_path", ["job/job.json", contract.ARRAY_FILE])
def test_an_empty_record_on_s3_is_named_not_a_failed_read(
    run_cli: Callable[..., Any], aws_env: str, record_path: str
) -> None:
    """A bounded read of an empty object is a range S3 cannot satisfy (HTTP 416): jobs
    status exited 1, "reading job/array.json ... failed", as for a store it cannot reach."""
    make_s3_bucket(aws_env, "empty")
    store = Store.open("s3://empty/job")
    store.put(record_path, b"")
    result = run_cli("jobs", "status", store.url)
    assert result.exit_code == 2, result.stderr
    assert "failed" not in result.stderr
    assert record_path in result.stderr
