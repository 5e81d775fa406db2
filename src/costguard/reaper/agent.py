"""On-instance autostop: ``costguard agent`` shuts the machine down once it has been idle.

It runs on the GPU instance (``infra/systemd/costguard-agent.service``), takes a
:class:`Reading` every ``interval_seconds`` and shuts down when every reading of the last
``idle_minutes`` is idle (:func:`costguard.reaper.autostop.decide_shutdown`, the same window rule as
the reaper). Unlike
SkyPilot's autostop it watches the GPU itself, not only jobs and SSH (skypilot#10628).

Busy is any of: GPU utilisation, CPU utilisation or network at or above its threshold; no
GPU reading (unless ``gpu_missing_ok``); a job registered by ``costguard run``; an SSH
session (the last two unless configured otherwise).

The job contract (what ``costguard run`` writes, what the agent reads)
-----------------------------------------------------------------------
* The directory is ``$COSTGUARD_JOBS_DIR``, default ``/run/costguard/jobs`` (the systemd
  unit creates it writable by root only: the boot script runs ``costguard run`` as root).
* A running job is a file ``<pid>.pid`` in it whose text is that same process id, written
  atomically (temporary file + rename) when the job starts and removed when it ends;
  :func:`costguard.contract.registered_job` does both (the writer side lives with the job
  contract, so ``costguard run`` registers a job without importing the agent).
* A file counts only while process ``<pid>`` is alive, so a wrapper killed with SIGKILL
  cannot keep the machine up forever; only when it is a plain file owned by root or by
  the process's own user (nobody keeps the machine up with another user's process, such
  as init, pid 1, which never counts). Other files in the directory are ignored.

The sampler and the shutdown action are plain objects passed in (:class:`Sampler`,
:data:`Shutdown`), and the loop takes its clock and sleep as arguments: tests run it with
a fake sampler, a fake clock and a recording action, for a bounded number of ticks.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from costguard import contract
from costguard.clouds import azure as azure_clouds
from costguard.clouds import metadata, require
from costguard.errors import CostguardError
from costguard.reaper.autostop import AgentDecision, AgentPolicy, Reading, decide_shutdown
from costguard.settings import Settings

JOBS_DIR_ENV = contract.ENV_JOBS_DIR
DEFAULT_JOBS_DIR = contract.DEFAULT_JOBS_DIR
POWEROFF = ("systemctl", "poweroff")
AZURE_IMDS = "http://169.254.169.254"
#: The identity call's whole answer within this (the service answers in milliseconds).
IMDS_DEADLINE_S = 5.0


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, it is another user's
    return True


def process_owner(pid: int) -> int | None:
    """The user id that process ``pid`` runs as (its ``/proc`` entry), ``None`` if gone."""
    try:
        return Path(f"/proc/{pid}").stat().st_uid
    except OSError:
        return None


def active_jobs(
    directory: Path,
    alive: Callable[[int], bool] = pid_alive,
    owner: Callable[[int], int | None] = process_owner,
) -> list[int]:
    """Process ids of registered jobs that are still running (stale files are ignored),
    each named by a plain file that root or the process's own user wrote."""
    pids = []
    for path in sorted(directory.glob("*.pid")) if directory.is_dir() else []:
        try:
            status = path.lstat()
            if not stat.S_ISREG(status.st_mode) or status.st_size > 32:
                continue
            pid = int(path.read_text(encoding="ascii").strip())
        except (OSError, ValueError):
            continue
        if path.stem != str(pid) or pid <= 1 or not alive(pid):
            continue
        if status.st_uid in (0, owner(pid)):
            pids.append(pid)
    return pids


class Sampler(Protocol):
    """Takes one :class:`Reading` of the machine."""

    def read(self) -> Reading:
        """Look at the machine now."""
        ...


#: Shuts the machine down (or stops it through the provider); gets the reason.
Shutdown = Callable[[str], None]


@dataclass(frozen=True)
class Tick:
    """One turn of the loop: what was read, what was decided, whether it acted."""

    reading: Reading
    decision: AgentDecision
    acted: bool


