"""`costguard launch --provider local` end to end: a real torch loop under `costguard run`,
real notices over the simulator's IMDSv2, real SIGKILLs, and a controller killed mid-job."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import torch

from costguard.checkpoint.supervisor import record_exit
from costguard.errors import CostguardError, InputError
from costguard.money import format_usd
from costguard.plots import COST_COLOR, HEIGHT_PX, ON_DEMAND_COLOR, PREEMPTION_COLOR, WIDTH_PX
from costguard.spot.job import ENV_JOB_ATTEMPT, ENV_JOB_ID, Simulation
from costguard.spot.launcher.base import LaunchSpec, Market, Offer
from costguard.spot.launcher.local import (
    EPHEMERAL_LOW,
    RENDEZVOUS_LOW,
    LocalLauncher,
    pid_alive,
    rendezvous_port,
)
from tests.cli.test_widths import read_screen
from tests.helpers.output import WIDTHS, assert_commands_whole, assert_fits, read_png
from tests.helpers.training import TRAIN_SCRIPT, SharedRuns, assert_bitwise_equal, train_reference
from tests.helpers.waiting import wait_for
from tests.test_plots import blobs, rgb

#: Every child process is bounded by this (the machine may be shared and slow).
TIMEOUT_S = 600
#: A line that is a command in backticks alone (after its indent and label).
COMMAND = re.compile(r"\s*(\S+: )?`[^`]*`\S*")


def launch_argv(*args: str) -> list[str]:
    """``python -m costguard launch ARGS`` with this interpreter."""
    return [sys.executable, "-m", "costguard", "launch", *args]


def train_command(out: Path, steps: int, sleep: float = 0.05) -> list[str]:
    """The seeded torch training script (tests/checkpoint/train_script.py)."""
    return [
        sys.executable,
        str(TRAIN_SCRIPT),
        "--steps",
        str(steps),
        "--sleep",
        str(sleep),
        "--out",
        str(out),
    ]


def read_job(url: Path) -> dict[str, object]:
    """``job/job.json`` of a local checkpoint folder."""
    data: dict[str, object] = json.loads((url / "job" / "job.json").read_text())
    return data


def attempt_lines(state_dir: Path, job_id: str, attempt: int) -> list[str]:
    """The output lines of a local attempt."""
    return (state_dir / job_id / f"attempt-{attempt}.log").read_text().splitlines()


def steps_of(lines: list[str]) -> tuple[int, int]:
    """(READY step, last STEP printed) of a training attempt's output."""
    ready = next(int(line.split()[1]) for line in lines if line.startswith("READY "))
    steps = [int(line.split()[1]) for line in lines if line.startswith("STEP ")]
    return ready, max(steps, default=ready)


