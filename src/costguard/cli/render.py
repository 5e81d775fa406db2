"""Output for people (rich tables) and scripts (JSON, CSV). No decisions here.

Every text goes out through :mod:`costguard.text`: a control character is shown escaped
in a paragraph, a note or a table (a table cell's own newlines kept), rich reads a cell
as text and never as markup, and a CSV cell is never a formula. A value read from a
store, an export, a tag or a cloud API is also passed through
:func:`costguard.text.visible` where it is put into a cell, so that its newlines cannot
start a line of their own.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, redirect_stdout
from decimal import Decimal
from typing import IO, Any, Literal, NamedTuple

import click
from rich.cells import cell_len

from costguard.cli import wrap_words
from costguard.money import usd_str
from costguard.text import csv_cell, visible, visible_lines

#: Environment variables with which rich treats a stream that is not a tty as a terminal.
_FORCED_TERMINAL = frozenset({"FORCE_COLOR", "TTY_COMPATIBLE"})


def stdout() -> IO[str]:
    """The current standard output, looked up at call time (click's test runner swaps it)."""
    return sys.stdout


def is_terminal(stream: IO[str] | None = None) -> bool:
    """Whether ``stream`` (default: stdout) is an interactive terminal."""
    stream = stream or stdout()
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class Pipe(NamedTuple):
    """What the layouts need to know of a pipe, a file or cron: not a terminal, and wide.

    Plain output is written with ``click.echo``, so it needs no rich console, and a
    script's ``costguard estimate ... | grep`` does not pay for importing one.
    """

    is_terminal: bool = False
    width: int = 160


def console(*, stderr: bool = False) -> Any:
    """A rich console on stdout (or stderr); wide and colourless when not a terminal.

    Where the stream is no terminal and the environment does not say to treat it as one
    (rich reads ``FORCE_COLOR`` and ``TTY_COMPATIBLE``), a :class:`Pipe` stands in.
    """
    stream = sys.stderr if stderr else stdout()
    terminal = is_terminal(stream)
    if not terminal and not _FORCED_TERMINAL.intersection(os.environ):
        return Pipe()
    from rich.console import Console

    return Console(
        file=stream,
        width=None if terminal else 160,
        no_color=not terminal,
        highlight=False,
        soft_wrap=not terminal,
    )


@contextmanager
def progress(description: str, total: int) -> Iterator[Callable[[str], None]]:
    """A progress bar on stderr over ``total`` steps: on a terminal only, never in a pipe
    or cron, and only when there is more than one step. Yields ``advance(label)``."""
    con = console(stderr=True)
    if not con.is_terminal or total < 2:
        yield lambda label: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    columns = (TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=con, transient=True) as bar:
        task = bar.add_task(description, total=total)

        def advance(label: str) -> None:
            done = visible_lines(f"{description} ({label} done)")
            bar.update(task, advance=1, description=done)

        yield advance


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
    import json  # --format json only

    json.dump(to_jsonable(document), stdout(), indent=2)
    stdout().write("\n")


def print_csv(columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> None:
    """A CSV table on stdout: a header, then one line per row; no text cell is read as a
    formula (:func:`costguard.text.csv_cell`), numbers stay numbers."""
    import csv  # only for --format csv

    writer = csv.DictWriter(stdout(), list(columns), lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if v is None else to_jsonable(csv_cell(v)) for k, v in row.items()})


def print_notes(lines: Iterable[str], *, heading: str | None = None, err: bool = False) -> None:
    """Plain explanatory lines (assumptions, notes) under a table, or on stderr for CSV."""
    lines = [visible(line) for line in lines]
    if not lines:
        return
    if err:
        if heading:
            click.echo(heading, err=True)
        for line in lines:
            click.echo(f"  - {line}", err=True)
        return
    con = console()
    if heading:
        click.echo(heading)
    for line in lines:
        print_prose(line, first="  - ", indent="    ", con=con)


# Tables for people. One helper for every command, so that every table fits the terminal
# it is printed on: the columns that matter (money, names, regions) are never cut; when the
# terminal is too narrow for all columns the least important ones go first, and when even
# the essential ones do not fit side by side each row is printed as a block of lines. When
# stdout is not a terminal (a pipe, a file, cron) the layout is plain and does not depend
# on any width: aligned columns, no box drawing, one line per row.

_GAP = 2  # columns are two spaces apart (rich SIMPLE_HEAD, right padding only)
_PROSE_MIN = 24  # free text is given at least this many characters before it wraps


class Column(NamedTuple):
    """One column of a table for people.

    ``drop`` is 0 for a column always shown; a column with a higher ``drop`` is left out
    first when the terminal is too narrow. ``prose`` marks free text (reasons, notes) that
    may wrap at word boundaries; every other cell is shown whole or not at all.
    """

    header: str
    justify: Literal["left", "right"] = "left"
    drop: int = 0
    prose: bool = False

    @property
    def label(self) -> str:
        """The header on one line (stacked and plain layouts)."""
        return " ".join(self.header.split())


def print_table(
    title: str | None,
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    *,
    con: Any = None,
) -> None:
    """Print ``rows`` (already formatted cells) under ``title`` so that they fit.

    On a terminal: a table of the columns that fit side by side (a line names those left
    out), or one block of lines per row when even the essential ones do not. Elsewhere:
    the plain layout with every column.
    """
    con = con or console()
    cells = [
        [
            _one_line(visible_lines(c)) if not col.prose else visible_lines(c)
            for c, col in zip(row, columns, strict=True)
        ]
        for row in rows
    ]
    if not con.is_terminal:
        _print_plain(con, title, columns, cells)
        return
    width = con.width
    shown = list(range(len(columns)))
    for index in sorted(
        (i for i, c in enumerate(columns) if c.drop), key=lambda i: -columns[i].drop
    ):
        if _table_width(columns, cells, shown) <= width:
            break
        shown.remove(index)
    if _table_width(columns, cells, shown) > width:
        _print_stacked(con, title, columns, cells)
        return
    if title:
        print_prose(title, con=con)
    con.print(_rich_table(columns, cells, shown))
    left_out = [columns[i].label for i in range(len(columns)) if i not in shown]
    if left_out:
        print_prose(
            f"({', '.join(left_out)} not shown at {width} columns: a wider terminal, or "
            "--format json, shows them)",
            con=con,
        )


def print_prose(
    text: str, *, indent: str = "", first: str | None = None, con: Any = None, err: bool = False
) -> None:
    """A paragraph: wrapped at word boundaries on a terminal, one line elsewhere (a newline
    or another control character in ``text`` is shown escaped); a `command` in backticks
    is never broken (:func:`costguard.cli.wrap_words`).

    ``first`` starts the first line (default: ``indent``), ``indent`` the lines it wraps
    onto; ``err``: on stderr, wrapped to stderr's terminal.
    """
    for line in prose_lines(text, indent=indent, first=first, con=con or console(stderr=err)):
        click.echo(line, err=err)


def prose_lines(text: str, *, indent: str = "", first: str | None = None, con: Any) -> list[str]:
    """The lines :func:`print_prose` prints ``text`` as on ``con``."""
    first = indent if first is None else first
    text = visible(text)
    if not con.is_terminal:
        return [first + text]
    body = text.lstrip()  # the text's own indent stays on its first line
    label = first + text[: len(text) - len(body)]
    return [line.rstrip() for line in wrap_words(label, body, max(20, con.width), indent)]


def terminal_height() -> int | None:
    """The height of the terminal stdout is, in lines; ``None`` when it is no terminal."""
    con = console()
    return con.height if con.is_terminal else None


class _Screen(io.StringIO):
    """A buffer that answers as the terminal stdout is (the width comes from the console)."""

    def isatty(self) -> bool:
        return True


def lines_printed(draw: Callable[[], None]) -> int:
    """How many lines ``draw`` prints on stdout's terminal, drawn into a buffer instead."""
    screen = _Screen()
    with redirect_stdout(screen):
        draw()
    return len(screen.getvalue().splitlines())


def _one_line(cell: str) -> str:
    return "; ".join(part.strip() for part in cell.splitlines() if part.strip())


def _natural(column: Column, cells: Sequence[Sequence[str]], index: int) -> int:
    widths = [cell_len(line) for line in column.header.splitlines()]
    widths += [cell_len(line) for row in cells for line in (row[index].splitlines() or [""])]
    return max(widths, default=0)


def _least(column: Column, cells: Sequence[Sequence[str]], index: int) -> int:
    """The narrowest a column may be: whole cells, or for prose its longest word."""
    natural = _natural(column, cells, index)
    if not column.prose:
        return natural
    words = [cell_len(w) for row in cells for w in row[index].split()]
    words += [cell_len(w) for w in column.header.split()]
    return max(min(natural, _PROSE_MIN), *words, 1)


def _table_width(
    columns: Sequence[Column], cells: Sequence[Sequence[str]], shown: Sequence[int]
) -> int:
    return sum(_least(columns[i], cells, i) for i in shown) + _GAP * (len(shown) - 1)


def _rich_table(
    columns: Sequence[Column], cells: Sequence[Sequence[str]], shown: Sequence[int]
) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
        header_style="bold",
        expand=False,
    )
    for i in shown:
        column = columns[i]
        if column.prose:
            table.add_column(
                column.header, justify=column.justify, min_width=_least(column, cells, i)
            )
        else:
            table.add_column(
                column.header,
                justify=column.justify,
                no_wrap=True,
                min_width=_natural(column, cells, i),
            )
    for row in cells:
        table.add_row(*(Text(row[i]) for i in shown))
    return table


