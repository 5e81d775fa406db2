"""A gang on this machine (`costguard launch --provider local --nodes 2`): how fast it
starts training, and how fast a notice to one node has every node saved and exited, next
to one node, in one run.

Each round starts, through the local launcher's own `launch_gang`, 2 nodes of P processes
(each node `costguard run` around `torchrun --nnodes 2 --node-rank R`, c10d rendezvous on
127.0.0.1) running the seeded DDP script of tests/checkpoint/ddp_train.py, and beside it
one node of P processes (`torchrun --standalone`, the same script) as a one-instance job;
the two alternate, so machine noise hits both alike.

1. From the last node up (its process started) to the first training step of any rank.
   Target: <= 10 s.
2. From a notice served to one node (node 1's simulated metadata, as a spot reclaim) to
   every node's `costguard run` exited after the save (exit 75), against the same for
   one node. Target: the gang's median <= the single node's + 2 s.

    python benchmarks/gang.py [--rounds 3] [--procs-per-node 1] [--steps-before 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.checkpoint.test_distributed import DDP_SCRIPT
from tests.helpers.training import STEP, child_env

from costguard.pricing.catalog import Market
from costguard.spot.launcher.base import Handle, LaunchSpec, Offer
from costguard.spot.launcher.local import LocalLauncher
from costguard.spot.simulator import Simulation

START_TARGET_S = 10.0
NOTICE_SLACK_S = 2.0
TIMEOUT_S = 300.0
OFFER = Offer("local", "aws:us-east-1", "g5.xlarge", Market.SPOT, Decimal("1"), "A10G", 1)


def spec(folder: Path, nodes: int, procs: int, command: tuple[str, ...]) -> LaunchSpec:
    """A job of ``nodes`` nodes checkpointing in its own folder."""
    return LaunchSpec(
        job_id=f"cg-bench-{nodes}-{time.monotonic_ns()}",
        checkpoint_url=str(folder / "ckpt"),
        command=command,
        owner="bench",
        expires_at=datetime.now(UTC) + timedelta(hours=1),
        every_steps=1000,
        nodes=nodes,
        procs_per_node=procs if nodes > 1 else None,
    )


def first_step(launcher: LocalLauncher, handles: tuple[Handle, ...], at_least: int) -> float:
    """When any rank of any node printed ``STEP`` ``at_least`` (polled every 10 ms)."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        for handle in handles:
            text = Path(handle.extra["log"]).read_text(errors="replace")
            if any(int(step) >= at_least for _, step in STEP.findall(text)):
                return time.monotonic()
        time.sleep(0.01)
    sys.exit(f"no step {at_least} within {TIMEOUT_S} s: see {handles[0].extra['log']}")


def exited(launcher: LocalLauncher, handles: tuple[Handle, ...]) -> float:
    """When the last node's ``costguard run`` exited (polled every 10 ms)."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if not any(launcher._alive(h) for h in handles):
            return time.monotonic()
        time.sleep(0.01)
    sys.exit(f"still running {TIMEOUT_S} s after the notice: see {handles[0].extra['log']}")


def one_round(folder: Path, nodes: int, procs: int, steps_before: int) -> tuple[float, float]:
    """(last node up to the first step, notice to every node exited) of one job."""
    env = child_env(folder, COSTGUARD_LOCAL_DIR=str(folder / "state"))
    launcher = LocalLauncher(Simulation(), job_started_unix=time.time(),
                             state_dir=folder / "state", env=env)  # fmt: skip
    script = (str(DDP_SCRIPT), "--steps", "100000", "--sleep", "0.05", "--out", str(folder / "o"))
    if nodes == 1:
        standalone = [*launcher.torchrun(), "--standalone", "--nproc-per-node", str(procs)]
        job = spec(folder, 1, procs, (*standalone, *script))
    else:
        job = spec(folder, nodes, procs, script)
    try:
        handles = launcher.launch_gang(OFFER, job, 1)
        up = time.monotonic()  # the last node's process has started
        started = first_step(launcher, handles, 1) - up
        first_step(launcher, handles, steps_before)
        noticed = time.monotonic()
        launcher.emulator.announce(time.time() + 120, node=nodes - 1)
        stopped = exited(launcher, handles) - noticed
        codes = {launcher._children[int(h.extra["pid"])].returncode for h in handles}
        if codes != {75}:
            sys.exit(f"{nodes} node(s) exited {codes}, not 75: see {handles[0].extra['log']}")
        return started, stopped
    finally:
        for handle in launcher.find(job.job_id):
            launcher.terminate(handle)
        launcher.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--procs-per-node", type=int, default=1)
    parser.add_argument("--steps-before", type=int, default=5, help="steps before the notice")
    args = parser.parse_args()
    results: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory(prefix="costguard-gang-") as tmp:
        for n in range(args.rounds):
            for nodes in (2, 1):
                folder = Path(tmp) / f"r{n}-n{nodes}"
                folder.mkdir()
                results[nodes].append(
                    one_round(folder, nodes, args.procs_per_node, args.steps_before)
                )
    procs = args.procs_per_node
    gang_start = statistics.median(s for s, _ in results[2])
    single_start = statistics.median(s for s, _ in results[1])
    gang_stop = statistics.median(e for _, e in results[2])
    single_stop = statistics.median(e for _, e in results[1])
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"{args.rounds} rounds, {procs} process(es) per node, {os.cpu_count()} CPUs (load {load}):"
    )
    print(
        f"  last node up -> first step: 2 nodes {gang_start:.2f} s (target <= "
        f"{START_TARGET_S:g} s: {'ok' if gang_start <= START_TARGET_S else 'MISSED'}); "
        f"1 node {single_start:.2f} s"
    )
    verdict = "ok" if gang_stop <= single_stop + NOTICE_SLACK_S else "MISSED"
    print(
        f"  notice to one node -> every node saved and exited: 2 nodes {gang_stop:.2f} s, "
        f"1 node {single_stop:.2f} s (target <= 1 node + {NOTICE_SLACK_S:g} s: {verdict}; "
        f"difference {gang_stop - single_stop:+.2f} s)"
    )
    for nodes in (2, 1):
        rounds = ", ".join(f"{s:.2f}/{e:.2f}" for s, e in results[nodes])
        print(f"  {nodes} node(s), each round start/stop s: {rounds}")


if __name__ == "__main__":
    main()
