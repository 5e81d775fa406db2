"""Every table fits the terminal it is printed on, and a pipe gets a plain layout.

At 80, 100 and 120 columns no line is wider than the terminal and no money figure,
instance name or region is cut or wrapped (each must appear whole on one line). The
figures expected are those of ``--format json``. Other commands' tables are checked the
same way next to their cloud fixtures (tests/alarms, tests/reaper, tests/spot).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from costguard.money import format_usd
from tests.helpers.output import WIDTHS, assert_fits, on_terminal

ESTIMATES = [
    ("estimate", "--gpu", "a10g", "--hours", "8", "--count", "4"),
    ("estimate", "--gpu", "h100", "--gpus-per-instance", "8", "--hours", "24", "--top", "0"),
    ("estimate", "--gpu", "t4", "--hours", "100", "--count", "12", "--top", "0"),
    ("estimate", "--instance-type", "Standard_NC24ads_A100_v4", "--hours", "8", "--spot"),
    (
        "estimate",
        "--gpu",
        "l4",
        "--hours",
        "24",
        "--provider",
        "slurm",
        "--provider",
        "aws",
        "--su-per-gpu-hour",
        "64",
        "--usd-per-su",
        "0.02",
        "--su-budget",
        "50000",
    ),
]


def estimate_cells(document: dict[str, Any]) -> Iterator[str]:
    for option in document["options"]:
        yield option["region"]
        yield option["instance_type"]
        yield format_usd(Decimal(option["total_usd"]))
        yield format_usd(Decimal(option["usd_per_hour"]), rate=True)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("args", ESTIMATES, ids=lambda a: " ".join(a[1:5]))
def test_estimate_fits(run_cli: Callable[..., Any], terminal, width: int, args) -> None:
    document = run_cli(*args, "--format", "json").json()
    terminal(width)
    result = run_cli(*args)
    assert result.exit_code == 0, result.stderr
    assert_fits(result.stdout, width, estimate_cells(document))
    if document["slurm"]:
        assert "50,000" in result.stdout


@pytest.mark.parametrize("width", WIDTHS)
def test_pricing_gpus_fits(run_cli: Callable[..., Any], terminal, width: int) -> None:
    document = run_cli("pricing", "gpus", "--format", "json").json()
    cells = [g["gpu"] for g in document["gpus"]]
    cells += [
        format_usd(Decimal(g[key]), rate=True)
        for g in document["gpus"]
        for key in ("ondemand_usd_per_gpu_hour", "spot_usd_per_gpu_hour")
        if g[key] is not None
    ]
    terminal(width)
    result = run_cli("pricing", "gpus")
    assert result.exit_code == 0, result.stderr
    assert_fits(result.stdout, width, cells)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize(
    "args",
    [
        ("gpu_instances", "--unverified"),
        ("gpu_instances", "--gpu", "h100"),
        ("storage", "--provider", "azure"),
        ("regions",),
    ],
)
def test_pricing_show_fits(run_cli: Callable[..., Any], terminal, width: int, args) -> None:
    document = run_cli("pricing", "show", *args, "--format", "json").json()
    cells = []
    for row in document["rows"]:
        cells += [str(row[k]) for k in ("region", "instance_type", "name") if row.get(k)]
        cells += [
            format_usd(Decimal(value), rate=True)
            for key, value in row.items()
            if key.endswith(("usd_per_hour", "usd_per_gb_month")) and value is not None
        ]
    terminal(width)
    result = run_cli("pricing", "show", *args)
    assert result.exit_code == 0, result.stderr
    assert_fits(result.stdout, width, cells)


@pytest.mark.parametrize("width", WIDTHS)
def test_pricing_summary_fits(run_cli: Callable[..., Any], terminal, width: int) -> None:
    document = run_cli("pricing", "show", "--format", "json").json()
    terminal(width)
    result = run_cli("pricing", "show")
    assert result.exit_code == 0, result.stderr
    assert_fits(result.stdout, width, [t["table"] for t in document["tables"]])


def test_a_pipe_gets_a_plain_layout_that_does_not_depend_on_width(
    run_cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ESTIMATES[0]
    monkeypatch.setenv("COLUMNS", "80")
    narrow = run_cli(*args).stdout
    monkeypatch.setenv("COLUMNS", "200")
    assert run_cli(*args).stdout == narrow
    assert not set("│┃━─┏┡└") & set(narrow)
    header = next(line for line in narrow.splitlines() if line.startswith("Where"))
    assert header.split() == [
        "Where",
        "Market",
        "Instance",
        "$/h",
        "Compute",
        "Total",
        "Storage",
        "Egress",
    ]
    # One line per market and place, every figure on it: greppable.
    (line,) = [row for row in narrow.splitlines() if row.startswith("aws us-east-1 ")]
    assert line.split() == [
        "aws",
        "us-east-1",
        "on-demand",
        "g5.xlarge",
        "$1.006",
        "$32.19",
        "$32.54",
        "$0.35",
        "$0.00",
    ]


def read_screen(
    argv: list[str], columns: int, rows: int = 40, env: dict[str, str] | None = None
) -> str:
    """Run ``argv`` on a pseudo-terminal of ``columns`` x ``rows``: what it printed, plain."""
    env = {k: v for k, v in (env or os.environ).items() if k not in ("COLUMNS", "LINES")}
    code, screen = on_terminal(argv, columns, env, rows)
    assert code == 0
    return screen


def test_readme_first_command_on_an_80_column_terminal() -> None:
    """The README's first command, in a real pseudo-terminal of 80 x 40."""
    costguard = shutil.which("costguard", path=str(Path(sys.executable).parent))
    assert costguard, "the costguard script is installed next to this python"
    argv = [costguard, "estimate", "--gpu", "a10g", "--hours", "8", "--count", "4"]
    screen = read_screen(argv, 80)
    assert_fits(
        screen,
        80,
        ["us-east-2", "g5.xlarge", "g5.2xlarge", "$1.006", "$0.3596", "$32.54", "$11.86"],
    )
    assert "(8 assumptions and 1 more answer not shown to fit: --full shows them)" in screen
    # Prose wraps at word boundaries: no word is split over two lines.
    assert "a spot in\n" not in screen


