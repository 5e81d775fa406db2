"""The supervisor behind ``costguard run``: a training script run as a child process with
checkpointing and preemption notices.

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
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from costguard import contract
from costguard.errors import EXIT_BAD_INPUT, CostguardError, InputError
from costguard.logs import get_logger
from costguard.secrets import mask_words
from costguard.text import visible

logger = get_logger(__name__)

#: Where the supervisor's lines go (``costguard run`` writes them to stderr).
Say = Callable[[str], None]

#: Without pidfds (not Linux): how often the wait for the script checks whether it ended.
EXIT_POLL_S = 0.25
#: Signals passed on to the child (SIGTERM from Kubernetes or shutdown, SIGUSR1 from SLURM).
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
EXIT_PREEMPTED = contract.EXIT_PREEMPTED  # the Checkpointer's code after an emergency save
#: Signals that are preemption notices to the Checkpointer (relayed to launchers' workers).
NOTICE_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
#: Commands whose workers neither inherit the pipe nor share the process group.
LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")
#: How often the events file of the script's Checkpointer is read.
EVENTS_POLL_S = 0.25
#: Under ``costguard launch``: how often the store is asked whether the controller wants
#: the script to save and stop (``job/stop.json``); a local folder is looked at more often.
STOP_POLL_S = 5.0
STOP_POLL_LOCAL_S = 0.5


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
    start_fresh: bool = False,
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
    >>> env[contract.ENV_NOTICE_FILE], env[contract.ENV_PREEMPTED_FILE], env[contract.ENV_RUN_PID]
    ('/r/notices.jsonl', '/r/preempted.json', '9')
    >>> env[contract.ENV_EVENTS_FILE]
    '/r/events.jsonl'
    """
    env = dict(base)
    env[contract.ENV_URL] = url
    env[contract.ENV_KEEP] = str(keep)
    env[contract.ENV_NOTICE_FD] = str(notice_fd)
    for name in (
        contract.ENV_NOTICE_FILE,
        contract.ENV_PREEMPTED_FILE,
        contract.ENV_RUN_PID,
        contract.ENV_EVENTS_FILE,
        contract.ENV_START_FRESH,
    ):
        env.pop(name, None)  # an outer costguard run's settings are not ours
    if start_fresh:
        env[contract.ENV_START_FRESH] = "1"
    if relay_dir is not None:
        env[contract.ENV_NOTICE_FILE] = str(Path(relay_dir, "notices.jsonl"))
        env[contract.ENV_PREEMPTED_FILE] = str(Path(relay_dir, "preempted.json"))
        env[contract.ENV_EVENTS_FILE] = str(Path(relay_dir, "events.jsonl"))
    if run_pid is not None:
        env[contract.ENV_RUN_PID] = str(run_pid)
    for name, value in (
        (contract.ENV_EVERY_STEPS, every_steps),
        (contract.ENV_EVERY_MINUTES, every_minutes),
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


class Events:
    """What the script's Checkpointer reports (JSON lines in the events file), followed
    while it runs: each restore and durable save becomes a line on stderr. A trainer's
    pace (:mod:`costguard.integrations.pace`, marked ``record``) is written to ``store``'s
    ``job/pace.json`` here, as the Checkpointer writes its own."""

    def __init__(self, path: Path, *, quiet: bool, say: Say, store: Any = None) -> None:
        self.path = path
        self.quiet = quiet
        self._say = say
        self._store = store
        self._pace_failed = False
        self.restored: dict[str, Any] | None = None
        #: The restore's refusal to start from step 0 (checkpoints exist, none usable).
        self.refused: dict[str, Any] | None = None
        self.last_durable: dict[str, Any] | None = None
        #: How many durable saves the script's Checkpointer reported.
        self.saves = 0
        #: The trainer's last pace event (its steps done and its total, when it knows it).
        self.pace: dict[str, Any] | None = None
        #: rank -> its "closed" event: the loop ended and the final checkpoint is durable.
        self.closed: dict[int, dict[str, Any]] = {}
        #: pid -> the end its notice watch reported (``None`` while its code runs):
        #: :mod:`costguard.integrations.notices`.
        self.watches: dict[int, dict[str, Any] | None] = {}
        self._offset = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="costguard-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop following, then read what is left."""
        self._stop.set()
        self._thread.join(timeout=5)
        self._read()

    def _follow(self) -> None:
        while not self._stop.wait(EVENTS_POLL_S):
            self._read()

    def _read(self) -> None:
        try:
            with self.path.open("rb") as file:
                file.seek(self._offset)
                data = file.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1  # only whole lines: the writer may be mid-line
        self._offset += end
        for line in data[:end].splitlines():
            with contextlib.suppress(ValueError):
                self._show(json.loads(line))

    def _show(self, event: dict[str, Any]) -> None:
        if event.get("event") == "restore" and event.get("refused"):
            self.refused = event  # said once, as the command's error, when the script ends
        elif event.get("event") == "restore":
            self.restored = event if event.get("name") else None
            if not self.quiet:
                self._say(
                    f"resumed from step {event['step']} ({event['name']})"
                    if event.get("name")
                    else "no checkpoint yet: the script starts from step 0"
                )
        elif event.get("event") == "closed":
            self.closed[int(event.get("rank", 0))] = event
        elif event.get("event") in (contract.EVENT_WATCH, contract.EVENT_WATCH_END) and (
            isinstance(event.get("pid"), int)
        ):
            end = event if event["event"] == contract.EVENT_WATCH_END else None
            self.watches[event["pid"]] = end or self.watches.get(event["pid"])
        elif event.get("event") == "pace":
            self.pace = event
            if event.get("record") is True and self._store is not None:
                self._record_pace(event)
            line = eta_line(event)
            if line and not self.quiet:
                self._say(line)
        elif event.get("event") == "save":
            if event.get("ok"):
                self.last_durable = event
                self.saves += 1
                if not self.quiet:
                    self._say(
                        f"saved step {event['step']} ({event['reason']}, "
                        f"{event['size_bytes']:,} bytes, {event['save_s']:.1f} s)"
                    )
            else:
                self._say(f"the save of step {event['step']} failed: {event.get('error')}")

    def _record_pace(self, event: dict[str, Any]) -> None:
        """Write a trainer's pace to ``job/pace.json``; a failure is said once."""
        from costguard.checkpoint.pace import parse_pace, write_pace
        from costguard.errors import CostguardError

        pace = parse_pace(json.dumps(event).encode())
        if pace is None:
            return
        try:
            write_pace(self._store, pace)
        except CostguardError as exc:
            if not self._pace_failed:
                self._pace_failed = True
                self._say(f"could not record the pace: {exc.message}")

    def finished(self) -> bool:
        """Whether every rank under this run (this node's, of a job of several nodes)
        closed its Checkpointer after the final step was committed (which rank 0 tells
        every rank of the world)."""
        if not self.closed:
            return False
        world = {_count(e.get("world", 1)) for e in self.closed.values()}
        here = {_count(e.get("node_ranks", e.get("world", 1))) for e in self.closed.values()}
        steps = {e.get("step") for e in self.closed.values()}
        return (
            len(world) == len(here) == 1
            and len(self.closed) == here.pop()
            and all(0 <= rank < max(world) for rank in self.closed)
            and len(steps) == 1
            and all(e.get("committed") is True for e in self.closed.values())
        )

    def newest(self, synced: Any = None, store: Any = None) -> str:
        """The newest durable checkpoint this run knows of, for the exit summary: the
        Checkpointer's, or ``synced`` (a :class:`~costguard.checkpoint.foldersync.Kept`,
        the newest ``--sync-dir`` checkpoint in the store) when that is newer. When this
        run saw neither (a node of several, whose ranks do not include rank 0, the one
        that writes; a script that restored nothing and saved nothing), ``store``'s
        newest committed checkpoint, which is where the next run starts."""
        event = self.last_durable or self.restored
        if synced is not None and (event is None or int(event["step"]) <= synced.step):
            return str(synced.describe())
        if event is not None:
            return f"step {event['step']} ({event['name']})"
        if store is None:
            return "none yet (a new run starts from step 0)"
        from costguard.checkpoint.inventory import latest

        try:
            entry = latest(store)
        except CostguardError as exc:
            return f"unknown (the store could not be listed: {exc.message})"
        if entry is None:
            return "none yet (a new run starts from step 0)"
        return f"step {entry.step} ({visible(entry.name)})"


class StopWatch:
    """Under ``costguard launch``: the controller's request to save and stop
    (``--stop-at-projection``) becomes a notice to the script, as a preemption would. Only
    a request for this attempt whose proof hashes to its check (``COSTGUARD_STOP_CHECK``)
    counts: anything else in ``job/stop.json`` is a warning, and the run goes on."""

    def __init__(
        self,
        store: Any,
        job_id: str,
        attempt: int,
        check: str | None,
        on_stop: Callable[[Any], None],
        say: Say,
    ) -> None:
        self.store = store
        self._say = say
        self.job_id = job_id
        self.attempt = attempt
        self._check = check
        self._on_stop = on_stop
        self._interval_s = STOP_POLL_LOCAL_S if store.is_local else STOP_POLL_S
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="costguard-stop", daemon=True)

    @classmethod
    def under_launch(
        cls, store: Any, env: dict[str, str], on_stop: Callable[[Any], None], say: Say
    ) -> StopWatch | None:
        """A started watch when this run is an attempt of a ``costguard launch`` job."""
        from costguard.proof import check_from_env
        from costguard.tags import ATTEMPT, is_job_id

        job_id = env.get(contract.ENV_JOB_ID, "")
        attempt = env.get(contract.ENV_JOB_ATTEMPT, "").strip()
        if not is_job_id(job_id) or not ATTEMPT.fullmatch(attempt):
            return None
        watch = cls(store, job_id, int(attempt), check_from_env(env), on_stop, say)
        watch._thread.start()
        return watch

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        from costguard.checkpoint.notices import Notice

        warned: set[str] = set()
        while not self._stop.wait(self._interval_s):
            reason = self._request(warned)
            if reason is not None:
                self._on_stop(Notice("costguard", "stop", None, reason[:200]))
                return

    def _request(self, warned: set[str]) -> str | None:
        """The request for this attempt, if one holds; each warning is said once."""

        def once(message: str) -> None:
            if message not in warned:
                warned.add(message)
                self._say(message)

        from costguard.proof import stop_request

        try:
            return stop_request(self.store, self.job_id, self.attempt, self._check, once)
        except CostguardError:
            return None  # the store cannot be read now: asked again at the next poll


