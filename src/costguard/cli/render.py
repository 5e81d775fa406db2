"""Output for people (rich tables) and scripts (JSON, CSV). No decisions here."""

from __future__ import annotations

import contextlib
import csv
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from decimal import Decimal
from typing import IO, Any

import click

from costguard.money import usd_str


def stdout() -> IO[str]:
    """The current standard output, looked up at call time (click's test runner swaps it)."""
    return sys.stdout


def is_terminal(stream: IO[str] | None = None) -> bool:
    """Whether ``stream`` (default: stdout) is an interactive terminal."""
    stream = stream or stdout()
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def console(*, stderr: bool = False) -> Any:
    """A rich console on stdout (or stderr); wide and colourless when not a terminal."""
    from rich.console import Console

    stream = sys.stderr if stderr else stdout()
    terminal = is_terminal(stream)
    return Console(
        file=stream,
        width=None if terminal else 160,
        no_color=not terminal,
        highlight=False,
        soft_wrap=not terminal,
    )


def to_jsonable(value: Any) -> Any:
    """Decimals as exact decimal strings; everything else as JSON knows it."""
    if isinstance(value, Decimal):
        return usd_str(value)
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    return value


def print_json(document: Mapping[str, Any]) -> None:
    """One JSON document on stdout."""
    json.dump(to_jsonable(document), stdout(), indent=2)
    stdout().write("\n")


def print_csv(columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> None:
    """A CSV table on stdout: a header, then one line per row."""
    writer = csv.DictWriter(stdout(), list(columns), lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if v is None else to_jsonable(v) for k, v in row.items()})


def print_notes(lines: Iterable[str], *, heading: str | None = None, err: bool = False) -> None:
    """Plain explanatory lines (assumptions, notes) under a table, or on stderr for CSV."""
    lines = list(lines)
    if not lines:
        return
    if heading:
        click.echo(heading, err=err)
    for line in lines:
        click.echo(f"  - {line}", err=err)


@contextlib.contextmanager
def progress_bar(description: str) -> Iterator[Callable[[int, int], None]]:
    """A ``progress(done, total)`` callback that draws a bar on stderr when it is a
    terminal, and does nothing in a pipe, a log file or cron."""
    if not is_terminal(sys.stderr):
        yield lambda done, total: None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        console=console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)
