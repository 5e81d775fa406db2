"""`costguard burn --plot` and `costguard jobs status --plot`: PNGs that show the figures.

The burn picture is drawn from a seeded burn report (and once through the CLI against
moto); the job picture from a real local launch in tests/spot/test_launch_local.py. Each
PNG is decoded and looked at: its size, that it is not blank, and where its lines are.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from costguard.alarms.burn import PricedInstance, burn_report
from costguard.plots import BUDGET_COLOR, COST_COLOR, HEIGHT_PX, WIDTH_PX, draw_burn
from costguard.reaper.policy import Instance
from tests.helpers.output import Png, read_png

BLACK = (0, 0, 0)


def rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def blobs(png: Png, colour: tuple[int, int, int]) -> list[set[tuple[int, int]]]:
    """The connected patches of ``colour`` (markers), 8-connected."""
    todo = {
        (x, y)
        for y, row in enumerate(png.rows)
        for x, px in enumerate(row)
        if all(abs(a - b) <= 40 for a, b in zip(px, colour, strict=True))
    }
    found = []
    while todo:
        patch, edge = set(), [todo.pop()]
        while edge:
            x, y = edge.pop()
            patch.add((x, y))
            for near in ((x + dx, y + dy) for dx in (-1, 0, 1) for dy in (-1, 0, 1)):
                if near in todo:
                    todo.remove(near)
                    edge.append(near)
        found.append(patch)
    return [p for p in found if len(p) >= 10]


def frame(png: Png) -> tuple[int, int]:
    """The rows of the axes' top and bottom edges (the long dark lines)."""
    edges = png.rows_with(BLACK, least=png.width // 2, tolerance=80)
    assert len(edges) >= 2, edges
    return min(edges), max(edges)


def height_of(png: Png, row: float) -> float:
    """Where ``row`` lies between the axes' bottom (0) and top (1)."""
    top, bottom = frame(png)
    return (bottom - row) / (bottom - top)


def seeded_report(budget: Decimal) -> Any:
    now = datetime(2026, 2, 15, 12, tzinfo=UTC)
    fleet = [
        (Instance("aws", "us-east-1", "i-a", "g5.xlarge", True, 1,
                  datetime(2026, 1, 20, tzinfo=UTC)), Decimal("1.006")),
        (Instance("aws", "us-west-2", "i-b", "g5.12xlarge", True, 4,
                  datetime(2026, 2, 10, 6, tzinfo=UTC)), Decimal("5.672")),
    ]  # fmt: skip
    return burn_report([PricedInstance(vm, rate) for vm, rate in fleet], now, budget)


@pytest.mark.parametrize("budget", [Decimal(2500), Decimal(6000)])
def test_the_burn_picture_puts_the_budget_where_it_belongs(tmp_path: Path, budget: Decimal) -> None:
    report = seeded_report(budget)
    picture = draw_burn(tmp_path / "burn.png", report)
    png = read_png(picture.path)
    assert (png.width, png.height) == (WIDTH_PX, HEIGHT_PX)
    assert len({px for row in png.rows for px in row}) > 50, "a blank picture"
    # The budget line: a long red line at budget / y_top of the axes' height.
    red = png.rows_with(rgb(BUDGET_COLOR), least=png.width // 3)
    assert red, "no budget line"
    assert height_of(png, sum(red) / len(red)) == pytest.approx(
        float(budget) / picture.y_top, abs=0.01
    )
    # The projection ends at the right edge, above the budget line exactly when the
    # report says the month goes over it.
    blue = rgb(COST_COLOR)
    right = max(x for row in png.rows for x, px in enumerate(row) if px == blue)
    ends = [y for y, row in enumerate(png.rows) if any(px == blue for px in row[right - 2 :])]
    end = height_of(png, sum(ends) / len(ends))
    assert end == pytest.approx(float(report.projected_usd) / picture.y_top, abs=0.015)
    assert (end > float(budget) / picture.y_top) is report.over_budget
    assert report.over_budget is (budget == Decimal(2500))


def test_burn_plot_through_the_cli(
    run_cli: Callable[..., Any], aws_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    boto3.client("ec2", region_name="us-east-1").run_instances(
        ImageId="ami-12345678", InstanceType="g5.xlarge", MinCount=2, MaxCount=2
    )
    picture = tmp_path / "burn.png"
    result = run_cli("burn", "--region", "us-east-1", "--budget", "100000", "--plot", str(picture))
    assert result.exit_code == 0, result.stderr
    assert f"Picture: {picture}" in result.stderr
    png = read_png(picture)
    assert (png.width, png.height) == (WIDTH_PX, HEIGHT_PX)
    assert png.rows_with(rgb(BUDGET_COLOR), least=png.width // 3)


@pytest.mark.parametrize(
    ("name", "says"), [("burn.jpg", "does not end in .png"), ("no/such/dir/b.png", "folder")]
)
def test_a_plot_path_that_cannot_be_written_exits_2_first(
    run_cli: Callable[..., Any], tmp_path: Path, name: str, says: str
) -> None:
    for args in (("burn",), ("jobs", "status", str(tmp_path / "ckpt"))):
        result = run_cli(*args, "--plot", str(tmp_path / name))
        assert result.exit_code == 2, result.stderr
        assert says in result.stderr
        assert "Hint:" in result.stderr


def test_a_plot_in_a_folder_that_takes_no_file_exits_2_before_anything_else(
    run_cli: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`spend --plot /proc/x.png --format json` printed the whole JSON, then exited 2 when
    the picture could not be written; `burn` would have gone on to its cloud calls."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")  # credentials: the calls come next
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing answers there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    export = tmp_path / "focus.csv"
    export.write_text("BilledCost,ChargePeriodStart\n")
    for args in (("burn", "--region", "us-east-1"), ("spend", str(export), "--format", "json")):
        result = run_cli(*args, "--plot", "/proc/costguard-test.png")
        assert result.exit_code == 2, result.stderr
        assert "cannot write in /proc" in result.stderr
        assert result.stdout == ""


def test_burn_picture_is_drawn_from_the_report_figures() -> None:
    from costguard.plots import burn_series

    report = seeded_report(Decimal(100))
    spend, projection = burn_series(report)
    assert spend.x[0] == 0.0
    assert spend.y[-1] == pytest.approx(float(report.spent_usd))
    assert projection.y == (float(report.spent_usd), float(report.projected_usd))
    assert projection.x[1] == (report.month_end - report.month_start) / timedelta(days=1)
