"""Acceptance through `costguard run`: real training children, real signals, real notices.

* exact resume: killed by SIGTERM/SIGUSR1 at random steps 3 times, resumed each time,
  the final weights are bitwise identical to an uninterrupted run (local store, moto S3);
* notices: each cloud's metadata service announces a preemption while training; the
  emergency save is durable before the deadline and the resume loses zero steps;
* bad input fails before the script starts.
"""

from __future__ import annotations

import functools
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from email.utils import formatdate
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from costguard.checkpoint.store import Store
from costguard.cli.checkpoint import checkpoint_group
from tests.helpers.metadata import AckState, MetadataState, azure_event
from tests.helpers.processes import signal_side_thread
from tests.helpers.stores import make_s3_bucket
from tests.helpers.training import (
    TRAIN_SCRIPT,
    Followed,
    SharedRuns,
    assert_bitwise_equal,
    costguard_command,
    manifests,
    run_python,
    train_reference,
)

STEPS = 40
TIMEOUT_S = 120


class Child(Followed):
    """A `costguard run -- python train_script.py` process whose stdout lines we follow."""

    def __init__(self, url: str, out: Path, env: dict[str, str], *extra: str) -> None:
        command = [*costguard_command(), "run", "--checkpoint", url, *extra, "--"]
        command += [sys.executable, str(TRAIN_SCRIPT), "--steps", str(STEPS), "--out", str(out)]
        super().__init__([*command, "--sleep", "0.05"], env, TIMEOUT_S)

    def steps(self) -> list[int]:
        return [int(line.split()[1]) for line in self.lines if line.startswith("STEP ")]

    def ready(self) -> int:
        return int(next(line for line in self.lines if line.startswith("READY")).split()[1])


def reached(line: str, step: int) -> bool:
    return line.startswith("STEP ") and int(line.split()[1]) >= step


@pytest.mark.slow
@pytest.mark.parametrize("store", ["local", "s3"])
def test_exact_resume_after_three_signals(
    store: str,
    tmp_path: Path,
    train_env: Callable[..., dict[str, str]],
    request: pytest.FixtureRequest,
    shared_runs: SharedRuns,
) -> None:
    env = train_env()
    if store == "s3":
        request.getfixturevalue("aws_env")
        make_s3_bucket(os.environ["AWS_ENDPOINT_URL"], "resume")
        env.update({k: v for k, v in os.environ.items() if k.startswith("AWS_")})
        url = "s3://resume/run"
    else:
        url = str(tmp_path / "ckpt")
    reference = train_reference(shared_runs, STEPS, env, TIMEOUT_S)
    seed = random.randrange(10**6)
    rng = random.Random(seed)
    out = tmp_path / "resumed.pt"
    done = 0
    for attempt, sig in enumerate((signal.SIGTERM, signal.SIGUSR1, signal.SIGTERM)):
        child = Child(url, out, env, "--every-steps", "4")
        target = done + rng.randint(2, 8)
        child.read_until(functools.partial(reached, step=target))
        child.proc.send_signal(sig)
        code = child.finish()
        assert code == 75, (seed, attempt, child.lines[-3:], child.stderr())
        # The save happens at the step boundary after the signal: the step being trained
        # when it arrived is finished and saved before its STEP line is printed.
        assert done <= child.ready() <= done + 1, (seed, attempt)
        done = max(child.steps())
    final = Child(url, out, env, "--every-steps", "4")
    assert final.finish() == 0, final.stderr()
    assert done <= final.ready() <= done + 1, f"lost steps (seed {seed})"
    assert_bitwise_equal(torch.load(out, weights_only=True), reference)


def _notice(cloud: str, state: MetadataState, deadline: float) -> None:
    if cloud == "aws":
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(deadline))
        state.aws_action = {"action": "terminate", "time": when}
    elif cloud == "gcp":
        state.gcp_preempted = True
    else:
        state.azure_events = [
            azure_event("A1", [state.azure_vm_name], formatdate(deadline, usegmt=True))
        ]


@pytest.mark.slow
@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_a_cloud_notice_saves_before_the_deadline_and_loses_no_step(
    cloud: str,
    tmp_path: Path,
    metadata_server: tuple[str, MetadataState],
    watched_env: Callable[[str], dict[str, str]],
) -> None:
    _, state = metadata_server
    env = watched_env(cloud)
    url = str(tmp_path / "ckpt")
    child = Child(url, tmp_path / "out.pt", env, "--every-steps", "1000")
    child.read_until(lambda line: line == "STEP 5")
    deadline = time.time() + 30
    _notice(cloud, state, deadline)
    assert child.finish() == 75, child.stderr()
    last = max(child.steps()) + 1  # the step in training when the notice came is saved too
    saved = manifests(url)
    assert [m["step"] for m in saved] in ([last], [last - 1])  # next step boundary
    assert saved[0]["reason"] == f"notice:{cloud}-preempt" or cloud == "aws"
    assert saved[0]["created_unix"] < deadline
    resumed = Child(url, tmp_path / "out.pt", {**env, "COSTGUARD_CLOUD": "none"})
    resumed.read_until(lambda line: line.startswith("READY"))
    resumed.proc.kill()
    resumed.finish()
    assert resumed.ready() == saved[0]["step"] >= last - 1  # zero lost steps
    assert any("GET" in r for r in state.requests)


