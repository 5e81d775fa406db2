"""Every table fits the terminal it is printed on, and a pipe gets a plain layout.

At 80, 100 and 120 columns no line is wider than the terminal and no money figure,
instance name or region is cut or wrapped (each must appear whole on one line). The
figures expected are those of ``--format json``. Other commands' tables are checked the
same way next to their cloud fixtures (tests/alarms, tests/reaper, tests/spot).
"""

from __future__ import annotations

import os
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
    assert "Assumptions:" in screen
    # Prose wraps at word boundaries: no word is split over two lines.
    assert "a spot in\n" not in screen
