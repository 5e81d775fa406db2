"""The notebook API: `costguard.estimate(...)` and `costguard.pricing.table(...)`.

Its DataFrame and its HTML table hold the figures of `costguard estimate --format json`.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from html.parser import HTMLParser
from typing import Any

import pytest

import costguard
from costguard.errors import InputError
from costguard.money import format_usd


class Cells(HTMLParser):
    """The text of every <td>, row by row."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self._in_cell = False

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag == "tr":
            self.rows.append([])
        self._in_cell = tag == "td"

    def handle_endtag(self, tag: str) -> None:
        self._in_cell = False

    def handle_data(self, data: str) -> None:
        if self._in_cell:
            self.rows[-1].append(data)


@pytest.mark.parametrize(
    ("kwargs", "args"),
    [
        (
            {"gpu": "a10g", "hours": 8, "count": 4},
            ("--gpu", "a10g", "--hours", "8", "--count", "4"),
        ),
        (
            {"gpu": "h100", "hours": 24.5, "gpus_per_instance": 8, "spot": True, "top": 0},
            (
                "--gpu",
                "h100",
                "--hours",
                "24.5",
                "--gpus-per-instance",
                "8",
                "--spot",
                "--top",
                "0",
            ),
        ),
        (
            {"gpu": "l4", "hours": "10", "data_region": "us-east-1", "data_gb": 500},
            ("--gpu", "l4", "--hours", "10", "--data-region", "us-east-1", "--data-gb", "500"),
        ),
    ],
)
def test_dataframe_and_html_hold_the_json_figures(
    run_cli: Callable[..., Any], kwargs: dict[str, Any], args: tuple[str, ...]
) -> None:
    document = run_cli("estimate", *args, "--format", "json").json()
    result = costguard.estimate(**kwargs)
    assert result.document()["assumptions"] == document["assumptions"]

    frame = result.to_pandas()
    assert len(frame) == len(document["options"]) > 0
    for (_, row), option in zip(frame.iterrows(), document["options"], strict=True):
        for key in ("provider", "region", "instance_type", "market", "pricing_as_of"):
            assert row[key] == option[key]
        for key in ("usd_per_hour", "compute_usd", "storage_usd", "egress_usd", "total_usd"):
            assert isinstance(row[key], Decimal)
            assert row[key] == Decimal(option[key]), key
    assert frame.attrs["pricing_as_of"] == document["pricing_as_of"]
    assert frame.attrs["assumptions"][1:] == document["assumptions"]

    parser = Cells()
    parser.feed(result._repr_html_())
    rows = [r for r in parser.rows if r]
    assert len(rows) == len(document["options"])
    for row, option in zip(rows, document["options"], strict=True):
        assert row[:4] == [option["provider"], option["region"], option["market"],
                           option["instance_type"]]  # fmt: skip
        assert row[4] == format_usd(Decimal(option["usd_per_hour"]), rate=True)
        assert row[-1] == format_usd(Decimal(option["total_usd"]))
    assert "Not included: taxes" in result._repr_html_()


def test_a_price_table_as_a_dataframe(run_cli: Callable[..., Any]) -> None:
    document = run_cli("pricing", "show", "gpu_instances", "--format", "json").json()
    frame = costguard.pricing.table("gpu_instances")
    assert len(frame) == len(document["rows"])
    assert list(frame.columns) == list(document["rows"][0])
    first = document["rows"][0]
    assert frame.iloc[0]["instance_type"] == first["instance_type"]
    assert frame.iloc[0]["ondemand_usd_per_hour"] == Decimal(first["ondemand_usd_per_hour"])
    assert frame.attrs["as_of"] == document["as_of"]


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda: costguard.estimate(gpu="a10g", hours=0), "hours"),
        (lambda: costguard.estimate(gpu="a10g", hours=float("nan")), "hours"),
        (lambda: costguard.estimate(gpu="a10g", hours=8, count=0), "count"),
        (lambda: costguard.estimate(gpu="z9000", hours=8), "z9000"),
        (lambda: costguard.estimate(gpu="a10g", hours=8, region="mars-1"), "mars-1"),
        (lambda: costguard.pricing.table("gpus"), "gpus"),
    ],
)
def test_bad_input_raises_input_error(
    run_cli: Callable[..., Any], call: Callable[[], Any], says: str
) -> None:
    with pytest.raises(InputError) as info:
        call()
    assert says in info.value.message
    assert info.value.hint
