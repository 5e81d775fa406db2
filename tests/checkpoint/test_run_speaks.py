"""`costguard run` tells the person what happens: where checkpoints go, the resume, each
durable save, and at the end what the exit code means and where to resume from. Ctrl-C
saves and stops; a second one stops at once. A URL that carries a secret is refused
before anything starts, and never echoed."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.checkpoint.test_run import TIMEOUT_S, Child, reached
from tests.helpers.training import TRAIN_SCRIPT, costguard_command


def _run(url: str, out: Path, env: dict[str, str], *extra: str, steps: int = 12) -> str:
    done = subprocess.run(
        [
            *costguard_command(), "run", "--checkpoint", url, "--every-steps", "5", *extra,
            "--", sys.executable, str(TRAIN_SCRIPT), "--steps", str(steps), "--out", str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


def test_run_says_where_it_resumes_each_save_and_the_final_checkpoint(
    tmp_path: Path, train_env: Callable[..., dict[str, str]]
) -> None:
    env, url, out = train_env(), str(tmp_path / "ckpt"), tmp_path / "out.pt"
    first = _run(url, out, env)
    assert f"costguard: checkpoints go to {url}" in first
    assert "no checkpoint yet: the script starts from step 0" in first
    assert "costguard: saved step 5 (schedule" in first
    assert "costguard: saved step 10 (schedule" in first
    # The loop ended at step 12: close() committed it, and the summary names it.
    assert "costguard: saved step 12 (final" in first
    assert "exit 0: the script finished; final checkpoint: step 12 (ckpt-000000000012-" in first
    second = _run(url, out, env, steps=14)
    assert "resumed from step 12 (ckpt-000000000012-" in second
    quiet = _run(url, out, env, "-q", steps=16)
    assert "saved step" not in quiet
    assert "final checkpoint: step 16" in quiet


def test_ctrl_c_saves_and_exits_75_then_a_rerun_resumes(
    tmp_path: Path, train_env: Callable[..., dict[str, str]]
) -> None:
    url = str(tmp_path / "ckpt")
    child = Child(url, tmp_path / "out.pt", train_env(), "--every-steps", "1000")
    child.read_until(lambda line: reached(line, 4))
    child.proc.send_signal(signal.SIGINT)
    code = child.finish()
    err = child.stderr()
    assert code == 75, err
    assert "Ctrl-C: asking the script to save and stop" in err
    assert "exit 75: saved on a notice; newest checkpoint: step" in err
    assert "Run the same command to resume." in err
    assert "Traceback" not in err
    assert "KeyboardInterrupt" not in err
    saved = max(child.steps())
    again = Child(url, tmp_path / "out.pt", train_env(), "--every-steps", "1000")
    again.read_until(lambda line: line.startswith("READY"))
    again.proc.kill()
    again.finish()
    assert again.ready() >= saved  # nothing trained before the Ctrl-C is lost


def test_a_second_ctrl_c_stops_at_once_without_a_traceback(
    tmp_path: Path, train_env: Callable[..., dict[str, str]]
) -> None:
    # A script that never checks for notices: only the second Ctrl-C can stop it. Its
    # ticks, each with the wall clock's time, show it still going after the first.
    script = "import time\nwhile True:\n    print(time.time(), flush=True)\n    time.sleep(0.1)\n"
    proc = subprocess.Popen(
        [
            *costguard_command(), "run", "--checkpoint", str(tmp_path / "ck"),
            "--", sys.executable, "-c", script,
        ],
        env=train_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stderr is not None
    proc.stdout.readline()  # the script runs
    proc.send_signal(signal.SIGINT)
    # The first Ctrl-C was handled (so the second is not merged into it) ...
    while "Ctrl-C: asking the script to save" not in (line := proc.stderr.readline()):
        assert line, "costguard ended before it said what the first Ctrl-C does"
    handled = time.time()
    # ... and the script goes on after it: a tick printed later, costguard still there.
    while float(proc.stdout.readline() or "inf") <= handled:
        pass
    assert proc.poll() is None, "a script without a Checkpointer goes on after one Ctrl-C"
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert time.monotonic() - started < 10
    assert "stopped at once by a second Ctrl-C" in err
    assert "Traceback" not in err


SECRET_URLS = [
    ("s3://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY@bucket/p", "wJalrXUtnFEMI"),
    ("az://container/p?sv=2024-01-01&sig=c2VjcmV0c2lnbmF0dXJl", "c2VjcmV0c2lnbmF0dXJl"),
    ("s3://bucket/p?X-Amz-Signature=0123456789abcdef0123", "0123456789abcdef0123"),
    ("gs://bucket/p?X-Goog-Signature=feedfacecafe0987654321", "feedfacecafe0987654321"),
]


@pytest.mark.parametrize(("url", "secret"), SECRET_URLS)
def test_a_url_with_a_secret_is_refused_before_anything_and_never_echoed(
    url: str, secret: str, tmp_path: Path, train_env: Callable[..., dict[str, str]]
) -> None:
    marker = tmp_path / "started"
    done = subprocess.run(
        [
            *costguard_command(), "run", "--checkpoint", url,
            "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')",
        ],
        env=train_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Error:" in done.stderr
    assert "Hint:" in done.stderr
    assert secret not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert not marker.exists()


def test_an_unreachable_gcs_store_is_reported_soon_naming_gcs(
    tmp_path: Path, train_env: Callable[..., dict[str, str]]
) -> None:
    from tests.helpers.processes import free_port

    env = train_env(
        STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{free_port()}",  # nothing listens there
        COSTGUARD_STORAGE_OPTIONS='{"token": "anon", "project": "test"}',
    )
    started = time.monotonic()
    done = subprocess.run(
        [*costguard_command(), "run", "--checkpoint", "gs://bucket-x/p", "--", "true"],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    took = time.monotonic() - started
    assert done.returncode == 2, done.stderr
    assert took < 60, took  # one retry layer: ours, bounded (it took 217 s with two)
    assert "Traceback" not in done.stderr
    assert "STORAGE_EMULATOR_HOST" in done.stderr
    assert "AWS_ENDPOINT_URL" not in done.stderr
    assert sum(line.startswith("Error:") for line in done.stderr.splitlines()) == 1
