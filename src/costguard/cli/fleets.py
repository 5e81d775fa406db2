"""Which instances a command looks at: the shared ``--provider``/``--region``/... flags.

``costguard reap`` and ``costguard burn`` both list instances through the reaper's cloud
adapters (:mod:`costguard.reaper.aws`, ``gcp``, ``azure``): one listing per AWS region,
GCP project or Azure subscription. Locations are checked offline, before any cloud call:
AWS regions against botocore's endpoint data, GCP and Azure regions against the price
tables (neither SDK ships a region list), with a did-you-mean.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import click

from costguard.cli.params import AzureSubscription, Name, option_group
from costguard.providers import adapter_class, providers
from costguard.reaper.fleet import Fleet, FleetRequest, PriceBook
from costguard.settings import Settings


def fleet_options(region_help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the location flags to a click command; ``region_help`` says the default."""

    region = click.option("--region", "regions", type=Name(), multiple=True, help=region_help)
    return option_group(_PROVIDER, region, *_OPTIONS)


_PROVIDER = click.option(
    "--provider",
    type=click.Choice(providers("fleet"), case_sensitive=False),
    default="aws",
    show_default=True,
    help="Which cloud to look at.",
)
_OPTIONS = (
    click.option("--all-regions", is_flag=True, help="AWS: every region enabled in the account."),
    click.option(
        "--zone",
        "zones",
        type=Name(),
        multiple=True,
        help="GCP zone (repeatable), e.g. us-central1-a.",
    ),
    click.option("--project", type=Name(), envvar="GOOGLE_CLOUD_PROJECT", help="GCP project ID."),
    click.option(
        "--subscription",
        type=AzureSubscription(),
        envvar="AZURE_SUBSCRIPTION_ID",
        help="Azure subscription ID.",
    ),
    click.option("--resource-group", type=Name(), help="Azure: only this resource group."),
)

#: Per cloud: the option only it takes, and the one it needs (option name, flag).
_PROVIDER_FLAGS = (
    ("gcp", ("zones", "--zone"), ("project", "--project (or GOOGLE_CLOUD_PROJECT)")),
    (
        "azure",
        ("resource_group", "--resource-group"),
        ("subscription", "--subscription (or AZURE_SUBSCRIPTION_ID)"),
    ),
)


def check_combinations(provider: str, options: dict[str, Any]) -> None:
    """Flags that only make sense together; bad ones exit 2 before any cloud call."""
    if options["all_regions"] and (options["regions"] or provider != "aws"):
        msg = "--all-regions is for AWS and replaces --region"
        raise click.UsageError(msg)
    for cloud, (only, only_flag), (needed, needed_flag) in _PROVIDER_FLAGS:
        if options[only] and provider != cloud:
            msg = f"{only_flag} is for --provider {cloud}"
            raise click.UsageError(msg)
        if provider == cloud and not options[needed]:
            msg = f"--provider {cloud} needs {needed_flag}"
            raise click.UsageError(msg)


def fleets(
    provider: str,
    options: dict[str, Any],
    prices: PriceBook,
    settings: Settings,
    *,
    aws_default_regions: Sequence[str] = (),
) -> list[Fleet]:
    """Validate locations offline, then one fleet per AWS region or one per account.

    AWS without ``--region`` looks at ``aws_default_regions``, or the profile's region.
    """
    check_combinations(provider, options)
    fleet_class = adapter_class("fleet", provider)  # the SDK loads only now
    request = FleetRequest(options, prices, settings, aws_default_regions)
    fleets: list[Fleet] = fleet_class.for_options(request)
    return fleets
