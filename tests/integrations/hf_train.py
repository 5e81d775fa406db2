"""A Hugging Face Trainer run for the --sync-dir tests: a 2-layer GPT-2 built from its
config, random tokens, a checkpoint every 10 steps (no download: HF_HUB_OFFLINE=1).

Prints ``READY <checkpoint it resumes from>`` and ``STEP <n>`` after each step; writes the
final weights to ``--final``. ``--die-in-save N``: the process kills itself (SIGKILL)
halfway through writing checkpoint-N's optimizer state.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.trainer_utils import get_last_checkpoint

SAMPLES, LENGTH, VOCAB = 48, 16, 128


class Tokens(torch.utils.data.Dataset):
    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(1)
        self.data = torch.randint(0, VOCAB, (SAMPLES, LENGTH), generator=generator)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.data[index], "labels": self.data[index]}


class Progress(TrainerCallback):
    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s

    def on_step_end(self, args, state, control, **kwargs):
        print(f"STEP {state.global_step}", flush=True)
        time.sleep(self.sleep_s)
        return control


def die_in_save(step: int) -> None:
    """SIGKILL while checkpoint-``step``'s optimizer file is half written."""
    original = Trainer._save_optimizer_and_scheduler

    def save(self, output_dir):
        if self.state.global_step == step:
            Path(output_dir, "optimizer.pt").write_bytes(b"PK\x03\x04half")
            print("DYING", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, output_dir)

    Trainer._save_optimizer_and_scheduler = save  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--final", required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--callback", action="store_true")
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--die-in-save", type=int, default=0)
    options = parser.parse_args()
    if options.die_in_save:
        die_in_save(options.die_in_save)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=LENGTH)
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir=options.out,
        max_steps=options.steps,
        save_steps=10,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    callbacks: list[TrainerCallback] = [Progress(options.sleep)]
    if options.callback:
        from costguard.integrations.transformers import PreemptionCallback

        callbacks.append(PreemptionCallback())
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=callbacks)
    last = get_last_checkpoint(options.out) if Path(options.out).is_dir() else None
    print(f"READY {Path(last).name if last else 'none'}", flush=True)
    trainer.train(resume_from_checkpoint=last)
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, options.final)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
