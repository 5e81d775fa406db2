"""Checks of what the CLI shows: text that fits a terminal, and PNG charts read back pixel
by pixel."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import termios
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

WIDTHS = (80, 100, 120)


def assert_fits(text: str, width: int, cells: Iterable[str]) -> None:
    """No line wider than ``width``, nothing cut with an ellipsis, every cell shown whole.

    ``cells`` are the money figures, names and regions the output must show: each must
    appear on one line, as it is (a cell wrapped over two lines or cut is not found).
    """
    from rich.cells import cell_len

    lines = text.splitlines()
    too_wide = [line for line in lines if cell_len(line) > width]
    assert not too_wide, f"{len(too_wide)} line(s) wider than {width}: {too_wide[:3]}"
    assert "\u2026" not in text, "a cell was cut (ellipsis)"
    missing = sorted({cell for cell in cells if not any(cell in line for line in lines)})
    assert not missing, f"not shown whole at {width} columns: {missing[:10]}"


def assert_commands_whole(lines: list[str], width: int, text: str | None = None) -> None:
    """Each `command` in backticks (of ``text``, default: the lines) whole on one of
    ``lines``, and no line wider than ``width`` but one where a command stands alone
    (after a label such as ``Hint: `` at most), so that it can be copied."""
    text = "\n".join(lines) if text is None else text
    for command in re.findall(r"`[^`]*`", " ".join(text.split())):
        assert any(command in line for line in lines), (command, lines)
    for line in lines:
        alone = re.fullmatch(r"\s*(\S+: )?`[^`]*`\S*", line)
        assert len(line) <= width or alone, f"{len(line)} > {width}: {line!r}"


def on_terminal(
    argv: list[str], columns: int, env: Mapping[str, str], rows: int = 40, typed: bytes = b""
) -> tuple[int, str]:
    """Run ``argv`` on a pseudo-terminal of ``columns`` x ``rows`` (its stdin, stdout and
    stderr, sized before the command starts), with ``typed`` waiting on its input: its exit
    code and what it printed, plain."""
    pid, fd = pty.fork()
    if pid == 0:  # the child
        fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        os.execve(argv[0], argv, {**env, "TERM": "xterm"})
    if typed:
        os.write(fd, typed)
    chunks = []
    try:
        while select.select([fd], [], [], 60)[0]:
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
    finally:
        _, status = os.waitpid(pid, 0)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode()).replace("\r", "")
    return os.waitstatus_to_exitcode(status), text


@dataclass(frozen=True)
class Png:
    """A PNG as the tests look at it: its size and its RGB pixels, row by row."""

    width: int
    height: int
    rows: list[list[tuple[int, int, int]]]

    def count(self, colour: tuple[int, int, int], tolerance: int = 40) -> int:
        """How many pixels are within ``tolerance`` of ``colour`` in every channel."""
        return sum(1 for row in self.rows for px in row if _near(px, colour, tolerance))

    def rows_with(self, colour: tuple[int, int, int], least: int, tolerance: int = 40) -> list[int]:
        """The rows holding at least ``least`` pixels of ``colour``: horizontal lines."""
        return [
            y
            for y, row in enumerate(self.rows)
            if sum(1 for px in row if _near(px, colour, tolerance)) >= least
        ]


def _near(px: tuple[int, int, int], colour: tuple[int, int, int], tolerance: int) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(px, colour, strict=True))


def read_png(path: Path) -> Png:
    """Check ``path`` is a PNG (signature, then a full decode) and read its pixels."""
    from PIL import Image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    with Image.open(path) as image:
        assert image.format == "PNG"
        rgb = image.convert("RGB")
        width, height = rgb.size
        data = rgb.tobytes()
    flat = [(data[i], data[i + 1], data[i + 2]) for i in range(0, len(data), 3)]
    return Png(width, height, [flat[y * width : (y + 1) * width] for y in range(height)])
