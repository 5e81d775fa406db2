"""Every command, at every level, answers --help with an example."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import click
import pytest

from costguard.cli import cli


def command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, command in sorted(group.commands.items()):
        yield (*prefix, name)
        if isinstance(command, click.Group):
            yield from command_paths(command, (*prefix, name))


PATHS = [(), *command_paths(cli)]


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "costguard")
def test_help_shows_an_example(run_cli: Callable[..., Any], path: tuple[str, ...]) -> None:
    result = run_cli(*path, "--help")
    assert result.exit_code == 0, result.stderr
    assert "Usage:" in result.stdout
    assert "costguard " in result.stdout
    assert "Example" in result.stdout or "costguard estimate --gpu" in result.stdout


def test_every_registered_command_is_covered() -> None:
    expected = {"estimate", "pricing", "alarm", "burn", "reap", "agent", "run", "checkpoint"}
    assert expected <= {p[0] for p in PATHS if p}


@pytest.mark.parametrize("path", [(), ("pricing",), ("jobs",), ("slurm",)])
def test_nothing_after_a_group_prints_its_help_alone(
    run_cli: Callable[..., Any], path: tuple[str, ...]
) -> None:
    result = run_cli(*path)
    assert result.exit_code == 0
    first = result.stdout.splitlines()[0]
    assert first.startswith("Usage: ")
    assert first.endswith(" ".join((*path, "[OPTIONS] COMMAND [ARGS]...")))
    assert "Commands:" in result.stdout
    assert "Error" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("typed", "intended"),
    [
        (("estimate", "--hour", "8"), "--hours"),
        (("estimate", "--hours", "8", "--gpus", "4"), "--gpu"),
        (("estimate", "--hours", "8", "--counts", "4"), "--count"),
        (("reap", "--idle-minute", "30"), "--idle-minutes"),
    ],
)
def test_a_close_name_suggests_the_intended_option_first(
    run_cli: Callable[..., Any], typed: tuple[str, ...], intended: str
) -> None:
    result = run_cli(*typed)
    assert result.exit_code == 2
    first_line = result.stderr.splitlines()[0]
    assert first_line.startswith("Error: no such option"), first_line
    suggested = first_line.split("did you mean ", 1)[1]
    assert suggested.startswith(f"'{intended}'"), first_line
