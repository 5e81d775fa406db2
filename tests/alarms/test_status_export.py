"""`costguard alarm status --export`: the export's latest billing month, said for what it
is (issue 49 item 9)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

HANDMADE = Path(__file__).parents[1] / "billing" / "data" / "focus_handmade.csv"


def test_a_straggler_month_is_named_as_the_part_of_the_export_it_is(
    aws_env: str, run_cli: Callable[..., Any], monkeypatch: Any, tmp_path: Path
) -> None:
    """An export of 16 charges, one of them billed in the next month: the line said
    "Billed in 2026-12 ... $0.30" as if that were the export's bill."""
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # moto answers unimplemented calls with 500
    header, first, *rest = HANDMADE.read_text().splitlines()
    late = first.replace("2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z").replace(
        "2026-11-", "2026-12-"
    )
    export = tmp_path / "focus.csv"
    export.write_text("\n".join([header, first, *rest, late]) + "\n")
    assert run_cli("alarm", "--budget", "200", "--email", "me@uni.edu").exit_code == 0
    table = run_cli("alarm", "status", "--export", str(export))
    assert table.exit_code == 0, table.stderr
    text = " ".join(table.stdout.split())
    assert "Billed in 2026-12, the export's latest month (1 of its 16 charges, to" in text
    document = run_cli("alarm", "status", "--export", str(export), "--format", "json").json()
    assert (document["export"]["charges"], document["export"]["charges_in_export"]) == (1, 16)
