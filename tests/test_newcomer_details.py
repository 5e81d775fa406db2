"""Small things a newcomer meets in the first hour (issue 33, item 6)."""

from __future__ import annotations

import pytest

import costguard
from costguard.checkpoint.notices import Notice
from costguard.errors import InputError


def test_the_python_api_asks_for_hours_as_the_cli_does() -> None:
    with pytest.raises(InputError) as info:
        costguard.estimate(gpu="a10g")
    assert info.value.message == "hours is required: how long the run takes"
    assert info.value.hint == "e.g. costguard.estimate(gpu='a10g', hours=8)"
    assumptions = costguard.estimate(gpu="a10g", hours=8).document()["assumptions"]
    assert "Compute: price per hour x 8 h x 1 instance(s)" in assumptions


def test_a_signal_notice_is_named_once() -> None:
    assert Notice("signal", "signal", None, "SIGTERM").describe() == "signal notice (SIGTERM)"
    assert Notice("aws", "terminate", None).describe() == "aws terminate notice"
