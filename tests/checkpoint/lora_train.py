"""A LoRA-shaped, seeded, deterministic CPU fine-tune that checkpoints through costguard.

A frozen base (weights with ``requires_grad`` off and a constant buffer, each over the
pool threshold) plus a small trainable low-rank adapter with dropout, AdamW and a
scheduler: what incremental saves are for. Run by test_incremental.py as a plain process
(SIGTERM preempts it: exit 75) with ``COSTGUARD_CHECKPOINT_URL`` set. Prints ``READY
<start>`` after the restore and ``STEP <n>`` after each step, and writes the final state
to ``--out``. ``--sleep`` slows every step so a test can interrupt mid-run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from costguard.checkpoint import Checkpointer, ResumableLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: tests/ importable
from tests.checkpoint import _train_common as common

WIDTH, OUT, RANK = 256, 1024, 4


class Lora(torch.nn.Module):
    """``base(x) + up(down(dropout(x)))`` with ``base`` frozen."""

    def __init__(self) -> None:
        super().__init__()
        self.base = torch.nn.Linear(WIDTH, OUT)  # a 1 MiB weight
        self.base.requires_grad_(False)
        self.register_buffer("mix", torch.randn(OUT, OUT // 4))  # 1 MiB, never changes
        self.down = torch.nn.Linear(WIDTH, RANK, bias=False)
        self.up = torch.nn.Linear(RANK, OUT, bias=False)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.base(x) + self.up(self.down(self.drop(x)))
        return (hidden @ self.mix).mean(dim=1, keepdim=True)


def main() -> None:
    args = common.options(steps=30).parse_args()

    common.deterministic(torch_seed=3)
    model = Lora()
    loader = ResumableLoader(common.regression(64, WIDTH), batch_size=8, shuffle=True, seed=5)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.7)

    ckpt = Checkpointer.from_env(default="checkpoints/", every_steps=4, keep_last=2)
    parts = common.parts(model, optimizer, scheduler, loader)
    step = ckpt.restore(**parts)
    print(f"READY {step}", flush=True)
    for x, y in common.batches(
        ckpt, loader, step, args.steps, parts, sleep_s=args.sleep,
        announce=lambda n: print(f"STEP {n}", flush=True),
    ):  # fmt: skip
        common.train_step(model, x, y, optimizer, scheduler)
    ckpt.close()
    common.save_final(parts, args.out)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
