"""Property tests are reproducible: the profile that ``tests/conftest.py`` loads by default
(for the README's test command and CI alike) draws the same examples on every run, and
``--hypothesis-profile wide`` is there to search at random on purpose."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


def _draws() -> list[int]:
    seen: list[int] = []

    @settings(max_examples=25)
    @given(st.integers())
    def record(number: int) -> None:
        seen.append(number)

    record()
    return seen


def test_a_property_test_draws_the_same_examples_on_every_run(
    pytestconfig: pytest.Config,
) -> None:
    active = settings()  # the profile loaded now
    if pytestconfig.getoption("hypothesis_profile") not in (None, "repeatable"):
        assert not active.derandomize  # the wide search, asked for
        return
    assert active.derandomize
    assert active.database is None  # nothing replayed from an earlier run
    assert _draws() == _draws()


def test_the_wide_search_is_random() -> None:
    wide = settings.get_profile("wide")
    assert not wide.derandomize
    assert wide.max_examples > settings.get_profile("repeatable").max_examples
