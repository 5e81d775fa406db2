"""Checkpoint to object storage and resume after preemption.

``from costguard.checkpoint import Checkpointer`` is all a training script needs (see
:class:`~costguard.checkpoint.checkpointer.Checkpointer`). torch and fsspec are imported
when a Checkpointer is made, not here.

Under torchrun every rank makes its own Checkpointer and calls it the same way; the ranks
agree on when to save and on which checkpoint to resume from
(:mod:`costguard.checkpoint.distributed`).
"""

from costguard.checkpoint.checkpointer import (
    EXIT_PREEMPTED,
    Checkpointer,
    JobSettings,
    NoUsableCheckpointError,
    Preempted,
    RestoreError,
    SavePolicy,
    SaveResult,
    StoreSettings,
)
from costguard.checkpoint.export import export, load_state
from costguard.checkpoint.schedule import Schedule, suggest_interval_s, young_daly_interval_s
from costguard.checkpoint.state import ResumableLoader
from costguard.checkpoint.store import StoreError
from costguard.retry import RetryPolicy

__all__ = [
    "EXIT_PREEMPTED",
    "Checkpointer",
    "JobSettings",
    "NoUsableCheckpointError",
    "Preempted",
    "RestoreError",
    "ResumableLoader",
    "RetryPolicy",
    "SavePolicy",
    "SaveResult",
    "Schedule",
    "StoreError",
    "StoreSettings",
    "export",
    "load_state",
    "suggest_interval_s",
    "young_daly_interval_s",
]
