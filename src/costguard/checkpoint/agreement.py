"""What the ranks of one job agree at a step boundary, and on which notice. Pure.

:mod:`~costguard.checkpoint.distributed` packs each rank's view into the integers of
:meth:`Decision.flags` and combines them with one ``all_reduce(MAX)``; :func:`decide` is
that combination written out, so it is tested without processes.

>>> decide([[0, 0, 0, -1], [1, 0, 0, -1]]).action
'emergency'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from costguard.checkpoint.notices import Notice

#: Without ``sync_every``, ranks agree about this often (in steps measured to take this long).
SYNC_TARGET_S = 0.1
#: ... but at least every this many steps, so a notice is never acted on late.
MAX_SYNC_STEPS = 100


@dataclass(frozen=True)
class Decision:
    """What every rank does at a step boundary, agreed by all of them.

    ``next_sync`` is in how many steps the ranks agree again (1: at the next boundary);
    between agreements only the step-count schedule, which every rank computes alike, can
    start a save.
    """

    emergency: bool = False
    advisory: bool = False
    scheduled: bool = False
    next_sync: int = 1

    @property
    def action(self) -> str:
        """``"emergency"`` (save, wait, exit), ``"save"`` (in the background) or ``"none"``.

        >>> Decision(advisory=True, scheduled=True).action
        'save'
        """
        if self.emergency:
            return "emergency"
        return "save" if self.advisory or self.scheduled else "none"

    def flags(self) -> list[int]:
        """The four integers one rank contributes to the ``MAX`` reduction.

        ``next_sync`` goes in negated, so the maximum picks the smallest proposal.
        """
        return [int(self.emergency), int(self.advisory), int(self.scheduled), -self.next_sync]


def decide(per_rank: Sequence[Sequence[int]]) -> Decision:
    """Combine every rank's :meth:`Decision.flags`: each event counts when any rank saw it.

    This is what ``all_reduce(MAX)`` computes, written out so it can be tested without
    processes: a notice on rank 3 alone stops all ranks at the same step, and the ranks
    agree again after the fewest steps any of them proposed.

    >>> decide([[0, 0, 1, -8], [0, 0, 0, -3]])
    Decision(emergency=False, advisory=False, scheduled=True, next_sync=3)
    >>> decide([Decision().flags(), Decision(emergency=True).flags()]).action
    'emergency'
    """
    if not per_rank:
        msg = "no ranks to decide for"
        raise ValueError(msg)
    emergency, advisory, scheduled, negated = (
        max(column) for column in zip(*per_rank, strict=True)
    )
    return Decision(emergency > 0, advisory > 0, scheduled > 0, max(1, -negated))


def propose_sync(step_s: float, sync_every: int | None) -> int:
    """How many steps until the next agreement this rank proposes.

    A fixed ``sync_every`` wins; otherwise about :data:`SYNC_TARGET_S` of training, so
    the tiny all-reduce stays a small fraction of short steps and a notice still acts
    within a fraction of a second.

    >>> propose_sync(0.5, None), propose_sync(0.01, None), propose_sync(1e-6, None)
    (1, 10, 100)
    >>> propose_sync(0.01, 4)
    4
    """
    if sync_every is not None:
        return sync_every
    if step_s <= 0:
        return MAX_SYNC_STEPS
    return max(1, min(MAX_SYNC_STEPS, int(SYNC_TARGET_S / step_s)))


def earliest(notices: Sequence[Notice | None]) -> Notice | None:
    """The notice all ranks obey: the one with the earliest deadline (any, when none has one).

    >>> a, b = Notice("aws", "terminate", 50.0), Notice("signal", "signal", None)
    >>> earliest([None, b, a]) == a, earliest([None, b]) == b, earliest([None])
    (True, True, None)
    """
    found = [n for n in notices if n is not None]
    if not found:
        return None
    with_deadline = [n for n in found if n.deadline_unix is not None]
    if with_deadline:
        return min(with_deadline, key=lambda n: n.deadline_unix or 0.0)
    return found[0]
