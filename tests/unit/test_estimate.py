"""The cost arithmetic, checked against figures worked out by hand from the tables."""

from __future__ import annotations

import csv
import shutil
from decimal import Decimal
from pathlib import Path

import pytest

from costguard.errors import InputError
from costguard.money import HOURS_PER_MONTH, gb_to_gib
from costguard.pricing.catalog import Catalog, Market, StorageRate, TransferRate
from costguard.pricing.document import option_row
from costguard.pricing.estimate import (
    EstimateRequest,
    estimate,
    limit_places,
    transfer_rate_between,
)
from costguard.pricing.tables import bundled_tables_dir, load_catalog

D = Decimal
ON_DEMAND = (Market.ON_DEMAND,)
SPOT = (Market.SPOT,)


def only(result, provider, region, market):
    (option,) = [
        o for o in result.options if (o.provider, o.region, o.market) == (provider, region, market)
    ]
    return option


def test_issue_example_g5_xlarge(catalog: Catalog) -> None:
    result = estimate(
        EstimateRequest(gpu="A10G", hours=D(8), count=4, regions=("us-east-1",)), catalog
    )
    option = only(result, "aws", "us-east-1", Market.ON_DEMAND)
    assert option.instance_type == "g5.xlarge"
    assert option.usd_per_hour == D("1.006")
    assert option.compute_usd == D("32.192")
    # 100 GB gp3 at $0.08/GB-month for 8 of 730 hours, 4 instances.
    assert option.block_storage_usd == D(100) * D("0.08") * D(8) * 4 / HOURS_PER_MONTH
    assert option.total_usd == option.compute_usd + option.storage_usd + option.egress_usd


def test_best_instance_per_region_and_market(catalog: Catalog) -> None:
    result = estimate(EstimateRequest(gpu="A10G", hours=D(1), regions=("us-east-2",)), catalog)
    od = only(result, "aws", "us-east-2", Market.ON_DEMAND)
    spot = only(result, "aws", "us-east-2", Market.SPOT)
    candidates = [
        i
        for i in catalog.instances
        if i.region == "us-east-2" and i.accelerator == "A10G" and i.accelerator_count == 1
    ]
    assert od.usd_per_hour == min(i.ondemand_usd_per_hour or D(10**6) for i in candidates)
    assert spot.usd_per_hour == min(i.spot_usd_per_hour or D(10**6) for i in candidates)


def test_options_sorted_cheapest_first(catalog: Catalog) -> None:
    result = estimate(EstimateRequest(gpu="L4", hours=D(5), count=2), catalog)
    totals = [o.total_usd for o in result.options]
    assert totals == sorted(totals)
    assert {o.provider for o in result.options} == {"aws", "gcp"}


def test_gpus_per_instance_selects_sizes(catalog: Catalog) -> None:
    result = estimate(EstimateRequest(gpu="H100", hours=D(1), gpus_per_instance=8), catalog)
    assert result.options
    assert all(o.gpus_per_instance == 8 for o in result.options)


def test_instance_type_without_gpu(catalog: Catalog) -> None:
    result = estimate(
        EstimateRequest(instance_type="G5.XLARGE", hours=D(2), markets=ON_DEMAND), catalog
    )
    assert {o.instance_type for o in result.options} == {"g5.xlarge"}
    regions = {i.region for i in catalog.instances if i.instance_type == "g5.xlarge"}
    assert len(regions) > 6  # AWS beyond its first six regions
    assert {o.region for o in result.options} == regions  # one option per region


def test_gcp_disk_is_priced_per_gib(catalog: Catalog) -> None:
    result = estimate(
        EstimateRequest(gpu="L4", hours=D(730), regions=("us-central1",), markets=ON_DEMAND),
        catalog,
    )
    option = only(result, "gcp", "us-central1", Market.ON_DEMAND)
    assert option.block_storage_usd == gb_to_gib(D(100)) * D("0.10")


