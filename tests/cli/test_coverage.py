"""Every region a user can name has prices or an explicit "not covered" answer that
names the refresh that fills it, and that refresh really adds the region."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costguard.errors import InputError
from costguard.pricing.catalog import Market
from costguard.pricing.estimate import EstimateRequest, estimate
from costguard.pricing.tables import load_catalog

CATALOG = load_catalog()


@pytest.mark.parametrize("region", CATALOG.regions, ids=str)
def test_every_region_has_prices_or_says_how_to_get_them(region) -> None:
    offered = sorted(
        (i.accelerator, i.accelerator_count)
        for i in CATALOG.instances
        if (i.provider, i.region) == (region.provider, region.name) and i.accelerator
    )
    request = EstimateRequest(
        gpu=offered[0][0] if offered else "T4",
        gpus_per_instance=offered[0][1] if offered else 1,
        hours=Decimal(1),
        regions=(region.name,),
        providers=(region.provider,),
    )
    if offered:
        assert estimate(request, CATALOG).options
        return
    with pytest.raises(InputError) as info:
        estimate(request, CATALOG)
    assert "not covered" in info.value.message
    assert f"costguard pricing refresh --provider {region.provider} --region {region.name}" in (
        info.value.hint or ""
    )


def test_the_not_covered_answer_in_the_cli(run_cli) -> None:
    result = run_cli("estimate", "--gpu", "t4", "--hours", "2", "--region", "uksouth")
    assert result.exit_code == 2
    assert "uksouth is not covered" in result.stderr
    assert "needs no account" in result.stderr
    gpus = run_cli("pricing", "gpus", "--provider", "azure")
    assert "Not covered by the bundled tables: azure" in gpus.stderr


instances = st.sampled_from(
    [i for i in CATALOG.instances if i.accelerator and i.ondemand_usd_per_hour]
)


@settings(max_examples=80, deadline=None)
@given(
    inst=instances,
    hours=st.decimals(min_value="0.01", max_value="10000", places=2),
    count=st.integers(min_value=1, max_value=64),
)
def test_every_region_prices_exactly_price_x_hours_x_count(inst, hours, count) -> None:
    request = EstimateRequest(
        instance_type=inst.instance_type,
        gpu=inst.accelerator,
        hours=hours,
        count=count,
        regions=(inst.region,),
        providers=(inst.provider,),
        markets=(Market.ON_DEMAND,),
        disk_gb=Decimal(0),
    )
    (option,) = estimate(request, CATALOG).options
    assert option.usd_per_hour == inst.ondemand_usd_per_hour
    assert option.compute_usd == inst.ondemand_usd_per_hour * hours * count
