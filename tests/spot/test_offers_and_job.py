"""Offers from the price tables, job.json round trips, and the exit record `costguard run`
writes when it runs an attempt of a launched job."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from costguard.checkpoint.store import Store
from costguard.errors import InputError
from costguard.pricing.catalog import Catalog
from costguard.spot.job import (
    Job,
    JobError,
    JobSpec,
    Simulation,
    load_job,
    parse_job,
    read_exit_record,
    save_job,
)
from costguard.spot.launcher.base import Handle, Market
from costguard.spot.offers import find_offers, require_offers
from costguard.spot.recovery import Attempt, AttemptOutcome


def test_offers_fit_and_come_cheapest_first(catalog: Catalog) -> None:
    offers = find_offers(catalog, gpu="A10G", provider="aws")
    assert offers
    assert all(o.provider == "aws" and o.gpu == "A10G" for o in offers)
    prices = [o.usd_per_hour for o in offers]
    assert prices == sorted(prices)
    assert {o.market for o in offers} == {Market.SPOT, Market.ON_DEMAND}
    # One offer per region and market: the cheapest instance type there.
    keys = [(o.region, o.market) for o in offers]
    assert len(keys) == len(set(keys))
    regional = find_offers(catalog, gpu="A10G", provider="aws", regions=("us-west-2",))
    assert {o.region for o in regional} == {"us-west-2"}
    four = find_offers(catalog, gpu="A10G", gpu_count=4, provider="aws")
    assert four
    assert all(o.gpu_count == 4 for o in four)


def test_the_price_cap_applies_to_spot_only(catalog: Catalog) -> None:
    cap = Decimal("0.45")
    offers = find_offers(catalog, gpu="A10G", provider="aws", max_usd_per_hour=cap)
    assert all(o.usd_per_hour <= cap for o in offers if o.market is Market.SPOT)
    assert any(o.market is Market.ON_DEMAND and o.usd_per_hour > cap for o in offers)


def test_local_offers_are_the_clouds_relabelled(catalog: Catalog) -> None:
    local = find_offers(catalog, gpu="T4", provider="local")
    clouds = {o.provider for o in find_offers(catalog, gpu="T4", provider="aws")} | {
        o.provider for o in find_offers(catalog, gpu="T4", provider="gcp")
    }
    assert {o.provider for o in local} == {"local"}
    assert {o.region.split(":")[0] for o in local} >= clouds
    assert local[0].usd_per_hour == min(o.usd_per_hour for o in local)


def test_no_offer_and_a_cap_below_the_price_are_input_errors(catalog: Catalog) -> None:
    with pytest.raises(InputError, match="below the cheapest spot price") as raised:
        require_offers(
            catalog,
            gpu="A10G",
            gpu_count=1,
            provider="aws",
            regions=(),
            spot=True,
            max_usd_per_hour=Decimal("0.01"),
        )
    assert raised.value.hint
    assert "raise --max-price" in raised.value.hint
    with pytest.raises(InputError, match="no spot offer for 3 x A10G"):
        require_offers(
            catalog,
            gpu="A10G",
            gpu_count=3,
            provider="aws",
            regions=(),
            spot=True,
            max_usd_per_hour=None,
        )


def spec(url: str, **changes: object) -> JobSpec:
    base = JobSpec(
        job_id="cg-test-1",
        provider="local",
        gpu="T4",
        gpu_count=1,
        regions=("us-east-1",),
        spot=True,
        checkpoint_url=url,
        command=("python", "train.py", "--lr", "3e-4"),
        owner="me",
        created_unix=1000.0,
        expires_at=datetime(2030, 1, 1, tzinfo=UTC),
        max_usd_per_hour=Decimal("0.3"),
        max_total_usd=Decimal("12.50"),
        hours=Decimal("2.5"),
        options={"image": "ami-0123456789abcdef0"},
        sync_dir="/home/me/out",
        simulation=Simulation(every_s=30.0, seed=4, notice_s=5.0, metadata_port=4567),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_job_json_round_trips_exactly(tmp_path: Path, catalog: Catalog) -> None:
    store = Store.open(tmp_path / "ckpt")
    offer = find_offers(catalog, gpu="T4", provider="local")[0]
    attempt = Attempt(
        1,
        offer,
        1000.5,
        handle=Handle("local", offer.region, "local-42", extra={"pid": "42"}),
        ended_unix=1100.25,
        outcome=AttemptOutcome.PREEMPTED,
        exit_code=75,
        detail="simulated",
        resumed_step=None,
        last_step=12,
        lost_s=0.0,
        lost_steps=0,
    )
    job = Job(spec(store.url), attempts=(attempt, Attempt(2, offer, 1101.0)))
    saved = save_job(store, job)
    loaded = load_job(store)
    assert loaded == saved
    assert loaded.current is not None
    assert loaded.current.number == 2
    assert loaded.attempts[0].offer.usd_per_hour == offer.usd_per_hour  # exact Decimal
    # The checkpoint library ignores the job's files.
    from costguard.checkpoint.inventory import inventory

    assert inventory(store) == []


def test_a_foreign_job_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(JobError, match="not a costguard record"):
        parse_job(b'{"version": 99}')
    store = Store.open(tmp_path / "empty")
    with pytest.raises(InputError, match="no costguard job"):
        load_job(store)


def test_costguard_run_writes_the_exit_record_of_a_launched_attempt(
    tmp_path: Path, spot_env: Callable[..., dict[str, str]]
) -> None:
    url = tmp_path / "ckpt"
    env = spot_env(COSTGUARD_JOB_ID="cg-test-1", COSTGUARD_JOB_ATTEMPT="3", COSTGUARD_CLOUD="none")
    argv = [sys.executable, "-m", "costguard", "run", "--checkpoint", str(url), "--"]
    done = subprocess.run(
        [*argv, sys.executable, "-c", "raise SystemExit(3)"], env=env, timeout=120, check=False
    )
    assert done.returncode == 3
    store = Store.open(url)
    record = read_exit_record(store, 3, "cg-test-1")
    assert record is not None
    assert (record.exit_code, record.last_step) == (3, None)
    assert record.job_id == "cg-test-1"
    # A record of another job at the same URL does not count.
    assert read_exit_record(store, 3, "cg-other") is None
    # Without the job variables nothing is written.
    plain = {k: v for k, v in env.items() if not k.startswith("COSTGUARD_JOB_")}
    subprocess.run([*argv, sys.executable, "-c", "pass"], env=plain, timeout=120, check=True)
    assert sorted(store.listing()) == ["job/attempt-3.exit.json"]
