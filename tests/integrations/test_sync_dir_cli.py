"""``--sync-dir`` on the command line: ``costguard run`` refuses a file before the script
starts; ``costguard slurm script`` passes an absolute folder on to ``costguard run``."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.training import child_env, costguard_command


def test_run_refuses_a_sync_dir_that_is_a_file_before_the_script_starts(tmp_path: Path) -> None:
    marker, taken = tmp_path / "started", tmp_path / "a-file"
    taken.write_text("")
    script = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    flags = ["--checkpoint", str(tmp_path / "store"), "--sync-dir", str(taken)]
    done = subprocess.run(
        [*costguard_command(), "run", *flags, "--", *script],
        env=child_env(tmp_path, COSTGUARD_CLOUD="none"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "Error:" in done.stderr
    assert "--sync-dir" in done.stderr
    assert "is a file" in done.stderr
    assert not marker.exists()


def test_slurm_script_passes_the_sync_dir_on_made_absolute(
    run_cli: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = run_cli(
        "slurm", "script", "--time", "1:00:00", "--checkpoint", "s3://bucket/run1",
        "--sync-dir", "out", "--", "python", "train.py",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    line = next(t for t in result.stdout.splitlines() if t.startswith("costguard_run=("))
    words = shlex.split(line.removeprefix("costguard_run=(").removesuffix(")"))
    assert words[words.index("--sync-dir") + 1] == str(tmp_path / "out")