@pytest.mark.slow
def test_three_preemptions_resume_exactly_and_lose_no_step(
    tmp_path: Path,
    shared_runs: SharedRuns,
    spot_env: Callable[..., dict[str, str]],
    run_cli: Callable[..., Any],
    terminal: Callable[[int], None],
) -> None:
    env = spot_env()
    # Each spot attempt gets its notice 2 s after its launch, and the watcher polls each
    # second: it trains 3 s and a step at most, 4 steps of 1 s. Three such attempts cannot
    # do 16, however fast the machine starts them: all three spot attempts are preempted.
    # (With 0.05 s steps, a machine that starts torch in a second finished on the second.)
    steps, step_s = 16, 1.0
    reference = train_reference(shared_runs, steps, env, TIMEOUT_S)
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.pt"
    result = subprocess.run(
        [
            *launch_argv(
                "--provider", "local", "--gpu", "a10g", "--checkpoint", str(ckpt),
                "--preempt-every", "2", "--notice-seconds", "120", "--max-preemptions", "3",
                "--every-steps", "5", "--poll-seconds", "0.2", "--yes", "--format", "json",
                "--",
            ),
            *train_command(out, steps, step_s),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(result.stdout)
    attempts = doc["attempts"]
    summary = doc["summary"]
    assert doc["status"] == "succeeded"
    assert summary["preemptions"] >= 3
    # Every notice was honoured: each preempted attempt saved and exited 75.
    preempted = [a for a in attempts if a["outcome"] == "preempted"]
    assert len(preempted) == 3
    assert {a["exit_code"] for a in preempted} == {75}
    assert summary["lost_steps"] == 0
    # Spot until --max-preemptions, then on-demand; never twice in a row in one zone: the
    # first preemption moves to a sibling zone of the region (same price), the second one
    # in that region backs off the whole region.
    assert [a["offer"]["market"] for a in attempts] == ["spot"] * 3 + ["on-demand"]
    places = [(a["offer"]["region"], a["offer"]["zone"]) for a in attempts]
    assert all(zone for _, zone in places), places
    assert all(a != b for a, b in itertools.pairwise(places))
    (r1, z1), (r2, z2), (r3, _) = places[:3]
    assert r1 == r2, places
    assert z1 != z2, places
    assert r3 != r1, places
    spot_prices = [a["offer"]["usd_per_hour"] for a in attempts[:2]]
    assert spot_prices[0] == spot_prices[1]  # a zone costs what its region costs
    assert "the price tables are per region" in result.stderr
    assert "another zone of the region" in result.stderr
    # The logs agree: each attempt resumed at (or after) the last step the one before did.
    state = Path(env["COSTGUARD_LOCAL_DIR"])
    previous_last = 0
    for attempt in attempts:
        ready, last = steps_of(attempt_lines(state, doc["job_id"], attempt["number"]))
        assert ready >= previous_last, (attempt["number"], ready, previous_last)
        assert attempt["resumed_step"] == (ready or None)
        previous_last = last
    assert previous_last == steps
    final_weights = torch.load(out, weights_only=True)
    assert_bitwise_equal(final_weights, reference)
    # The result is in the store: its newest checkpoint is the final step, named in the
    # report, and exporting it gives the weights the job ended with.
    assert doc["latest_checkpoint"]["step"] == steps
    exported = tmp_path / "model.pt"
    done = subprocess.run(
        [*launch_argv()[:-1], "checkpoint", "export", str(ckpt), "--to", str(exported)],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    assert_bitwise_equal(torch.load(exported, weights_only=True), final_weights["model"])
    # job.json says the same, and nothing of the job still runs.
    assert read_job(ckpt)["status"] == "succeeded"
    launcher = LocalLauncher(Simulation(), job_started_unix=0.0, state_dir=state)
    assert launcher.find(doc["job_id"]) == []
    assert "launch guard: not needed for --provider local" in result.stderr
    assert "(simulated: nothing was billed)" in summary["cost_basis"]
    assert float(summary["cost_usd"]) > 0
    assert float(summary["on_demand_usd"]) > float(summary["cost_usd"]) / 2
    # `jobs status` of that job fits 80, 100 and 120 columns: places, markets, prices,
    # outcomes and steps whole (the issue saw "preem...", "$0.00..." and "234->4...").
    cells = [f"{a['offer']['provider']}/{a['offer']['region']}" for a in attempts]
    cells += [a["offer"]["market"] for a in attempts] + ["preempted", "succeeded"]
    cells += [format_usd(Decimal(a["offer"]["usd_per_hour"]), rate=True) for a in attempts]
    cells += [f"{a['resumed_step'] or 0}->{a['last_step']}" for a in attempts]
    for width in WIDTHS:
        terminal(width)
        status = run_cli("jobs", "status", str(ckpt))
        assert status.exit_code == 0, status.stderr
        lines = status.stdout.splitlines()
        assert_commands_whole(lines, width)  # a command to paste may stand alone, whole
        assert_fits("\n".join(x for x in lines if not COMMAND.fullmatch(x)), width, cells)
    # The picture of that job: its cost line, the on-demand line, and one marker for each
    # of the 3 preemptions (plus the legend's).
    picture = tmp_path / "job.png"
    status = run_cli("jobs", "status", str(ckpt), "--plot", str(picture))
    assert status.exit_code == 0, status.stderr
    png = read_png(picture)
    assert (png.width, png.height) == (WIDTH_PX, HEIGHT_PX)
    assert png.count(rgb(COST_COLOR), tolerance=10) > 300
    assert png.count(rgb(ON_DEMAND_COLOR), tolerance=10) > 100
    assert len(blobs(png, rgb(PREEMPTION_COLOR))) == 3 + 1


def _running_handle(ckpt: Path) -> Any:
    try:
        doc = read_job(ckpt)
    except (OSError, ValueError):
        return None
    attempts: list[dict[str, Any]] = doc["attempts"]  # type: ignore[assignment]
    if attempts and attempts[-1]["handle"] and attempts[-1]["outcome"] is None:
        return attempts[-1]["handle"]
    return None


@pytest.mark.slow
def test_a_new_controller_attaches_without_launching_a_duplicate(
    tmp_path: Path, spot_env: Callable[..., dict[str, str]]
) -> None:
    env = spot_env()
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.pt"
    controller_log = (tmp_path / "controller-1.log").open("wb")
    first = subprocess.Popen(
        [
            *launch_argv(
                "--provider", "local", "--gpu", "t4", "--checkpoint", str(ckpt),
                "--preempt-at", "20", "--notice-seconds", "120", "--every-steps", "4",
                "--poll-seconds", "0.2", "--yes", "--",
            ),
            *train_command(out, 24, sleep=1.0),  # 24 s of training: the notice comes first
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=controller_log,
        start_new_session=True,
    )  # fmt: skip
    try:
        handle = wait_for(
            lambda: _running_handle(ckpt), "a running attempt", timeout_s=300, poll_s=0.2
        )
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the controller dies; its attempt does not
        first.wait(timeout=30)
        controller_log.close()
    pid = int(handle["extra"]["pid"])
    assert pid_alive(pid), "the attempt died with its controller"

    busy = subprocess.run(
        launch_argv("--attach", str(ckpt)), env=env, capture_output=True, text=True, timeout=60
    )
    assert busy.returncode == 2, busy.stderr
    assert "supervised by" in busy.stderr
    assert "--force" in busy.stderr

    second = subprocess.run(
        launch_argv(
            "--attach", str(ckpt), "--force", "--yes", "--poll-seconds", "0.2", "--format", "json"
        ),
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    doc = json.loads(second.stdout)
    attempts = doc["attempts"]
    # Attempt 1 was adopted, not relaunched: same process; the new controller served its
    # notice, and attempt 2 started only after attempt 1 had ended, from its checkpoint.
    assert attempts[0]["handle"]["extra"]["pid"] == str(pid)
    assert [(a["outcome"], a["exit_code"]) for a in attempts] == [
        ("preempted", 75),
        ("succeeded", 0),
    ]
    assert attempts[1]["launched_unix"] >= attempts[0]["ended_unix"]
    assert attempts[1]["resumed_step"] == attempts[0]["last_step"] > 0
    assert doc["summary"]["lost_steps"] == 0
    assert doc["status"] == "succeeded"
    assert attempts[-1]["last_step"] == 24
    assert "attached to job" in second.stderr
    assert not pid_alive(pid)
    assert out.exists()


@pytest.mark.parametrize("quiet", [False, True])
def test_the_job_speaks_while_it_runs_and_its_log_is_named(
    tmp_path: Path, spot_env: Callable[..., dict[str, str]], quiet: bool
) -> None:
    env = spot_env()
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.pt"
    result = subprocess.run(
        [
            *launch_argv(
                "--provider", "local", "--gpu", "t4", "--checkpoint", str(ckpt),
                "--on-demand", "--every-steps", "3", "--poll-seconds", "0.2", "--yes",
                *(["--quiet"] if quiet else []), "--format", "json", "--",
            ),
            *train_command(out, 6),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(result.stdout)  # the job's output goes to stderr: stdout stays JSON
    log = Path(env["COSTGUARD_LOCAL_DIR"]) / doc["job_id"] / "attempt-1.log"
    assert f"costguard: attempt 1 writes its output to\n  {log}\n" in result.stderr
    job_lines = [f"  [1] {line}" for line in log.read_text().splitlines()]
    assert any(line.startswith("  [1] STEP 6") for line in job_lines)
    stderr = result.stderr.splitlines()
    if quiet:
        assert not [line for line in stderr if line.startswith("  [1] ")]
    else:
        # Every line the job printed, in its order, as it printed it.
        shown = [line for line in stderr if line.startswith("  [1] ")]
        assert shown == job_lines


@pytest.mark.slow
def test_ctrl_c_releases_the_job_for_attach(
    tmp_path: Path, spot_env: Callable[..., dict[str, str]]
) -> None:
    """The issue's path: Ctrl-C, the job finishes alone, its notice time passes unserved,
    then `--attach` (no --force) reports what happened: success, no notice, its real end."""
    env = spot_env()
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.pt"
    controller = subprocess.Popen(
        [
            *launch_argv(
                "--provider", "local", "--gpu", "t4", "--checkpoint", str(ckpt),
                "--preempt-at", "5", "--notice-seconds", "120",
                "--every-steps", "4", "--poll-seconds", "0.2", "--yes", "--quiet", "--",
            ),
            *train_command(out, 12, sleep=0.5),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # A foreground process: a shell starts background jobs with SIGINT ignored, and a
        # test run started that way would hand its children that, and Ctrl-C with it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        wait_for(lambda: _running_handle(ckpt), "a running attempt", timeout_s=300, poll_s=0.2)
        controller.send_signal(signal.SIGINT)  # what Ctrl-C sends to the foreground process
        _, stderr = controller.communicate(timeout=60)
    finally:
        if controller.poll() is None:
            controller.kill()
    assert controller.returncode == 130
    assert "takes over" in stderr
    assert "--force" not in stderr
    assert read_job(ckpt)["heartbeat_unix"] == 0.0
    exit_record = ckpt / "job" / "attempt-1.exit.json"
    finished = wait_for(
        lambda: exit_record.exists() and json.loads(exit_record.read_text()),
        "the attempt's exit record",
        timeout_s=300,
        poll_s=0.2,
    )
    spec: dict[str, Any] = read_job(ckpt)["spec"]  # type: ignore[assignment]
    job_started = spec["created_unix"]
    assert finished["finished_unix"] > job_started + 5  # the notice was due, and not served
    # The controller comes back later than the job ended: figures taken at the attach
    # would be told apart from the exit record's.
    wait_for(lambda: time.time() > finished["finished_unix"] + 1, "a second past the job's end")
    # The next step it gave works at once, without --force: it supervises to the end.
    attached = subprocess.run(
        launch_argv("--attach", str(ckpt), "--yes", "--poll-seconds", "0.2", "--format", "json"),
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert attached.returncode == 0, attached.stderr[-3000:]
    doc = json.loads(attached.stdout)
    assert doc["status"] == "succeeded"
    (attempt,) = doc["attempts"]
    assert (attempt["outcome"], attempt["exit_code"]) == ("succeeded", 0)
    assert "interruption" not in attempt["detail"]
    assert "notice" not in attempt["detail"]
    # The figures are the job's: it ended when its exit record says, not on attach.
    assert attempt["ended_unix"] == finished["finished_unix"]
    assert doc["summary"]["wall_s"] == pytest.approx(
        finished["finished_unix"] - job_started, abs=0.1
    )
    assert doc["summary"]["preemptions"] == 0
    assert out.exists()


def test_a_local_launch_reads_well_on_an_80_column_terminal(
    tmp_path: Path, spot_env: Callable[..., dict[str, str]]
) -> None:
    """The whole session in a real pseudo-terminal: estimate, the job's lines, the report."""
    env = spot_env()
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.pt"
    argv = [
        *launch_argv(
            "--provider", "local", "--gpu", "a10g", "--checkpoint", str(ckpt), "--hours", "2",
            "--max-total", "5", "--on-demand", "--every-steps", "3", "--poll-seconds", "0.2",
            "--yes", "--",
        ),
        *train_command(out, 4),
    ]  # fmt: skip
    screen = read_screen(argv, 80, env=env)
    log_path = next(Path(env["COSTGUARD_LOCAL_DIR"]).glob("*/attempt-1.log"))
    log = iter([log_path])
    # The job's own lines are its own (torch's warnings run long), and a path is not cut:
    # every line costguard writes fits.
    ours = [line for line in screen.splitlines() if not line.startswith("  [1] ")]
    assert (
        ours.index(f"  {next(log)}") == ours.index("costguard: attempt 1 writes its output to") + 1
    )
    # A command to paste (the weights' export) stands whole on its line, however long.
    # A path longer than the line, wrapped onto a line of its own, stands alone, whole.
    ours = [
        line
        for line in ours
        if "local-state" not in line
        and not COMMAND.fullmatch(line)
        and not re.fullmatch(r"\s+\S+", line)
    ]
    attempts: list[dict[str, Any]] = read_job(ckpt)["attempts"]  # type: ignore[assignment]
    (attempt,) = attempts
    steps = f"{attempt['resumed_step'] or 0}->{attempt['last_step']}"
    assert_fits("\n".join(ours), 80, ["succeeded", "on-demand", "$1.006", steps, "$2.01"])
    assert "  [1] STEP 4" in screen
    # issue 49 item 6: the lines the job's `costguard run` wrote are costguard's too: they
    # were 83-159 wide after their "  [1] "; wrapped, their words all there
    run_lines = [line for line in screen.splitlines() if line.startswith("  [1] costguard: ")]
    assert run_lines
    assert all(len(line) <= 80 for line in run_lines), run_lines
    shown = " ".join(screen.split())
    for line in log_path.read_text().splitlines():
        if line.startswith("costguard: "):
            assert " ".join(line.split()) in shown, line


@pytest.mark.parametrize("job_id", ["..", "../other", "/etc", "a/b", "*", "run-1\n", "Run-1"])
def test_the_local_launcher_joins_no_unchecked_job_id_into_a_path(
    tmp_path: Path, job_id: str
) -> None:
    # Issue 28: `state_dir / job_id` with a job id from a writable job.json reached
    # other folders (an absolute id replaces state_dir; ".." climbs out of it).
    state = tmp_path / "state"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "attempt-1.json").write_text('{"pid": 1}')
    launcher = LocalLauncher(Simulation(), job_started_unix=0.0, state_dir=state)
    with pytest.raises(InputError, match="not a costguard job id"):
        launcher.find(job_id)
    spec = LaunchSpec(job_id, str(tmp_path / "ckpt"), ("true",), "me", datetime.now(UTC))
    offer = Offer("local", "sim-1", "sim", Market.SPOT, Decimal("0.1"), "T4", 1)
    with pytest.raises(InputError, match="not a costguard job id"):
        launcher.launch(offer, spec, attempt=1)
    assert not state.exists()
    assert (
        record_exit({ENV_JOB_ID: job_id, ENV_JOB_ATTEMPT: "1"}, str(tmp_path / "ckpt"), 0) is False
    )
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.slow
def test_ctrl_c_ends_the_controller_within_seconds(
    tmp_path: Path, spot_env: Callable[..., dict[str, str]]
) -> None:
    """Issue 49 item 1: Ctrl-C, sent to the controller's process group as a terminal sends
    it, ends `launch --provider local` at once (130); the job goes on for `--attach`."""
    env = spot_env()
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.pt"
    controller = subprocess.Popen(
        [
            *launch_argv(
                "--provider", "local", "--gpu", "t4", "--checkpoint", str(ckpt),
                "--every-steps", "4", "--poll-seconds", "0.2", "--yes", "--quiet", "--",
            ),
            *train_command(out, 30, sleep=0.5),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group, as a terminal's foreground job
    )  # fmt: skip
    try:
        wait_for(lambda: _running_handle(ckpt), "a running attempt", timeout_s=300, poll_s=0.2)
        sent = time.monotonic()
        os.killpg(controller.pid, signal.SIGINT)
        _, stderr = controller.communicate(timeout=60)
        seconds = time.monotonic() - sent
    finally:
        if controller.poll() is None:
            controller.kill()
    assert controller.returncode == 130, stderr
    assert seconds < 5, f"{seconds:.1f} s after Ctrl-C"
    attempt = ckpt / "job" / "attempt-1.exit.json"
    wait_for(attempt.exists, "the job's end", timeout_s=300, poll_s=0.2)  # by itself, unharmed


def test_a_logs_path_under_home_is_named_from_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 49 item 6: the log path, on a line of its own, was split at 80 columns:
    ~/.local/state/costguard/local/cg-alice-20261206-075900-abcd1234/attempt-1.log fits."""
    from costguard.cli.follow import Follower

    monkeypatch.setenv("HOME", str(tmp_path))
    folder = tmp_path / ".local" / "state" / "costguard" / "local" / "cg-alice-20261206-075900-ab12"
    folder.mkdir(parents=True)
    (folder / "attempt-1.log").write_text("step 1\n")
    said: list[str] = []
    Follower(folder, echo=said.append).drain(final=True)
    (first, path), *_ = (line.split("\n") for line in said)
    assert first == "costguard: attempt 1 writes its output to"
    assert path == f"  ~/{(folder / 'attempt-1.log').relative_to(tmp_path)}"
    assert len(path) <= 80
    assert Path(path.strip().replace("~", str(tmp_path), 1)).read_text() == "step 1\n"


@pytest.mark.parametrize("ranges", ["32768\t60999\n", "40000 60999\n", "", "not a range"])
def test_a_gang_rendezvous_port_is_free_and_one_the_kernel_never_hands_out(
    tmp_path: Path, ranges: str
) -> None:
    """The port is drawn below the kernel's range for port 0 and outgoing connections
    (from /proc; 32768, Linux's default, when that cannot be read), so no other program
    takes it before node 0's torchrun binds it; and it is free when drawn."""
    ports_file = tmp_path / "ip_local_port_range"
    ports_file.write_text(ranges)
    low = int(ranges.split()[0]) if ranges[:1].isdigit() else EPHEMERAL_LOW
    for _ in range(20):
        port = rendezvous_port(ports_file)
        assert RENDEZVOUS_LOW <= port < low
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free: binds


def test_a_gang_rendezvous_port_is_never_one_in_use(tmp_path: Path) -> None:
    """Every port of the range but one is taken (the smallest range drawn from: 1,024
    ports): the one drawn is the free one, every time; with none free, costguard's own
    error."""
    ports_file = tmp_path / "ip_local_port_range"
    ports_file.write_text(f"{RENDEZVOUS_LOW} 60999")
    free = RENDEZVOUS_LOW + 512
    with contextlib.ExitStack() as held:
        for port in range(RENDEZVOUS_LOW, RENDEZVOUS_LOW + 1024):
            if port == free:
                continue
            sock = held.enter_context(socket.socket())
            with contextlib.suppress(OSError):  # already taken by someone else: as good
                sock.bind(("127.0.0.1", port))
        assert {rendezvous_port(ports_file) for _ in range(3)} == {free}
        held.enter_context(socket.socket()).bind(("127.0.0.1", free))
        with pytest.raises(CostguardError, match="no free loopback port between 10000"):
            rendezvous_port(ports_file)
