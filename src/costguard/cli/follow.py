"""The job's own output while ``costguard launch --provider local`` supervises it.

A local attempt writes its output to ``<state dir>/<job id>/attempt-N.log`` (each node of a
gang to ``attempt-N.node-R.log``). The follower names each log as it appears and, unless
``--quiet``, prints its lines as they come, prefixed with the attempt number (``[N]``; a
gang's node ``[N.R]``), on stderr (stdout stays the report, e.g. JSON). It reads
from a thread that polls the folder; the last lines are read when it stops.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path

import click

from costguard.cli import render, wrap_words

_ATTEMPT = re.compile(r"attempt-([0-9]+)(?:\.node-([0-9]+))?\.log")
POLL_S = 0.2
MAX_LINE = 4000  # a line longer than this is printed in pieces, never held back whole


class Follower:
    """Print the new lines of every ``attempt-N.log`` in ``folder``, until stopped."""

    def __init__(
        self,
        folder: Path,
        *,
        quiet: bool = False,
        echo: Callable[[str], None] | None = None,
        poll_s: float = POLL_S,
    ) -> None:
        self.folder = folder
        self.quiet = quiet
        self.poll_s = poll_s
        self._echo = echo or (lambda line: click.echo(line, err=True))
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="costguard-follow", daemon=True)

    def __enter__(self) -> Follower:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.drain(final=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.drain()

    def _logs(self) -> list[tuple[tuple[int, int], str, Path]]:
        """Each log: its (attempt, node) order, what it is called, its path."""
        try:
            found = [(m, p) for p in self.folder.iterdir() if (m := _ATTEMPT.fullmatch(p.name))]
        except OSError:
            return []
        logs = []
        for match, path in found:
            attempt, node = int(match.group(1)), match.group(2)
            name = str(attempt) if node is None else f"{attempt}.{int(node)}"
            logs.append(((attempt, -1 if node is None else int(node)), name, path))
        return sorted(logs)

    def drain(self, *, final: bool = False) -> None:
        """Print what was written since the last call (all of it when ``final``)."""
        for _, number, path in self._logs():
            if path not in self._offsets:
                self._offsets[path] = 0
                # The path on a line of its own: it stays whole, to copy; under the home
                # folder as ~/... (a shell expands it), which fits 80 columns.
                who = number.replace(".", " node ", 1)
                self._echo(f"costguard: attempt {who} writes its output to\n  {_short(path)}")
            try:
                with path.open("rb") as stream:
                    stream.seek(self._offsets[path])
                    data = stream.read()
            except OSError:
                continue
            self._offsets[path] += len(data)
            data = self._partial.pop(path, b"") + data
            *lines, rest = data.split(b"\n")
            if (final and rest) or len(rest) > MAX_LINE:
                lines.append(rest)
            elif rest:
                self._partial[path] = rest
            if not self.quiet and lines:
                con = render.console(stderr=True)
                width = con.width if con.is_terminal else None
                for line in lines:
                    text = line.decode("utf-8", errors="replace").rstrip("\r")
                    self._show(number, text, width)

    def _show(self, number: str, text: str, width: int | None) -> None:
        """A line of attempt ``number``'s log (``N``, or ``N.R`` for node R), after
        ``  [N] ``. The lines costguard's
        own ``run`` wrote there (``costguard: ...``, one each: the log is no terminal) are
        wrapped at a terminal's ``width`` under their text; the script's own are as it
        wrote them."""
        label = f"  [{number}] "
        if not text.startswith("costguard: ") or width is None:
            self._echo(label + text)
            return
        for line in wrap_words(label, text, max(40, width), " " * (len(label) + 2)):
            self._echo(line)


def _short(path: Path) -> str:
    """``path`` with the home folder written ``~``, when it is under it.

    >>> _short(Path.home() / ".local" / "state" / "a.log")
    '~/.local/state/a.log'
    >>> _short(Path("/tmp/a.log"))
    '/tmp/a.log'
    """
    try:
        return f"~/{path.relative_to(Path.home())}"
    except (ValueError, RuntimeError):  # elsewhere, or no home folder known
        return str(path)
