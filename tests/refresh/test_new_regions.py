"""A refresh adds a region the bundled tables do not cover (the fix their "not covered"
answers name)."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

from costguard.pricing.tables import load_catalog
from tests.refresh.servers import azure_item


def test_a_refresh_adds_a_region_the_tables_did_not_cover(
    run_cli, tmp_path: Path, cache_dir: Path
) -> None:
    mirror = tmp_path / "responses" / "azure"
    mirror.mkdir(parents=True)
    vm = azure_item("Standard_NC4as_T4_v3", "uksouth", "0.592")
    spot = azure_item("Standard_NC4as_T4_v3", "uksouth", "0.1184", spot=True)
    paas = {**vm, "productName": "NCasT4_v3 Series Cloud Services", "retailPrice": 0.9}
    page = {"Items": [vm, spot, paas]}
    (mirror / "prices-1.json").write_text(json.dumps(page, default=float))
    (mirror / "fetched.json").write_text(json.dumps({"fetched_at": "2026-11-29T08:00:00Z"}))
    result = run_cli("pricing", "refresh", "--from", str(mirror.parent), "--region", "uksouth")
    assert result.exit_code == 0, result.stderr
    cached = load_catalog(cache_dir / "current")
    added = [r for r in cached.instances if r.region == "uksouth"]
    assert [(r.instance_type, r.ondemand_usd_per_hour, r.spot_usd_per_hour) for r in added] == [
        ("Standard_NC4as_T4_v3", Decimal("0.592"), Decimal("0.1184"))
    ]
    assert cached.tables["gpu_instances"].part("azure", "uksouth").as_of.isoformat() == (
        "2026-11-29"
    )
    shown = run_cli(
        "estimate",
        "--gpu",
        "t4",
        "--hours",
        "10",
        "--region",
        "uksouth",
        "--format",
        "json",
        "--no-stale-warning",
    )
    assert shown.exit_code == 0, shown.stderr
    options = {o["market"]: o for o in shown.json()["options"]}
    assert Decimal(options["on-demand"]["compute_usd"]) == Decimal("5.920")
