"""`costguard run` and the signal handling it is started with, and leaves behind.

* Called in-process (a notebook, a test's CliRunner), it leaves the caller's handlers as
  they were. It left SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 ignored; every script the
  caller started later ignored SIGTERM too (exec keeps an ignored signal ignored), and a
  CI run hung for minutes on a script that a notice's SIGTERM no longer ended.
* A signal ignored when it starts (``nohup``; a batch script's background job, whose
  Ctrl-C is ignored; ``trap '' TERM``) stays ignored, by it and by the script, as without
  costguard; for a notice's signal it says so.
* Otherwise the script starts with each signal's default action, whatever handler the
  process that started `costguard run` had.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from costguard.cli import cli
from tests.helpers.processes import kill_tree
from tests.helpers.training import costguard_command

#: Prints the signals it started with ignored (by number, from the kernel's own mask) once
#: its own SIGTERM handler is in place (not where SIGTERM is ignored), then exits 43 on
#: SIGTERM, 75 once `costguard run` has relayed a notice, else 0 in a minute.
SCRIPT = """\
import json, os, signal, sys, time
mask = int(next(l for l in open("/proc/self/status") if l.startswith("SigIgn:")).split()[1], 16)
if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(43))
print("IGNORED", json.dumps([n for n in range(1, 32) if mask >> (n - 1) & 1]), flush=True)
notices = os.environ["COSTGUARD_NOTICE_FILE"]
for _ in range(1200):
    if os.path.exists(notices) and os.path.getsize(notices):
        sys.exit(75)
    time.sleep(0.05)
"""

#: The signals `costguard run` passes on (its supervisor's FORWARDED).
PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def test_run_in_process_leaves_the_callers_signal_handlers_as_they_were(tmp_path: Path) -> None:
    """The caller's own handlers, and a SIGTERM that comes after the run, are the
    caller's: the handler here runs, and this process lives on."""
    came: list[int] = []

    def mine(signum: int, frame: object) -> None:
        came.append(signum)

    before = {s: signal.signal(s, mine) for s in PASSED_ON}
    try:
        result = CliRunner().invoke(
            cli,
            ["run", "--checkpoint", str(tmp_path / "ck"), "--", sys.executable, "-c", "pass"],
            catch_exceptions=False,
        )
        assert result.exit_code == 0, result.output
        assert {s: signal.getsignal(s) for s in PASSED_ON} == dict.fromkeys(PASSED_ON, mine)
        signal.raise_signal(signal.SIGTERM)
        assert came == [signal.SIGTERM]
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def started(
    tmp_path: Path, env: dict[str, str], trap: str
) -> tuple[subprocess.Popen[str], list[int]]:
    """`costguard run -- python SCRIPT` started by a shell that ignores ``trap``'s signals
    (none: ""), and the signals the script started with ignored."""
    run = [*costguard_command(), "run", "--checkpoint", str(tmp_path / "ck"), "--"]
    shell = f"trap '' {trap}; exec \"$@\"" if trap else 'exec "$@"'
    proc = subprocess.Popen(
        ["sh", "-c", shell, "sh", *run, sys.executable, "-c", SCRIPT],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split(maxsplit=1)
    assert line[:1] == ["IGNORED"], line
    return proc, json.loads(line[1])


def ended(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        kill_tree(proc)  # the script too: it runs in a process group of its own
        raise
    return proc.returncode, err


def test_the_script_starts_with_the_default_actions_when_none_was_ignored(
    tmp_path: Path, train_env: Callable[..., dict[str, str]]
) -> None:
    proc, ignored = started(tmp_path, train_env(), "")
    assert not set(ignored) & set(PASSED_ON), ignored
    proc.send_signal(signal.SIGTERM)  # passed on: the script's own handler ends it
    code, err = ended(proc)
    assert code == 43, err
    assert "ignored" not in err


@pytest.mark.parametrize("trap", ["HUP", "INT", "TERM"])
def test_a_signal_ignored_at_the_start_stays_ignored_by_the_run_and_the_script(
    tmp_path: Path, train_env: Callable[..., dict[str, str]], trap: str
) -> None:
    """`nohup` (HUP), a batch script's background job (INT), `trap '' TERM`: the signal
    neither stops the script nor is passed on as a notice (a background job's terminal
    Ctrl-C used to ask the script to save and stop); a notice's signal is named."""
    proc, ignored = started(tmp_path, train_env(), trap)
    number = signal.Signals[f"SIG{trap}"]
    assert number in ignored, ignored
    proc.send_signal(number)
    time.sleep(1.0)  # a notice would end the script within 0.05 s; time for it to show
    assert proc.poll() is None
    proc.send_signal(signal.SIGUSR2)  # passed on: its default action ends the script
    code, err = ended(proc)
    assert code == 128 + signal.SIGUSR2, err
    assert "Ctrl-C" not in err
    warning = f"warning: SIG{trap} was ignored when costguard run started"
    assert (warning in err) == (trap == "TERM"), err


def test_a_handler_that_raises_as_it_is_put_back_leaves_none_of_the_others_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Ctrl-C (or a caller's ``sys.exit`` on SIGTERM) that runs as soon as its handler is
    put back raises there: the handlers after it are set all the same (they were left as
    costguard's, which swallow a notice), then the exception goes on."""
    from costguard.checkpoint.supervisor import put_back

    real = signal.signal
    before = {s: signal.getsignal(s) for s in PASSED_ON}

    def mine(signum: int, frame: object) -> None:
        pass

    def raising_once(signum: int, handler: object) -> object:
        previous = real(signum, handler)  # type: ignore[arg-type]
        if not raised:
            raised.append(signum)
            raise KeyboardInterrupt  # as a handler run at once would
        return previous

    raised: list[int] = []
    monkeypatch.setattr(signal, "signal", raising_once)
    try:
        with pytest.raises(KeyboardInterrupt):
            put_back(dict.fromkeys(PASSED_ON, mine))
        assert {s: signal.getsignal(s) for s in PASSED_ON} == dict.fromkeys(PASSED_ON, mine)
        assert raised[:1] == [signal.SIGTERM]  # the first set; SIGINT's is set last
    finally:
        for s, handler in before.items():
            real(s, handler)