def eta_line(event: dict[str, Any]) -> str | None:
    """The finish time a pace event gives, when the run's total steps are known: its steps
    left at the measured pace, with the saves' stalls and a trainer's evaluations.

    >>> eta_line({"steps_done": 500, "total_steps": 2000, "steps_measured": 400,
    ...           "seconds_measured": 200.0, "overhead_s": 0.0})
    'step 500 of 2000 (25%) at 0.5 s/step: finish in 12 min 30 s'
    """
    from costguard.money import duration

    try:
        done, total = int(event["steps_done"]), int(event["total_steps"])
        measured, seconds = int(event["steps_measured"]), float(event["seconds_measured"])
        stalls = float(event.get("overhead_s") or 0.0) + float(event.get("evaluation_s") or 0.0)
        overhead = stalls / seconds
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    if measured <= 0 or total <= 0:
        return None
    per_step = seconds / measured
    left = max(0, total - done) * per_step * (1 + overhead)
    return (
        f"step {done} of {total} ({min(done / total, 1.0):.0%}) at {per_step:.3g} s/step: "
        f"finish in {duration(left)}"
    )


def wait_answering_signals(child: subprocess.Popen[Any]) -> int:
    """``child.wait()``, running this process's signal handlers as soon as a signal comes.

    CPython runs a handler in the main thread, between bytecodes. The kernel may hand a
    signal sent to this process to any of its threads (the watchers', a store's I/O
    thread); when that is not the main thread, a main thread blocked in ``waitpid`` is not
    woken, and the handler (a notice to relay, a signal to pass on) would wait for the
    child to end by itself. So the main thread waits on the child's pidfd and on
    :func:`signal.set_wakeup_fd` together, and runs the handlers when either wakes it.
    Without pidfds (not Linux, or a kernel older than 5.3) it checks the child every
    :data:`EXIT_POLL_S`.
    """
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    previous = signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    try:
        pidfd: int | None = os.pidfd_open(child.pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(wake_read, selectors.EVENT_READ)
            if pidfd is not None:
                selector.register(pidfd, selectors.EVENT_READ)
            while child.poll() is None:
                selector.select(None if pidfd is not None else EXIT_POLL_S)
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_read, 256):  # the handlers run as this loop goes on
                        pass
    finally:
        signal.set_wakeup_fd(previous)
        for fd in (wake_read, wake_write, pidfd):
            if fd is not None:
                os.close(fd)
    return child.returncode


