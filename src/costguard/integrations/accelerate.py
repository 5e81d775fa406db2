"""Accelerate: whether a notice arrived, for a loop that saves with ``save_state``.

::

    from costguard.integrations.accelerate import notice, EXIT_PREEMPTED
    for step in range(start, total_steps):
        train_step(batch)
        if notice():
            accelerator.save_state(f"out/checkpoint_{step + 1}")
            raise SystemExit(EXIT_PREEMPTED)

Run under ``costguard run --checkpoint URL --sync-dir out/``: the folder written on the
notice is committed to the store before ``costguard run`` exits, and the newest one is put
back in ``out/`` for ``accelerator.load_state`` on a new machine. Without ``costguard run``
``notice()`` is always false.
"""

from __future__ import annotations

from costguard.integrations.notices import EXIT_PREEMPTED, shared

__all__ = ["EXIT_PREEMPTED", "notice"]


def notice() -> bool:
    """Whether ``costguard run`` relayed a preemption notice (or SIGTERM/SIGUSR1 arrived).

    Call it once before the loop too: the first call, in the main thread, is what turns
    SIGTERM into a notice instead of the end of the process.
    """
    return shared().pending() is not None