@pytest.mark.slow
def test_a_gcp_host_maintenance_notice_saves_and_exits_75(
    tmp_path: Path,
    metadata_server: tuple[str, MetadataState],
    watched_env: Callable[[str], dict[str, str]],
) -> None:
    _, state = metadata_server
    url = str(tmp_path / "ckpt")
    child = Child(url, tmp_path / "out.pt", watched_env("gcp"), "--every-steps", "1000")
    child.read_until(lambda line: line == "STEP 5")
    state.gcp_maintenance = "TERMINATE_ON_HOST_MAINTENANCE"
    assert child.finish() == 75, child.stderr()
    (saved,) = manifests(url)
    assert saved["reason"] == "notice:gcp-stop"
    assert saved["step"] >= 5


@pytest.mark.slow
def test_a_siblings_azure_eviction_changes_nothing_here(
    tmp_path: Path,
    acking_metadata_server: tuple[str, AckState],
    train_env: Callable[..., dict[str, str]],
) -> None:
    # Scheduled Events reach every VM of the availability set / placement group; this one
    # concerns vm2 only (its Resources), listed from before the job starts to its end.
    base, state = acking_metadata_server
    when = formatdate(time.time() + 30, usegmt=True)
    state.azure_events = [azure_event("S1", ["vm2"], when)]
    env = train_env(
        COSTGUARD_CLOUD="azure", COSTGUARD_NOTICE_POLL_S="0.05", COSTGUARD_AZURE_METADATA_URL=base
    )
    url = str(tmp_path / "ckpt")
    child = Child(url, tmp_path / "out.pt", env, "--every-steps", "1000")
    assert child.finish() == 0, child.stderr()
    assert any(line.startswith("DONE") for line in child.lines)  # trained to the end
    polls = [r for r in state.requests if r.startswith("GET /metadata/scheduledevents")]
    assert len(polls) >= 2, state.requests  # the watcher saw the event, more than once
    assert not [m for m in manifests(url) if str(m["reason"]).startswith("notice:")]
    assert not [r for r in state.requests if r.startswith("POST")]
    assert state.started == []
    assert state.azure_events[0]["EventStatus"] == "Scheduled"


