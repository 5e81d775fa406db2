"""costguard: keep ML and science work on cloud GPUs within budget.

Four habits, each a command: ``costguard estimate`` before you run, ``costguard alarm``
on day one, checkpoint-and-resume on spot, and ``costguard reap`` for idle GPUs.

Importing this package loads no cloud SDK and no torch; each feature imports what it
needs when it is used.
"""

from __future__ import annotations

from typing import Any

from costguard._version import __version__

__all__ = ["__version__", "estimate", "job_status", "pricing", "spend"]


def __getattr__(name: str) -> Any:
    """``costguard.estimate`` and ``costguard.pricing``, loaded on first use (PEP 562).

    ``costguard.estimate(gpu="a10g", hours=8, count=4)`` is the notebook API
    (:mod:`costguard.notebook`); ``costguard.pricing.table("gpu_instances")`` a table as a
    DataFrame; ``costguard.spend("export.csv.gz", by="job")`` what a billing export billed,
    as a DataFrame; ``costguard.job_status("s3://my-bucket/run1")`` a launched job's
    attempts, cost so far, finish time and projected total (an array's: a DataFrame of
    its tasks).
    """
    if name == "estimate":
        from costguard.notebook import estimate

        return estimate
    if name == "job_status":
        from costguard.notebook import job_status

        return job_status
    if name == "spend":
        from costguard.billing.frame import spend

        return spend
    if name == "pricing":
        import importlib

        return importlib.import_module("costguard.pricing")
    msg = f"module 'costguard' has no attribute {name!r}"
    raise AttributeError(msg)
