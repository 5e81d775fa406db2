"""An Accelerate loop for the --sync-dir tests: ``save_state`` every 10 steps into
``<out>/checkpoint_<step>``, ``load_state`` of the newest at the start, and
``costguard.integrations.accelerate.notice()`` at each step boundary.

Each step's batch is drawn from a generator seeded by the step, so a resume is exact.
Prints ``READY <step>`` and ``STEP <n>``; writes the final weights to ``--final``.
``--ema``: an EMA of the weights registered with ``register_for_checkpointing`` (saved
after the mark, ``custom_checkpoint_0.pkl``); ``--die-in-custom N``: the process kills
itself (SIGKILL) while that file of checkpoint_N is written. ``--teardown-s S``: after
``DONE`` the script spends S seconds shutting down (``end_training``, then a wait, as a
tracker's flush would). ``--on-notice break``: a notice ends the loop without a save (the
script then finishes as if its work were done, exit 0); ``--on-notice none``: the script
never calls ``notice()`` (SIGTERM ends it, as a loop without costguard's helper).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from costguard.integrations.accelerate import EXIT_PREEMPTED, notice


def newest(out: Path) -> tuple[int, Path | None]:
    found = [
        (int(m.group(1)), p)
        for p in (out.iterdir() if out.is_dir() else ())
        if (m := re.fullmatch(r"checkpoint_(\d+)", p.name))
    ]
    return max(found, default=(0, None), key=lambda f: f[0])


class Ema:
    """An exponential moving average of the weights, saved by Accelerate after its mark."""

    def __init__(self, model: torch.nn.Module, die_at: int) -> None:
        self.model = model
        self.shadow = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.step = 0
        self.die_at = die_at

    def update(self, step: int) -> None:
        self.step = step
        for key, value in self.model.state_dict().items():
            self.shadow[key].mul_(0.9).add_(value.detach(), alpha=0.1)

    def state_dict(self) -> dict[str, object]:
        state: dict[str, object] = {"shadow": self.shadow, "step": self.step}
        if self.step == self.die_at:
            state["dies"] = Dying()  # pickled once torch.save has opened the file
        return state

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.shadow, self.step = state["shadow"], int(state["step"])  # type: ignore[assignment,call-overload]


class Dying:
    def __reduce__(self) -> tuple[object, ...]:
        print("DYING", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        return (Dying, ())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--final", required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--ema", action="store_true")
    parser.add_argument("--die-in-custom", type=int, default=0)
    parser.add_argument("--teardown-s", type=float, default=0.0)
    parser.add_argument("--on-notice", choices=["save", "break", "none"], default="save")
    options = parser.parse_args()
    out = Path(options.out)
    set_seed(0)
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    ema = Ema(model, options.die_in_custom) if options.ema else None
    if ema is not None:
        accelerator.register_for_checkpointing(ema)
    watching = options.on_notice != "none"
    if watching:
        notice()  # the first call turns SIGTERM into a notice
    start, folder = newest(out)
    if folder is not None:
        accelerator.load_state(str(folder))
    print(f"READY {start}", flush=True)
    for step in range(start, options.steps):
        generator = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(32, 16, generator=generator)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True).sin())
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if ema is not None:
            ema.update(step + 1)
        print(f"STEP {step + 1}", flush=True)
        time.sleep(options.sleep)
        if options.on_notice == "break" and notice():
            break
        if (watching and notice()) or (step + 1) % 10 == 0:
            accelerator.save_state(str(out / f"checkpoint_{step + 1}"))
            if watching and notice():
                raise SystemExit(EXIT_PREEMPTED)
    state = accelerator.unwrap_model(model).state_dict()
    torch.save({k: v.clone() for k, v in state.items()}, options.final)
    print("DONE", flush=True)
    accelerator.end_training()
    time.sleep(options.teardown_s)


if __name__ == "__main__":
    main()
