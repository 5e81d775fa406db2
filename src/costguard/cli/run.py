"""``costguard run``: run a training script with checkpointing and preemption notices.

The script runs as a child process. It learns where to checkpoint from environment
variables (``Checkpointer.from_env`` reads them), signals sent to ``costguard run`` are
forwarded to it, and preemption notices from this cloud's metadata service are relayed
to it through an inherited pipe (``COSTGUARD_NOTICE_FD``). ``costguard run`` exits with
the child's exit code (75 after a notice-triggered save: run the same command to resume).

Multi-process launchers (torchrun) start their workers in new sessions, without the pipe,
and treat SIGUSR1 as fatal. So every notice is also appended to a relay file that each
rank polls (``COSTGUARD_NOTICE_FILE``), and with such a launcher SIGTERM and SIGUSR1 are
relayed as notices instead of being forwarded (a second one is forwarded). A rank that
saved on a notice leaves a record (``COSTGUARD_PREEMPTED_FILE``); the launcher's own
failure code then becomes 75.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import click

from costguard.cli.params import FiniteFloat, Url, WholeNumber
from costguard.errors import InputError
from costguard.reaper.agent import jobs_dir, registered_job

#: Signals passed on to the child (SIGTERM from Kubernetes or shutdown, SIGUSR1 from SLURM).
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
EXIT_PREEMPTED = 75  # the Checkpointer's code after an emergency save (EX_TEMPFAIL)
#: Signals that are preemption notices to the Checkpointer (relayed to launchers' workers).
NOTICE_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
#: Commands whose workers neither inherit the pipe nor share the process group.
LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


def child_environment(
    base: dict[str, str],
    *,
    url: str,
    every_steps: int | None,
    every_minutes: float | None,
    keep: int,
    notice_fd: int,
    relay_dir: str | None = None,
    run_pid: int | None = None,
) -> dict[str, str]:
    """The child's environment: ``base`` plus the checkpoint settings and the notice pipe
    (and, with ``relay_dir``, the relay file and preemption record for deeper processes).

    >>> env = child_environment({}, url="/c", every_steps=5, every_minutes=None, keep=2,
    ...                         notice_fd=7)
    >>> sorted(env.items())  # doctest: +NORMALIZE_WHITESPACE
    [('COSTGUARD_CHECKPOINT_EVERY_STEPS', '5'), ('COSTGUARD_CHECKPOINT_KEEP', '2'),
     ('COSTGUARD_CHECKPOINT_URL', '/c'), ('COSTGUARD_NOTICE_FD', '7')]
    >>> env = child_environment({}, url="/c", every_steps=None, every_minutes=None, keep=2,
    ...                         notice_fd=7, relay_dir="/r", run_pid=9)
    >>> env["COSTGUARD_NOTICE_FILE"], env["COSTGUARD_PREEMPTED_FILE"], env["COSTGUARD_RUN_PID"]
    ('/r/notices.jsonl', '/r/preempted.json', '9')
    """
    env = dict(base)
    env["COSTGUARD_CHECKPOINT_URL"] = url
    env["COSTGUARD_CHECKPOINT_KEEP"] = str(keep)
    env["COSTGUARD_NOTICE_FD"] = str(notice_fd)
    for name in ("COSTGUARD_NOTICE_FILE", "COSTGUARD_PREEMPTED_FILE", "COSTGUARD_RUN_PID"):
        env.pop(name, None)  # an outer costguard run's settings are not ours
    if relay_dir is not None:
        env["COSTGUARD_NOTICE_FILE"] = str(Path(relay_dir, "notices.jsonl"))
        env["COSTGUARD_PREEMPTED_FILE"] = str(Path(relay_dir, "preempted.json"))
    if run_pid is not None:
        env["COSTGUARD_RUN_PID"] = str(run_pid)
    for name, value in (
        ("COSTGUARD_CHECKPOINT_EVERY_STEPS", every_steps),
        ("COSTGUARD_CHECKPOINT_EVERY_MINUTES", every_minutes),
    ):
        if value is None:
            env.pop(name, None)
        else:
            env[name] = str(value)
    return env


def is_launcher(command: Sequence[str]) -> bool:
    """Whether ``command`` starts a multi-process launcher (torchrun and its module forms).

    >>> is_launcher(["torchrun", "--nproc-per-node", "2", "train.py"])
    True
    >>> is_launcher(["python", "-m", "torch.distributed.run", "train.py"])
    True
    >>> is_launcher(["python", "train.py", "--note", "torchrun"])
    False
    """
    if not command:
        return False
    if Path(command[0]).name in LAUNCHERS:
        return True
    args = iter(command[1:])
    for arg in args:  # the interpreter's options, up to the script or -m
        if arg == "-m":
            return next(args, "") in LAUNCHERS
        if arg in ("-X", "-W"):
            next(args, "")
        elif not arg.startswith("-") or arg == "-c":
            return False
    return False


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
by running the same command again.
\b
Multi-process training (each rank makes a Checkpointer; rank 0 writes):
  costguard run --checkpoint s3://my-bucket/run1 -- torchrun --nproc-per-node 2 train.py""",
    short_help="Run a training script with checkpointing and preemption notices.",
)
@click.option(
    "--checkpoint",
    "url",
    type=Url(),
    default="checkpoints/",
    show_default=True,
    help="Where checkpoints go: a folder, s3://bucket/prefix, gs://..., az://container/...",
)
@click.option("--every-steps", type=WholeNumber(min=1), help="Save every N steps.")
@click.option(
    "--every-minutes",
    type=FiniteFloat(min=0, min_open=True),
    help="Save every T minutes.",
)
@click.option(
    "--keep",
    type=WholeNumber(min=1),
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
@click.option(
    "--signals",
    "signal_mode",
    type=click.Choice(["auto", "forward", "relay"]),
    default="auto",
    show_default=True,
    help="SIGTERM/SIGUSR1: forward them to the command, or relay them as notices to every "
    "process (and forward a second one); auto relays for torchrun.",
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
    signal_mode: str,
    command: Sequence[str],
) -> None:
    """Run COMMAND (after --) with checkpointing to URL and preemption notices.

    Before the script starts, the checkpoint location is checked (write, read back,
    delete a probe object), so a wrong URL or a missing bucket fails at once.
    """
    from costguard.checkpoint.distributed import append_notice
    from costguard.checkpoint.notices import (
        Notice,
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

    relay_signals = signal_mode == "relay" or (signal_mode == "auto" and is_launcher(command))
    relay_dir = tempfile.mkdtemp(prefix="costguard-run-")
    notice_file = Path(relay_dir, "notices.jsonl")
    preempted_file = Path(relay_dir, "preempted.json")
    read_fd, write_fd = os.pipe()
    env = child_environment(
        dict(os.environ),
        url=url,
        every_steps=every_steps,
        every_minutes=every_minutes,
        keep=keep,
        notice_fd=read_fd,
        relay_dir=relay_dir,
        run_pid=os.getpid(),
    )
    try:
        # Its own process group: a terminal's Ctrl-C reaches the child once, through us.
        child = subprocess.Popen(list(command), env=env, pass_fds=(read_fd,), process_group=0)
    except OSError as exc:
        os.close(read_fd)
        os.close(write_fd)
        shutil.rmtree(relay_dir, ignore_errors=True)
        msg = f"cannot start {command[0]!r}: {exc.strerror or exc}"
        raise InputError(msg, hint="check the command after --") from None
    os.close(read_fd)

    def relay_notice(notice: Any) -> None:
        # The child may have exited or closed the pipe; the notice then has no reader.
        with contextlib.suppress(OSError):
            relay(write_fd, notice)
        with contextlib.suppress(OSError):
            append_notice(notice_file, notice)

    relayed: set[int] = set()

    def forward(signum: int, frame: FrameType | None) -> None:
        if relay_signals and signum in NOTICE_SIGNALS and signum not in relayed:
            relayed.add(signum)
            name = signal.Signals(signum).name
            relay_notice(Notice("signal", "signal", None, name))
            return
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

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
        preempted = preempted_file.exists()
        shutil.rmtree(relay_dir, ignore_errors=True)
    code = exit_code(returncode)
    if code not in (0, EXIT_PREEMPTED) and preempted:
        # torchrun reports its workers' 75 as a failure of its own (exit 1).
        click.echo(
            f"costguard: the command exited with {code} after its ranks saved on a "
            "preemption notice; reporting 75.",
            err=True,
        )
        code = EXIT_PREEMPTED
    if code == EXIT_PREEMPTED:
        click.echo(
            "costguard: the script saved a checkpoint on a preemption notice; "
            "run the same command to resume.",
            err=True,
        )
    # costguard launch: tell the controller how this attempt ended (job/attempt-N.exit.json).
    from costguard.spot.job import record_exit

    record_exit(os.environ, url, code, _storage_options())
    ctx.exit(code)
