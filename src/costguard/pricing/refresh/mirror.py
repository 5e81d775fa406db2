"""Read API responses downloaded earlier (``--from DIR``), for sites without the network.

The layout: one folder per provider, one file per response page, in the shape the API
answered (files are read in name order)::

    DIR/aws/pricing-*.json   Price List GetProducts responses ({"PriceList": [...], ...})
    DIR/aws/spot-*.json      EC2 DescribeSpotPriceHistory responses ({"SpotPriceHistory": [...]})
                             (optional: without them only on-demand prices are refreshed)
    DIR/gcp/skus-*.json      Cloud Billing Catalog services.skus.list responses ({"skus": [...]})
    DIR/azure/prices-*.json  Retail Prices API responses ({"Items": [...], ...})

On a machine with access, for example (repeat per region, and per page where the API
pages; the AWS CLI joins the pages itself)::

    aws pricing get-products --region us-east-1 --service-code AmazonEC2 --filters \\
        Type=TERM_MATCH,Field=regionCode,Value=us-east-1 \\
        Type=TERM_MATCH,Field=operatingSystem,Value=Linux \\
        Type=TERM_MATCH,Field=tenancy,Value=Shared \\
        Type=TERM_MATCH,Field=preInstalledSw,Value=NA \\
        Type=TERM_MATCH,Field=capacitystatus,Value=Used > DIR/aws/pricing-us-east-1.json
    aws ec2 describe-spot-price-history --region us-east-1 --product-descriptions \\
        Linux/UNIX --start-time "$(date -u +%FT%TZ)" > DIR/aws/spot-us-east-1.json
    curl -H "Authorization: Bearer $(gcloud auth print-access-token)" \\
        "https://cloudbilling.googleapis.com/v1/services/6F81-5844-456A/skus?pageSize=5000" \\
        > DIR/gcp/skus-1.json     # then with &pageToken=<nextPageToken of the last page>
    curl -G https://prices.azure.com/api/retail/prices \\
        --data-urlencode api-version=2023-01-01-preview --data-urlencode \\
        "\\$filter=serviceName eq 'Virtual Machines' and armRegionName eq 'eastus'" \\
        > DIR/azure/prices-eastus-1.json     # then each page's NextPageLink
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

from costguard.errors import CostguardError, InputError

#: The files of each provider in a mirror, by what they hold.
PATTERNS = {
    "aws": {"pricing": "pricing-*.json", "spot": "spot-*.json"},
    "gcp": {"skus": "skus-*.json"},
    "azure": {"prices": "prices-*.json"},
}
#: The files a provider's mirror folder must have (AWS spot history is optional).
REQUIRED = {"aws": "pricing", "gcp": "skus", "azure": "prices"}


def files(mirror: Path, provider: str, kind: str) -> list[Path]:
    """The response files of one kind in ``mirror``, in name order."""
    return sorted((mirror / provider).glob(PATTERNS[provider][kind]))


def check(mirror: Path, provider: str) -> None:
    """Raise :class:`InputError` when ``mirror`` has no responses for ``provider``."""
    kind = REQUIRED[provider]
    if not files(mirror, provider, kind):
        pattern = mirror / provider / PATTERNS[provider][kind]
        msg = f"no {provider} responses in {mirror}: nothing matches {pattern}"
        raise InputError(
            msg, hint="see `costguard pricing refresh --help` for the layout, or drop --provider"
        )


def pages(mirror: Path, provider: str, kind: str) -> Iterator[dict[str, Any]]:
    """Each response file as a JSON object; numbers with a fraction become Decimal."""
    for path in files(mirror, provider, kind):
        try:
            with path.open(encoding="utf-8") as handle:
                page = json.load(handle, parse_float=Decimal)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            msg = f"cannot read {path}: {exc}"
            raise CostguardError(msg, hint="download that response again") from None
        if not isinstance(page, dict):
            msg = f"{path} is not an API response (a JSON object)"
            raise CostguardError(msg, hint="download that response again")
        yield page


def records(page: Mapping[str, Any], key: str) -> Iterator[Mapping[str, Any]]:
    """The records under ``key`` of a response page, live or downloaded; entries that are
    not JSON objects are skipped.

    >>> list(records({"Items": [{"a": 1}, "junk"]}, "Items"))
    [{'a': 1}]
    """
    values = page.get(key) or []
    if not isinstance(values, list):
        msg = f"a response's {key!r} is not a list but {type(values).__name__}"
        raise CostguardError(msg, hint="download that response again, or try again later")
    # The type test first: JSON objects are dicts, and an ABC check costs more per record.
    return (value for value in values if type(value) is dict or isinstance(value, Mapping))