def run_agent(
    sampler: Sampler,
    shutdown: Shutdown,
    policy: AgentPolicy,
    *,
    clock: Callable[[], datetime],
    sleep: Callable[[float], None],
    max_ticks: int | None = None,
    execute: bool = False,
    on_tick: Callable[[Tick], None] | None = None,
) -> list[Tick]:
    """Read, decide, act; sleep ``interval_seconds``; repeat until shut down or out of ticks.

    A dry run unless ``execute``: the decision is reported and the loop goes on, and
    ``shutdown`` is never called. Returns the ticks (tests bound them with ``max_ticks``;
    the service runs with ``None``: until shutdown). Example::

        run_agent(SystemSampler(contract.jobs_dir(os.environ)), PowerOff(),
                  AgentPolicy(idle_minutes=30), clock=lambda: datetime.now(UTC),
                  sleep=time.sleep, execute=True)
    """
    keep = policy.window_rule.window + timedelta(seconds=3 * policy.interval_seconds)
    history: deque[Reading] = deque()
    ticks: list[Tick] = []
    while max_ticks is None or len(ticks) < max_ticks:
        reading = sampler.read()
        history.append(reading)
        now = clock()
        while history and history[0].at < now - keep:
            history.popleft()
        decision = decide_shutdown(history, policy, now)
        acted = decision.shutdown and execute
        if acted:
            shutdown(decision.reason)
        tick = Tick(reading, decision, acted)
        ticks.append(tick)
        if on_tick:
            on_tick(tick)
        if acted:
            break
        if max_ticks is None or len(ticks) < max_ticks:
            sleep(policy.interval_seconds)
    return ticks


# ------------------------------------------------------------------ the real machine


def parse_proc_stat(text: str) -> tuple[int, int]:
    """``(busy, total)`` CPU jiffies from ``/proc/stat`` (iowait counts as idle).

    >>> parse_proc_stat("cpu  100 0 50 800 50 0 0 0 0 0\\ncpu0 1 2 3 4\\n")
    (150, 1000)
    """
    fields = [int(v) for v in text.splitlines()[0].split()[1:9]]
    total = sum(fields)
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return total - idle, total


def parse_net_dev(text: str) -> int:
    """Bytes received + sent on every interface but loopback, from ``/proc/net/dev``.

    >>> parse_net_dev("h1\\nh2\\n  lo: 5 0 0 0 0 0 0 0 5 0\\neth0: 100 1 0 0 0 0 0 0 20 1\\n")
    120
    """
    total = 0
    for line in text.splitlines()[2:]:
        name, _, numbers = line.partition(":")
        values = numbers.split()
        if name.strip() == "lo" or len(values) < 9:
            continue
        total += int(values[0]) + int(values[8])
    return total


def parse_nvidia_smi(text: str) -> float | None:
    """The busiest GPU, from ``nvidia-smi --query-gpu=utilization.gpu`` (CSV, no units).

    ``None`` (no GPU reading) unless *every* line is a utilisation from 0 to 100: a GPU
    that reports ``[N/A]``, ``nan`` or a negative number is unreadable, and skipping it
    would let the machine look idle while it works.

    >>> parse_nvidia_smi("3\\n97\\n"), parse_nvidia_smi("[N/A]\\n")
    (97.0, None)
    >>> parse_nvidia_smi("[N/A]\\n0"), parse_nvidia_smi("0\\nnan"), parse_nvidia_smi("-1")
    (None, None, None)
    """
    values = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            value = float(line.strip())
        except ValueError:
            return None
        if not 0 <= value <= 100:  # NaN, negative, infinite: not a reading
            return None
        values.append(value)
    return max(values) if values else None


def count_ssh_sessions(proc: Path) -> int:
    """Open SSH sessions: ``sshd: user@pts/0`` or ``user@notty`` (VS Code, scp) processes.

    OpenSSH 9.8 renamed the session process ``sshd-session``; both are counted.
    """
    count = 0
    for cmdline in proc.glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue  # the process ended while we looked
        if text.startswith(("sshd: ", "sshd-session: ")) and "@" in text:
            count += 1
    return count