def test_bad_input_fails_before_the_script_starts(
    tmp_path: Path, train_env: Callable[..., dict[str, str]], aws_env: str
) -> None:
    marker = tmp_path / "started"
    script = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    env = train_env(**{k: v for k, v in os.environ.items() if k.startswith("AWS_")})
    (tmp_path / "file").write_text("")
    cases = [
        (["--checkpoint", "s3://no-such-bucket/run"], "does not exist"),
        (["--checkpoint", str(tmp_path / "file" / "run")], "cannot write|does not exist"),
        (["--checkpoint", "ftp://host/x"], "scheme|not one"),
        (["--checkpoint", str(tmp_path / "ok"), "--every-steps", "0"], "every-steps"),
        (["--checkpoint", str(tmp_path / "ok"), "--cloud", "mars"], "cloud"),
    ]
    for args, message in cases:
        done = subprocess.run(
            [*costguard_command(), "run", *args, "--", *script],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        assert done.returncode == 2, (args, done.stderr)
        assert "Error:" in done.stderr
        assert re.search(message, done.stderr), done.stderr
        assert not marker.exists()
    missing = subprocess.run(
        [*costguard_command(), "run", "--checkpoint", str(tmp_path / "ok"), "--", "no-such-cmd-x"],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert missing.returncode == 2
    assert "cannot start" in missing.stderr


def test_exit_code_and_signal_forwarding(
    tmp_path: Path, train_env: Callable[..., dict[str, str]]
) -> None:
    child = (
        "import os, signal, sys, time\n"
        "assert os.environ['COSTGUARD_CHECKPOINT_URL'].endswith('ck')\n"
        "signal.signal(signal.SIGUSR1, lambda *a: sys.exit(42))\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        run_python(tmp_path / "ck", child),
        env=train_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "up"
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=30) == 42
    proc.stdout.close()
    code = subprocess.run(
        run_python(tmp_path / "ck", "import os; os.kill(os.getpid(), 9)"),
        env=train_env(),
        timeout=TIMEOUT_S,
    ).returncode
    assert code == 137


#: A script that exits 42 on SIGUSR1, 43 on SIGTERM, and 75 once `costguard run` has
#: relayed a notice (to its relay file); otherwise it waits a minute and exits 0.
SIGNALLED_SCRIPT = """\
import os, signal, sys, time
signal.signal(signal.SIGUSR1, lambda *a: sys.exit(42))
signal.signal(signal.SIGTERM, lambda *a: sys.exit(43))
notices = os.environ["COSTGUARD_NOTICE_FILE"]
print("up", flush=True)
for _ in range(1200):
    if os.path.exists(notices) and os.path.getsize(notices):
        sys.exit(75)
    time.sleep(0.05)
"""


@pytest.mark.parametrize(
    ("mode", "sig", "code"),
    [
        ("forward", signal.SIGUSR1, 42),  # passed on to the script
        ("forward", signal.SIGTERM, 43),
        ("relay", signal.SIGTERM, 75),  # a notice to every process (torchrun's workers)
        ("auto", signal.SIGINT, 75),  # Ctrl-C: a notice, in every mode
    ],
)
def test_a_signal_that_lands_on_a_side_thread_is_acted_on_at_once(
    tmp_path: Path,
    train_env: Callable[..., dict[str, str]],
    mode: str,
    sig: signal.Signals,
    code: int,
) -> None:
    """The kernel may hand a signal sent to `costguard run` to any of its threads. When it
    was not the main one, the main thread, blocked waiting for the script, ran the handler
    only after the script had ended: a SIGTERM to a torchrun job on a busy machine was
    never relayed, and the ranks trained on to their last step (exit 0, not 75)."""
    command = [*costguard_command(), "run", "--checkpoint", str(tmp_path / "ck")]
    command += ["--signals", mode, "--", sys.executable, "-c", SIGNALLED_SCRIPT]
    proc = subprocess.Popen(
        command, env=train_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "up"
        signal_side_thread(proc.pid, sig)
        # The script would wait a minute: within 20 s, only the signal, passed on or
        # relayed as a notice, ends it.
        assert proc.wait(timeout=20) == code
    finally:
        if proc.poll() is None:  # the script too: it holds stdout, in its own group
            for child in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split():
                os.kill(int(child), signal.SIGKILL)
            proc.kill()
        _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err, err


def test_the_job_is_registered_for_the_agent_while_it_runs(
    tmp_path: Path, train_env: Callable[..., dict[str, str]]
) -> None:
    jobs = tmp_path / "jobs"
    # At its first look (costguard run may not have learned the script's pid yet: the job
    # is then registered under costguard run's own), and then under its own pid.
    child = (
        "import os, sys, time\n"
        "jobs = os.environ['COSTGUARD_JOBS_DIR']\n"
        "first = set(os.listdir(jobs))\n"
        "mine, run = f'{os.getpid()}.pid', f'{os.getppid()}.pid'\n"
        "if not first or not first <= {mine, run}: sys.exit(3)\n"
        "deadline = time.monotonic() + 30\n"
        "while os.listdir(jobs) != [mine] and time.monotonic() < deadline: time.sleep(0.01)\n"
        "sys.exit(0 if os.listdir(jobs) == [mine] else 4)\n"
    )
    env = {**train_env(), "COSTGUARD_JOBS_DIR": str(jobs)}
    done = subprocess.run(
        run_python(tmp_path / "ck", child),
        env=env,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0  # the child saw the job registered, then its own pid
    assert list(jobs.iterdir()) == []  # and it is gone once the job ended
    unwritable = {**env, "COSTGUARD_JOBS_DIR": "/proc/costguard-no-such-dir"}
    done = subprocess.run(
        run_python(tmp_path / "ck", "pass"),
        env=unwritable,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0  # no agent there: nothing registered, nothing fails


def test_checkpoint_ls_and_verify(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    store.put("ckpt-000000000001-00000000/state.pt", b"abc")
    import hashlib

    from costguard.checkpoint.manifest import Manifest, ObjectEntry

    m = Manifest(
        "ckpt-000000000001-00000000",
        1,
        0.0,
        (ObjectEntry("state.pt", 3, hashlib.sha256(b"abc").hexdigest()),),
    )
    store.put(m.manifest_path, m.to_json().encode())
    store.put("ckpt-000000000002-00000000/state.pt", b"partial")
    runner = CliRunner()
    ls = runner.invoke(checkpoint_group, ["ls", str(tmp_path), "--format", "json"])
    assert ls.exit_code == 0
    entries = json.loads(ls.stdout)["checkpoints"]
    assert [(e["step"], e["status"], e["latest"]) for e in entries] == [
        (2, "partial", False),
        (1, "complete", True),
    ]
    ok = runner.invoke(checkpoint_group, ["verify", str(tmp_path)])
    assert ok.exit_code == 0
    assert "ok" in ok.stdout
    store.put("ckpt-000000000001-00000000/state.pt", b"abd")  # same size, other bytes
    bad = runner.invoke(checkpoint_group, ["verify", str(tmp_path)])
    assert bad.exit_code == 1
    assert "BAD" in bad.stdout
    empty = runner.invoke(checkpoint_group, ["verify", str(tmp_path / "none")])
    assert empty.exit_code == 1
