"""The launch rules without click: the request's checks, the spec, the first launch."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from costguard.errors import InputError
from costguard.pricing.tables import load_catalog
from costguard.spot.job import JobSpec
from costguard.spot.launcher.base import Market, Offer
from costguard.spot.offers import find_offers
from costguard.spot.prepare import (
    LaunchRequest,
    check_request,
    first_launch,
    new_spec,
    parse_option_pairs,
    simulation_for,
    sync_dir_for,
)
from costguard.spot.report import estimate_lines

REQUEST = LaunchRequest("aws", "a10g", ("python", "train.py"), "s3://bucket/run1")
SPOT = Offer("aws", "us-east-1", "g5.xlarge", Market.SPOT, Decimal("0.42"), "A10G", 1)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"command": ()}, "no command to run"),
        ({"gpu": None}, "--gpu is required"),
        ({"checkpoint_url": ""}, "--checkpoint is required: a spot instance is preempted"),
        (
            {"checkpoint_url": None, "spot": False},
            "--checkpoint is required: the job's state is kept",
        ),
        ({"checkpoint_url": "ckpt/"}, "cannot write checkpoints to the local folder 'ckpt/'"),
        ({"seed": 1, "preempt_at": "30"}, "--preempt-at, --seed only apply to --provider local"),
    ],
)
def test_a_bad_request_is_refused_before_anything_is_read(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(InputError, match=message):
        check_request(replace(REQUEST, **change))


def test_a_good_request_passes_and_local_takes_a_folder() -> None:
    check_request(REQUEST)
    check_request(replace(REQUEST, provider="local", checkpoint_url="ckpt/", seed=3))


@pytest.mark.parametrize(
    ("provider", "sync_dir", "message"),
    [
        ("aws", " ", "--sync-dir is empty"),
        ("aws", "s3://bucket/out", "--sync-dir 's3://bucket/out' is a URL"),
        ("local", "gs://bucket/out", "is a URL"),
        ("gcp", "../elsewhere/out", "leaves the folder it names"),
        ("azure", "/mnt/data/../../etc", "leaves the folder it names"),
        ("local", "{file}", "is a file, not the trainer's output folder"),
    ],
)
def test_a_bad_sync_dir_is_refused_before_anything_is_read(
    tmp_path: Path, provider: str, sync_dir: str, message: str
) -> None:
    afile = tmp_path / "train.log"
    afile.write_text("x")
    request = replace(REQUEST, provider=provider, sync_dir=sync_dir.format(file=afile))
    with pytest.raises(InputError, match=message) as refused:
        sync_dir_for(request)
    assert refused.value.hint


def test_the_sync_dir_is_the_instances_own_or_made_absolute_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On a cloud instance it is a path there (a relative one is under the job's workdir,
    # where the boot script starts costguard run): kept as given.
    assert sync_dir_for(REQUEST) is None
    assert sync_dir_for(replace(REQUEST, sync_dir="out/")) == "out/"
    assert sync_dir_for(replace(REQUEST, sync_dir="/mnt/nvme/out")) == "/mnt/nvme/out"
    # Simulated here: the attempts may start in another folder (--attach) than this one.
    monkeypatch.chdir(tmp_path)
    local = replace(REQUEST, provider="local", checkpoint_url="ckpt/")
    assert sync_dir_for(replace(local, sync_dir="out/")) == str(tmp_path / "out")


def test_option_pairs_need_a_key_and_an_equals_sign() -> None:
    assert parse_option_pairs([" image = ami-1 ", "x="]) == {"image": "ami-1", "x": ""}
    for bad in ("image", "=ami-1"):
        with pytest.raises(InputError, match="is not KEY=VALUE"):
            parse_option_pairs([bad])


def test_the_simulation_is_local_only_and_one_schedule() -> None:
    assert simulation_for(REQUEST, Path("/s")) is None
    local = replace(REQUEST, provider="local")
    simulation = simulation_for(replace(local, preempt_at="30,90"), Path("/s"))
    assert simulation is not None
    assert simulation.at_s == (30.0, 90.0)
    with pytest.raises(InputError, match="exclude each other"):
        simulation_for(replace(local, preempt_at="30", preempt_every_s=10.0), Path("/s"))


def test_one_clock_reading_names_dates_and_expires_the_job() -> None:
    now = datetime(2026, 12, 1, 23, 59, 59, 999999, tzinfo=UTC)
    spec = new_spec(
        replace(REQUEST, timeout_hours=2.0, regions=("us-east-1", "us-east-1")),
        gpu="A10G",
        checkpoint_url=REQUEST.checkpoint_url or "",
        options={"image": "ami-1"},
        simulation=None,
        owner="me",
        now=now,
        token="abc123",
    )
    assert spec.job_id == "cg-me-20261201-235959-abc123"
    assert spec.created_unix == now.timestamp()
    assert spec.expires_at - now == timedelta(hours=2)
    assert spec.regions == ("us-east-1",)
    assert dict(spec.options) == {"image": "ami-1"}


def _spec(**change: Any) -> JobSpec:
    spec = new_spec(
        REQUEST,
        gpu="A10G",
        checkpoint_url="s3://bucket/run1",
        options={},
        simulation=None,
        owner="me",
        now=datetime(2026, 12, 1, tzinfo=UTC),
        token="t",
    )
    return replace(spec, **change)


def test_the_first_launch_is_decided_once_or_refused_with_the_reason() -> None:
    spec = _spec()
    assert first_launch(spec, [SPOT]).offer == SPOT
    with pytest.raises(InputError, match="no offer fits") as none:
        first_launch(spec, [])
    assert none.value.hint == "raise --max-total or pick a cheaper GPU"
    with pytest.raises(InputError, match="max-total"):
        first_launch(_spec(max_total_usd=Decimal("0.1")), [SPOT])


def test_the_estimate_lines_say_what_the_price_cap_does() -> None:
    spec = _spec(max_usd_per_hour=Decimal(1), hours=Decimal(10))
    lines = estimate_lines(spec, SPOT, None, "2026-11-30")
    assert lines[0] == "job cg-me-20261201-000000-t: 1 x A10G on aws: g5.xlarge spot in us-east-1"
    assert "  estimate: $4.20 for 10 h if nothing is preempted" in lines
    assert any("sent as the spot MaxPrice" in line for line in lines)


def test_the_estimate_lines_name_the_sync_dir_where_it_is() -> None:
    cloud = estimate_lines(_spec(sync_dir="out/"), SPOT, None, "2026-11-30")
    (line,) = [line for line in cloud if "--sync-dir" in line]
    assert line.startswith("  --sync-dir out/ on the instance (under its workdir")
    assert "kept in s3://bucket/run1" in line
    assert not any("--sync-dir" in line for line in estimate_lines(_spec(), SPOT, None, "x"))
    local = _spec(provider="local", sync_dir="/home/me/out")
    (line,) = [line for line in estimate_lines(local, SPOT, None, "x") if "--sync-dir" in line]
    assert line.startswith("  --sync-dir /home/me/out on this machine:")


def test_launch_picks_a_verified_price_and_names_a_cheaper_unverified_one() -> None:
    # 8 x H100 on AWS: ap-southeast-3's $7.5955/h spot is the tenth-of-on-demand
    # placeholder, cheaper than every spot price read from a market.
    offers = find_offers(load_catalog(), gpu="H100", gpu_count=8, provider="aws")
    placeholder = next(
        o for o in offers if o.region == "ap-southeast-3" and o.market is Market.SPOT
    )
    assert not placeholder.verified
    spec = _spec(gpu="H100", gpu_count=8)
    first = first_launch(spec, offers).offer
    assert first.verified
    assert first.region != "ap-southeast-3"
    assert first.usd_per_hour > placeholder.usd_per_hour
    said = estimate_lines(spec, first, None, "2026-11-30", offers)
    assert (
        "  a cheaper unverified price exists: p5.48xlarge spot in ap-southeast-3 at $7.5955/h"
        in said
    )
    # Where only unverified prices fit, the pick says it is one.
    only = [o for o in offers if not o.verified and o.market is Market.SPOT]
    alone = first_launch(spec, only).offer
    assert any(
        line.startswith("  unverified price:")
        for line in estimate_lines(spec, alone, None, "2026-11-30", only)
    )
