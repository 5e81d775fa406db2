"""``costguard run``: run a training script with checkpointing and preemption notices.

The script runs as a child process. It learns where to checkpoint from environment
variables (``Checkpointer.from_env`` reads them), signals sent to ``costguard run`` are
forwarded to it, and preemption notices from this cloud's metadata service are relayed
to it through an inherited pipe (``COSTGUARD_NOTICE_FD``). ``costguard run`` exits with
the child's exit code (75 after a notice-triggered save: run the same command to resume).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import click

from costguard.errors import InputError
from costguard.reaper.agent import jobs_dir, registered_job

#: Signals passed on to the child (SIGTERM from Kubernetes or shutdown, SIGUSR1 from SLURM).
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
EXIT_PREEMPTED = 75  # the Checkpointer's code after an emergency save (EX_TEMPFAIL)


def child_environment(
    base: dict[str, str],
    *,
    url: str,
    every_steps: int | None,
    every_minutes: float | None,
    keep: int,
    notice_fd: int,
) -> dict[str, str]:
    """The child's environment: ``base`` plus the checkpoint settings and the notice pipe.

    >>> env = child_environment({}, url="/c", every_steps=5, every_minutes=None, keep=2,
    ...                         notice_fd=7)
    >>> sorted(env.items())  # doctest: +NORMALIZE_WHITESPACE
    [('COSTGUARD_CHECKPOINT_EVERY_STEPS', '5'), ('COSTGUARD_CHECKPOINT_KEEP', '2'),
     ('COSTGUARD_CHECKPOINT_URL', '/c'), ('COSTGUARD_NOTICE_FD', '7')]
    """
    env = dict(base)
    env["COSTGUARD_CHECKPOINT_URL"] = url
    env["COSTGUARD_CHECKPOINT_KEEP"] = str(keep)
    env["COSTGUARD_NOTICE_FD"] = str(notice_fd)
    for name, value in (
        ("COSTGUARD_CHECKPOINT_EVERY_STEPS", every_steps),
        ("COSTGUARD_CHECKPOINT_EVERY_MINUTES", every_minutes),
    ):
        if value is None:
            env.pop(name, None)
        else:
            env[name] = str(value)
    return env


def exit_code(returncode: int) -> int:
    """The shell's convention for a child's status: 128 + N when killed by signal N.

    >>> exit_code(3), exit_code(-9)
    (3, 137)
    """
    return 128 - returncode if returncode < 0 else returncode


def _storage_options() -> dict[str, Any] | None:
    text = os.environ.get("COSTGUARD_STORAGE_OPTIONS", "").strip()
    if not text:
        return None
    try:
        options = json.loads(text)
    except ValueError:
        options = None
    if not isinstance(options, dict):
        msg = "COSTGUARD_STORAGE_OPTIONS must be a JSON object"
        raise InputError(msg, hint="e.g. COSTGUARD_STORAGE_OPTIONS='{\"anon\": false}'")
    return options


@contextlib.contextmanager
def _registered(pid: int) -> Iterator[None]:
    """Tell ``costguard agent`` a job runs (its pid file), where the jobs folder is writable.

    On a laptop the default folder (``/run/costguard/jobs``) does not exist for a normal
    user: no agent runs there, so nothing is registered and nothing fails.
    """
    with contextlib.ExitStack() as stack:
        with contextlib.suppress(OSError):
            stack.enter_context(registered_job(jobs_dir(os.environ), pid))
        yield


@click.command(
    "run",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    epilog="""\b
Examples:
  costguard run --checkpoint s3://my-bucket/run1 --every-steps 500 -- python train.py
  costguard run --checkpoint checkpoints/ --every-minutes 10 -- python train.py --lr 3e-4
\b
In train.py:
  ckpt = Checkpointer.from_env(default="checkpoints/")
  start = ckpt.restore(model=model, optimizer=opt)
  for step in range(start, total_steps):
      ...
      ckpt.step(step, model=model, optimizer=opt)
\b
Exit code: the script's; 75 means it saved on a preemption notice and can be resumed
by running the same command again.""",
    short_help="Run a training script with checkpointing and preemption notices.",
)
@click.option(
    "--checkpoint",
    "url",
    default="checkpoints/",
    show_default=True,
    help="Where checkpoints go: a folder, s3://bucket/prefix, gs://..., az://container/...",
)
@click.option("--every-steps", type=click.IntRange(min=1), help="Save every N steps.")
@click.option(
    "--every-minutes",
    type=click.FloatRange(min=0, min_open=True),
    help="Save every T minutes.",
)
@click.option(
    "--keep",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Keep the newest N checkpoints (in the store too).",
)
@click.option(
    "--cloud",
    type=click.Choice(["auto", "aws", "gcp", "azure", "none"]),
    envvar="COSTGUARD_CLOUD",
    default="auto",
    show_default=True,
    help="Whose preemption notices to watch; auto reads the machine's vendor (no network).",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
@click.pass_context
def run_command(
    ctx: click.Context,
    url: str,
    every_steps: int | None,
    every_minutes: float | None,
    keep: int,
    cloud: str,
    command: Sequence[str],
) -> None:
    """Run COMMAND (after --) with checkpointing to URL and preemption notices.

    Before the script starts, the checkpoint location is checked (write, read back,
    delete a probe object), so a wrong URL or a missing bucket fails at once.
    """
    from costguard.checkpoint.notices import (
        NoticeBoard,
        detect_cloud,
        poll_interval_s,
        relay,
        start_cloud_watcher,
    )
    from costguard.checkpoint.store import Store

    if "://" not in url:
        url = str(Path(url).expanduser().resolve())
    notice_env = {**os.environ, "COSTGUARD_CLOUD": cloud}
    detect_cloud(notice_env)  # bad settings are input errors, before anything starts
    poll_interval_s(notice_env)
    Store.open(url, _storage_options()).check_writable()

    read_fd, write_fd = os.pipe()
    env = child_environment(
        dict(os.environ),
        url=url,
        every_steps=every_steps,
        every_minutes=every_minutes,
        keep=keep,
        notice_fd=read_fd,
    )
    try:
        # Its own process group: a terminal's Ctrl-C reaches the child once, through us.
        child = subprocess.Popen(list(command), env=env, pass_fds=(read_fd,), process_group=0)
    except OSError as exc:
        os.close(read_fd)
        os.close(write_fd)
        msg = f"cannot start {command[0]!r}: {exc.strerror or exc}"
        raise InputError(msg, hint="check the command after --") from None
    os.close(read_fd)

    def forward(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    def relay_notice(notice: Any) -> None:
        # The child may have exited or closed the pipe; the notice then has no reader.
        with contextlib.suppress(OSError):
            relay(write_fd, notice)

    previous: dict[int, Callable[..., Any] | int | None] = {}
    for sig in FORWARDED:
        previous[sig] = signal.signal(sig, forward)
    watcher = start_cloud_watcher(NoticeBoard(), notice_env, on_notice=relay_notice)
    try:
        with _registered(child.pid):
            returncode = child.wait()
    finally:
        if watcher is not None:
            watcher.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        os.close(write_fd)
    code = exit_code(returncode)
    if code == EXIT_PREEMPTED:
        click.echo(
            "costguard: the script saved a checkpoint on a preemption notice; "
            "run the same command to resume.",
            err=True,
        )
    ctx.exit(code)
