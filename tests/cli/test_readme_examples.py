"""The README's command examples that run offline (`estimate` but `--from-run`,
`pricing`, `alarm ... --dry-run`, `slurm script`, any `--help`), pasted as they are into
bash on a real pseudo-terminal of 80 columns: each exits 0, and no line it prints is wider
than the terminal but a copyable command standing alone on its line."""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import pytest

from tests.helpers.output import assert_commands_whole, on_terminal

README = Path(__file__).parents[2] / "README.md"
BIN = Path(sys.executable).parent
WIDTH = 80


def readme_commands() -> list[str]:
    """Every `$ costguard ...` line of the README's console blocks, a line ending in a
    backslash joined with the next, as a user pastes it."""
    found = []
    for block in re.findall(r"```console\n(.*?)```", README.read_text(encoding="utf-8"), re.S):
        pasted = block.replace("\\\n", " ")
        found += [line[2:] for line in pasted.splitlines() if line.startswith("$ costguard ")]
    return found


def offline(command: str) -> bool:
    """Whether ``command`` runs without a cloud account or the network."""
    words = shlex.split(command, comments=True)
    return (
        "--help" in words
        or (words[1] == "estimate" and "--from-run" not in words)  # a run's store it reads
        or words[1:3] in (["pricing", "gpus"], ["pricing", "show"], ["pricing", "check"])
        or (words[1] == "alarm" and "--dry-run" in words)
        or words[1:3] == ["slurm", "script"]
    )


COMMANDS = [c for c in readme_commands() if offline(c)]


def test_the_readme_examples_are_found() -> None:
    kinds = {tuple(shlex.split(c, comments=True)[1:3]) for c in COMMANDS}
    assert len(COMMANDS) >= 12, COMMANDS
    assert {("pricing", "gpus"), ("slurm", "script")} <= kinds
    assert any(c.startswith("costguard alarm ") for c in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: shlex.join(shlex.split(c, True)))
def test_a_readme_example_runs_and_fits_80_columns(command: str, tmp_path: Path) -> None:
    keep = ("HOME", "LANG", "LC_ALL", "TMPDIR", "USER")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(
        PATH=f"{BIN}{os.pathsep}/usr/bin{os.pathsep}/bin",
        COLUMNS=str(WIDTH),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        COSTGUARD_CACHE_DIR=str(tmp_path / "cache"),  # the bundled tables, as on a new install
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
    )
    code, screen = on_terminal(
        ["/bin/bash", "-c", f"cd {shlex.quote(str(tmp_path))} && {command}"], WIDTH, env
    )
    assert code == 0, screen
    if "--format json" not in command:  # a document for scripts, each value on one line
        assert_commands_whole(screen.splitlines(), WIDTH)


#: A train.py as the README's: a Checkpointer loop (tests/checkpoint/steady_script.py),
#: 400 steps of 5 ms.
STEADY = Path(__file__).parents[1] / "checkpoint" / "steady_script.py"
TRAIN_PY = f"""import runpy, sys
sys.argv = ["train.py", "--steps", "400", "--sleep", "0.005"]
open("ran", "a").close()
runpy.run_path({str(STEADY)!r}, run_name="__main__")
"""


def test_the_readmes_pilot_and_its_from_run_on_a_laptop(tmp_path: Path) -> None:
    """Issue 49 item 3, as a laptop user pastes the README's pilot lines in order: the one
    for a GPU machine is refused before the script runs (it ran the whole pilot, then
    refused the CPU); the laptop's prices the run; `--from-run` reads the folder the pilot
    wrote (the README said pilot/, the pilot writes costguard-pilot/)."""
    lines = [c for c in readme_commands() if c.startswith("costguard pilot ")]
    lines += [c for c in readme_commands() if re.search(r"--from-run (?!s3://)", c)]
    assert len(lines) == 3, lines
    (tmp_path / "train.py").write_text(TRAIN_PY)
    env = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "LC_ALL", "USER")}
    env.update(
        PATH=f"{BIN}{os.pathsep}/usr/bin{os.pathsep}/bin",
        COLUMNS=str(WIDTH),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        COSTGUARD_CACHE_DIR=str(tmp_path / "cache"),
        CUDA_VISIBLE_DEVICES="",  # a CPU-only laptop, whatever this machine has
        PYTHONPATH=os.pathsep.join(sys.path),
    )
    python = shlex.quote(sys.executable)
    for command in lines:
        pasted = re.sub(r"-- python ", f"-- {python} ", command)
        code, screen = on_terminal(
            ["/bin/bash", "-c", f"cd {shlex.quote(str(tmp_path))} && {pasted}"], WIDTH, env
        )
        if command.startswith("costguard pilot ") and "--speedup" not in command:
            assert code == 2, screen
            assert "Error: this machine shows no NVIDIA GPU" in screen
            assert not (tmp_path / "ran").exists()  # refused before the script ran
        else:
            assert code == 0, screen
            assert "SCALED" in screen
