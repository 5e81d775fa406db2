"""A small, seeded, deterministic CPU training run that checkpoints through costguard.

Run by the tests as a child of ``costguard run`` (and as a SLURM batch job). It prints
``READY <start> <unix time>`` after the restore and ``STEP <n>`` after each step, and writes
the final weights, optimizer and scheduler state to ``--out`` with ``torch.save``. Python,
NumPy and torch randomness all feed the loss, so a resume that loses any RNG state changes
the final weights. ``--sleep`` slows every step; ``--sleep-first`` only those of a fresh
start, so that a resumed run goes at full speed and a test knows which run it interrupts.
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np
import torch

from costguard.checkpoint import Checkpointer, ResumableLoader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", required=True)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds per step")
    parser.add_argument("--sleep-first", type=float, default=0.0, help="the same, fresh start")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    data = torch.randn(72, 8, generator=torch.Generator().manual_seed(4))
    target = data.sum(dim=1, keepdim=True).sin()
    dataset = torch.utils.data.TensorDataset(data, target)
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
    step = ckpt.restore(
        model=model, optimizer=optimizer, scheduler=scheduler, loader=loader, extra=extra
    )
    sleep_s = args.sleep + (args.sleep_first if step == 0 else 0.0)
    print(f"READY {step} {time.time():.1f}", flush=True)
    while step < args.steps:
        for x, y in loader:
            noise = random.random() * 1e-3 + float(np.random.rand()) * 1e-3
            loss = torch.nn.functional.mse_loss(model(x), y) + noise
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            extra["loss_sum"] += float(loss)
            if sleep_s:
                time.sleep(sleep_s)
            ckpt.step(
                step,
                epoch=loader.epoch,
                model=model,
                optimizer=optimizer,
                scheduler=scheduler,
                loader=loader,
                extra=extra,
            )
            step += 1
            print(f"STEP {step}", flush=True)
            if step >= args.steps:
                break
    ckpt.close()
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "extra": extra,
        },
        args.out,
    )
    print(f"DONE {time.time():.1f}", flush=True)


if __name__ == "__main__":
    main()
