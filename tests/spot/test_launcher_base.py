"""The ``Launcher`` base and the launcher options declared as data.

An adapter writes four methods; every optional ability has a default in the base, so no
caller looks for one (``getattr``/``hasattr`` on a launcher is refused here by reading the
source). Options are declared per adapter and checked by one validator: each declared
example follows its own rule, and each kind of rule refuses what breaks it, naming the key.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

import costguard
from costguard.errors import InputError
from costguard.pricing.catalog import Market
from costguard.spot.launcher import aws, azure, gcp
from costguard.spot.launcher.base import Handle, Launcher, LaunchSpec, Offer, State, Status
from costguard.spot.launcher.options import Option, Options

SOURCE = Path(costguard.__file__).parent
ADAPTERS = {"aws": aws.OPTIONS, "gcp": gcp.OPTIONS, "azure": azure.OPTIONS}


class OnlyTheFour(Launcher):
    """A provider that writes what every adapter must, and nothing else."""

    provider = "test"

    def launch(self, offer: Offer, spec: LaunchSpec, attempt: int) -> Handle:
        return Handle(self.provider, offer.region, f"i-{attempt}")

    def status(self, handle: Handle) -> Status:
        return Status(handle, State.RUNNING)

    def terminate(self, handle: Handle) -> None:
        return None

    def find(self, job_id: str) -> Sequence[Handle]:
        return []


def test_the_optional_abilities_have_defaults() -> None:
    launcher = OnlyTheFour()
    offer = Offer("test", "r1", "t", Market.SPOT, Decimal("1"), "T4", 1)
    spec = LaunchSpec("j", "s3://b/j", ("true",), "me", datetime(2026, 12, 2, tzinfo=UTC))
    handle = launcher.launch(offer, spec, 1)
    assert launcher.zones("r1", "t") == ()
    assert launcher.resume(offer, spec, 1, "costguard-j-1", 0.0) is None
    assert launcher.stopped(handle, "j") is None
    assert launcher.state_dir is None
    launcher.close()
    launcher.check(spec)  # no options declared: nothing to refuse


def test_an_adapter_must_write_the_four_methods() -> None:
    class NoFind(Launcher):
        provider = "test"

        def launch(self, offer: Offer, spec: LaunchSpec, attempt: int) -> Handle:
            raise NotImplementedError

        def status(self, handle: Handle) -> Status:
            raise NotImplementedError

        def terminate(self, handle: Handle) -> None:
            raise NotImplementedError

    with pytest.raises(TypeError, match="find"):
        NoFind()  # type: ignore[abstract]


def _probes(path: Path) -> list[str]:
    """``getattr``/``hasattr`` calls on something named like a launcher, in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and node.args
            and "launcher" in ast.unparse(node.args[0]).lower()
        ):
            found.append(f"{path.relative_to(SOURCE)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_caller_probes_a_launcher_for_an_ability() -> None:
    callers = [*SOURCE.joinpath("spot").rglob("*.py"), *SOURCE.joinpath("cli").rglob("*.py")]
    assert [probe for path in callers for probe in _probes(path)] == []


@pytest.mark.parametrize("provider", sorted(ADAPTERS))
def test_every_declared_example_follows_its_own_rule(provider: str) -> None:
    declared = ADAPTERS[provider]
    examples = {}
    for option in declared:
        assert option.example, f"{option.name} has no example"
        examples[option.name.replace("_*", "_westus")] = option.example
    values = declared.check(examples, provider)
    assert values == {
        k: declared[k.replace("_westus", "_*")].folded(v) for k, v in examples.items()
    }


@pytest.mark.parametrize("provider", sorted(ADAPTERS))
def test_every_required_option_is_asked_for_by_name(provider: str) -> None:
    declared = ADAPTERS[provider]
    examples = {o.name: o.example for o in declared if not o.family}
    for option in declared:
        if not option.required:
            continue
        given = {k: v for k, v in examples.items() if k != option.name}
        with pytest.raises(InputError, match=f"launching on {provider} needs the {option.name}"):
            declared.check(given, provider)
        # The launcher's own value (a project it was built with) stands in for it.
        assert declared.check(given, provider, {option.name: option.example})[option.name]


RULES = Options(
    Option("zone", "a zone", example="us-central1-a", pattern=re.compile(r"[a-z]+-[a-z0-9]+-[a-z]"),
           invalid="not a zone: {value!r}", hint="like us-central1-a"),
    Option("subnet_*", "a subnet per region", example="subnet-1", pattern=re.compile(r"subnet-\d"),
           invalid="the {name} option must be a subnet id", hint="subnet-N"),
    Option("groups", "ids", example="sg-1,sg-2", listed=True, pattern=re.compile(r"sg-\d"),
           invalid="{name} lists {value!r}", hint="sg-N,sg-M"),
    Option("user", "a user", example="ml", default="azureuser", refused=frozenset({"root"}),
           invalid="the user cannot be {value!r}", hint="e.g. user=ml"),
    Option("action", "what to do", example="stop", default="DELETE", case="upper",
           choices=("DELETE", "STOP"), invalid="{value!r} is no action", hint="DELETE or STOP"),
    Option("disk_gb", "GB", example="200", default="100", whole=(10, 500)),
)  # fmt: skip


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"zone": "us-central1"}, "not a zone: 'us-central1'"),
        ({"subnet_westus": "subnet-x"}, "the subnet_westus option must be a subnet id"),
        ({"groups": "sg-1, web"}, "groups lists 'web'"),
        ({"user": "Root"}, "the user cannot be 'Root'"),
        ({"action": "keep"}, "'KEEP' is no action"),
        ({"disk_gb": "501"}, "the disk_gb option must be a whole number from 10 to 500, not '501'"),
        ({"disk_gb": "ten"}, "the disk_gb option must be a whole number from 10 to 500, not 'ten'"),
    ],
)
def test_each_rule_refuses_what_breaks_it(given: dict[str, str], message: str) -> None:
    with pytest.raises(InputError) as caught:
        RULES.check(given, "test")
    assert caught.value.message == message
    assert caught.value.hint


def test_values_come_back_folded_with_their_defaults() -> None:
    values = RULES.check({"action": " stop ", "groups": "sg-1,sg-2", "subnet_eastus": "subnet-2"},
                         "test")  # fmt: skip
    assert values == {
        "subnet_eastus": "subnet-2",
        "groups": "sg-1,sg-2",
        "user": "azureuser",
        "action": "STOP",
        "disk_gb": "100",
    }
    assert RULES.value({}, "disk_gb") == "100"
    assert RULES.value({"disk_gb": " 20 "}, "disk_gb") == "20"


def test_an_option_is_read_as_it_was_checked() -> None:
    """The validator strips and folds a value; the request uses that same value (a zone
    given with blanks passed the check, then missed the region when read raw)."""
    from costguard.settings import Settings
    from costguard.spot.launcher.gcp import GcpLauncher
    from tests.servers.gcp import LAUNCH_OPTIONS

    options = {**LAUNCH_OPTIONS, "zone": " us-central1-b ", "termination_action": "stop"}
    spec = LaunchSpec("run-1", "gs://b/run-1", ("python", "t.py"), "me",
                      datetime(2026, 12, 2, tzinfo=UTC), options=options)  # fmt: skip
    offer = Offer("gcp", "us-central1", "g2-standard-4", Market.SPOT, Decimal("1"), "L4", 1)
    instance = GcpLauncher(Settings(), environ={}).request(offer, spec, 1)
    assert instance.machine_type == "zones/us-central1-b/machineTypes/g2-standard-4"
    assert instance.scheduling.instance_termination_action == "STOP"
