"""``--sync-dir`` on the command line: every command that takes it (``run``, ``launch``,
``slurm script``, ``slurm submit``) refuses the same bad folders with exit 2 before anything
starts; ``costguard slurm script`` passes an absolute folder on to ``costguard run``."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

#: A valid invocation of each command taking --sync-dir, the value going in at ``{sync}``;
#: ``{tmp}`` is the test's folder, where nothing may be written.
SYNC_COMMANDS = {
    "run": ["run", "--checkpoint", "{tmp}/ckpt", "--sync-dir", "{sync}", "--",
            sys.executable, "-c", "open('{tmp}/started', 'w')"],
    "launch": ["launch", "--provider", "local", "--gpu", "a10g", "--checkpoint", "{tmp}/ckpt",
               "--sync-dir", "{sync}", "--yes", "--", "python", "train.py"],
    "slurm script": ["slurm", "script", "--time", "1:00:00", "--checkpoint", "s3://b/run1",
                     "--sync-dir", "{sync}", "--", "python", "train.py"],
    "slurm submit": ["slurm", "submit", "--time", "1:00:00", "--checkpoint", "s3://b/run1",
                     "--sync-dir", "{sync}", "--", "python", "train.py"],
}  # fmt: skip
#: Folders no command takes as --sync-dir, and what the refusal says.
BAD_SYNC_DIRS = [
    ("s3://bucket/out", "is a URL"),
    ("gs://bucket/out/", "is a URL"),
    ("../out", "leaves the folder it names"),
    ("out/../../x", "leaves the folder it names"),
    ("  ", "--sync-dir is empty"),
    ("{tmp}/a-file", "is a file"),
]


@pytest.mark.parametrize(("sync_dir", "message"), BAD_SYNC_DIRS)
@pytest.mark.parametrize("command", sorted(SYNC_COMMANDS))
def test_every_command_refuses_the_same_bad_sync_dirs_before_anything_starts(
    run_cli: Callable[..., Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    sync_dir: str,
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COSTGUARD_CLOUD", "none")
    monkeypatch.setenv("COSTGUARD_LOCAL_DIR", str(tmp_path / "local-state"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch
    (tmp_path / "a-file").write_text("")
    args = [
        a.format(tmp=tmp_path, sync=sync_dir.format(tmp=tmp_path)) for a in SYNC_COMMANDS[command]
    ]
    result = run_cli(*args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert lines[-2].startswith("Error: --sync-dir"), result.stderr
    assert message in lines[-2]
    assert lines[-1].startswith("Hint: ")
    assert result.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # no store, no script


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
