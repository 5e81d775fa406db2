"""Submit a batch script with ``sbatch``: the only part of the SLURM feature that does I/O.

The script goes to ``sbatch`` on standard input (SLURM keeps its own copy), so nothing
is written next to the user's files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping

from costguard.errors import CostguardError

SBATCH_TIMEOUT_S = 60


def find_sbatch(env: Mapping[str, str]) -> str:
    """The ``sbatch`` on ``env``'s PATH; a clear error where there is none."""
    found = shutil.which("sbatch", path=env.get("PATH", os.defpath))
    if found is None:
        msg = "sbatch is not on PATH: this machine cannot submit SLURM jobs"
        raise CostguardError(
            msg,
            hint="run it on the cluster's login node (`module load slurm` on some), or "
            "write the script with `costguard slurm script ... > job.sbatch` and submit it there",
        )
    return found


def parse_job_id(output: str) -> str:
    """The job id in ``sbatch --parsable``'s answer (``ID`` or ``ID;CLUSTER``).

    >>> parse_job_id("4242\\n"), parse_job_id("17;cluster-a\\n")
    ('4242', '17')
    """
    first = output.strip().splitlines()[-1] if output.strip() else ""
    job_id = first.split(";", 1)[0].strip()
    if not job_id.isdigit():
        msg = f"sbatch answered {output.strip()!r}, not a job id"
        raise CostguardError(msg, hint="check `squeue --me`: the job may not have been queued")
    return job_id


def submit(script: str, env: Mapping[str, str]) -> str:
    """Queue ``script`` with ``sbatch --parsable``; returns the job id."""
    sbatch = find_sbatch(env)
    try:
        done = subprocess.run(
            [sbatch, "--parsable"],
            input=script,
            capture_output=True,
            text=True,
            env=dict(env),
            timeout=SBATCH_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        msg = f"sbatch did not answer within {SBATCH_TIMEOUT_S} s"
        raise CostguardError(
            msg, hint="the controller may be busy or down: `sinfo`, then try again"
        ) from None
    if done.returncode != 0:
        reason = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no message"
        msg = f"sbatch refused the job: {reason}"
        raise CostguardError(
            msg, hint="`costguard slurm script ...` prints the script that was submitted"
        )
    return parse_job_id(done.stdout)
