"""What a store, an export, a tag or a cloud API holds never reaches a terminal raw (issue 43).

Each command that shows such a value is fed one that carries an OSC title sequence, a
clear-screen CSI, a bell, a newline followed by a fake report line, a bidi override and
rich markup (a closing tag that does not open, a hyperlink). In a pipe and as on a
terminal (rich's ``FORCE_COLOR``, click's colour kept), each must show the value escaped,
never raise, never make a link, and never let the fake line start a line of its own.
``spend --format csv`` writes no cell a spreadsheet would run as a formula.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st

from costguard.checkpoint.manifest import Manifest, ObjectEntry, checkpoint_name
from costguard.checkpoint.store import Store
from costguard.cli import cli
from costguard.pricing.catalog import Market
from costguard.spot.job import JOB_FILE, Job, JobSpec, save_job
from costguard.spot.launcher.base import Handle, Offer
from costguard.spot.recovery import Attempt, AttemptOutcome

#: What a forged record carries: every way to act on a terminal or a reader at once.
FAKE_LINE = "succeeded: all steps done"
HOSTILE = (
    "x\x1b]0;owned\x07\x1b[2J\x9b31m[/bad][link=https://evil.example]click[/link]"
    f"\u202eevil\n{FAKE_LINE}"
)
#: What must never appear in the output: the raw controls, a link, the fake line alone.
RAW = ("\x1b]", "\x1b[2J", "\x07", "\x9b", "\u202e")


def assert_clean(result: Result, *, must_show: bool = True) -> None:
    """The command exited 0 or 2 with no unexpected error, and printed nothing raw."""
    out = result.stdout + result.stderr
    assert result.exit_code in (0, 2), (result.exit_code, out[-2000:])
    assert "unexpected" not in out, out[-2000:]
    assert "Traceback" not in out, out[-2000:]
    assert "MarkupError" not in out
    for raw in RAW:
        assert raw not in out, (raw, out[-2000:])
    assert "\x1b]8;" not in out, "a hyperlink was made"
    lines = out.splitlines()
    assert not any(line.strip().startswith(FAKE_LINE) for line in lines), out[-2000:]
    if must_show and result.exit_code == 0:
        # Shown, escaped, with its brackets as typed.
        assert "\\x1b]0;owned\\x07" in out, out[-2000:]
        assert "[/bad]" in out, out[-2000:]


MODES = ["pipe", "terminal"]


def invoke(args: list[str], mode: str, monkeypatch: pytest.MonkeyPatch) -> Result:
    """``costguard args`` in a pipe, or as on a terminal: rich's console is asked to act as
    one (``FORCE_COLOR``, as a terminal would make it) and click keeps every escape."""
    if mode == "terminal":
        monkeypatch.setenv("FORCE_COLOR", "1")
    else:
        monkeypatch.delenv("FORCE_COLOR", raising=False)
        monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    return CliRunner().invoke(cli, args, color=mode == "terminal", catch_exceptions=False)


# -- jobs status: region, status, reason, kept_stopped, instance, checkpoint reason -------


#: Where a forged value goes: costguard's own writer would refuse to write it, so a record
#: is written with this in its place and the stored JSON is then rewritten, as a forger would.
MARK = "forged-value"


def forge(store: Store, path: str, **top: Any) -> None:
    """Rewrite the JSON record at ``path``: every string ``MARK`` becomes :data:`HOSTILE`,
    and ``top``'s fields are set at its top level."""

    def swap(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        if isinstance(value, list):
            return [swap(v) for v in value]
        return HOSTILE if value == MARK else value

    doc = {**swap(json.loads(store.get(path))), **top}
    store.put(path, json.dumps(doc).encode())


def forged_job(store: Store) -> None:
    """A job.json as anyone who can write the store may write it: its region, zone,
    instance, status, reason and kept instances carry :data:`HOSTILE`."""
    now = time.time()
    spec = JobSpec("cg-me-20261202-201512-a1b2c3", "local", "T4", 1, ("local",), True,
                   store.url, ("true",), "me", now - 60, datetime.now(UTC))  # fmt: skip
    offer = Offer("local", MARK, MARK, Market.SPOT, Decimal("0.5"), "T4", 1, zone=MARK)
    handle = Handle("local", MARK, MARK, extra={"pid": "1"})
    attempt = Attempt(1, offer, now - 50, handle, now - 10, AttemptOutcome.SUCCEEDED, 0,
                      detail=MARK)  # fmt: skip
    save_job(store, Job(spec, (attempt,), status="succeeded", reason=MARK, kept_stopped=(MARK,)))
    forge(store, JOB_FILE, status=HOSTILE)


def forged_checkpoint(store: Store, step: int, reason: str = HOSTILE) -> Manifest:
    """A complete checkpoint whose manifest carries ``reason``."""
    name = checkpoint_name(step, f"{step:08x}")
    data = b"payload"
    store.put(f"{name}/state.pt", data)
    manifest = Manifest(name, step, time.time(), (ObjectEntry("state.pt", len(data),
                        hashlib.sha256(data).hexdigest()),), reason=reason)  # fmt: skip
    store.put(manifest.manifest_path, manifest.to_json().encode())
    return manifest


@pytest.mark.parametrize("mode", MODES)
def test_jobs_status_shows_a_forged_job_escaped(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store.open(str(tmp_path / "ckpt"))
    forged_job(store)
    forged_checkpoint(store, 10)
    result = invoke(["jobs", "status", store.url], mode, monkeypatch)
    assert_clean(result)


def test_jobs_status_json_stays_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store.open(str(tmp_path / "ckpt"))
    forged_job(store)
    result = invoke(["jobs", "status", store.url, "--format", "json"], "terminal", monkeypatch)
    if result.exit_code == 0:
        assert json.loads(result.stdout)["reason"] == HOSTILE
    assert_clean(result, must_show=False)


# -- checkpoint ls / verify: the manifest's reason ----------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_checkpoint_ls_shows_a_manifest_reason_escaped(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store.open(str(tmp_path / "ckpt"))
    forged_checkpoint(store, 10, reason=HOSTILE.replace(":", ""))
    assert_clean(invoke(["checkpoint", "ls", store.url], mode, monkeypatch))


def test_checkpoint_ls_json_stays_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store.open(str(tmp_path / "ckpt"))
    forged_checkpoint(store, 10)
    listed = invoke(["checkpoint", "ls", store.url, "--format", "json"], "terminal", monkeypatch)
    assert_clean(listed, must_show=False)
    assert json.loads(listed.stdout)["checkpoints"][0]["reason"] == HOSTILE[:200]


# -- estimate --from-run: the device the pace names ---------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("gpu", [[], ["--gpu", "a10g", "--speedup", "1"]], ids=["own", "a10g"])
def test_estimate_from_run_shows_the_pace_device_escaped(
    mode: str, gpu: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from costguard.checkpoint.pace import PACE_FILE, Pace, write_pace

    store = Store.open(str(tmp_path / "run1"))
    write_pace(store, Pace(390, 195.0, 400, 2e9, 2e9 - 200, device=MARK, host=MARK))
    forge(store, PACE_FILE)
    args = ["estimate", "--from-run", store.url, "--steps", "1000", *gpu]
    assert_clean(invoke(args, mode, monkeypatch))


# -- spend: tag values and group keys, table and CSV --------------------------------------

#: Group keys a labmate can put in a tag: terminal escapes, markup, spreadsheet formulas.
FORMULAS = ["=cmd|' /C calc'!A0", "+1+1", "-2+3", "@SUM(1,1)", '=HYPERLINK("http://evil.example")',
            "\t=1+1", "\r=1+1", " =1+1", "\uff1d1+1"]  # fmt: skip


def hostile_export(path: Path, jobs: list[str]) -> Path:
    """A FOCUS export with one charge per job tag in ``jobs``, and a credit (negative)."""
    header = ("ProviderName,BillingAccountId,SubAccountId,ServiceName,ChargeCategory,ChargeClass,"
              "ChargeDescription,CommitmentDiscountId,BillingCurrency,BillingPeriodStart,"
              "BillingPeriodEnd,ChargePeriodStart,ChargePeriodEnd,BilledCost,EffectiveCost,"
              "ListCost,Tags")  # fmt: skip
    import csv

    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(header.split(","))
        for n, job in enumerate(jobs):
            tags = json.dumps({"costguard:job": job, "costguard:owner": HOSTILE})
            cost = "-4.21" if n == 0 else "1.50"
            writer.writerow(["AWS", "999988887777", "111122223333", "EC2", "Usage", "", "hour",
                             "", "USD", "2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z",
                             "2026-11-03T10:00:00Z", "2026-11-03T11:00:00Z", cost, cost, cost,
                             tags])  # fmt: skip
    return path


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("by", ["job", "owner"])
def test_spend_shows_tag_values_escaped(
    mode: str, by: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    export = hostile_export(tmp_path / "focus.csv", [HOSTILE, *FORMULAS])
    assert_clean(invoke(["spend", str(export), "--by", by], mode, monkeypatch))


def test_spend_csv_neutralises_formulas_and_keeps_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import csv
    import io

    export = hostile_export(tmp_path / "focus.csv", [*FORMULAS, HOSTILE])
    result = invoke(["spend", str(export), "--format", "csv"], "pipe", monkeypatch)
    assert_clean(result, must_show=False)
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) >= 6  # the export trims a key's blanks: "\t=1+1" is "=1+1" there
    for row in rows:
        for cell in (row["key"], row["billed_usd"], row["effective_usd"]):
            if cell.lstrip(" ")[:1] in set("=+-@\t\r\uff1d"):
                Decimal(cell)  # only a number may start so: a spreadsheet reads it as one
    keys = {row["key"] for row in rows}
    for neutral in ("'=cmd|' /C calc'!A0", "'@SUM(1,1)", "'+1+1", "'=1+1", "'-2+3", "'\uff1d1+1"):
        assert neutral in keys
    amounts = {row["key"]: Decimal(row["billed_usd"]) for row in rows}
    assert amounts["'=cmd|' /C calc'!A0"] == Decimal("-4.21")  # a credit stays a number


# -- every renderer, any string -----------------------------------------------------------

#: What may reach a terminal raw: none of these, besides the CLI's own newlines and, on a
#: terminal, rich's own style codes (SGR: ``ESC [ ... m``).
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
SGR = re.compile("\x1b\\[[0-9;]*m")
TRICKY = st.lists(
    st.sampled_from(list("ab [/]=+-@:\\\"',;") + [chr(c) for c in range(32)] + ["\x7f", "\x9b",
                    "\x85", "\u202e", "\u2066", "\u2028", "\ud800", "[link=http://e.x]", "[/]",
                    "[bold]", "\x1b]8;;http://e.x\x1b\\", "\x1b[2J", "\uff1d"]),
    max_size=20,
).map("".join)  # fmt: skip


@settings(max_examples=150, derandomize=True, deadline=None)
@given(values=st.lists(st.one_of(TRICKY, st.text(max_size=40)), min_size=1, max_size=4),
       mode=st.sampled_from(MODES))  # fmt: skip
def test_no_string_survives_a_renderer_raw(values: list[str], mode: str) -> None:
    from costguard.cli import render

    columns = [render.Column("name"), render.Column("note", prose=True)]
    rows = [[v, v] for v in values]
    env = {"FORCE_COLOR": "1"} if mode == "terminal" else {"FORCE_COLOR": None}
    runner = CliRunner(env=env)
    with runner.isolation(color=mode == "terminal") as (out, err, *_):
        render.print_table("title " + values[0], columns, rows)
        render.print_prose(values[-1])
        render.print_notes(values, heading="Notes:")
        render.print_notes(values, err=True)
        printed = out.getvalue().decode() + err.getvalue().decode()
    text = SGR.sub("", printed)
    assert not UNSAFE.search(text), repr(text)
    assert "\x1b" not in text, repr(text)
    if mode == "pipe":  # no value's newline starts a line: title, header, rows; a paragraph;
        # a heading and a note per value; a note per value on stderr
        assert len(text.splitlines()) == 2 + len(values) + 1 + 1 + 2 * len(values), repr(text)


@settings(max_examples=150, derandomize=True, deadline=None)
@given(st.lists(st.one_of(TRICKY, st.text(max_size=40), st.decimals(-(10**9), 10**9,
                allow_infinity=False, places=4)), min_size=1, max_size=6))  # fmt: skip
def test_no_csv_cell_is_a_formula_and_numbers_stay_numbers(values: list[object]) -> None:
    import csv
    import io

    from costguard.cli import render

    with CliRunner().isolation() as (out, *_):
        render.print_csv(["key", "usd"], [{"key": v, "usd": v} for v in values])
        sys.stdout.flush()
        printed = out.getvalue().decode()
    rows = list(csv.DictReader(io.StringIO(printed)))
    assert len(rows) == len(values)
    for value, row in zip(values, rows, strict=True):
        for cell in row.values():
            assert not UNSAFE.search(cell), repr(cell)
            if cell.lstrip(" ")[:1] in set("=+-@\uff1d\uff0b\uff0d\uff20"):
                Decimal(cell)  # only a number may start so
        if isinstance(value, Decimal):
            assert Decimal(row["usd"]) == value.normalize() or Decimal(row["usd"]) == value


# -- reap and burn: an EC2 instance's Name and tags ----------------------------------------


#: What EC2 carries (its XML has no C0 control but ESC's 8-bit twin CSI, U+009B): a CSI
#: sequence, markup, a bidi override and a newline before a fake line.
EC2_HOSTILE = f"x\x9b2J[/bad][link=https://evil.example]click[/link]\u202eevil\n{FAKE_LINE}"


@pytest.mark.parametrize("mode", MODES)
def test_reap_and_burn_show_ec2_names_and_tags_escaped(
    mode: str, aws_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    from tests.servers.aws import launch_instance

    ec2 = boto3.client("ec2", region_name="us-east-1")
    hours_ago = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=3)
    launch_instance(ec2, EC2_HOSTILE, at=hours_ago, tags={"costguard:job": EC2_HOSTILE})
    for command in ("reap", "burn"):
        result = invoke([command, "--region", "us-east-1"], mode, monkeypatch)
        assert_clean(result, must_show=False)
        if command == "reap" and mode == "pipe":  # the Name whole, its controls escaped
            assert "\\x9b2J[/bad][link=https://evil.example]" in result.stdout


# -- alarm status: a budget as the cloud lists it ------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_alarm_status_shows_a_budget_name_escaped(
    mode: str, aws_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    boto3.client("budgets", region_name="us-east-1").create_budget(
        AccountId="123456789012",
        Budget={
            "BudgetName": f"costguard-{HOSTILE}",  # anyone with budgets:CreateBudget
            "BudgetLimit": {"Amount": "5", "Unit": "USD"},
            "TimeUnit": "MONTHLY",
            "BudgetType": "COST",
        },
    )
    assert_clean(invoke(["alarm", "status"], mode, monkeypatch))


# -- run --sync-dir: the folder a manifest names, restored ---------------------------------


def test_run_sync_dir_says_the_restored_path_escaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from costguard.checkpoint.manifest import FOLDER_FORMAT_VERSION

    store = Store.open(str(tmp_path / "ckpt"))
    name = checkpoint_name(5, "00000005")
    data = b"weights"
    store.put(f"{name}/model.bin", data)
    path = "checkpoint-5\x1b]0;owned\x07\u202e[/bad]"
    extra = {"folder": {"path": path, "files": {"model.bin": f"{path}/model.bin"}, "kind": "hf"}}
    manifest = Manifest(name, 5, time.time(), (ObjectEntry("model.bin", len(data),
                        hashlib.sha256(data).hexdigest()),), format_version=FOLDER_FORMAT_VERSION,
                        extra=extra)  # fmt: skip
    store.put(manifest.manifest_path, manifest.to_json().encode())
    out = tmp_path / "out"
    args = ["run", "--checkpoint", store.url, "--sync-dir", str(out), "--", sys.executable,
            "-c", "pass"]  # fmt: skip
    result = invoke(args, "pipe", monkeypatch)
    assert_clean(result, must_show=False)
    if (out / path).exists():  # restored: it said so, escaped
        assert "restored checkpoint-5\\x1b]0;owned\\x07\\u202e[/bad]" in result.stderr


def test_spend_json_stays_json_and_keeps_the_values_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    export = hostile_export(tmp_path / "focus.csv", [HOSTILE, *FORMULAS])
    result = invoke(["spend", str(export), "--format", "json"], "terminal", monkeypatch)
    assert_clean(result, must_show=False)
    assert all(ord(c) < 128 for c in result.stdout)  # json.dump escapes the rest
    keys = {group["key"] for group in json.loads(result.stdout)["groups"]}
    assert HOSTILE in keys  # exact: escaping JSON is json.dump's, not ours
    assert "=cmd|' /C calc'!A0" in keys
