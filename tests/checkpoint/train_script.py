"""A small, seeded, deterministic CPU training run that checkpoints through costguard.

Run by the tests as a child of ``costguard run`` (and as a SLURM batch job). It prints
``READY <start> <unix time>`` after the restore and ``STEP <n>`` after each step, and writes
the final weights, optimizer and scheduler state to ``--out`` with ``torch.save``. Python,
NumPy and torch randomness all feed the loss, so a resume that loses any RNG state changes
the final weights. ``--sleep`` slows every step; ``--sleep-first`` only those of a fresh
start, so that a resumed run goes at full speed and a test knows which run it interrupts.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from costguard.checkpoint import Checkpointer, ResumableLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: tests/ importable
from tests.checkpoint import _train_common as common


def main() -> None:
    parser = common.options(steps=40)
    parser.add_argument("--sleep-first", type=float, default=0.0, help="the same, fresh start")
    args = parser.parse_args()

    common.deterministic(python=1, numpy=2, torch_seed=3)
    dataset = common.regression(72, 8)
    loader = ResumableLoader(dataset, batch_size=8, shuffle=True, seed=5)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 32),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.2),
        torch.nn.Linear(32, 1),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.7)
    extra: dict[str, float] = {"loss_sum": 0.0}

    ckpt = Checkpointer.from_env(default="checkpoints/", every_steps=5)
    parts = common.parts(model, optimizer, scheduler, loader, extra=extra)
    step = ckpt.restore(**parts)
    sleep_s = args.sleep + (args.sleep_first if step == 0 else 0.0)
    print(f"READY {step} {time.time():.1f}", flush=True)
    for x, y in common.batches(
        ckpt, loader, step, args.steps, parts, sleep_s=sleep_s,
        announce=lambda n: print(f"STEP {n}", flush=True),
    ):  # fmt: skip
        extra["loss_sum"] += float(
            common.train_step(model, x, y, optimizer, scheduler, common.noise())
        )
    ckpt.close()
    common.save_final(parts, args.out)
    print(f"DONE {time.time():.1f}", flush=True)


if __name__ == "__main__":
    main()