def test_azure_disk_bills_the_tier_that_holds_it(catalog: Catalog) -> None:
    def disk_cost(gb: int) -> Decimal:
        result = estimate(
            EstimateRequest(
                gpu="T4", hours=D(730), regions=("eastus",), markets=ON_DEMAND, disk_gb=D(gb)
            ),
            catalog,
        )
        return only(result, "azure", "eastus", Market.ON_DEMAND).block_storage_usd

    assert disk_cost(100) == D("19.71")  # P10, 128 GiB
    assert disk_cost(137) == D("19.71")  # 137 GB = 127.6 GiB still fits a P10
    assert disk_cost(140) == D("38.01")  # 130.4 GiB needs a P15
    assert disk_cost(3000) == 2 * D("235.52")  # two P40 disks


def test_object_storage_and_egress(catalog: Catalog) -> None:
    result = estimate(
        EstimateRequest(
            gpu="A10G",
            hours=D(1),
            regions=("us-east-1",),
            markets=ON_DEMAND,
            disk_gb=D(0),
            storage_gb=D(1000),
            storage_months=D(2),
            egress_gb=D(50),
        ),
        catalog,
    )
    option = only(result, "aws", "us-east-1", Market.ON_DEMAND)
    assert option.block_storage_usd == 0
    assert option.object_storage_usd == D(1000) * D("0.023") * 2
    assert option.internet_egress_usd == D(50) * D("0.09")


def test_data_transfer_rules(catalog: Catalog) -> None:
    east1 = catalog.find_region("us-east-1")
    east2 = catalog.find_region("us-east-2")
    tokyo = catalog.find_region("ap-northeast-1")
    iowa = catalog.find_region("us-central1")
    assert transfer_rate_between(catalog, east1, east1) is None
    pair = transfer_rate_between(catalog, east1, east2)
    assert pair is not None
    assert pair.usd == D("0.01")  # special pair
    tokyo_out = transfer_rate_between(catalog, tokyo, east1)
    assert tokyo_out is not None
    assert tokyo_out.usd == D("0.09")
    cross = transfer_rate_between(catalog, iowa, east1)
    assert cross is not None
    assert cross.kind == "internet_egress"  # another cloud pays the source's egress
    assert cross.provider == "gcp"


def test_data_region_charges_and_points_to_local_option(catalog: Catalog) -> None:
    data = catalog.find_region("us-west-2")
    result = estimate(
        EstimateRequest(
            gpu="A10G", hours=D(8), markets=ON_DEMAND, data_region=data, data_gb=D(500)
        ),
        catalog,
    )
    local = only(result, "aws", "us-west-2", Market.ON_DEMAND)
    remote = only(result, "aws", "us-east-1", Market.ON_DEMAND)
    assert local.data_transfer_usd == 0
    assert remote.data_transfer_usd == D(500) * D("0.02")
    assert result.near_data is not None
    assert result.near_data.region == "us-west-2"


def test_data_region_outside_filter_is_still_pointed_out(catalog: Catalog) -> None:
    data = catalog.find_region("us-east-1")
    result = estimate(
        EstimateRequest(
            gpu="A10G",
            hours=D(8),
            regions=("eu-west-1",),
            markets=ON_DEMAND,
            data_region=data,
            data_gb=D(1000),
        ),
        catalog,
    )
    assert {o.region for o in result.options} == {"eu-west-1"}
    assert result.near_data is not None
    assert result.near_data.region == "us-east-1"
    assert any("next to the data" in note for note in result.notes)


def test_gpu_not_offered_in_data_region_is_said(catalog: Catalog) -> None:
    data = catalog.find_region("us-central1")
    result = estimate(
        EstimateRequest(gpu="A10G", hours=D(1), data_region=data, data_gb=D(10)), catalog
    )
    assert result.near_data is None
    assert any("not offered in the data's region" in note for note in result.notes)


