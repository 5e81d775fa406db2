from __future__ import annotations

from decimal import Decimal

import pytest

from costguard.errors import UnknownNameError, did_you_mean
from costguard.money import format_usd, gb_to_gib, parse_decimal, usd_str
from costguard.pricing.gpus import canonical_gpu


@pytest.mark.parametrize(
    ("typed", "canonical"),
    [
        ("a10g", "A10G"),
        ("A10G", "A10G"),
        ("a10", "A10"),
        ("l4", "L4"),
        ("t4", "T4"),
        ("v100", "V100"),
        ("a100", "A100"),
        ("a100-80gb", "A100-80GB"),
        ("A100 80GB", "A100-80GB"),
        ("nvidia_h100", "H100"),
        ("h200", "H200"),
        ("L40S", "L40S"),
        ("b200", "B200"),
        ("H100-mega", "H100-MEGA"),
    ],
)
def test_gpu_aliases(typed: str, canonical: str) -> None:
    assert canonical_gpu(typed) == canonical


def test_unknown_gpu_suggests_close_names() -> None:
    with pytest.raises(UnknownNameError) as info:
        canonical_gpu("h1000")
    assert "H100" in (info.value.hint or "")
    assert info.value.exit_code == 2


def test_unknown_gpu_without_close_match_lists_names() -> None:
    with pytest.raises(UnknownNameError) as info:
        canonical_gpu("zzzz")
    assert "known GPU names" in (info.value.hint or "")


def test_table_only_accelerators_are_found() -> None:
    assert canonical_gpu("TPU-V3-8", known=["tpu-v3-8"]) == "tpu-v3-8"


def test_did_you_mean_none_when_nothing_close() -> None:
    assert did_you_mean("qqqq", ["aws", "gcp"]) is None


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "abc", "", "1e", "0x10"])
def test_parse_decimal_refuses_non_numbers(text: str) -> None:
    with pytest.raises(ValueError, match="number"):
        parse_decimal(text)


def test_parse_decimal_keeps_float_digits() -> None:
    assert parse_decimal(0.1) == Decimal("0.1")
    assert parse_decimal("1_000") == Decimal(1000)


def test_usd_str_is_exact_and_plain() -> None:
    assert usd_str(Decimal("32.192000")) == "32.192"
    assert usd_str(Decimal("1E+2")) == "100"
    assert usd_str(Decimal("0.0000004")) == "0"
    assert usd_str(Decimal("0.35068493150684931")) == "0.350685"


def test_format_usd() -> None:
    assert format_usd(Decimal("1234.567")) == "$1,234.57"
    assert format_usd(Decimal("1.006"), rate=True) == "$1.006"
    assert format_usd(Decimal("0.5"), rate=True) == "$0.50"
    assert format_usd(Decimal("55.04"), rate=True) == "$55.04"


def test_gib_conversion() -> None:
    assert gb_to_gib(Decimal("1.073741824")) == 1
    assert gb_to_gib(Decimal(100)) < 100