#: The one-line fix for a script that does not act on a notice, by the trainer it runs.
NOTICE_FIXES = {
    "transformers": "Trainer(..., callbacks=[costguard.integrations.transformers"
    ".PreemptionCallback()])",
    "lightning": "Trainer(..., callbacks=[costguard.integrations.lightning.PreemptionCallback()])",
    "accelerate": "if costguard.integrations.accelerate.notice(): "
    "accelerator.save_state(...); sys.exit(75)",
    "": "ckpt = costguard.Checkpointer.from_env(...); ckpt.step(...) at each step",
}


def _count(value: object) -> int:
    """A count from an event (a rank's own record): a positive int, else 0 (none)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def take(tokens: list[bool]) -> bool:
    """Take one of ``tokens`` if one is left: one step (``list.pop``), so of handlers and
    threads asking at once, as many get one as there are.

    >>> tokens = [True]
    >>> take(tokens), take(tokens)
    (True, False)
    """
    try:
        tokens.pop()
    except IndexError:
        return False
    return True


def ignored_line(kind: str, seconds: float) -> str:
    """What a script that did not act on a notice is told, with the one-line fix.

    >>> ignored_line("lightning", 12.3)[:64]
    'the script has not acted on the notice passed on 12 s ago (no sa'
    """
    fix = NOTICE_FIXES.get(kind, NOTICE_FIXES[""])
    return (
        f"the script has not acted on the notice passed on {seconds:.0f} s ago (no save "
        f"since): the work since its last save is at risk. The fix: {fix}"
    )


def trainer_end(
    events: Events, syncer: Any, total_steps: int | None = None
) -> tuple[bool | None, str]:
    """Whether the trainer reached its end, from its own state (``None``: not known), and
    the figures that say so: every rank's Checkpointer closed on its final step, the
    steps done and total of a trainer's callback, the ``global_step`` and ``max_steps``
    of a Hugging Face ``trainer_state.json`` the run wrote; for a trainer that says
    neither (an Accelerate loop), the step of the newest ``--sync-dir`` checkpoint in the
    store against ``total_steps`` (``costguard run --total-steps``)."""
    if events.finished():
        return True, "every rank closed with its final checkpoint"
    progress: tuple[int, int] | None = None
    pace = events.pace or {}
    with contextlib.suppress(KeyError, TypeError, ValueError):
        progress = (int(pace["steps_done"]), int(pace["total_steps"]))
    if progress is None and syncer is not None:
        progress = syncer.progress()
    newest = syncer.newest if syncer is not None else None
    if progress is None and total_steps and newest is not None:
        return (
            newest.step >= total_steps,
            f"its newest checkpoint, {newest.path}, is step {newest.step} of --total-steps "
            f"{total_steps}",
        )
    if progress is None or progress[1] <= 0:
        return None, "its end not known"
    done, total = progress
    return done >= total, f"step {done} of {total}"


def summary(code: int, newest: str, *, interrupted: bool = False) -> str:
    """What the exit code means, the newest durable checkpoint and what to do next.

    >>> summary(75, "step 300")
    'exit 75: saved on a notice; newest checkpoint: step 300. Run the same command to resume.'
    """
    if interrupted:
        what = "stopped at once by a second Ctrl-C"
        then = "Run the same command to resume from it."
    elif code == 0:
        return f"exit 0: the script finished; final checkpoint: {newest}."
    elif code == EXIT_PREEMPTED:
        what = "saved on a notice"
        then = "Run the same command to resume."
    else:
        what = "the script failed"
        then = "Fix the failure, then run the same command to resume from it."
    return f"exit {code}: {what}; newest checkpoint: {newest}. {then}"


def untouched(
    watches: Mapping[int, Mapping[str, Any] | None], forwarded_ns: Sequence[int], pid: int
) -> bool:
    """Whether the notices passed on left the script's course as it would have been
    without them, from what its notice watches reported
    (:class:`~costguard.integrations.notices.Watch`): every watch reported the end of its
    process's code, none was handed a notice, none took a signal that another handler took
    too, and the script's own process (``pid``) took, before its end, each signal
    costguard forwarded to it before then (``forwarded_ns``, the wall clock's time of each
    send): none went to another handler in its place. No watch: not known (``False``).

    >>> end = {"seen": False, "alone": True, "signals": 1, "unix_ns": 50}
    >>> untouched({7: end}, [40], 7), untouched({7: end}, [40, 45], 7)
    (True, False)
    >>> untouched({7: {**end, "seen": True}}, [40], 7), untouched({7: end, 8: None}, [], 7)
    (False, False)
    """
    ends = list(watches.values())
    if not ends or not all(
        end is not None and end.get("seen") is False and end.get("alone") is True for end in ends
    ):
        return False
    own = watches.get(pid)
    if own is None:
        return not forwarded_ns
    ended, took = own.get("unix_ns"), own.get("signals")
    if not isinstance(ended, int) or not isinstance(took, int):
        return False
    return took >= sum(sent < ended for sent in forwarded_ns)


def _after_notice(
    code: int, events: Events, syncer: Any, say: Say, *, unseen: bool, total_steps: int | None
) -> int:
    """The true exit of a script that ended (0, or by a signal) after costguard passed on a
    notice: done (0) when the trainer's own state says it reached its end, or when it exited
    0 by itself with the notice never seen (``unseen``: :func:`untouched`), else preempted
    (75: resumable), whatever the script's own code said."""
    end, figures = trainer_end(events, syncer, total_steps)
    if end:
        if code != 0:
            say(
                f"the script's work was done ({figures}) when the notice's signal ended it "
                f"(exit {code}); reporting 0"
            )
        return 0
    if code == 0 and unseen:
        say(
            "the script exited 0 by itself and never looked at the notice costguard passed "
            "on (it came after the script's last look, as in a teardown after its loop): "
            "its work was done"
        )
        return 0
    say(
        f"the script exited {code} after costguard passed on a notice, before the trainer "
        f"reached its end ({figures}): preempted, reporting 75"
    )
    return EXIT_PREEMPTED


