"""An Accelerate loop as a user writes one, for the preemption trials: a small MLP and an
EMA of its weights registered for checkpointing, ``save_state`` every 4 steps into
``OUT/step_<n>``, ``load_state`` of the newest at the start, costguard's ``notice()`` at
each step boundary (a notice: save now, exit 75).

``python accelerate_trial.py OUT FINAL``: prints ``READY <step>`` then ``STEP <n>``; the
final weights and the EMA go to FINAL."""

import re
import sys
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from costguard.integrations.accelerate import EXIT_PREEMPTED, notice


class Ema:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.shadow = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def update(self) -> None:
        for k, v in self.model.state_dict().items():
            self.shadow[k].mul_(0.8).add_(v.detach(), alpha=0.2)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.shadow

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.shadow = state


out, final = Path(sys.argv[1]), sys.argv[2]
set_seed(3)
accelerator = Accelerator(cpu=True)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
model, optimizer = accelerator.prepare(model, optimizer)
ema = Ema(model)
accelerator.register_for_checkpointing(ema)
notice()
saves = sorted((int(m[1]), p) for p in (out.iterdir() if out.is_dir() else ())
               if (m := re.fullmatch(r"step_(\d+)", p.name)))  # fmt: skip
start = 0
if saves:
    start, folder = saves[-1]
    accelerator.load_state(str(folder))
print(f"READY {start}", flush=True)
for step in range(start, 40):
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step))
    loss = torch.nn.functional.cross_entropy(model(x), (x.sum(1) > 0).long())
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    ema.update()
    print(f"STEP {step + 1}", flush=True)
    time.sleep(0.1)
    if notice() or (step + 1) % 4 == 0:
        accelerator.save_state(str(out / f"step_{step + 1}"))
        if notice():
            raise SystemExit(EXIT_PREEMPTED)
weights = accelerator.unwrap_model(model).state_dict()
torch.save({**{k: v.clone() for k, v in weights.items()},
            **{f"ema.{k}": v for k, v in ema.shadow.items()}}, final)  # fmt: skip
