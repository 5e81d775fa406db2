"""The fixture price records of the refresh tests, and a mirror (``--from``) of them.

The records are small and written in the providers' documented shapes
(:mod:`tests.refresh.servers`). Their prices differ from the bundled tables on purpose,
so a test can tell a refreshed price from an old one.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from tests.refresh.servers import aws_product, azure_item, gcp_sku

# --- AWS: us-east-1 on-demand (spot comes from moto, which answers 0.00001 everywhere) ---
G5_XLARGE_USD = Decimal("1.2345")
MOTO_SPOT_USD = Decimal("0.00001")
AWS_PRODUCTS = [
    aws_product("g5.xlarge", "us-east-1", "1.2345000000"),
    aws_product("g4dn.xlarge", "us-east-1", "0.5260000000"),
    aws_product("p4d.24xlarge", "us-east-1", "21.9600000000"),
    aws_product("m5.large", "us-east-1", "0.0960000000"),
    aws_product("c5.large", "us-east-1", "0.0850000000"),
    aws_product("g5.xlarge", "us-west-2", "1.1111000000"),
    # Not what costguard lists: the filters keep them out (server- and client-side).
    aws_product("g5.xlarge", "us-east-1", "2.0000000000", operatingSystem="Windows"),
    aws_product("g5.xlarge", "us-east-1", "9.9000000000", tenancy="Dedicated"),
    aws_product("g5.xlarge", "us-east-1", "1.5000000000", preInstalledSw="SQL Std"),
    aws_product(
        "g5.xlarge", "us-east-1", "0.0000000000", capacitystatus="UnusedCapacityReservation"
    ),
]

# --- GCP: us-central1 unit prices ---------------------------------------------------------
G2_CORE, G2_RAM, L4_GPU = Decimal("0.024988"), Decimal("0.002928"), Decimal("0.56")
G2_SPOT_CORE, G2_SPOT_RAM, L4_SPOT = Decimal("0.009995"), Decimal("0.001171"), Decimal("0.2236")
G2_STANDARD_4_USD = 4 * G2_CORE + 16 * G2_RAM + 1 * L4_GPU
G2_STANDARD_4_SPOT_USD = 4 * G2_SPOT_CORE + 16 * G2_SPOT_RAM + 1 * L4_SPOT


def _gcp_host(series: str, core: str, ram: str, spot_core: str, spot_ram: str) -> list[Any]:
    return [
        gcp_sku(f"{series} Core running in Americas", core),
        gcp_sku(f"{series} Ram running in Americas", ram, unit="GiBy.h", group="RAM"),
        gcp_sku(
            f"Spot Preemptible {series} Core running in Americas",
            spot_core,
            usage_type="Preemptible",
        ),
        gcp_sku(
            f"Spot Preemptible {series} Ram running in Americas",
            spot_ram,
            usage_type="Preemptible",
            unit="GiBy.h",
            group="RAM",
        ),
    ]


def _gcp_gpu(model: str, usd: str, spot: str) -> list[Any]:
    return [
        gcp_sku(f"Nvidia {model} GPU running in Americas", usd, group="GPU"),
        gcp_sku(
            f"Nvidia {model} GPU attached to Spot Preemptible VMs running in Americas",
            spot,
            usage_type="Preemptible",
            group="GPU",
        ),
    ]


GCP_SKUS = [
    *_gcp_host("G2 Instance", str(G2_CORE), str(G2_RAM), str(G2_SPOT_CORE), str(G2_SPOT_RAM)),
    *_gcp_host("N1 Predefined Instance", "0.031611", "0.004237", "0.006655", "0.000892"),
    *_gcp_host("A2 Instance", "0.031611", "0.004237", "0.008", "0.0011"),
    *_gcp_host("E2 Instance", "0.021811", "0.002923", "0.006543", "0.000877"),
    *_gcp_host("N2 Instance", "0.031611", "0.004237", "0.00766", "0.001027"),
    *_gcp_gpu("L4", str(L4_GPU), str(L4_SPOT)),
    *_gcp_gpu("Tesla T4", "0.35", "0.069"),
    *_gcp_gpu("Tesla V100", "2.48", "0.744"),
    *_gcp_gpu("Tesla A100", "2.933908", "1.16"),
    # Other ways of buying, other regions, other products: not used for us-central1.
    gcp_sku("Commitment v1: N1 Cpu in Americas for 1 Year", "0.019915", usage_type="Commit1Yr"),
    gcp_sku("Custom Instance Core running in Americas", "0.033174"),
    gcp_sku("Nvidia Tesla T4 Virtual Workstation GPU running in Americas", "0.55", group="GPU"),
    gcp_sku("N1 Predefined Instance Core running in EMEA", "0.9", regions=["europe-west4"]),
]

#: A4's SKUs as GCP names them: the whole VM (vCPUs, memory, one B200) is one "GPU slice";
#: there is no "A4 Instance Core/Ram" SKU (gpuhunt src/gpuhunt/providers/gcp.py @ 35841515
#: prices a4 as GPUs x slice; SkyPilot's fetch_gcp.py @ 21fd5541: "GCP does not have A4
#: instance in SKUs API"). The spot SKU is tagged OnDemand ("This live SKU is categorized
#: as OnDemand despite its description": SpareCores/sc-crawler tests/test_gcp.py @
#: 55aec325); DWS Calendar Mode and commitments are other ways of buying. Test figures.
_AMERICAS_A4 = ("us-central1", "us-east1")
GCP_A4_SKUS = [
    gcp_sku("A4 Nvidia B200 (1 gpu slice) running in Americas", "16.11",
            regions=_AMERICAS_A4, group="GPU"),
    gcp_sku("Spot Preemptible A4 Nvidia B200 (1 gpu slice) running in Americas", "4.9542",
            regions=_AMERICAS_A4, group="GPU"),
    gcp_sku("DWS Calendar Mode A4 Nvidia B200 (1 gpu slice) in Americas", "11.277",
            regions=_AMERICAS_A4, group="GPU"),
    gcp_sku("Commitment v1: A4 Nvidia B200 (1 gpu slice) in Americas for 1 Year", "10",
            regions=_AMERICAS_A4, usage_type="Commit1Yr", group="GPU"),
]  # fmt: skip

# --- Azure: eastus -----------------------------------------------------------------------
NC4AS_T4_USD, NC4AS_T4_SPOT_USD = Decimal("0.6"), Decimal("0.07")
AZURE_ITEMS = [
    azure_item("Standard_NC4as_T4_v3", "eastus", "0.6"),
    azure_item("Standard_NC4as_T4_v3", "eastus", "0.07", spot=True),
    azure_item("Standard_NC24ads_A100_v4", "eastus", "3.8"),
    azure_item("Standard_NC24ads_A100_v4", "eastus", "0.5", spot=True),
    azure_item("Standard_D2s_v5", "eastus", "0.1"),
    azure_item("Standard_D2s_v5", "eastus", "0.012", spot=True),
    # Skipped: Low Priority, Windows, dev/test and reservation prices.
    azure_item("Standard_NC4as_T4_v3", "eastus", "0.1", low_priority=True),
    azure_item("Standard_NC4as_T4_v3", "eastus", "0.8", windows=True),
    azure_item("Standard_NC4as_T4_v3", "eastus", "0.5", price_type="DevTestConsumption"),
    azure_item("Standard_NC4as_T4_v3", "eastus", "0.3", price_type="Reservation"),
    azure_item("Standard_NC4as_T4_v3", "westus2", "0.66"),
]


def write_mirror(folder: Path, fetched_at: datetime | None = None) -> Path:
    """The fixture records as downloaded responses (``--from`` layout), several pages each,
    downloaded at ``fetched_at`` (``fetched.json``; default: now)."""
    for provider, kind, key, records in (
        ("aws", "pricing", "PriceList", [json.dumps(p) for p in AWS_PRODUCTS]),
        ("gcp", "skus", "skus", GCP_SKUS),
        ("azure", "prices", "Items", AZURE_ITEMS),
    ):
        (folder / provider).mkdir(parents=True, exist_ok=True)
        for number, start in enumerate(range(0, len(records), 4), start=1):
            page = {key: records[start : start + 4]}
            text = json.dumps(page, default=lambda d: float(d) if isinstance(d, Decimal) else d)
            (folder / provider / f"{kind}-{number:03d}.json").write_text(text)
    spot = {
        "SpotPriceHistory": [
            {
                "AvailabilityZone": zone,
                "InstanceType": "g5.xlarge",
                "ProductDescription": "Linux/UNIX",
                "SpotPrice": price,
                "Timestamp": "2026-11-30T12:00:00+00:00",
            }
            for zone, price in (
                ("us-east-1a", "0.51"),
                ("us-east-1b", "0.4321"),
                ("us-east-1-atl-2a", "0.1"),
            )
        ]
    }
    (folder / "aws" / "spot-001.json").write_text(json.dumps(spot))
    moment = (fetched_at or datetime.now(UTC)).isoformat()
    (folder / "fetched.json").write_text(json.dumps({"fetched_at": moment}))
    return folder
