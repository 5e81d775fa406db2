"""How each node of a multi-node job (a gang) starts its processes: the ``torchrun``
command line that ``costguard slurm script --nodes`` and ``costguard launch --nodes``
share, and the checks on what it runs. Pure.

One ``torchrun`` per node, each under its own ``costguard run``, meeting at the first
node through a c10d rendezvous; ``torchrun`` starts the node's processes and tells each its
global rank. A notice to any node reaches every rank (the ranks agree on notices at each
step), so every node saves the same step and exits 75.

>>> torchrun_args(["torchrun"], 2, 4)
['torchrun', '--nnodes', '2', '--nproc-per-node', '4', '--rdzv-backend', 'c10d']
>>> torchrun_args(["torchrun"], 2, 1, node_rank=1, endpoint="10.0.0.5:29500", rdzv_id="j")[5:7]
['--node-rank', '1']
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from costguard.errors import InputError

#: The most nodes of one gang ``costguard launch --nodes`` starts (and its records hold).
MAX_NODES = 1024
#: The most processes one node's ``torchrun`` starts.
MAX_PROCS_PER_NODE = 1024


def torchrun_args(
    torchrun: Sequence[str],
    nodes: int,
    procs_per_node: int,
    *,
    node_rank: int | None = None,
    endpoint: str | None = None,
    rdzv_id: str | None = None,
) -> list[str]:
    """The words that start one node's ``torchrun`` (``torchrun``: how to start it, e.g.
    ``pixi run torchrun``), before the script and its arguments. ``node_rank``,
    ``endpoint`` (the rendezvous ``host:port``) and ``rdzv_id`` are left out when the
    caller adds them itself (a batch script's shell knows them only at run time)."""
    words = [*torchrun, "--nnodes", str(nodes), "--nproc-per-node", str(procs_per_node)]
    if node_rank is not None:
        words += ["--node-rank", str(node_rank)]
    words += ["--rdzv-backend", "c10d"]
    if endpoint is not None:
        words += ["--rdzv-endpoint", endpoint]
    if rdzv_id is not None:
        words += ["--rdzv-id", rdzv_id]
    return words


def check_node_command(command: Sequence[str]) -> None:
    """With ``--nodes``, the command is what ``torchrun`` runs (``train.py ARGS`` or
    ``-m MODULE``), never ``python`` or ``torchrun`` itself; :class:`InputError` if so.

    >>> check_node_command(["train.py", "--lr", "3e-4"])
    >>> check_node_command(["python", "train.py"])
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: with --nodes, COMMAND is what torchrun runs, not 'python'
    """
    if command and re.fullmatch(r"(python[0-9.]*|torchrun)", Path(command[0]).name):
        msg = f"with --nodes, COMMAND is what torchrun runs, not {command[0]!r}"
        raise InputError(
            msg,
            hint="e.g. -- train.py --lr 3e-4, or -- -m pkg.train (torchrun is started for you)",
        )
