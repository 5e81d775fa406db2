"""A real single-node SLURM cluster (Debian's slurm-wlm and munge) for the whole session.

The fixture writes a private configuration (its own state folder, free ports, its own
munge key and socket), starts munged (as the munge user), slurmctld and slurmd in the
foreground as its children, waits until the node is idle, and stops them at the end.
Clients reach it through ``SLURM_CONF``. Needs root (slurmd runs jobs as their owners)
and the packages ``.ci/run`` installs; without them the run fails, it does not skip.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.helpers.processes import server_port
from tests.helpers.waiting import WaitTimeoutError, wait_for
from tests.slurm.cluster import SlurmCluster

INSTALL_HINT = "apt-get install -y slurm-wlm munge (as .ci/run does)"
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo")
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 20


def _binary(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin")
    if found is None:
        pytest.fail(f"{name} is not installed, so the SLURM tests cannot run: {INSTALL_HINT}")
    return found


def _config(root: Path, node: str, ctld_port: int, slurmd_port: int) -> str:
    return f"""\
ClusterName=costguard-test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.socket
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
JobRequeue=1
KillWait=30
MinJobAge=3600
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
NodeName={node} NodeAddr=127.0.0.1 CPUs=2 RealMemory=2048 State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def _wait(predicate: Callable[[], object], what: str, cluster: SlurmCluster) -> None:
    """Wait for ``predicate()`` (a client that fails or hangs means "not yet"); a daemon
    that ends meanwhile, or the bound, fails the run with the daemons' logs."""

    def running() -> None:
        started = zip(DAEMONS, cluster.processes, strict=False)  # munged first, then the others
        ended = [name for name, proc in started if proc.poll() is not None]
        if ended:
            raise AssertionError(f"{', '.join(ended)} ended")

    try:
        wait_for(
            predicate,
            what,
            timeout_s=START_TIMEOUT_S,
            poll_s=0.5,
            alive=running,
            ignoring=(AssertionError, subprocess.TimeoutExpired),
        )
    except AssertionError as exc:
        pytest.fail(f"the SLURM test cluster did not come up: {exc}\n{cluster.logs()}")


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for proc in reversed(processes):
        if proc.poll() is None:
            proc.terminate()
    for proc in reversed(processes):
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """The session's SLURM cluster; fails the run when it cannot start."""
    binaries = {name: _binary(name) for name in (*DAEMONS, *CLIENTS)}
    if os.geteuid() != 0:
        pytest.fail("the SLURM tests start slurmd, which must run as root: run them as root")
    try:
        munge_user = pwd.getpwnam("munge")
    except KeyError:
        pytest.fail(f"there is no munge user: {INSTALL_HINT}")
    # Not pytest's tmp_path: munged wants every folder above its socket open to all.
    root = Path(tempfile.mkdtemp(prefix="costguard-slurm-", dir="/tmp"))
    root.chmod(0o755)
    for name in ("state", "spool", "log"):
        (root / name).mkdir()
    munge = root / "munge"
    munge.mkdir(mode=0o755)
    key = munge / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    for path in (munge, key):
        os.chown(path, munge_user.pw_uid, munge_user.pw_gid)
    node = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    conf.write_text(_config(root, node, server_port(), server_port()))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for name in list(env):
        if name.startswith(("SLURM_", "SBATCH_", "SQUEUE_", "SCONTROL_")) and name != "SLURM_CONF":
            del env[name]
    cluster = SlurmCluster(root=root, env=env, node=node)
    log = (root / "log" / "daemons.out").open("ab")
    try:
        cluster.processes.append(
            subprocess.Popen(
                [
                    binaries["munged"],
                    "--foreground",
                    f"--socket={munge}/munge.socket",
                    f"--key-file={key}",
                    f"--pid-file={munge}/munged.pid",
                    f"--log-file={munge}/munged.log",
                    f"--seed-file={munge}/munged.seed",
                ],
                user=munge_user.pw_uid,
                group=munge_user.pw_gid,
                extra_groups=[],
                stdout=log,
                stderr=log,
            )
        )
        _wait(lambda: (munge / "munge.socket").exists(), "munged's socket", cluster)
        for daemon, extra in (("slurmctld", ["-c"]), ("slurmd", ["-N", node])):
            cluster.processes.append(
                subprocess.Popen([binaries[daemon], "-D", *extra], env=env, stdout=log, stderr=log)
            )
        _wait(
            lambda: cluster.run("sinfo", "-h", "-n", node, "-o", "%t").strip() == "idle",
            "the node to be idle",
            cluster,
        )
        yield cluster
    finally:
        try:
            if cluster.processes:
                subprocess.run(
                    [binaries["scancel"], "--full", "--partition", cluster.partition],
                    env=env,
                    timeout=30,
                    check=False,
                    capture_output=True,
                )

                def queue_empty() -> bool:
                    queue = subprocess.run(
                        [binaries["squeue"], "-h"],
                        env=env,
                        capture_output=True,
                        text=True,
                        timeout=30,
                        check=False,
                    )
                    return queue.returncode != 0 or not queue.stdout.strip()

                # Best effort: the daemons are stopped next whatever the queue holds.
                with contextlib.suppress(WaitTimeoutError):
                    wait_for(queue_empty, "an empty queue", timeout_s=STOP_TIMEOUT_S, poll_s=0.5)
        finally:
            _stop(cluster.processes)
            log.close()
            shutil.rmtree(root, ignore_errors=True)
