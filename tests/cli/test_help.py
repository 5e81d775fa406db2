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
