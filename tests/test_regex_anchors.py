"""No pattern in the library ends with ``$``: it matches before a trailing newline, so
``re.match(r"^ami-[0-9a-f]{8}$", "ami-01234567\\n")`` passes, and a name, id or zone with a
newline in it went on to a cloud call, a tag or a path (issue 28). A whole-string check is
``fullmatch`` (no anchors); a suffix is ``\\Z``.

The walk reads every pattern the source gives ``re`` (``re.compile``, ``re.match``, ...:
string literals and the module's string constants), so a new ``$`` fails here, wherever the
pattern is used afterwards (``check_names`` calls ``.fullmatch`` on the pattern it is given).
The behaviour tests feed a trailing newline to validators whose input is not stripped first.
"""

from __future__ import annotations

import ast
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

import costguard
from costguard.alarms.spec import alarm_spec
from costguard.checkpoint.completion import folder_kind
from costguard.errors import InputError
from costguard.pricing.refresh.parse_aws import aws_zone_region
from costguard.reaper.gcp import check_locations
from costguard.settings import Settings
from costguard.spot.launcher.aws import AwsLauncher
from costguard.spot.launcher.azure import AzureLauncher
from costguard.spot.launcher.base import Launcher, LaunchSpec
from costguard.spot.launcher.gcp import GcpLauncher
from tests.servers.aws import AWS_LAUNCH_OPTIONS
from tests.servers.azure import LAUNCH_OPTIONS as AZURE_LAUNCH_OPTIONS
from tests.servers.gcp import LAUNCH_OPTIONS as GCP_LAUNCH_OPTIONS

SOURCE = Path(costguard.__file__).parent
#: The functions of ``re`` whose first argument is a pattern.
PATTERN_FUNCTIONS = {"compile", "match", "search", "fullmatch", "sub", "subn", "split",
                     "findall", "finditer"}  # fmt: skip


def _end_anchor(pattern: str) -> bool:
    """Whether ``pattern`` holds a ``$`` that is an anchor (not escaped, not in a class).

    >>> _end_anchor(r"^a$"), _end_anchor(r"a\\$"), _end_anchor(r"[$]"), _end_anchor(r"a\\Z")
    (True, False, False, False)
    """
    plain = re.sub(r"\\.", "", pattern)
    plain = re.sub(r"\[\^?\]?[^\]]*\]", "", plain)
    return "$" in plain


def _text(node: ast.expr, constants: dict[str, str]) -> str | None:
    """The pattern an argument spells: a literal, a module constant, or an f-string's
    literal parts (its fields cannot add an anchor the walk would miss: they are
    ``re.escape``d names or other constants)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    if isinstance(node, ast.JoinedStr):
        return "".join(
            part.value
            for part in node.values
            if isinstance(part, ast.Constant) and isinstance(part.value, str)
        )
    return None


def anchored_patterns(root: Path) -> list[str]:
    """``file:line pattern`` for each pattern under ``root`` with a ``$`` anchor."""
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if "import re" not in text:
            continue  # calls no function of re
        tree = ast.parse(text)
        constants = {
            target.id: node.value.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "re"
                and node.func.attr in PATTERN_FUNCTIONS
                and node.args
            ):
                continue
            pattern = _text(node.args[0], constants)
            if pattern is not None and _end_anchor(pattern):
                where = path.relative_to(root.parent)
                found.append(f"{where}:{node.lineno} {pattern!r}")
    return found


def test_no_pattern_in_the_library_anchors_with_a_dollar() -> None:
    assert anchored_patterns(SOURCE) == []


def test_the_walk_sees_patterns_however_they_are_written(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text(
        "import re\n"
        'A = re.compile(r"^ami-[0-9a-f]{8}$")\n'
        'TEXT = r"_KEY$"\n'
        "B = re.compile(TEXT, re.I)\n"
        'ok = re.fullmatch(r"a[$]b\\$", "x")\n'
        'C = re.compile(rf"{TEXT}x$")\n'
        'if re.match(r"^(python|torchrun)$", "x"): pass\n'
    )
    assert [line.split(" ")[0] for line in anchored_patterns(package)] == [
        "pkg/m.py:2", "pkg/m.py:4", "pkg/m.py:6", "pkg/m.py:7",
    ]  # fmt: skip


# ------------------------------------------------------ a trailing newline is refused


def test_a_zone_with_a_trailing_newline_is_no_zone() -> None:
    with pytest.raises(InputError, match="unknown GCP zone"):
        check_locations([], ["us-central1-a\n"], ["us-central1"])


def test_a_folder_name_with_a_trailing_newline_is_no_checkpoint() -> None:
    assert folder_kind("checkpoint-40\n", []) is None
    assert folder_kind("checkpoint_3\n", []) is None
    assert folder_kind("checkpoint-40", []) == "transformers"


def test_a_zone_with_a_trailing_newline_has_no_region() -> None:
    assert aws_zone_region("us-east-1a\n") is None
    assert aws_zone_region("us-east-1a") == "us-east-1"


@pytest.mark.parametrize(
    ("role_arn", "target"),
    [
        ("arn:aws:iam::123456789012:role/costguard-budgets\n", "user/alice"),
        ("arn:aws:iam::123456789012:role/costguard-budgets", "user/alice\n"),
        # Non-ASCII digits and letters are no account id and no IAM name.
        ("arn:aws:iam::١٢٣٤٥٦٧٨٩٠١٢:role/costguard-budgets", "user/alice"),
        ("arn:aws:iam::123456789012:role/costguard-budgets", "user/alicé"),
    ],
)
def test_hard_stop_names_are_whole_ascii_names(role_arn: str, target: str) -> None:
    with pytest.raises(InputError, match="hard-stop"):
        alarm_spec(budget="100", hard_stop=True, hard_stop_role_arn=role_arn,
                   hard_stop_targets=[target])  # fmt: skip


def _spec(options: dict[str, str]) -> LaunchSpec:
    return LaunchSpec("run-1", "s3://ckpt/costguard/run-1", ("python", "t.py"), "alice",
                      datetime(2026, 12, 2, tzinfo=UTC), options=options)  # fmt: skip


@pytest.mark.parametrize(
    ("launcher", "options", "fragment"),
    [
        (AwsLauncher(), {**AWS_LAUNCH_OPTIONS, "subnet": "subnet-0abc1234\n"}, "subnet"),
        (AwsLauncher(), {**AWS_LAUNCH_OPTIONS, "root_device": "/dev/sda1\n"}, "root_device"),
        (AzureLauncher(Settings()), {**AZURE_LAUNCH_OPTIONS, "admin_username": "azureuser\n"},
         "admin_username"),
        (GcpLauncher(Settings()), {**GCP_LAUNCH_OPTIONS, "zone": "us-central1-a\n"},
         "not a GCP zone"),
    ],
    ids=["aws-subnet", "aws-root-device", "azure-admin-username", "gcp-zone"],
)  # fmt: skip
def test_launch_options_with_a_trailing_newline_are_refused_offline(
    launcher: Launcher, options: dict[str, str], fragment: str
) -> None:
    with pytest.raises(InputError, match=fragment):
        launcher.check(_spec(options))