def test_unverified_price_carries_a_note(catalog: Catalog) -> None:
    result = estimate(
        # europe-west4: the SkyPilot row at half the others' price, with no second source
        EstimateRequest(gpu="H200", hours=D(1), gpus_per_instance=8, regions=("europe-west4",)),
        catalog,
    )
    assert result.options
    assert all(o.price_status == "unverified" and o.notes for o in result.options)


def test_limit_places_keeps_markets_together(catalog: Catalog) -> None:
    result = estimate(EstimateRequest(gpu="T4", hours=D(1)), catalog)
    top = limit_places(result.options, 2)
    assert len({(o.provider, o.region) for o in top}) == 2
    assert limit_places(result.options, 0) == result.options


@pytest.mark.parametrize(
    ("request_kwargs", "message", "hint"),
    [
        (
            {"gpu": "A10G", "regions": ("us-central1",)},
            "not offered in us-central1",
            "it is offered in aws:",
        ),
        ({"gpu": "H100", "gpus_per_instance": 3}, "3 x H100", "--gpus-per-instance 4"),
        ({"gpu": "H100", "gpus_per_instance": 16}, "16 x H100", "--gpus-per-instance 8"),
        ({"instance_type": "x9.huge"}, "not in the tables", "pricing show"),
        ({"gpu": "T4", "instance_type": "g5.xlarge"}, "carries 1 x A10G", "drop --gpu"),
    ],
)
def test_no_match_explains(catalog: Catalog, request_kwargs, message, hint) -> None:
    with pytest.raises(InputError, match=message) as info:
        estimate(EstimateRequest(hours=D(1), **request_kwargs), catalog)
    assert hint in (info.value.hint or "")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"gpu": "T4", "hours": D(0)},
        {"gpu": "T4", "hours": D(-1)},
        {"gpu": "T4", "hours": D(1), "count": 0},
        {"gpu": "T4", "hours": D(1), "disk_gb": D(-5)},
        {"gpu": "T4", "hours": D(1), "data_gb": D(5)},
        {"gpu": "T4", "hours": D(1), "markets": ()},
        {"hours": D(1)},
    ],
)
def test_request_validation(kwargs) -> None:
    with pytest.raises(InputError) as info:
        EstimateRequest(**kwargs)
    assert info.value.hint


def test_transfer_to_another_continent_uses_that_continents_rate(catalog: Catalog) -> None:
    iowa = catalog.region("gcp", "us-central1")
    to_europe = transfer_rate_between(catalog, iowa, catalog.region("gcp", "europe-west4"))
    to_asia = transfer_rate_between(catalog, iowa, catalog.region("gcp", "asia-east1"))
    assert to_europe is not None
    assert to_asia is not None
    assert (to_europe.destination, to_europe.usd) == ("europe", D("0.05"))
    assert (to_asia.destination, to_asia.usd) == ("asia", D("0.08"))
    taiwan = catalog.region("gcp", "asia-east1")
    within = transfer_rate_between(catalog, taiwan, catalog.region("gcp", "asia-south1"))
    assert within is not None
    assert (within.destination, within.usd) == ("same-continent", D("0.08"))  # APAC to APAC


@pytest.mark.parametrize(
    ("region", "instance_type", "has_spot"),
    [
        ("ap-south-1", "g4dn.xlarge", True),  # Mumbai
        ("eu-west-2", "g4dn.xlarge", True),  # London
        ("ap-southeast-1", "g4dn.xlarge", True),  # Singapore
        ("sa-east-1", "g4dn.xlarge", False),  # Sao Paulo: the spot source does not list it
        ("westeurope", "Standard_NC4as_T4_v3", True),  # Azure outside the US
        ("swedencentral", "Standard_NC4as_T4_v3", True),
    ],
)
def test_a_t4_is_priced_where_students_are(
    catalog: Catalog, region: str, instance_type: str, has_spot: bool
) -> None:
    result = estimate(EstimateRequest(gpu="T4", hours=D(10), regions=(region,)), catalog)
    on_demand = [o for o in result.options if o.market is Market.ON_DEMAND]
    assert [o.instance_type for o in on_demand] == [instance_type]
    row = next(
        i for i in catalog.instances if (i.region, i.instance_type) == (region, instance_type)
    )
    assert row.ondemand_usd_per_hour is not None
    assert on_demand[0].compute_usd == row.ondemand_usd_per_hour * 10
    assert any(o.market is Market.SPOT for o in result.options) is has_spot


