"""A running SLURM cluster as the tests see it (the ``slurm_cluster`` fixture starts one)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers.waiting import WaitTimeoutError, wait_for


@dataclass
class SlurmCluster:
    """A running cluster: its folder, the client environment, its node and partition."""

    root: Path
    env: dict[str, str]
    node: str
    partition: str = "debug"
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def run(self, *args: str, timeout_s: float = 30) -> str:
        """Run a SLURM client command against this cluster; its stdout."""
        done = subprocess.run(
            list(args),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def job_state(self, job_id: str) -> tuple[str, str]:
        """(state, reason) of a job, e.g. ("PENDING", "BeginTime") or ("COMPLETED", "None")."""
        text = self.run("scontrol", "-o", "show", "job", job_id)
        fields = dict(item.split("=", 1) for item in text.split() if "=" in item)
        return fields.get("JobState", "?"), fields.get("Reason", "?")

    def update(self, job_id: str, setting: str, timeout_s: float = 20) -> None:
        """``scontrol update``, tried again while a requeued job is still completing."""
        refusals: list[AssertionError] = []

        def updated() -> bool:
            try:
                self.run("scontrol", "update", f"JobId={job_id}", setting)
            except AssertionError as refused:
                refusals.append(refused)
                return False
            return True

        try:
            wait_for(updated, f"scontrol update {setting}", timeout_s=timeout_s, poll_s=0.5)
        except WaitTimeoutError:
            raise refusals[-1] from None

    def run_time_s(self, job_id: str) -> int:
        """How long the job has been running, in seconds (``RunTime``)."""
        text = self.run("scontrol", "-o", "show", "job", job_id)
        value = next(f.split("=", 1)[1] for f in text.split() if f.startswith("RunTime="))
        days, _, clock = value.rpartition("-")
        hours, minutes, seconds = (int(part) for part in clock.split(":"))
        return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds

    def logs(self) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log"):
            path = self.root / "log" / name
            if path.exists():
                parts.append(f"--- {name}\n" + "\n".join(path.read_text().splitlines()[-30:]))
        return "\n".join(parts)
