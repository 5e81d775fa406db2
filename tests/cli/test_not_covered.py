"""The "Not covered by the ... tables" footer of `estimate` and `pricing gpus`: what the
answer leaves out. `estimate` names every region asked for that the tables have no
prices for, by provider, once however many GPUs are asked for; at 80 and 120 columns
every footer fits, its refresh command whole on one line."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from costguard.pricing.tables import load_catalog
from tests.helpers.output import assert_commands_whole

CATALOG = load_catalog()
FOOTER = re.compile(r"Not covered by the bundled tables \(no prices\): (\w+) ([^;]*);")
ASKED = [
    ("--gpu", "l4,t4", "--hours", "10", "--region", "europe"),  # two tables, one footer
    ("--gpu", "a100", "--hours", "10", "--region", "asia"),
    ("--gpu", "t4", "--hours", "2", "--region", "uksouth", "--region", "us-east-1"),
]


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("args", ASKED, ids=lambda a: " ".join(a))
def test_estimate_names_every_region_it_leaves_out_once(
    run_cli: Callable[..., Any], terminal: Callable[[int], None], width: int, args: tuple[str, ...]
) -> None:
    asked = run_cli("estimate", *args, "--format", "json").json()["query"]["regions"]
    missing = {
        (r.provider, r.name)
        for r in CATALOG.regions
        if r.name in asked and (r.provider, r.name) not in CATALOG.covered
    }
    assert missing, "the case leaves a region out"
    terminal(width)
    result = run_cli("estimate", *args)
    assert result.exit_code == 0, result.stderr
    footers = FOOTER.findall(" ".join(result.stdout.split()))
    providers = [provider for provider, _ in footers]
    assert sorted(providers) == sorted({provider for provider, _ in missing})  # once each
    named = {(p, name.strip()) for p, names in footers for name in names.split(",")}
    assert named == missing
    assert_commands_whole(result.stdout.splitlines(), width)


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("provider", [(), ("--provider", "azure")], ids=["all", "azure"])
def test_the_pricing_gpus_footer_fits(
    run_cli: Callable[..., Any],
    terminal: Callable[[int], None],
    width: int,
    provider: tuple[str, ...],
) -> None:
    terminal(width)
    result = run_cli("pricing", "gpus", *provider)
    assert result.exit_code == 0, result.stderr
    assert "Not covered by the bundled tables: azure" in " ".join(result.stderr.split())
    assert_commands_whole(result.stderr.splitlines(), width)