class SystemSampler:
    """Reads nvidia-smi, ``/proc`` and the jobs directory. ``proc`` and the nvidia-smi
    command can be pointed elsewhere (tests, containers)."""

    def __init__(
        self,
        jobs: Path,
        *,
        proc: Path = Path("/proc"),
        nvidia_smi: Sequence[str] = ("nvidia-smi",),
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.jobs = jobs
        self.proc = proc
        self.nvidia_smi = tuple(nvidia_smi)
        self.clock = clock
        self.monotonic = monotonic
        # The first reading needs a previous one to compute rates from.
        self._last = self._counters()

    def _counters(self) -> tuple[float, tuple[int, int] | None, int | None]:
        def read(name: str) -> str | None:
            try:
                return (self.proc / name).read_text(encoding="utf-8")
            except OSError:
                return None

        stat, net = read("stat"), read("net/dev")
        return (
            self.monotonic(),
            parse_proc_stat(stat) if stat else None,
            parse_net_dev(net) if net else None,
        )

    def gpu(self) -> float | None:
        """The busiest GPU's utilisation, or ``None`` without nvidia-smi or a GPU."""
        command = [*self.nvidia_smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=20, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return parse_nvidia_smi(done.stdout)

    def read(self) -> Reading:
        """One reading: rates since the previous one."""
        gpu = self.gpu()
        before_time, before_cpu, before_net = self._last
        self._last = after_time, after_cpu, after_net = self._counters()
        cpu = None
        if before_cpu and after_cpu and after_cpu[1] > before_cpu[1]:
            cpu = 100 * (after_cpu[0] - before_cpu[0]) / (after_cpu[1] - before_cpu[1])
        network = None
        seconds = after_time - before_time
        if before_net is not None and after_net is not None and seconds > 0:
            network = max(0, after_net - before_net) * 8 / seconds / 1_000_000
        return Reading(
            self.clock(),
            gpu,
            cpu,
            network,
            jobs=len(active_jobs(self.jobs)),
            ssh_sessions=count_ssh_sessions(self.proc),
        )


class PowerOff:
    """Shut the machine down with a command (default ``systemctl poweroff``).

    AWS stops the instance on an OS shutdown (unless its shutdown behaviour is terminate);
    GCP stops it. Azure does **not** deallocate it, and a powered-off VM keeps billing:
    use :class:`AzureDeallocate` there.
    """

    def __init__(self, command: Sequence[str] = POWEROFF) -> None:
        self.command = tuple(command)

    def __call__(self, reason: str) -> None:
        try:
            subprocess.run(self.command, check=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            msg = f"could not shut down with {' '.join(self.command)}: {exc}"
            raise CostguardError(
                msg, hint="run the agent as root, or set --shutdown-command"
            ) from None


class AzureDeallocate:
    """Deallocate this Azure VM through the API (found through the instance metadata
    service), with the VM's managed identity. Needs the ``azure`` extra and the
    ``deallocate`` permission (infra/azure/reaper-act-role.json)."""

    def __init__(
        self,
        settings: Settings,
        *,
        imds: str = AZURE_IMDS,
        credential: Any = None,
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self.imds = imds.rstrip("/")
        self.credential = credential
        self.client_options = dict(client_options or {})

    def identity(self) -> dict[str, str]:
        """Subscription, resource group and name of this VM, from the metadata service."""
        # The URL is the fixed metadata address (or a test server's), never user input;
        # the whole answer within IMDS_DEADLINE_S and 1 MiB, however the service sends it.
        url = f"{self.imds}/metadata/instance/compute?api-version=2021-02-01"
        try:
            status, data = metadata.fetch(
                "GET", url, {"Metadata": "true"}, deadline_s=IMDS_DEADLINE_S
            )
            body, why = (json.loads(data) if status == 200 else None), f"HTTP {status}"
        except (OSError, ValueError, RecursionError) as exc:
            body, why = None, f"{type(exc).__name__}: {exc}"
        keys = ("subscriptionId", "resourceGroupName", "name")
        if not isinstance(body, dict) or not all(isinstance(body.get(k), str) for k in keys):
            msg = f"cannot read the Azure instance metadata service ({why})"
            raise CostguardError(msg, hint="is this an Azure VM? use --action poweroff elsewhere")
        return {k: body[k] for k in keys}

    def __call__(self, reason: str) -> None:
        me = self.identity()
        credential = self.credential
        if credential is None:
            credential = require("azure.identity", azure_clouds.EXTRA).ManagedIdentityCredential()
        compute = azure_clouds.client(
            "azure.mgmt.compute",
            "ComputeManagementClient",
            me["subscriptionId"],
            self.settings,
            credential,
            **self.client_options,
        )
        try:
            # Not waited for: the deallocation ends this very process.
            compute.virtual_machines.begin_deallocate(me["resourceGroupName"], me["name"])
        except azure_clouds.errors() as exc:
            raise azure_clouds.translate(exc, f"deallocating {me['name']}") from None