def test_each_option_names_the_date_of_every_storage_and_transfer_price_it_pays(
    catalog: Catalog,
) -> None:
    """Issue 48's rule for every figure shown: the storage and egress columns are priced
    from rows with their own dates (AWS af-south-1: EBS gp3 of 2025-10-28, S3 Standard and
    egress of 2024-09-25), which the option, its JSON and the assumptions name."""
    result = estimate(
        EstimateRequest(
            gpu="T4",
            hours=D(8),
            regions=("af-south-1",),
            markets=ON_DEMAND,
            storage_gb=D(500),
            egress_gb=D(100),
            data_region=catalog.find_region("eu-west-1"),
            data_gb=D(10),
        ),
        catalog,
    )
    option = only(result, "aws", "af-south-1", Market.ON_DEMAND)
    block = catalog.storage_rates("aws", "af-south-1", "block")[0]
    bucket = catalog.storage_rates("aws", "af-south-1", "object")[0]
    egress = catalog.transfer_rate("aws", "af-south-1", "internet_egress", "internet")
    moved = transfer_rate_between(
        catalog, catalog.find_region("eu-west-1"), catalog.find_region("af-south-1")
    )
    assert egress is not None
    assert moved is not None
    expected: dict[str, StorageRate | TransferRate] = {
        "block_storage": block,
        "object_storage": bucket,
        "internet_egress": egress,
        "data_transfer": moved,
    }
    assert {part.part: part.rate for part in option.parts} == expected
    row = option_row(option, catalog)
    assert row["part_prices_as_of"] == {k: r.as_of.isoformat() for k, r in expected.items()}
    days = sorted({r.as_of for r in expected.values()})
    assert len(days) > 1  # the rows differ in date: the line gives the span
    (line,) = [a for a in result.assumptions if a.startswith("Storage and transfer prices:")]
    assert f"dated {days[0]} to {days[-1]}" in line
    # No storage, no egress: no part, no line.
    bare = estimate(
        EstimateRequest(gpu="T4", hours=D(8), regions=("af-south-1",), disk_gb=D(0)), catalog
    )
    assert all(o.parts == () for o in bare.options)
    assert not [a for a in bare.assumptions if a.startswith("Storage and transfer prices:")]


def test_a_part_the_tables_do_not_price_is_said_to_be_left_out(tmp_path: Path) -> None:
    """A region the instance tables price but the storage or transfer table does not (a
    refresh adds instance regions only): its object storage and egress cost nothing in
    the figures, and a note says they are not included, as for block storage."""
    folder = tmp_path / "tables"
    shutil.copytree(bundled_tables_dir(), folder)
    for name in ("storage.csv", "transfer.csv"):
        with (folder / name).open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        with (folder / name).open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows(r for r in rows if r["region"] != "af-south-1")
    tables = load_catalog(folder)
    result = estimate(
        EstimateRequest(
            gpu="T4",
            hours=D(8),
            regions=("af-south-1",),
            markets=ON_DEMAND,
            storage_gb=D(500),
            egress_gb=D(100),
        ),
        tables,
    )
    option = only(result, "aws", "af-south-1", Market.ON_DEMAND)
    assert option.storage_usd == option.egress_usd == 0
    assert "no block-storage price for af-south-1: disks not included" in option.notes
    assert "no object-storage price for af-south-1: storage not included" in option.notes
    assert "no internet-egress price for af-south-1: egress not included" in option.notes
    assert option.parts == ()
