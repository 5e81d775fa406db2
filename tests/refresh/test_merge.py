"""Merging fresh prices into the tables in use (pure): the row rules and the invariants."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from costguard.pricing.catalog import InstancePrice, Market, PriceStatus, TablePart
from costguard.pricing.refresh.merge import FreshPrices, RowOutcome, merge_row, merge_tables
from costguard.pricing.refresh.parse import RowPrices, row_key
from costguard.pricing.tables import load_catalog, load_gpu_parts

NOW = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
CATALOG = load_catalog()
BOTH = frozenset(Market)


def g5(
    ondemand: str | None = "1.006", spot: str | None = "0.4246", note: str = ""
) -> InstancePrice:
    return InstancePrice(
        "aws",
        "us-east-1",
        "g5.xlarge",
        "A10G",
        1,
        Decimal(4),
        Decimal(16),
        Decimal(ondemand) if ondemand else None,
        Decimal(spot) if spot else None,
        PriceStatus.CORRECTED if ondemand else None,
        PriceStatus.LISTED if spot else None,
        note,
    )


def fresh_for(
    row: InstancePrice, found: dict[Market, Decimal], markets=BOTH, covered=True
) -> FreshPrices:
    key = row_key(row)
    return FreshPrices(
        "aws",
        frozenset({row.region}),
        markets,
        RowPrices(
            {key: found} if found else {},
            frozenset({key}) if covered else frozenset(),
            markets=frozenset((row.region, market) for market in markets),
        ),
        "test API",
        NOW,
        1,
    )


def test_fresh_prices_replace_old_ones_and_old_notes_go() -> None:
    row = g5(note="corrected from a catalog")
    new, outcome = merge_row(
        row, fresh_for(row, {Market.ON_DEMAND: Decimal("1.1"), Market.SPOT: Decimal("0.3")})
    )
    assert outcome is RowOutcome.UPDATED
    assert (new.ondemand_usd_per_hour, new.spot_usd_per_hour) == (Decimal("1.1"), Decimal("0.3"))
    assert (new.ondemand_status, new.spot_status) == (PriceStatus.LISTED, PriceStatus.LISTED)
    assert new.note == ""


def test_a_price_the_api_did_not_list_is_kept_and_flagged() -> None:
    row = g5(note="an old remark")
    new, outcome = merge_row(row, fresh_for(row, {}))
    assert outcome is RowOutcome.NOT_FOUND
    assert (new.ondemand_usd_per_hour, new.spot_usd_per_hour) == (
        row.ondemand_usd_per_hour,
        row.spot_usd_per_hour,
    )
    assert new.ondemand_status is PriceStatus.UNVERIFIED
    assert new.spot_status is PriceStatus.UNVERIFIED
    assert "on-demand not listed by the API on 2026-12-01: kept 1.006" in new.note
    assert "an old remark" in new.note


def test_a_market_not_read_stays_as_it_was() -> None:
    row = g5()
    new, _ = merge_row(
        row, fresh_for(row, {Market.ON_DEMAND: Decimal(2)}, markets=frozenset({Market.ON_DEMAND}))
    )
    assert new.spot_usd_per_hour == row.spot_usd_per_hour
    assert new.spot_status is PriceStatus.LISTED


def test_rows_the_api_does_not_price_are_kept_untouched() -> None:
    row = g5(note="TPU price only")
    new, outcome = merge_row(row, fresh_for(row, {}, covered=False))
    assert (new, outcome) == (row, RowOutcome.KEPT)


def test_spot_above_on_demand_is_left_out() -> None:
    row = g5(spot=None)
    new, _ = merge_row(row, fresh_for(row, {Market.ON_DEMAND: Decimal(1), Market.SPOT: Decimal(2)}))
    assert new.spot_usd_per_hour is None
    assert new.spot_status is None
    assert "spot 2 above on-demand 1: spot left out" in new.note


optional_price = st.none() | st.decimals(
    min_value=Decimal("0.0001"), max_value=Decimal(100), places=4
)


@given(
    old_ondemand=optional_price,
    old_spot=optional_price,
    new_ondemand=optional_price,
    new_spot=optional_price,
    markets=st.sampled_from([BOTH, frozenset({Market.ON_DEMAND})]),
)
def test_a_merged_row_is_always_one_the_loader_accepts(
    old_ondemand, old_spot, new_ondemand, new_spot, markets
) -> None:
    if old_ondemand is not None and old_spot is not None and old_spot > old_ondemand:
        old_spot = old_ondemand
    row = g5(str(old_ondemand) if old_ondemand else None, str(old_spot) if old_spot else None)
    found = {
        m: p
        for m, p in ((Market.ON_DEMAND, new_ondemand), (Market.SPOT, new_spot))
        if p is not None and m in markets
    }
    new, outcome = merge_row(row, fresh_for(row, found, markets))
    for price, status in (
        (new.ondemand_usd_per_hour, new.ondemand_status),
        (new.spot_usd_per_hour, new.spot_status),
    ):
        assert (price is None) == (status is None)
    if new.ondemand_usd_per_hour is not None and new.spot_usd_per_hour is not None:
        assert new.spot_usd_per_hour <= new.ondemand_usd_per_hour
    assert outcome is (RowOutcome.UPDATED if found else RowOutcome.NOT_FOUND)
    if Market.ON_DEMAND in found:
        assert new.ondemand_usd_per_hour == found[Market.ON_DEMAND]


@settings(max_examples=25, deadline=None)
@given(
    providers=st.sets(st.sampled_from(["aws", "gcp", "azure"]), min_size=1),
    factor=st.decimals(min_value=Decimal("0.5"), max_value=Decimal(2), places=2),
)
def test_merge_tables_only_touches_the_refreshed_providers(providers, factor) -> None:
    fresh = []
    for provider in providers:
        rows = [r for r in CATALOG.instances if r.provider == provider]
        prices = {
            row_key(r): {Market.ON_DEMAND: r.ondemand_usd_per_hour * factor}
            for r in rows
            if r.ondemand_usd_per_hour is not None
        }
        regions = frozenset(r.region for r in rows)
        covered = frozenset(row_key(r) for r in rows)
        fresh.append(
            FreshPrices(
                provider,
                regions,
                frozenset({Market.ON_DEMAND}),
                RowPrices(
                    prices, covered, markets=frozenset((r, Market.ON_DEMAND) for r in regions)
                ),
                f"{provider} API",
                NOW,
                len(rows),
            )
        )
    merged = merge_tables(CATALOG, fresh, NOW)
    rows = [r for name in ("gpu_instances", "cpu_instances") for r in merged.instances[name]]
    assert len(rows) == len(CATALOG.instances)
    before = {(r.provider, *row_key(r)): r for r in CATALOG.instances}
    for row in rows:
        old = before[(row.provider, *row_key(row))]
        if row.provider not in providers:
            assert row == old
        elif old.ondemand_usd_per_hour is not None:
            assert row.ondemand_usd_per_hour == old.ondemand_usd_per_hour * factor
            assert (
                row.spot_usd_per_hour is None or row.spot_usd_per_hour <= row.ondemand_usd_per_hour
            )
    gpu = next(m for m in merged.meta if m.name == "gpu_instances")
    for (provider, region), part in gpu.parts.items():
        # Spot was not read: the rows are as old as their spot prices.
        assert part.as_of == CATALOG.tables["gpu_instances"].part(provider, region).as_of
        if provider in providers:
            assert part.source.startswith(f"on-demand from {provider} API; the rest: ")
        else:
            assert "kept from the bundled tables" in part.source
    assert [m.name for m in merged.meta] == [
        "gpu_instances",
        "cpu_instances",
        "storage",
        "transfer",
        "regions",
    ]
    assert set(merged.stats) == providers


def test_full_refresh_dates_the_parts_and_the_table() -> None:
    rows = [r for r in CATALOG.instances if r.provider == "azure"]
    regions = frozenset(r.region for r in rows)
    fresh = FreshPrices(
        "azure",
        regions,
        BOTH,
        # The API listed prices in every region, none for these rows: all flagged.
        RowPrices(
            {},
            frozenset(row_key(r) for r in rows),
            regions,
            frozenset((r, m) for r in regions for m in Market),
        ),
        "Azure Retail Prices API (https://prices.azure.com/api/retail/prices)",
        NOW,
        0,
    )
    merged = merge_tables(CATALOG, [fresh], NOW)
    gpu = next(m for m in merged.meta if m.name == "gpu_instances")
    assert gpu.parts[("azure", "eastus")] == TablePart(date(2026, 12, 1), fresh.source)
    # The oldest part: AWS and GCP were not refreshed (GCP regions from CoCalc's
    # catalogue of 2026-02-24).
    assert gpu.as_of == date(2026, 2, 24)
    assert "SkyPilot catalog v8" in gpu.source
    assert "azure: Azure Retail Prices API" in gpu.source
    assert merged.stats["azure"].not_found == len(rows)


def test_regions_nothing_came_back_for_keep_their_rows_date_and_source() -> None:
    rows = [r for r in CATALOG.instances if r.provider == "aws"]
    asked = frozenset(r.region for r in rows)
    east = [r for r in rows if r.region == "us-east-1"]
    west = next(r for r in rows if r.region == "us-west-2")  # listed, none of its rows priced
    fresh = FreshPrices(
        "aws",
        asked,
        BOTH,
        RowPrices(
            {row_key(r): {Market.ON_DEMAND: Decimal(9)} for r in east},
            frozenset(row_key(r) for r in rows),
            frozenset({"us-west-2"}),
            frozenset((r, m) for r in ("us-east-1", "us-west-2") for m in Market),
        ),
        "AWS API",
        NOW,
        len(east),
    )
    assert fresh.answered == {"us-east-1", "us-west-2"}
    assert fresh.unanswered == asked - {"us-east-1", "us-west-2"}
    merged = merge_tables(CATALOG, [fresh], NOW)
    gpu = next(m for m in merged.meta if m.name == "gpu_instances")
    assert gpu.parts[("aws", "us-east-1")] == TablePart(date(2026, 12, 1), "AWS API")
    assert gpu.parts[("aws", "us-west-2")].as_of == date(2026, 12, 1)
    before = CATALOG.tables["gpu_instances"].part("aws", "eu-west-1")
    kept = gpu.parts[("aws", "eu-west-1")]
    assert kept.as_of == before.as_of == date(2026, 11, 30)  # not stamped fresh
    assert kept.source.startswith(before.source)
    assert "kept from the bundled tables" in kept.source
    after = {row_key(r): r for name in merged.instances for r in merged.instances[name]}
    for row in rows:
        if row.region not in fresh.answered:
            assert after[row_key(row)] == row  # not flagged: nothing was asked of it
    assert after[row_key(west)].ondemand_status is PriceStatus.UNVERIFIED
    stats = merged.stats["aws"]
    assert stats.updated == len(east)
    assert stats.updated + stats.not_found + stats.kept == sum(
        1 for r in rows if r.region in fresh.answered
    )


def test_a_refreshed_price_the_check_finds_suspect_is_written_unverified() -> None:
    # A fresh on-demand price for GCP us-east1 a2-highgpu-1g at half its family's, and a
    # spot price exactly a tenth of on-demand for AWS us-east-1 g6.xlarge.
    a2 = next(
        r for r in CATALOG.instances if (r.region, r.instance_type) == ("us-east1", "a2-highgpu-1g")
    )
    g6 = next(
        r for r in CATALOG.instances if (r.region, r.instance_type) == ("us-east-1", "g6.xlarge")
    )
    assert g6.ondemand_usd_per_hour is not None
    fresh = [
        FreshPrices(
            provider,
            frozenset({row.region}),
            BOTH,
            RowPrices(
                {row_key(row): prices},
                frozenset({row_key(row)}),
                frozenset({row.region}),
                frozenset((row.region, m) for m in prices),
            ),
            "API",
            NOW,
            1,
        )
        for provider, row, prices in (
            ("gcp", a2, {Market.ON_DEMAND: Decimal("1.9")}),
            ("aws", g6, {Market.SPOT: g6.ondemand_usd_per_hour / 10}),
        )
    ]
    merged = merge_tables(CATALOG, fresh, NOW).instances["gpu_instances"]
    by_key = {(r.provider, r.region, r.instance_type, r.accelerator): r for r in merged}
    new_a2 = by_key[("gcp", "us-east1", "a2-highgpu-1g", "A100")]
    assert new_a2.ondemand_usd_per_hour == Decimal("1.9")
    assert new_a2.ondemand_status is PriceStatus.UNVERIFIED
    assert "pricing check" in new_a2.note
    new_g6 = by_key[("aws", "us-east-1", "g6.xlarge", "L4")]
    assert new_g6.spot_status is PriceStatus.UNVERIFIED
    assert "a catalogue's placeholder" in new_g6.note
    # The rows nothing is wrong with stay as they were.
    assert by_key[("gcp", "us-central1", "a2-highgpu-1g", "A100")].ondemand_status is (
        PriceStatus.LISTED
    )


def test_a_refreshed_total_without_its_host_is_written_unverified() -> None:
    # A refresh that found the B200 GPU SKU but no A4 core or RAM SKU in us-central1
    # would write the GPUs alone: $90.216, the row the catalogue had.
    a4 = next(
        r
        for r in CATALOG.instances
        if (r.region, r.instance_type) == ("us-central1", "a4-highgpu-8g")
    )
    prices = {Market.ON_DEMAND: Decimal("90.216"), Market.SPOT: Decimal("32.6064")}
    fresh = [
        FreshPrices(
            "gcp",
            frozenset({a4.region}),
            BOTH,
            RowPrices(
                {row_key(a4): prices},
                frozenset({row_key(a4)}),
                frozenset({a4.region}),
                frozenset((a4.region, m) for m in prices),
            ),
            "API",
            NOW,
            1,
        )
    ]
    parts = load_gpu_parts(CATALOG.directory)
    merged = merge_tables(CATALOG, fresh, NOW, parts).instances["gpu_instances"]
    new_a4 = next(
        r for r in merged if r.region == "us-central1" and r.instance_type == a4.instance_type
    )
    assert new_a4.ondemand_status is new_a4.spot_status is PriceStatus.UNVERIFIED
    assert "host VM" in new_a4.note
