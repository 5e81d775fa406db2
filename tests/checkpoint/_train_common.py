"""What the training scripts of this folder share: their options, seeding, the toy
regression data, one optimizer step, and the loop that checkpoints after every step.

The scripts run as files (``python tests/checkpoint/train_script.py``, under torchrun,
``costguard run`` or SLURM) and as modules of the tests; each puts the repository root on
``sys.path`` first and imports this as ``tests.checkpoint._train_common``.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from costguard.checkpoint import Checkpointer, ResumableLoader


def options(steps: int) -> argparse.ArgumentParser:
    """``--steps`` (default ``steps``), ``--out`` and ``--sleep``; a script adds its own."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--out", required=True)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds per step")
    return parser


def deterministic(
    *, python: int | None = None, numpy: int | None = None, torch_seed: int | None = None
) -> None:
    """One thread, deterministic kernels, and the seeds given (in that order)."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if python is not None:
        random.seed(python)
    if numpy is not None:
        np.random.seed(numpy)
    if torch_seed is not None:
        torch.manual_seed(torch_seed)


def regression(rows: int, width: int) -> torch.utils.data.TensorDataset:
    """``rows`` seeded inputs of ``width`` and their target ``sin(sum(x))``: the same data
    in every process."""
    data = torch.randn(rows, width, generator=torch.Generator().manual_seed(4))
    target = data.sum(dim=1, keepdim=True).sin()
    return torch.utils.data.TensorDataset(data, target)


def shard(dataset: torch.utils.data.Dataset[Any], rank: int, world: int) -> Any:
    """Every ``world``-th row from ``rank`` on: this rank's part of ``dataset``."""
    return torch.utils.data.Subset(dataset, list(range(rank, len(dataset), world)))  # type: ignore[arg-type]


def parts(
    model: Any, optimizer: Any, scheduler: Any, loader: ResumableLoader, **extra: Any
) -> dict[str, Any]:
    """What ``Checkpointer.restore`` and ``step`` take, by name."""
    return {
        "model": model,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "loader": loader,
        **extra,
    }


def noise() -> float:
    """Python and NumPy randomness in the loss: a resume that loses either changes it."""
    return random.random() * 1e-3 + float(np.random.rand()) * 1e-3


def train_step(
    model: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    noise: float | None = None,
) -> torch.Tensor:
    """One step of mean squared error (plus ``noise``): its loss."""
    loss = torch.nn.functional.mse_loss(model(x), y)
    if noise is not None:
        loss = loss + noise
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
    return loss


def batches(
    ckpt: Checkpointer,
    loader: ResumableLoader,
    start: int,
    last: int,
    parts: dict[str, Any],
    *,
    sleep_s: float,
    announce: Callable[[int], None],
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The batches of steps ``start`` to ``last``, epoch after epoch; after each one is
    trained: sleep ``sleep_s``, ``ckpt.step`` with ``parts``, and ``announce`` the step."""
    step = start
    while step < last:
        for x, y in loader:
            yield x, y
            if sleep_s:
                time.sleep(sleep_s)
            ckpt.step(step, epoch=loader.epoch, **parts)
            step += 1
            announce(step)
            if step >= last:
                break


def save_final(parts: dict[str, Any], out: str) -> None:
    """``torch.save`` to ``out`` the state of the model, optimizer and scheduler of
    ``parts``, and its ``extra`` as it is (where it has one)."""
    state = {name: parts[name].state_dict() for name in ("model", "optimizer", "scheduler")}
    if "extra" in parts:
        state["extra"] = parts["extra"]
    torch.save(state, out)


def say(line: str) -> None:
    """One line in one write: the ranks share stdout, and must not split each other's lines."""
    os.write(sys.stdout.fileno(), f"{line}\n".encode())
