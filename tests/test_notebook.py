"""The notebook API: `costguard.estimate(...)` and `costguard.pricing.table(...)`.

Its DataFrame and its HTML table hold the figures of `costguard estimate --format json`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

import costguard
import costguard.errors
from costguard.errors import InputError
from costguard.money import format_usd
from costguard.pricing.question import Question
from costguard.pricing.quote import quote
from costguard.pricing.tables import load_tables


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

    frame = result.to_pandas(exact=True)
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
    frame = costguard.pricing.table("gpu_instances", exact=True)
    assert len(frame) == len(document["rows"])
    assert list(frame.columns) == list(document["rows"][0])
    first = document["rows"][0]
    assert frame.iloc[0]["instance_type"] == first["instance_type"]
    assert frame.iloc[0]["ondemand_usd_per_hour"] == Decimal(first["ondemand_usd_per_hour"])
    assert frame.attrs["as_of"] == document["as_of"]


def test_a_dataframe_pandas_can_plot_and_sum() -> None:
    """Issue 49 item 7: money was Decimal objects, so `df.plot.barh(x="region",
    y="total_usd")` failed ("no numeric data to plot"); vcpus and memory_gib of a price
    table were object columns. The exact Decimals stay one keyword away."""
    pytest.importorskip("matplotlib", reason="pandas plots through matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    result = costguard.estimate(gpu="a10g", hours=8, count=4)
    frame = result.to_pandas()
    money = ["usd_per_hour", "compute_usd", "storage_usd", "egress_usd", "total_usd"]
    assert all(str(frame[name].dtype) == "float64" for name in money), frame.dtypes
    exact = [row["total_usd"] for row in result.records()]
    assert frame["total_usd"].tolist() == [float(total) for total in exact]
    assert frame.plot.barh(x="region", y="total_usd") is not None
    assert frame["total_usd"].sum() == pytest.approx(float(sum(exact)))
    table = costguard.pricing.table("gpu_instances")
    for name in ("vcpus", "memory_gib", "ondemand_usd_per_hour"):
        assert str(table[name].dtype) == "float64", name
    assert table.plot.scatter(x="vcpus", y="ondemand_usd_per_hour") is not None
    priced = costguard.pricing.table("gpu_instances", exact=True)
    assert str(priced["vcpus"].dtype) == "float64"
    assert isinstance(priced["ondemand_usd_per_hour"].dropna().iloc[0], Decimal)


def test_old_prices_warn_in_a_notebook(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 49 item 7: the CLI's stale-price warning had no notebook form. The bundled
    tables are old a year after their date; the warning says what the CLI's says."""
    monkeypatch.delenv("COSTGUARD_STALE_WARNING", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", "/nonexistent-costguard-test")
    monkeypatch.setenv("COSTGUARD_CACHE_DIR", "/nonexistent-costguard-test/cache")
    catalog = load_tables(None, Path("/nonexistent-costguard-test/cache"))
    today = datetime.now(UTC).date()
    expected = quote(Question(hours=Decimal(8), gpus=("a10g",)), catalog, today=today)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        costguard.estimate(gpu="a10g", hours=8)
    said = [w for w in caught if issubclass(w.category, costguard.errors.StalePricesWarning)]
    stale = expected.stale_warning()
    if stale is None:
        assert said == []
        return
    (warning,) = said
    assert str(warning.message).startswith(stale)
    assert "`costguard pricing refresh`" in str(warning.message)
    assert warning.filename == __file__  # pointed at the notebook's cell, not costguard
    monkeypatch.setenv("COSTGUARD_STALE_WARNING", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        costguard.estimate(gpu="a10g", hours=8)  # the switch the CLI has hides it


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
