"""Properties of the arithmetic, over random requests (hypothesis)."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from costguard.pricing.catalog import Catalog, Market
from costguard.pricing.estimate import EstimateRequest, estimate
from costguard.pricing.tables import load_catalog

CATALOG: Catalog = load_catalog()
SINGLE_GPU = sorted(
    {i.accelerator for i in CATALOG.instances if i.accelerator and i.accelerator_count == 1}
)

hours = st.decimals(min_value="0.01", max_value="10000", places=2)
counts = st.integers(min_value=1, max_value=64)
gigabytes = st.decimals(min_value="0", max_value="100000", places=1)
gpus = st.sampled_from(SINGLE_GPU)


def by_key(result):
    return {(o.provider, o.region, o.instance_type, o.market): o for o in result.options}


@settings(max_examples=60, deadline=None)
@given(gpu=gpus, h=hours, count=counts, factor=st.integers(min_value=2, max_value=9))
def test_cost_is_linear_in_hours_and_count(gpu, h, count, factor) -> None:
    base = by_key(estimate(EstimateRequest(gpu=gpu, hours=h, count=count), CATALOG))
    longer = by_key(estimate(EstimateRequest(gpu=gpu, hours=h * factor, count=count), CATALOG))
    wider = by_key(estimate(EstimateRequest(gpu=gpu, hours=h, count=count * factor), CATALOG))
    assert base.keys() == longer.keys() == wider.keys()
    for key, option in base.items():
        assert longer[key].compute_usd == option.compute_usd * factor
        assert wider[key].compute_usd == option.compute_usd * factor
        # Disks bill per instance-hour too, so they scale the same way (up to the
        # 28-digit precision of a division by 730 hours).
        tiny = Decimal("1e-20")
        assert abs(longer[key].block_storage_usd - option.block_storage_usd * factor) < tiny
        assert abs(wider[key].block_storage_usd - option.block_storage_usd * factor) < tiny


@settings(max_examples=60, deadline=None)
@given(
    gpu=gpus,
    h=hours,
    count=counts,
    disk=gigabytes,
    storage=gigabytes,
    egress=gigabytes,
    data=gigabytes,
    data_region=st.sampled_from(CATALOG.regions),
)
def test_costs_are_never_negative_and_add_up(
    gpu, h, count, disk, storage, egress, data, data_region
) -> None:
    result = estimate(
        EstimateRequest(
            gpu=gpu,
            hours=h,
            count=count,
            disk_gb=disk,
            storage_gb=storage,
            egress_gb=egress,
            data_gb=data,
            data_region=data_region,
        ),
        CATALOG,
    )
    for option in result.options:
        parts = (
            option.compute_usd,
            option.block_storage_usd,
            option.object_storage_usd,
            option.internet_egress_usd,
            option.data_transfer_usd,
        )
        assert all(part >= 0 for part in parts)
        assert option.total_usd == option.compute_usd + option.storage_usd + option.egress_usd
        assert abs(option.total_usd - sum(parts, Decimal(0))) < Decimal("1e-18")
    totals = [o.total_usd for o in result.options]
    assert totals == sorted(totals)


@settings(max_examples=40, deadline=None)
@given(gpu=gpus, h=hours, count=counts)
def test_spot_never_costs_more_than_on_demand(gpu, h, count) -> None:
    result = estimate(EstimateRequest(gpu=gpu, hours=h, count=count), CATALOG)
    best: dict[tuple[str, str], dict[Market, Decimal]] = {}
    for option in result.options:
        best.setdefault((option.provider, option.region), {})[option.market] = option.total_usd
    for markets in best.values():
        if len(markets) == 2:
            assert markets[Market.SPOT] <= markets[Market.ON_DEMAND]
