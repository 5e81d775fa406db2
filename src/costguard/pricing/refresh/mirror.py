"""Read API responses downloaded earlier (``--from DIR``), for sites without the network.

The layout: one folder per provider, one file per response page, in the shape the API
answered (files are read in name order)::

    DIR/aws/pricing-*.json   Price List GetProducts responses ({"PriceList": [...], ...}),
                             or a region's bulk offer file (public, no account: .../offers/
                             v1.0/aws/AmazonEC2/current/<region>/index.json; large)
    DIR/aws/spot-*.json      EC2 DescribeSpotPriceHistory responses ({"SpotPriceHistory": [...]})
                             (optional: without them only on-demand prices are refreshed)
    DIR/gcp/skus-*.json      Cloud Billing Catalog services.skus.list responses ({"skus": [...]})
    DIR/azure/prices-*.json  Retail Prices API responses ({"Items": [...], ...})
    DIR/<provider>/fetched.json  optional: {"fetched_at": "2026-11-30T12:00:00Z"}, when the
                             responses were downloaded (also accepted as DIR/fetched.json)

The prices are dated by when they were downloaded: ``fetched.json``; without it, for
AWS, by the newest date its records of each region carry (spot ``Timestamp``,
``publicationDate``) but no later than the files' modification date; else by the files'
modification date (Azure's ``effectiveStartDate`` and GCP's ``effectiveTime`` say since
when a price holds, not when it was read). Never by the day of the refresh: a mirror of
2016 stays a mirror of 2016, and the estimate says its prices are stale.
A response that is an API error (a body with ``error``, ``Error`` or ``__type`` and no
records) fails that provider with the API's own message.

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
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, date, datetime
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


def has_responses(mirror: Path, provider: str) -> bool:
    """Whether ``mirror`` has a folder of ``provider``'s responses (not only the Spot
    Instance Advisor's file and its date, which ``DIR/aws/`` may hold too)."""
    folder = mirror / provider
    return folder.is_dir() and any(
        path.name not in ("spot-advisor-data.json", "fetched.json") for path in folder.iterdir()
    )


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


def api_error(page: Mapping[str, Any]) -> str | None:
    """The message of a response that is an API error rather than a page of records
    (Google's ``{"error": {...}}``, Azure's ``{"Error": {...}}``, AWS's ``__type``), or
    ``None``.

    >>> api_error({"error": {"code": 403, "message": "Billing API disabled",
    ...                      "status": "PERMISSION_DENIED"}})
    'PERMISSION_DENIED (403): Billing API disabled'
    >>> api_error({"skus": []}) is None
    True
    """
    for key in ("error", "Error", "errors", "Errors"):
        if page.get(key):
            return _describe(page[key])
    if "__type" in page or "message" in page or "Message" in page:
        return _describe(page)
    return None


def _describe(error: Any) -> str:
    if isinstance(error, list):
        return "; ".join(_describe(item) for item in error[:3])
    if not isinstance(error, Mapping):
        return str(error)
    message = error.get("message") or error.get("Message") or ""
    code = error.get("status") or error.get("Code") or error.get("code") or error.get("__type")
    number = error.get("code") if error.get("status") else None
    label = f"{code} ({number})" if number is not None else str(code or "error")
    return f"{label}: {message}" if message else label


def records(
    page: Mapping[str, Any], key: str, provider: str = "the"
) -> Iterator[Mapping[str, Any]]:
    """The records under ``key`` of a response page, live or downloaded; entries that are
    not JSON objects are skipped. A page that is an API error, not records, raises
    :class:`CostguardError` with the API's message (``provider`` names the API).

    >>> list(records({"Items": [{"a": 1}, "junk"]}, "Items"))
    [{'a': 1}]
    """
    if key not in page:
        error = api_error(page)
        if error is not None:
            msg = f"the {provider} price API answered an error instead of prices: {error}"
            raise CostguardError(
                msg, hint="fix what the message says, then download that response again"
            )
    values = page.get(key) or []
    if not isinstance(values, list):
        msg = f"a response's {key!r} is not a list but {type(values).__name__}"
        raise CostguardError(msg, hint="download that response again, or try again later")
    # The type test first: JSON objects are dicts, and an ABC check costs more per record.
    return (value for value in values if type(value) is dict or isinstance(value, Mapping))


def fetched_at(mirror: Path, provider: str) -> datetime | None:
    """When the responses of ``provider`` were downloaded, from ``fetched.json`` in its
    folder (or the mirror's); ``None`` when neither says."""
    for path in (mirror / provider / "fetched.json", mirror / "fetched.json"):
        if not path.is_file():
            continue
        try:
            value = json.loads(path.read_text(encoding="utf-8"))["fetched_at"]
            moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            msg = f"{path} does not say when the responses were downloaded: {exc}"
            raise InputError(
                msg, hint='write it as {"fetched_at": "2026-11-30T12:00:00Z"}'
            ) from None
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return None


def as_of(
    mirror: Path, provider: str, regions: Iterable[str], dated: Mapping[str, datetime]
) -> dict[str, date]:
    """The date of the prices of each region read from ``mirror`` (see the module
    docstring): ``fetched.json``, else the region's newest record date (``dated``) no
    later than the files' modification date, else that date."""
    fetched = fetched_at(mirror, provider)
    if fetched is not None:
        return dict.fromkeys(regions, fetched.astimezone(UTC).date())
    paths = [path for kind in PATTERNS[provider] for path in files(mirror, provider, kind)]
    modified = min(
        (datetime.fromtimestamp(path.stat().st_mtime, UTC).date() for path in paths),
        default=datetime.now(UTC).date(),
    )
    lowered = {region.lower(): moment for region, moment in dated.items()}
    days = {}
    for region in regions:
        moment = lowered.get(region.lower())
        days[region] = modified if moment is None else min(moment.astimezone(UTC).date(), modified)
    return days
