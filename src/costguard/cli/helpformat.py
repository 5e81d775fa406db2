"""How ``--help`` is laid out: click's formatter, never breaking a line inside a word.

click wraps help with :class:`textwrap.TextWrapper`, which also breaks after a hyphen
inside a word: ``--idle-|minutes``, ``us-|central1``, ``costguard-|pilot/``, ``$/GPU-|hour``,
each a flag, value or name that no longer reads or copies whole. :class:`HelpFormatter`
hands click the text with its hyphens glued (U+2011, a non-breaking hyphen, one column
too), so lines break between words only, and puts them back. :func:`use_help_format`
gives a command, and every command under it, the context that uses it; every group is a
:class:`HelpGroup`, whose command list shows each summary whole.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any

import click

_HYPHEN, _GLUED = "-", "\u2011"


def _glue(text: str) -> str:
    return text.replace(_HYPHEN, _GLUED)


class HelpFormatter(click.HelpFormatter):
    """click's help formatter whose lines break between words only, never at a hyphen.

    >>> formatter = HelpFormatter(width=22)  # click's own: "Stop after --idle-"
    >>> formatter.write_text("Stop after --idle-minutes of no GPU work in us-central1.")
    >>> print(formatter.getvalue())
    Stop after
    --idle-minutes of no
    GPU work in
    us-central1.
    <BLANKLINE>
    """

    def _unglued(self, write: Callable[[], None]) -> None:
        start = len(self.buffer)
        write()
        self.buffer[start:] = [part.replace(_GLUED, _HYPHEN) for part in self.buffer[start:]]

    def write_usage(self, prog: str, args: str = "", prefix: str | None = None) -> None:
        self._unglued(lambda: super(HelpFormatter, self).write_usage(prog, _glue(args), prefix))

    def write_text(self, text: str) -> None:
        self._unglued(lambda: super(HelpFormatter, self).write_text(_glue(text)))

    def write_dl(self, rows: Iterable[tuple[str, str]], *args: Any, **kwargs: Any) -> None:
        glued = [(_glue(term), _glue(definition)) for term, definition in rows]
        self._unglued(lambda: super(HelpFormatter, self).write_dl(glued, *args, **kwargs))


class HelpContext(click.Context):
    """A click context whose ``--help`` is laid out by :class:`HelpFormatter`."""

    formatter_class = HelpFormatter


class HelpGroup(click.Group):
    """A click group whose command list shows each command's summary whole, wrapped (click
    cuts one longer than the line short with "...")."""

    context_class = HelpContext

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        shown = [self.get_command(ctx, name) for name in self.list_commands(ctx)]
        rows = [
            (command.name or "", command.get_short_help_str(sys.maxsize))
            for command in shown
            if command is not None and not command.hidden
        ]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def use_help_format(command: click.Command) -> click.Command:
    """``command`` and every command under it (a group's), with :class:`HelpContext`."""
    command.context_class = HelpContext
    if isinstance(command, click.Group):
        for child in command.commands.values():
            use_help_format(child)
    return command
