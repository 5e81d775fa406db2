"""A Hugging Face Trainer script as a user writes one, for the preemption trials: a
one-layer GPT-2 from its config, gradient accumulation (2 batches a step), an evaluation
and a checkpoint every 5 steps, costguard's callback, resumed from ``get_last_checkpoint``.

``python hf_trial.py OUT FINAL``: prints ``READY <step>`` then ``STEP <n>``;
the final weights go to FINAL."""

import os
import sys
import time
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from costguard.integrations.transformers import PreemptionCallback


class Tokens(torch.utils.data.Dataset):
    def __init__(self, seed: int, size: int) -> None:
        self.rows = torch.randint(0, 64, (size, 12), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


class Show(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        print(f"STEP {state.global_step}", flush=True)
        time.sleep(0.1)


out, final = Path(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=12))
args = TrainingArguments(
    output_dir=str(out), max_steps=30, save_steps=5, eval_strategy="steps", eval_steps=5,
    per_device_train_batch_size=4, gradient_accumulation_steps=2, learning_rate=1e-3,
    report_to=[], use_cpu=True, seed=0, disable_tqdm=True, logging_steps=5,
)  # fmt: skip
trainer = Trainer(model=model, args=args, train_dataset=Tokens(1, 64), eval_dataset=Tokens(2, 8),
                  callbacks=[Show(), PreemptionCallback()])  # fmt: skip
last = get_last_checkpoint(str(out)) if out.is_dir() else None
print(f"READY {int(Path(last).name.split('-')[1]) if last else 0}", flush=True)
trainer.train(resume_from_checkpoint=last)
torch.save({k: v.clone() for k, v in model.state_dict().items()}, final)