def _print_stacked(
    con: Any, title: str | None, columns: Sequence[Column], cells: Sequence[Sequence[str]]
) -> None:
    """One block per row: ``label  value`` lines, free text wrapped under its label."""
    if title:
        print_prose(title, con=con)
    pad = max(cell_len(c.label) for c in columns) + 2
    for row in cells:
        click.echo("")
        for column, cell in zip(columns, row, strict=True):
            if not cell.strip():
                continue
            label = column.label.ljust(pad)
            for n, line in enumerate(cell.splitlines()):
                print_prose(line, first=label if n == 0 else " " * pad, indent=" " * pad, con=con)


def _print_plain(
    con: Any, title: str | None, columns: Sequence[Column], cells: Sequence[Sequence[str]]
) -> None:
    """Aligned columns, no box drawing, no wrapping: the same whatever reads it."""
    flat = [[_one_line(c) for c in row] for row in cells]
    labels = [c.label for c in columns]
    widths = [
        max([cell_len(labels[i])] + [cell_len(row[i]) for row in flat]) for i in range(len(columns))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if c.justify == "right" else v.ljust(w)
            for v, w, c in zip(values, widths, columns, strict=True)
        ]
        return "  ".join(parts).rstrip()

    if title:
        click.echo(visible(title))
    click.echo(line(labels))
    for row in flat:
        click.echo(line(row))


@contextmanager
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
