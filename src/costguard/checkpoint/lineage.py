"""Which ``--sync-dir`` checkpoints in a store are this run's, from costguard's own record.

A trainer's folder does not always say which run wrote it. Hugging Face's
``trainer_state.json`` carries its ``log_history``, which each later save of one run
continues; Accelerate's ``save_state`` and Lightning's ``.ckpt`` carry nothing that ties one
save to an earlier one (see :func:`costguard.checkpoint.foldersync.FolderSync.prepare`).
So costguard records it: every checkpoint it uploads carries its run's :class:`Lineage`
(``extra["folder"]["run"]`` in the manifest), a random id and the checkpoint the run
resumed from when the id was made. A run that resumes a checkpoint keeps its id; a run
with nothing to resume, or whose trainer started over below what was put back, makes a
new one.

The run is then the lineage of the newest checkpoint that carries one (:func:`others`):
checkpoints of another lineage are not this run's, and so are the ones written before any
lineage (by an older costguard) above the step the run resumed from. A history that
restarted is thus this run's, not another's.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from costguard.checkpoint.manifest import Manifest

#: The key of the record in a ``--sync-dir`` manifest's ``extra["folder"]``.
KEY = "run"
_ID = re.compile(r"[0-9a-f]{16}")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")


@dataclass(frozen=True)
class Lineage:
    """One run's history in a store: its id, and the checkpoint (store name and step) the
    run resumed from when the id was made (``None``: from step 0)."""

    id: str
    after: str | None = None
    after_step: int | None = None

    @classmethod
    def new(cls, after: Manifest | None = None) -> Lineage:
        """A new run's lineage, resuming ``after`` (``None``: from step 0)."""
        if after is None:
            return cls(uuid.uuid4().hex[:16])
        return cls(uuid.uuid4().hex[:16], after.name, after.step)

    def record(self) -> dict[str, Any]:
        """What goes in a manifest.

        >>> Lineage("0123456789abcdef", "ckpt-1", 1).record()
        {'id': '0123456789abcdef', 'after': 'ckpt-1', 'after_step': 1}
        """
        return {"id": self.id, "after": self.after, "after_step": self.after_step}


def lineage_of(manifest: Manifest) -> Lineage | None:
    """The lineage a ``--sync-dir`` manifest records, or ``None`` (none, or not one this
    costguard wrote: the store is untrusted).

    >>> from costguard.checkpoint.manifest import Manifest
    >>> m = Manifest("ckpt-2", 2, 0.0, (),
    ...              extra={"folder": {"run": {"id": "0123456789abcdef", "after": None}}})
    >>> lineage_of(m)
    Lineage(id='0123456789abcdef', after=None, after_step=None)
    """
    folder = manifest.extra.get("folder")
    record = folder.get(KEY) if isinstance(folder, dict) else None
    if not isinstance(record, dict) or not isinstance(record.get("id"), str):
        return None
    after, step = record.get("after"), record.get("after_step")
    if not _ID.fullmatch(record["id"]):
        return None
    if after is None:
        return Lineage(record["id"])
    if not isinstance(after, str) or not _NAME.fullmatch(after):
        return None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return None
    return Lineage(record["id"], after, step)


def others(manifests: Iterable[Manifest]) -> tuple[Lineage | None, dict[str, str]]:
    """The run's lineage (that of the newest manifest carrying one; ``None``: none does),
    and each manifest that is not the run's, by name, with why.

    >>> from costguard.checkpoint.manifest import Manifest
    >>> def made(name, step, when, run=None):
    ...     folder = {"run": run.record()} if run else {}
    ...     return Manifest(name, step, when, (), extra={"folder": folder})
    >>> old, new = Lineage("a" * 16), Lineage("b" * 16, "m40", 40)
    >>> run, out = others([made("m40", 40, 1), made("m90", 90, 2), made("m50", 50, 3, new),
    ...                    made("m20", 20, 0.5, old)])
    >>> run == new, sorted(out)
    (True, ['m20', 'm90'])
    """
    manifests = list(manifests)
    marked = [(m, lineage) for m in manifests if (lineage := lineage_of(m)) is not None]
    if not marked:
        return None, {}
    newest, run = max(marked, key=lambda pair: (pair[0].created_unix, pair[0].step))
    why: dict[str, str] = {}
    for manifest in manifests:
        lineage = lineage_of(manifest)
        if lineage is not None and lineage.id != run.id:
            why[manifest.name] = (
                f"costguard recorded it in another run ({lineage.id}); the run's newest "
                f"checkpoint, {newest.name}, is of run {run.id}"
            )
        elif lineage is None and (run.after_step is None or manifest.step > run.after_step):
            start = f"from {run.after} (step {run.after_step})" if run.after else "from step 0"
            why[manifest.name] = (
                f"written before costguard recorded runs, above where the run of its newest "
                f"checkpoint {newest.name} started ({start})"
            )
    return run, why
