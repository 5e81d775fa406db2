"""A SLURM allocation priced in service units: GPUs x hours x SU per GPU-hour."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from costguard.errors import InputError
from costguard.pricing.estimate import EstimateRequest
from costguard.pricing.slurm import SlurmRate, slurm_assumptions, slurm_option

D = Decimal


def test_service_units_count_every_gpu_of_every_instance() -> None:
    request = EstimateRequest(gpu="A100", hours=D("12.5"), count=3, gpus_per_instance=4)
    option = slurm_option(request, SlurmRate(su_per_gpu_hour=D("1.5")))
    assert option.gpus == 12
    assert option.gpu_hours == D("150")
    assert option.service_units == D("225")
    assert option.usd is None  # an allocation, not billed
    assert option.budget_share is None
    assert option.within_budget is None


def test_dollars_only_with_a_value_per_su() -> None:
    request = EstimateRequest(gpu="H100", hours=D(10), count=2)
    rate = SlurmRate(su_per_gpu_hour=D(64), usd_per_su=D("0.025"))
    option = slurm_option(request, rate)
    assert option.service_units == D(1280)
    assert option.usd == D("32.000")


def test_budget_share_and_fit() -> None:
    request = EstimateRequest(gpu="A100", hours=D(100), count=1)
    fits = slurm_option(request, SlurmRate(su_per_gpu_hour=D(50), su_budget=D(10000)))
    assert fits.budget_share == D("0.5")
    assert fits.within_budget is True
    exact = slurm_option(request, SlurmRate(su_per_gpu_hour=D(50), su_budget=D(5000)))
    assert exact.within_budget is True
    short = slurm_option(request, SlurmRate(su_per_gpu_hour=D(50), su_budget=D(4999)))
    assert short.within_budget is False
    assert short.budget_share == D("5000") / D("4999")


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"su_per_gpu_hour": D(0)}, "--su-per-gpu-hour"),
        ({"su_per_gpu_hour": D(-3)}, "--su-per-gpu-hour"),
        ({"su_per_gpu_hour": D(1), "usd_per_su": D("-0.1")}, "--usd-per-su"),
        ({"su_per_gpu_hour": D(1), "su_budget": D(0)}, "--su-budget"),
    ],
)
def test_rate_validation(kwargs: dict[str, Decimal], flag: str) -> None:
    with pytest.raises(InputError, match=flag) as caught:
        SlurmRate(**kwargs)
    assert caught.value.hint


def test_needs_a_gpu() -> None:
    request = EstimateRequest(instance_type="g5.xlarge", hours=D(1))
    with pytest.raises(InputError, match="--gpu"):
        slurm_option(request, SlurmRate(su_per_gpu_hour=D(1)))


def test_assumptions_say_billed_or_not() -> None:
    request = EstimateRequest(gpu="A100", hours=D(2), count=2)
    unbilled = slurm_assumptions(slurm_option(request, SlurmRate(su_per_gpu_hour=D(8))))
    assert any("2 GPU(s) x 2 h x 8 SU per GPU-hour" in line for line in unbilled)
    assert any("not billed" in line for line in unbilled)
    billed = slurm_assumptions(
        slurm_option(request, SlurmRate(su_per_gpu_hour=D(8), usd_per_su=D("0.5")))
    )
    assert not any("not billed" in line for line in billed)
    assert any("$0.50 per SU" in line for line in billed)


@given(
    hours=st.decimals(min_value=D("0.01"), max_value=D(1000), places=2),
    count=st.integers(1, 64),
    gpus=st.integers(1, 8),
    rate=st.decimals(min_value=D("0.01"), max_value=D(500), places=2),
)
def test_service_units_are_linear(hours: Decimal, count: int, gpus: int, rate: Decimal) -> None:
    def units(h: Decimal, c: int) -> Decimal:
        request = EstimateRequest(gpu="A100", hours=h, count=c, gpus_per_instance=gpus)
        return slurm_option(request, SlurmRate(su_per_gpu_hour=rate)).service_units

    assert units(hours, count) == hours * count * gpus * rate
    assert units(hours * 2, count) == 2 * units(hours, count)
    assert units(hours, count * 2) == 2 * units(hours, count)
