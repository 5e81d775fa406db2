"""Kill -9 a checkpoint writer at points hypothesis draws, then check what a restore finds.

Run by test_crash_safety.py as ``python crash_trials.py URL TRIALS SEED [lora]``. torch is
imported once; each trial forks a writer that restores and then saves back to back. The
writer announces on a pipe each time it enters a phase of a save: ``serialise``,
``upload`` (the payload), ``manifest`` (the commit) or ``retention`` (a delete). For each
trial hypothesis draws a kill point - the n-th entry into one phase plus a delay, or
simply a time after the start - the parent SIGKILLs the writer there and checks the store.
Prints one JSON line: the trials, the failures, the latest step after each trial, and how
many kills landed in each phase.

With ``lora`` the model is LoRA-shaped (a frozen weight and buffer in the pool of
incremental saves, a small trainable adapter) and every third save changes the buffer, so
kills land among pool uploads and pool deletions too; then no checkpoint in the store may
be corrupt either (a pool object deleted while a kept checkpoint needs it would make one).
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from costguard.checkpoint import Checkpointer, uploads
from costguard.checkpoint import state as state_mod
from costguard.checkpoint.inventory import inventory, verify
from costguard.checkpoint.store import Store

PHASES = {"serialise": b"S", "upload": b"U", "manifest": b"M", "retention": b"R"}
#: How long a trial waits for its phase before killing anyway (the writer is slow, or
#: the phase did not come: retention deletes nothing until keep_last is exceeded).
PHASE_WAIT_S = 10.0


@dataclass(frozen=True)
class KillPoint:
    """Kill after the ``nth`` entry into ``phase`` plus ``delay_s`` (phase ``time``: after
    ``delay_s`` from the writer's start)."""

    phase: str
    nth: int
    delay_s: float


KILL_POINTS = st.one_of(
    st.builds(
        KillPoint,
        phase=st.sampled_from(sorted(PHASES)),
        nth=st.integers(min_value=1, max_value=3),
        delay_s=st.sampled_from([0.0, 0.0005, 0.002, 0.01]) | st.floats(0.0, 0.03),
    ),
    st.builds(KillPoint, phase=st.just("time"), nth=st.just(0), delay_s=st.floats(0.02, 0.35)),
)


#: ``lora`` (argv[4]): the LoRA-shaped model with pooled tensors.
MODE = {"lora": False}


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    if MODE["lora"]:
        model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 8))
        model[0].requires_grad_(False)  # a 1 MiB frozen weight: pooled
        model.register_buffer("table", torch.zeros(512, 512))  # 1 MiB: pooled
        return model, torch.optim.AdamW(model[1].parameters(), lr=1e-3)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.Linear(256, 128))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def announce_phases(fd: int) -> None:
    """In the writer: write a phase's code to ``fd`` whenever a save enters it."""

    def tell(code: bytes) -> None:
        os.write(fd, code)

    serialise, torch_save, put, put_hashed, delete = (
        state_mod.serialise,
        state_mod.torch_save,
        Store.put,
        Store.put_hashed,
        Store.delete,
    )
    send_part, finish = uploads.S3Upload._send_part, uploads.S3Upload.finish
    local_finish = uploads.LocalUpload.finish

    def announced_serialise(state: Any) -> Any:
        tell(PHASES["serialise"])
        return serialise(state)

    # On S3 and locally the payload streams: serialising and sending (writing) overlap.
    def announced_torch_save(state: Any, file: Any) -> None:
        tell(PHASES["serialise"])
        torch_save(state, file)

    def announced_send_part(self: Any) -> None:
        tell(PHASES["upload"])
        send_part(self)

    def announced_finish(self: Any) -> None:  # the last part, or a small object's one PUT
        tell(PHASES["upload"])
        finish(self)

    def announced_local_finish(self: Any) -> None:  # fsync and rename into place
        tell(PHASES["upload"])
        local_finish(self)

    def phase_of(path: str) -> bytes:
        return PHASES["manifest"] if path.endswith("manifest.json") else PHASES["upload"]

    def announced_put(self: Store, path: str, data: Any) -> None:
        tell(phase_of(path))
        put(self, path, data)

    def announced_put_hashed(self: Store, path: str, data: Any) -> str:
        tell(phase_of(path))
        return put_hashed(self, path, data)

    def announced_delete(self: Store, paths: Any) -> None:
        tell(PHASES["retention"])
        delete(self, paths)

    state_mod.serialise = announced_serialise
    state_mod.torch_save = announced_torch_save
    uploads.S3Upload._send_part = announced_send_part  # type: ignore[method-assign]
    uploads.S3Upload.finish = announced_finish  # type: ignore[method-assign]
    uploads.LocalUpload.finish = announced_local_finish  # type: ignore[method-assign]
    Store.put = announced_put  # type: ignore[method-assign]
    Store.put_hashed = announced_put_hashed  # type: ignore[method-assign]
    Store.delete = announced_delete  # type: ignore[method-assign]


