"""`costguard agent`: the decision, the loop (fake sampler, fake clock, recorded action),
the job contract, the /proc and nvidia-smi readers, and the shutdown actions."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from costguard.cli.agent import agent_command
from costguard.contract import job_file, registered_job
from costguard.errors import CostguardError
from costguard.reaper.agent import (
    AgentPolicy,
    AzureDeallocate,
    PowerOff,
    Reading,
    SystemSampler,
    Tick,
    active_jobs,
    count_ssh_sessions,
    decide_shutdown,
    parse_nvidia_smi,
    run_agent,
)
from costguard.settings import Settings
from tests.servers.azure import AzureServer, AzureVm
from tests.servers.http import FakeTokenCredential, azure_client_options

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
POLICY = AgentPolicy(idle_minutes=10, interval_seconds=60)


class FakeClock:
    """Time that moves only when the loop sleeps."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class ScriptedSampler:
    """Idle readings, except what ``busy(tick)`` says."""

    def __init__(self, clock: FakeClock, busy: Callable[[int], dict[str, Any]] | None = None):
        self.clock = clock
        self.busy = busy or (lambda tick: {})
        self.tick = 0

    def read(self) -> Reading:
        fields: dict[str, Any] = {
            "gpu_util_percent": 0.0,
            "cpu_percent": 1.0,
            "network_mbps": 0.05,
            **self.busy(self.tick),
        }
        self.tick += 1
        return Reading(self.clock(), **fields)


class Recorder:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def __call__(self, reason: str) -> None:
        self.reasons.append(reason)


def run(
    busy: Callable[[int], dict[str, Any]] | None = None,
    policy: AgentPolicy = POLICY,
    *,
    max_ticks: int = 40,
    execute: bool = True,
) -> tuple[list[Tick], Recorder]:
    clock = FakeClock()
    action = Recorder()
    ticks = run_agent(
        ScriptedSampler(clock, busy),
        action,
        policy,
        clock=clock,
        sleep=clock.sleep,
        max_ticks=max_ticks,
        execute=execute,
    )
    return ticks, action


def test_an_idle_machine_shuts_down_once_after_exactly_the_window() -> None:
    ticks, action = run()
    assert action.reasons == ["idle for 10 min"]
    assert len(ticks) == 11  # readings at 0, 1, ..., 10 minutes
    assert ticks[-1].reading.at - ticks[0].reading.at == timedelta(minutes=10)
    assert [t.acted for t in ticks].count(True) == 1
    assert ticks[4].decision.reason == "idle for 4 of 10 min"


def test_a_busy_reading_restarts_the_count() -> None:
    ticks, action = run(lambda tick: {"gpu_util_percent": 40.0} if tick == 5 else {})
    assert len(action.reasons) == 1
    assert ticks[-1].reading.at - T0 == timedelta(minutes=16)  # 10 minutes after minute 5
    assert "busy at 2026-12-01T09:05:00Z: GPU 40.0%" in ticks[10].decision.reason


@pytest.mark.parametrize(
    ("busy", "ignore"),
    [
        ({"jobs": 1}, {"jobs_keep_awake": False}),
        ({"ssh_sessions": 2}, {"ssh_keeps_awake": False}),
        ({"gpu_util_percent": None}, {"gpu_missing_ok": True}),
        ({"cpu_percent": 30.0}, None),
        ({"network_mbps": 5.0}, None),
        ({"cpu_percent": None}, None),
    ],
)
def test_what_keeps_the_machine_up(busy: dict[str, Any], ignore: dict[str, Any] | None) -> None:
    ticks, action = run(lambda tick: busy, max_ticks=25)
    assert action.reasons == []
    assert len(ticks) == 25
    assert ticks[-1].decision.reason.startswith("busy at")
    if ignore is not None:
        _, ignored = run(lambda tick: busy, AgentPolicy(idle_minutes=10, **ignore))
        assert len(ignored.reasons) == 1


def test_dry_run_reports_but_never_acts() -> None:
    ticks, action = run(max_ticks=15, execute=False)
    assert action.reasons == []
    assert len(ticks) == 15
    assert [t.decision.shutdown for t in ticks].index(True) == 10


def test_the_loop_is_a_dry_run_unless_told_to_execute() -> None:
    clock = FakeClock()
    action = Recorder()
    ticks = run_agent(ScriptedSampler(clock), action, POLICY, clock=clock, sleep=clock.sleep,
                      max_ticks=15)  # fmt: skip
    assert action.reasons == []
    assert not any(t.acted for t in ticks)
    assert any(t.decision.shutdown for t in ticks)


class LoopStopError(Exception):
    """Ends the CLI's endless loop from the fake sleep."""


