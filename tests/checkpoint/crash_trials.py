"""Kill -9 a checkpoint writer at random moments, then check what a restore finds.

Run by test_crash_safety.py as ``python crash_trials.py URL TRIALS SEED``. torch is
imported once; each trial forks a writer that restores and then saves back to back
(serialise, upload, manifest, retention: every moment is inside some save), sleeps a
random time, SIGKILLs it, and checks the store in this process. Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import tempfile
import time

import torch

from costguard.checkpoint import Checkpointer
from costguard.checkpoint.inventory import inventory, verify


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.Linear(256, 128))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def writer(url: str) -> None:
    model, opt = model_and_optimizer()
    ckpt = Checkpointer(url, keep_last=2, check=False)
    step = ckpt.restore(model=model, optimizer=opt)
    while True:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.001)
        ckpt.save(step, model=model, optimizer=opt)  # waits for the previous one
        step += 1


def check(url: str) -> tuple[bool, str, int]:
    """Whether the store is sound after a kill: (ok, problem, latest step)."""
    entries = inventory(Checkpointer(url, check=False).store)
    latest = [e for e in entries if e.latest]
    if not latest:
        complete = [e for e in entries if e.status == "complete"]
        return (not complete, "complete checkpoints but no latest", 0)
    bad = [v for v in verify(Checkpointer(url, check=False).store, latest_only=True) if not v.ok]
    if bad:
        return (False, f"latest does not verify: {bad}", latest[0].step)
    model, opt = model_and_optimizer()
    ckpt = Checkpointer(url, check=False)
    start = ckpt.restore(model=model, optimizer=opt)
    if ckpt.restored is None or ckpt.restored.name != latest[0].name:
        return (False, f"restore used {ckpt.restored} instead of {latest[0].name}", start)
    return (True, "", start)


def warm_up() -> None:
    """One save and restore here, so the forked writers start with every lazy import done
    (the first AdamW step and torch.save import much of torch.distributed)."""
    with tempfile.TemporaryDirectory() as folder:
        model, opt = model_and_optimizer()
        model(torch.randn(2, 128)).sum().backward()
        opt.step()
        with Checkpointer(folder) as ckpt:
            ckpt.save(0, model=model, optimizer=opt, block=True)
        Checkpointer(folder).restore(model=model, optimizer=opt)


def main() -> None:
    url, trials, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    warm_up()
    rng = random.Random(seed)
    failures, steps, committed_once = [], [], False
    for trial in range(trials):
        pid = os.fork()
        if pid == 0:
            try:
                writer(url)
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.02, 0.35))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        ok, problem, step = check(url)
        if committed_once and step == 0:
            ok, problem = False, "an earlier checkpoint was lost"
        committed_once = committed_once or step > 0
        steps.append(step)
        if not ok:
            failures.append({"trial": trial, "problem": problem})
    print(json.dumps({"trials": trials, "failures": failures, "steps": steps}))


if __name__ == "__main__":
    main()
