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
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from costguard.checkpoint.pace import Pace
from costguard.checkpoint.store import Store
from tests.billing.test_focus import HANDMADE
from tests.helpers.training import child_env
from tests.spot.test_hostile_records import running_doc

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