@contextlib.contextmanager
def _registered(pid: int) -> Iterator[None]:
    """Tell ``costguard agent`` a job runs (its pid file), where the jobs folder is writable.

    On a laptop the default folder (``/run/costguard/jobs``) does not exist for a normal
    user: no agent runs there, so nothing is registered and nothing fails.
    """
    with contextlib.ExitStack() as stack:
        with contextlib.suppress(OSError):
            stack.enter_context(contract.registered_job(contract.jobs_dir(os.environ), pid))
        yield


def supervise(
    command: Sequence[str],
    *,
    url: str,
    every_steps: int | None,
    every_minutes: float | None,
    keep: int,
    cloud: str,
    signal_mode: str,
    quiet: bool,
    say: Say,
    sync_dir: str | None = None,
    start_fresh: bool = False,
    total_steps: int | None = None,
    pilot_steps: int | None = None,
    ending: bool = False,
) -> int:
    """Run ``command`` with checkpointing to ``url`` and preemption notices; its exit code
    as ``costguard run`` reports it (75: saved on a notice, run again to resume).

    Signals: see :func:`entry_dispositions`. The caller's handlers are put back on return;
    with ``ending`` (the process ends once this returns: the console script), a notice's
    signal is ignored instead, so one that comes while the process ends cannot kill it
    after it said how the script ended.

    When the script's restore refused to start from step 0 (checkpoints exist, none can be
    used), raises that :class:`~costguard.checkpoint.restoring.NoUsableCheckpointError`
    (exit 2) once the script has ended; ``start_fresh`` lets the script start over.

    Before the script starts, the checkpoint location is checked (write, read back,
    delete a probe object), so a wrong URL or a missing bucket fails at once. With
    ``sync_dir``, the trainer's own checkpoints there are kept in the store
    (:mod:`~costguard.checkpoint.foldersync`): the newest is put back before the script
    starts, each one it finishes is uploaded, the last ones after it exits.

    ``total_steps`` (the whole run's steps) and ``pilot_steps`` (stop after that many:
    ``costguard pilot``) reach the script's Checkpointer through the environment.
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
    from costguard.checkpoint.store import Store, storage_options_from_env

    if "://" not in url:
        url = str(Path(url).expanduser().resolve())
    notice_env = {**os.environ, contract.ENV_CLOUD: cloud}
    detect_cloud(notice_env)  # bad settings are input errors, before anything starts
    poll_interval_s(notice_env)
    storage_options = storage_options_from_env()
    store = Store.open(url, storage_options)  # refuses credentials in the URL, unknown schemes
    store.check_writable()
    say(f"checkpoints go to {store.url}; running {' '.join(mask_words(command))[:120]}")
    entry, kept_ignored = entry_dispositions()
    for signum in kept_ignored:
        if signum in NOTICE_SIGNALS:
            say(ignored_at_entry_line(signum))
    syncer = None
    if sync_dir is not None:
        from costguard.checkpoint.foldersync import FolderSync

        syncer = FolderSync(
            store,
            Path(sync_dir).expanduser().resolve(),
            keep=keep,
            say=say,
            workdir=Path.cwd(),
        )

    def attempt() -> tuple[int, Events, bool, bool]:
        """Run the script once: its code as reported, its events, whether a second
        Ctrl-C stopped it, whether a notice was passed on to it."""
        relay_signals = signal_mode == "relay" or (signal_mode == "auto" and is_launcher(command))
        relay_dir = tempfile.mkdtemp(prefix="costguard-run-")
        notice_file = Path(relay_dir, "notices.jsonl")
        preempted_file = Path(relay_dir, "preempted.json")
        events = Events(Path(relay_dir, "events.jsonl"), quiet=quiet, say=say, store=store)
        read_fd, write_fd = os.pipe()
        from costguard.checkpoint.pace import ENV_PILOT_STEPS, ENV_TOTAL_STEPS

        base = dict(os.environ)
        for name, value in ((ENV_TOTAL_STEPS, total_steps), (ENV_PILOT_STEPS, pilot_steps)):
            base.pop(name, None)  # an outer costguard run's are not ours
            if value is not None:
                base[name] = str(value)
        env = child_environment(
            base,
            url=url,
            every_steps=every_steps,
            every_minutes=every_minutes,
            keep=keep,
            notice_fd=read_fd,
            relay_dir=relay_dir,
            run_pid=os.getpid(),
            start_fresh=start_fresh,
        )
        early: list[int] = []  # the signals that come before the script has started

        # The handlers are in place before the script starts: a signal in between is
        # passed on, never this process's death with the script left running; and the
        # script starts with each of these signals' default action, as exec gives a
        # caught one (a signal ignored at entry, left alone, stays ignored for it too).
        queue = _queue(early)
        for sig in FORWARDED:
            if sig not in kept_ignored:
                signal.signal(sig, queue)
        # The job is registered before the script starts, under this process's id (alive
        # as long as the job), then under the script's: the script may look for its job
        # first thing, and the agent never sees a moment without it.
        before_start = contextlib.ExitStack()
        before_start.enter_context(_registered(os.getpid()))
        try:
            # Its own process group: a terminal's Ctrl-C reaches the child once, through us.
            child = subprocess.Popen(list(command), env=env, pass_fds=(read_fd,), process_group=0)
        except OSError as exc:
            before_start.close()
            os.close(read_fd)
            os.close(write_fd)
            shutil.rmtree(relay_dir, ignore_errors=True)
            msg = f"cannot start {command[0]!r}: {exc.strerror or exc}"
            raise InputError(msg, hint="check the command after --") from None
        os.close(read_fd)
        registration = contextlib.ExitStack()
        registration.enter_context(_registered(child.pid))
        before_start.close()

        #: When each notice was passed on (a relayed one, a forwarded SIGTERM or SIGUSR1):
        #: the clock's time and the wall clock's (a checkpoint's files carry that one).
        noticed: list[tuple[float, int]] = []
        #: The wall clock's time of each notice signal sent to the script itself.
        forwarded_ns: list[int] = []
        #: One token: whoever takes it says that the script ignores notices. Signal
        #: handlers (which interrupt one another) and watcher threads ask; ``pop`` is one
        #: step, so the line is said once.
        say_ignored = [True]
        saves_at_notice: list[int] = []

        def passed_on() -> None:
            """A notice reached the script: a second one while the script has saved nothing
            since the first (no Checkpointer save, no checkpoint written in the sync dir)
            says it ignores them, with the fix."""
            now = time.monotonic()
            if noticed and say_ignored:
                acted = events.saves > saves_at_notice[0] or (
                    syncer is not None and syncer.written_ns() > noticed[0][1]
                )
                if not acted and take(say_ignored):
                    kind = syncer.kind() if syncer is not None else ""
                    say(ignored_line(kind, now - noticed[0][0]))
            if not noticed:
                saves_at_notice.append(events.saves)
            noticed.append((now, time.time_ns()))

        def relay_notice(notice: Any) -> None:
            if child.poll() is not None:
                return  # the script has ended (its last checkpoints are going up): no one to tell
            passed_on()
            # The child may have exited or closed the pipe; the notice then has no reader.
            with contextlib.suppress(OSError):
                relay(write_fd, notice)
            with contextlib.suppress(OSError):
                append_notice(notice_file, notice)

        #: Each signal's first is relayed as a notice, once: a token per signal (a second
        #: signal's handler may interrupt the first's).
        first: dict[int, list[bool]] = {sig: [True] for sig in (signal.SIGINT, *NOTICE_SIGNALS)}
        interrupted: list[bool] = []

        def forward(signum: int, frame: FrameType | None) -> None:
            if signum == signal.SIGINT:
                # Ctrl-C: the first asks the script to save and stop (exit 75); the second
                # stops everything at once. The script never sees a KeyboardInterrupt.
                if take(first[signum]):
                    say("Ctrl-C: asking the script to save and stop (Ctrl-C again stops it now)")
                    relay_notice(Notice("signal", "signal", None, "SIGINT"))
                else:
                    interrupted.append(True)
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(child.pid, signal.SIGKILL)
                return
            if relay_signals and signum in NOTICE_SIGNALS and take(first[signum]):
                name = signal.Signals(signum).name
                relay_notice(Notice("signal", "signal", None, name))
                return
            with contextlib.suppress(ProcessLookupError):
                sent_ns = time.time_ns()
                child.send_signal(signum)  # nothing is sent once the script has ended
                if signum in NOTICE_SIGNALS and child.returncode is None:
                    forwarded_ns.append(sent_ns)
                    passed_on()

        handled = [sig for sig in FORWARDED if sig not in kept_ignored]
        for sig in handled:
            signal.signal(sig, forward)
        for signum in early:  # as they came, now that there is a script to tell
            forward(signum, None)
        watcher = start_cloud_watcher(NoticeBoard(), notice_env, on_notice=relay_notice)
        events.start()
        stop_watch = StopWatch.under_launch(store, dict(os.environ), relay_notice, say)
        if syncer is not None:
            syncer.start()
        try:
            returncode = wait_answering_signals(child)
        finally:
            registration.close()
            if stop_watch is not None:
                stop_watch.stop()
            events.stop()
            if syncer is not None:
                syncer.finish(clean=child.returncode in (0, EXIT_PREEMPTED))
            if watcher is not None:
                watcher.stop()
            os.close(write_fd)
            preempted = preempted_file.exists()
            shutil.rmtree(relay_dir, ignore_errors=True)
            # The script is gone: nothing to pass a signal on to.
            put_back({s: entry[s] if s == signal.SIGINT else late for s in handled})
        code = exit_code(returncode)
        if interrupted:
            code = 130  # the shell's code for Ctrl-C: what the ranks did before it is moot
        elif code not in (0, EXIT_PREEMPTED) and preempted:
            # torchrun reports its workers' 75 as a failure of its own (exit 1).
            say(f"the command exited with {code} after its ranks saved on a notice; reporting 75")
            code = EXIT_PREEMPTED
        if code not in (0, EXIT_PREEMPTED) and not interrupted and events.finished():
            # Done means done: gloo's teardown sometimes aborts a rank after the work is over.
            say(
                f"the command exited with {code} after every rank had closed with its final "
                "checkpoint committed (a crash while shutting down); reporting 0"
            )
            code = 0
        if noticed and not interrupted and (code == 0 or code > 128):
            unseen = events.saves == saves_at_notice[0] and untouched(
                events.watches, forwarded_ns, child.pid
            )
            code = _after_notice(code, events, syncer, say, unseen=unseen, total_steps=total_steps)
        return code, events, bool(interrupted), bool(noticed)

    def late(signum: int, frame: FrameType | None) -> None:
        """A notice's signal after the script ended: costguard run is only saying how it
        ended and recording that for the launcher, which a default SIGTERM would cut
        short (exit -15, no exit record): it is noted, and the run ends as it would,
        never with the script run once more."""
        came_late.append(signum)
        if take(late_said):
            say(f"{signal.Signals(signum).name} after the script ended: finishing its report")

    came_late: list[int] = []
    late_said = [True]
    try:
        restored = syncer.prepare() if syncer is not None else []
        refused_by_trainer: list[Any] = []
        while True:
            script_started_ns = time.time_ns()
            code, events, interrupted, noticed = attempt()
            if syncer is None or not restored or refused_by_trainer:
                if refused_by_trainer and syncer is not None:
                    syncer.judge_refused(
                        refused_by_trainer, restored, proven=syncer.wrote_since(script_started_ns)
                    )
                break
            if code in (0, EXIT_PREEMPTED) or interrupted or noticed or came_late:
                break
            if syncer.wrote_since(script_started_ns):
                break
            # It failed before writing a checkpoint of its own, right after costguard put one
            # back: the trainer's loader may refuse it. Run it once more from the one before,
            # unless a notice came meanwhile (the machine is going away).
            refused_by_trainer = restored
            restored = syncer.fall_back(restored, code)
            if not restored:
                break
            if came_late:
                name = signal.Signals(came_late[0]).name
                say(f"not running the script again: a notice ({name}) came after it ended")
                break
            top = restored[0]
            say(
                f"running the script again from {top.extra['folder']['path']} "
                f"(step {top.step}, {top.name})"
            )
        refused = events.refused if code != 0 and not interrupted else None
        if refused is not None:
            code = EXIT_BAD_INPUT
        else:
            synced = syncer.newest if syncer is not None else None
            say(summary(code, events.newest(synced, store), interrupted=bool(interrupted)))
        # costguard launch: tell the controller how this attempt ended (job/attempt-N.exit.json).
        record_exit(os.environ, url, code, storage_options)
        if refused is not None:
            from costguard.checkpoint.restoring import NoUsableCheckpointError

            raise NoUsableCheckpointError(str(refused["refused"]), hint=refused.get("hint"))
        return code
    finally:
        # Ctrl-C is the caller's again, and so are the others, unless the process ends
        # now: Python puts back the default action of every signal it handles as it shuts
        # down, but leaves an ignored one ignored; a SIGTERM then would kill the process
        # (-15) after it said exit 0.
        put_back(
            {
                s: signal.SIG_IGN if ending and s != signal.SIGINT else entry[s]
                for s in FORWARDED
                if s not in kept_ignored
            }
        )


def put_back(handlers: Mapping[int, Any]) -> None:
    """Set each of ``handlers`` (signal -> handler), SIGINT's last. One that runs as soon as
    it is set and raises (a Ctrl-C's KeyboardInterrupt, a caller's ``sys.exit`` on SIGTERM)
    does not leave the others unset: they are set, then the exception goes on."""
    pending = sorted(handlers.items(), key=lambda item: item[0] == signal.SIGINT)
    try:
        while pending:
            signal.signal(*pending[0])
            pending.pop(0)
    finally:
        if pending:  # set again from the first not known to be set
            put_back(dict(pending))


def entry_dispositions() -> tuple[dict[int, Any], frozenset[int]]:
    """The handlers of the signals :func:`supervise` passes on as it was called, and those
    of them ignored then, which stay ignored: neither caught nor passed on, and ignored by
    the script too, as it would be without costguard. So ``nohup costguard run ...`` keeps
    the script through a hang-up, and a job a batch script starts in the background (its
    Ctrl-C ignored) is not asked to stop by the terminal's Ctrl-C. A handler that was not
    installed from Python (``None``) is put back as the default action."""
    entry: dict[int, Any] = {signum: signal.getsignal(signum) for signum in FORWARDED}
    for signum, handler in entry.items():
        if handler is None:  # a handler not installed from Python cannot be put back
            entry[signum] = signal.SIG_DFL
    return entry, frozenset(s for s, handler in entry.items() if handler == signal.SIG_IGN)


def ignored_at_entry_line(signum: int) -> str:
    """What a run whose notice signal was ignored when it started is told.

    >>> ignored_at_entry_line(signal.SIGTERM)[:60]
    'warning: SIGTERM was ignored when costguard run started (as '
    """
    name = signal.Signals(signum).name
    return (
        f"warning: {name} was ignored when costguard run started (as `trap '' "
        f"{name[3:]}` or its parent leaves it): it stays ignored, by the script too, and is "
        "no preemption notice; the cloud's notices still are"
    )


def _queue(signals: list[int]) -> Callable[[int, FrameType | None], None]:
    """A handler that keeps each signal in ``signals``, for the moments before the script
    starts (they are passed on once it has)."""

    def keep(signum: int, frame: FrameType | None) -> None:
        signals.append(signum)

    return keep


def record_exit(env: Mapping[str, str], url: str, code: int, storage_options: Any = None) -> bool:
    """Write this attempt's exit record (``job/attempt-N.exit.json``, a gang's node its own
    ``job/attempt-N.node-K.exit.json``: the exit code and latest checkpoint step) when it
    runs under ``costguard launch``, so the controller tells "done" from "failed" from
    "preempted".

    Never raises: a record that cannot be written is logged, and the controller then
    treats the attempt as lost.
    """
    import socket

    from costguard.checkpoint.inventory import latest
    from costguard.checkpoint.store import Store

    launched = contract.launched_attempt(env)
    if launched is None:
        return False
    job_id, attempt, node = launched
    try:
        store = Store.open(url, storage_options)
        try:
            entry = latest(store)
        except CostguardError:
            entry = None
        record = {
            "attempt": attempt,
            "exit_code": code,
            "last_step": entry.step if entry is not None else None,
            "finished_unix": time.time(),
            "host": socket.gethostname(),
            "job_id": job_id,
            "node": node,
        }
        contract.write(store, contract.exit_record_path(attempt, node), contract.EXIT, record)
    except CostguardError as exc:
        logger.warning("costguard: could not write the job's exit record: %s", exc.message)
        return False
    return True