def writer(url: str, fd: int) -> None:
    announce_phases(fd)
    model, opt = model_and_optimizer()
    # The only writer: the folders a killed one left are abandoned at once (no grace).
    ckpt = Checkpointer(url, keep_last=2, check=False, partial_grace_s=0.0)
    step = ckpt.restore(model=model, optimizer=opt)
    while True:
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(0.001)
            if MODE["lora"] and step % 3 == 0:
                model.get_buffer("table").add_(1.0)  # a new pool object, the old one unneeded
        ckpt.save(step, model=model, optimizer=opt)  # waits for the previous one
        step += 1


def kill_at(pid: int, read_fd: int, point: KillPoint) -> str:
    """SIGKILL the writer at ``point``; the phase the kill landed after (or ``time``)."""
    landed = "time"
    if point.phase == "time":
        time.sleep(point.delay_s)
    else:
        wanted, seen = PHASES[point.phase], 0
        deadline = time.monotonic() + PHASE_WAIT_S
        while seen < point.nth and time.monotonic() < deadline:
            ready, _, _ = select.select([read_fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(read_fd, 4096)
            if not chunk:
                break
            seen += chunk.count(wanted)
        if seen >= point.nth:
            landed = point.phase
            if point.delay_s:
                time.sleep(point.delay_s)
        else:
            landed = "not reached"
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return landed


def check(url: str) -> tuple[bool, str, int]:
    """Whether the store is sound after a kill: (ok, problem, latest step)."""
    ckpt = Checkpointer(url, check=False)
    entries = inventory(ckpt.store)
    corrupt = [e.name for e in entries if e.status == "corrupt"]
    if MODE["lora"] and corrupt:
        return (False, f"corrupt checkpoints {corrupt}", 0)
    latest = [e for e in entries if e.latest]
    if not latest:
        complete = [e for e in entries if e.status == "complete"]
        return (not complete, "complete checkpoints but no latest", 0)
    bad = [v for v in verify(ckpt.store, latest_only=True) if not v.ok]
    if bad:
        return (False, f"latest does not verify: {bad}", latest[0].step)
    model, opt = model_and_optimizer()
    start = ckpt.restore(model=model, optimizer=opt)
    if ckpt.restored is None or ckpt.restored.name != latest[0].name:
        return (False, f"restore used {ckpt.restored} instead of {latest[0].name}", start)
    return (True, "", start)


def warm_up() -> None:
    """One save and restore here, so the forked writers start with every lazy import done
    (the first AdamW step and torch.save import much of torch.distributed)."""
    with tempfile.TemporaryDirectory() as folder:
        model, opt = model_and_optimizer()
        width = 512 if MODE["lora"] else 128
        model(torch.randn(2, width)).sum().backward()
        opt.step()
        with Checkpointer(folder) as ckpt:
            ckpt.save(0, model=model, optimizer=opt, block=True)
        Checkpointer(folder).restore(model=model, optimizer=opt)


class Trials:
    """The running record of every trial (hypothesis calls :meth:`one` once per example)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.failures: list[dict[str, Any]] = []
        self.steps: list[int] = []
        self.landed: Counter[str] = Counter()
        self.committed_once = False

    def one(self, point: KillPoint) -> None:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read_fd)
                writer(self.url, write_fd)
            finally:
                os._exit(1)
        os.close(write_fd)
        try:
            landed = kill_at(pid, read_fd, point)
        finally:
            os.close(read_fd)
        self.landed[landed] += 1
        ok, problem, step = check(self.url)
        if self.committed_once and step == 0:
            ok, problem = False, "an earlier checkpoint was lost"
        self.committed_once = self.committed_once or step > 0
        self.steps.append(step)
        if not ok:
            self.failures.append(
                {"trial": len(self.steps) - 1, "kill": str(point), "problem": problem}
            )
        assert ok, f"{problem} after a kill at {point}"


def main() -> None:
    url, trials, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    MODE["lora"] = sys.argv[4:] == ["lora"]
    torch.set_num_threads(1)
    warm_up()
    record = Trials(url)

    @hypothesis_seed(seed)
    @settings(
        max_examples=trials,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(KILL_POINTS)
    def kill_trial(point: KillPoint) -> None:
        record.one(point)

    for phase in sorted(PHASES):  # every phase is hit at least once, whatever is drawn
        kill_trial = example(KillPoint(phase, 2, 0.0))(kill_trial)

    try:
        kill_trial()
    except AssertionError as exc:  # hypothesis has shrunk it to the simplest kill point
        record.failures.append({"minimal": str(exc)})
    print(
        json.dumps(
            {
                "trials": len(record.steps),
                "failures": record.failures,
                "steps": record.steps,
                "landed": dict(record.landed),
            }
        )
    )


if __name__ == "__main__":
    main()