@pytest.fixture
def cli_loop(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., Any]:
    """`costguard agent ARGS` with an idle fake machine, a fake clock and a recorded shutdown:
    returns the run and the shutdown reasons (the loop ends after 15 readings)."""
    from costguard.reaper import agent

    clock = FakeClock()
    reasons: list[str] = []
    sampler = ScriptedSampler(clock)

    def sleep(seconds: float) -> None:
        if sampler.tick >= 15:
            raise LoopStopError
        clock.sleep(seconds)

    class FakePowerOff:
        def __init__(self, command: Any) -> None:
            self.command = list(command)

        def __call__(self, reason: str) -> None:
            reasons.append(reason)

    monkeypatch.setattr(agent, "SystemSampler", lambda *a, **k: sampler)
    monkeypatch.setattr(agent, "PowerOff", FakePowerOff)
    monkeypatch.setattr("costguard.cli.agent.time.sleep", sleep)

    class FakeDatetime:
        @staticmethod
        def now(tz: Any = None) -> datetime:
            return clock()

    monkeypatch.setattr("costguard.cli.agent.datetime", FakeDatetime)

    def invoke_loop(*args: str) -> tuple[Any, list[str]]:
        from click.testing import CliRunner

        command = ["--idle-minutes", "10", "--jobs-dir", str(tmp_path), *args]
        try:
            result = CliRunner().invoke(agent_command, command, catch_exceptions=False)
        except LoopStopError:
            result = None
        return result, reasons

    return invoke_loop


def test_the_command_is_a_dry_run_by_default(cli_loop: Callable[..., Any]) -> None:
    _, reasons = cli_loop()
    assert reasons == []
    _, reasons = cli_loop("--execute", "--dry-run")  # the last one wins
    assert reasons == []


def test_the_command_shuts_down_only_with_execute(cli_loop: Callable[..., Any]) -> None:
    result, reasons = cli_loop("--execute")
    assert reasons == ["idle for 10 min"]
    assert result is not None
    assert "shutting down: idle for 10 min" in result.output
    assert "dry run" not in result.output


def test_a_restarted_agent_waits_a_full_window() -> None:
    readings = [Reading(T0 + timedelta(minutes=m), 0.0, 1.0, 0.0) for m in range(3)]
    decision = decide_shutdown(readings, POLICY, T0 + timedelta(minutes=2))
    assert decision.shutdown is False
    assert decision.reason == "idle for 2 of 10 min"


def test_the_job_contract(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    with registered_job(jobs) as path:
        assert path == job_file(jobs, os.getpid())
        assert path.read_text() == f"{os.getpid()}\n"
        assert active_jobs(jobs) == [os.getpid()]
    assert not path.exists()
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)  # fmt: skip
    stale = int(finished.stdout)
    job_file(jobs, stale).write_text(f"{stale}\n")  # a wrapper killed with SIGKILL
    (jobs / "notes.txt").write_text("not a job")
    (jobs / "77.pid").write_text("garbage")
    (jobs / "78.pid").write_text(f"{os.getpid()}\n")  # name and content disagree
    assert active_jobs(jobs, alive=lambda pid: pid != stale) == []
    assert active_jobs(tmp_path / "missing") == []


