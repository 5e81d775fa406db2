"""Preemption notices for the trainers people already use, under ``costguard run``.

- :mod:`costguard.integrations.transformers`: ``PreemptionCallback`` for Hugging Face's
  ``Trainer``;
- :mod:`costguard.integrations.lightning`: ``PreemptionCallback`` for Lightning;
- :mod:`costguard.integrations.accelerate`: ``notice()`` for an Accelerate loop.

Each saves through the trainer's own checkpointing at the next step boundary after a
notice and exits 75; ``costguard run --sync-dir`` keeps those checkpoints in the store
(:mod:`costguard.checkpoint.foldersync`). Outside ``costguard run`` they do nothing.
Nothing here is imported by ``import costguard``.
"""