def first_screen(args: list[str], columns: int, rows: int) -> list[str]:
    """What ``costguard ARGS`` prints on a real pseudo-terminal of ``columns`` x ``rows``
    (stdout and the stale-price warning on stderr, as they share the screen)."""
    costguard = shutil.which("costguard", path=str(Path(sys.executable).parent))
    assert costguard, "the costguard script is installed next to this python"
    return read_screen([costguard, *args], columns, rows).splitlines()


def shown_places(lines: list[str]) -> list[str]:
    """The places of the table's rows (the on-demand row names each place)."""
    rows = [line for line in lines if re.match(r"(aws|gcp|azure) \S+ +on-demand ", line)]
    return [" ".join(line.split()[:2]) for line in rows]


QUICKSTART = ["estimate", "--gpu", "a10g", "--hours", "8", "--count", "4"]  # the README's first
H100_8 = ["estimate", "--gpu", "h100", "--gpus-per-instance", "8", "--hours", "24"]
L4 = ["estimate", "--gpu", "l4", "--hours", "10"]


@pytest.mark.parametrize(
    ("args", "columns", "rows", "places"),
    [
        pytest.param(QUICKSTART, 80, 24, 3, id="quickstart-80x24"),
        pytest.param(QUICKSTART, 120, 40, 10, id="quickstart-120x40"),
        pytest.param(H100_8, 80, 24, 1, id="h100x8-80x24"),
        pytest.param(H100_8, 120, 40, 10, id="h100x8-120x40"),
        pytest.param(L4, 80, 24, 3, id="l4-80x24"),
        pytest.param(L4, 120, 40, 10, id="l4-120x40"),
    ],
)
def test_the_first_screen_fits_the_terminal_with_the_prompt(
    run_cli: Callable[..., Any], args: list[str], columns: int, rows: int, places: int
) -> None:
    """Issue 49 item 5: the quickstart printed 46 lines at 80x24 (58 before), the table
    scrolled away. On a terminal the answer, its warning and the next prompt fit the
    screen: the title, the cheapest places in both markets with the figures of --format
    json, the cheapest answer, the warning, and the one flag that shows the rest."""
    document = run_cli(*args, "--top", "0", "--format", "json").json()
    lines = first_screen(args, columns, rows)
    assert len(lines) < rows, f"{len(lines)} lines on a screen of {rows}:\n" + "\n".join(lines)
    assert all(len(line) <= columns for line in lines)
    assert lines[0].startswith(f"{document['options'][0]['accelerator']} x ")
    shown_at = shown_places(lines)
    assert len(shown_at) == places, lines
    cheapest = []
    for option in document["options"]:
        place = f"{option['provider']} {option['region']}"
        if place not in cheapest:
            cheapest.append(place)
    assert shown_at == cheapest[:places]  # the cheapest first, in the JSON's order
    shown = [o for o in document["options"] if f"{o['provider']} {o['region']}" in shown_at]
    assert_fits("\n".join(lines), columns, estimate_cells({"options": shown}))
    text = " ".join(" ".join(lines).split())
    assert "Cheapest: " in text
    assert f"({len(cheapest) - places} more region(s): --top 0 shows all)" in text
    assert "--full shows them" in text
    priced = len([o for o in shown if o["usd_per_hour"] is not None])
    assert f"Warning: {priced} of {priced} prices shown are old" in text


def test_full_and_top_on_a_short_terminal(run_cli: Callable[..., Any]) -> None:
    """--full prints on a terminal what a pipe gets (every place --top asks for, every
    assumption, every answer); --top N is N places, the assumptions counted to fit."""
    args = QUICKSTART
    plain = run_cli(*args).stdout
    assumptions = plain.split("Assumptions:\n", 1)[1].split("Answers:", 1)[0]
    assert assumptions.count("  - ") == 8
    full = first_screen([*args, "--full"], 200, 24)
    assert shown_places(full) == shown_places(plain.splitlines())
    assert len(shown_places(full)) == 10
    assert "\n".join(full).split("Assumptions:\n", 1)[1].split("Answers:", 1)[0] == assumptions
    assert "spot prices are set per size" in " ".join(" ".join(full).split())
    top = first_screen([*args, "--top", "5"], 80, 24)
    assert len(shown_places(top)) == 5
    assert "(8 assumptions and 1 more answer not shown to fit: --full shows them)" in top