def test_a_job_file_counts_only_from_its_process_owner_or_root(tmp_path: Path) -> None:
    """Anyone who could write the jobs folder kept the machine up with ``1.pid`` (issue
    28): init never counts, nor a file another user wrote about a process not theirs, nor
    a link; the job's own user (or root) registering it still does."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    me = os.getpid()
    (jobs / "1.pid").write_text("1\n")
    assert active_jobs(jobs) == []
    with registered_job(jobs):
        assert active_jobs(jobs) == [me]
        stranger = os.getuid() + 1000  # a user who is not the process's owner
        assert active_jobs(jobs, owner=lambda pid: stranger) == ([me] if os.getuid() == 0 else [])
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        target = job_file(jobs, sleeper.pid)
        (tmp_path / "elsewhere").write_text(f"{sleeper.pid}\n")
        target.symlink_to(tmp_path / "elsewhere")
        assert active_jobs(jobs) == []  # a link, not a plain file
        target.unlink()
        target.write_text(f"{sleeper.pid}\n")
        assert active_jobs(jobs) == [sleeper.pid]
        if os.getuid() == 0:  # a file of another user about a process not theirs
            os.chown(target, 65534, 65534)
            assert active_jobs(jobs) == []
    finally:
        sleeper.kill()
        sleeper.wait()


def fake_proc(root: Path, *, busy: int, total: int, net: int) -> None:
    (root / "net").mkdir(parents=True, exist_ok=True)
    idle = total - busy
    (root / "stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 0 0 0 0\n")
    (root / "net" / "dev").write_text(
        "Inter-|   Receive\n face |bytes\n"
        f"    lo: 999999 0 0 0 0 0 0 0 999999 0 0 0 0 0 0 0\n"
        f"  eth0: {net} 0 0 0 0 0 0 0 {net} 0 0 0 0 0 0 0\n"
    )


def test_the_system_sampler_reads_proc_and_nvidia_smi(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    fake_proc(proc, busy=100, total=1000, net=0)
    for pid, cmdline in {
        "101": b"sshd: ana@pts/0\0",
        "102": b"sshd: ana [priv]\0",
        "103": b"sshd-session: bob@notty\0",
        "104": b"/usr/sbin/sshd\0-D\0",
        "105": b"python\0train.py\0",
    }.items():
        (proc / pid).mkdir()
        (proc / pid / "cmdline").write_bytes(cmdline)
    assert count_ssh_sessions(proc) == 2
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '3\\n41\\n'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    seconds = iter([0.0, 60.0])
    sampler = SystemSampler(
        tmp_path / "jobs", proc=proc, nvidia_smi=[str(smi)], clock=lambda: T0,
        monotonic=lambda: next(seconds),
    )  # fmt: skip
    fake_proc(proc, busy=250, total=2000, net=3_750_000)  # 7.5 MB in 60 s = 1 Mbit/s
    reading = sampler.read()
    assert reading.gpu_util_percent == 41.0
    assert reading.cpu_percent == pytest.approx(15.0)  # 150 of 1000 jiffies
    assert reading.network_mbps == pytest.approx(1.0)
    assert (reading.jobs, reading.ssh_sessions) == (0, 2)
    no_gpu = SystemSampler(tmp_path, proc=proc, nvidia_smi=[str(tmp_path / "absent")])
    assert no_gpu.read().gpu_util_percent is None


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("3\n97\n", 97.0),
        ("0\n", 0.0),
        ("[N/A]\n0\n", None),  # one unreadable GPU: no reading, not "idle"
        ("0\n[N/A]\n", None),
        ("nan\n0\n", None),
        ("0\nnan\n", None),  # the order of the GPUs does not matter
        ("-1\n", None),
        ("-inf\n0\n", None),
        ("101\n", None),
        ("", None),
    ],
)
def test_nvidia_smi_output_with_an_unreadable_gpu_is_no_reading(
    output: str, expected: float | None
) -> None:
    assert parse_nvidia_smi(output) == expected


@pytest.mark.parametrize(
    "broken",
    [
        {"gpu_util_percent": float("nan")},
        {"gpu_util_percent": -5.0},
        {"gpu_util_percent": float("-inf")},
        {"cpu_percent": float("nan")},
        {"cpu_percent": -1.0},
        {"network_mbps": float("-inf")},
        {"network_mbps": float("nan")},
    ],
)
def test_a_broken_reading_keeps_the_machine_up(broken: dict[str, Any]) -> None:
    ticks, action = run(lambda tick: broken, max_ticks=25)
    assert action.reasons == []
    assert ticks[-1].decision.reason.startswith("busy at")


def test_poweroff_runs_its_command(tmp_path: Path) -> None:
    marker = tmp_path / "off"
    PowerOff([sys.executable, "-c", f"open({str(marker)!r}, 'w').write('off')"])("idle")
    assert marker.read_text() == "off"
    with pytest.raises(CostguardError, match="could not shut down"):
        PowerOff([str(tmp_path / "no-such-command")])("idle")


def test_azure_deallocate_finds_itself_and_deallocates(azure_server: AzureServer) -> None:
    azure_server.add(AzureVm("gpu-box", "Standard_NC4as_T4_v3"))
    azure_server.me = "gpu-box"
    action = AzureDeallocate(
        Settings(azure_endpoint=azure_server.url),
        imds=azure_server.url,
        credential=FakeTokenCredential(),
        client_options=azure_client_options(),
    )
    action("idle for 60 min")
    assert [c.path.rsplit("/", 2)[-2] for c in azure_server.calls("POST", "/deallocate")] == [
        "gpu-box"
    ]
    assert not azure_server.calls("POST", "/powerOff")


def invoke(*args: str) -> Any:
    from click.testing import CliRunner

    return CliRunner().invoke(agent_command, list(args), catch_exceptions=False)


def test_once_shows_what_the_agent_sees(tmp_path: Path) -> None:
    result = invoke("--once", "--jobs-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    line = result.output.strip()
    assert " cpu=" in line
    assert " jobs=0 " in line
    assert "->" in line
    if "gpu=none" in line:  # no GPU on this machine
        assert "no GPU reading" in line


@pytest.mark.parametrize(
    "args",
    [
        ["--idle-minutes", "-5"],
        ["--idle-minutes", "0"],
        ["--gpu-threshold", "150"],
        ["--cpu-threshold", "-1"],
        ["--network-threshold-mbps", "-2"],
        ["--interval-seconds", "0"],
        ["--action", "reboot"],
    ],
)
def test_bad_input_exits_2(args: list[str]) -> None:
    result = invoke(*args, "--once")
    assert result.exit_code == 2
    assert "->" not in result.output  # nothing was read


@pytest.mark.parametrize(
    ("command", "says"),
    [('a "b', "cannot be parsed: No closing quotation"), ("  ", "is empty")],
)
def test_a_bad_shutdown_command_exits_2_with_a_hint(
    run_cli: Callable[..., Any], command: str, says: str
) -> None:
    result = run_cli("agent", "--shutdown-command", command, "--once")
    assert result.exit_code == 2, result.stderr
    assert f"Error: --shutdown-command {says}" in result.stderr
    assert "Hint: quote it as in a shell" in result.stderr
    assert "->" not in result.stdout  # nothing was read
    assert "unexpected" not in result.stderr
