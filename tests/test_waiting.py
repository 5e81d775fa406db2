"""The tests' one wait helper (tests/helpers/waiting.py): it returns what was waited for,
fails naming it when it never comes, and ends early when told to."""

from __future__ import annotations

import threading

import pytest

from tests.helpers.waiting import WaitTimeoutError, wait_for


def test_it_returns_the_first_truthy_value_another_thread_makes() -> None:
    box: list[str] = []
    timer = threading.Timer(0.1, box.append, ["done"])
    timer.start()
    try:
        assert wait_for(lambda: box and box[0], "the timer", timeout_s=10, poll_s=0.01) == "done"
    finally:
        timer.cancel()


def test_it_fails_naming_what_never_came() -> None:
    with pytest.raises(WaitTimeoutError, match="for the impossible; it did not happen"):
        wait_for(lambda: False, "the impossible", timeout_s=0.05, poll_s=0.01)


def test_a_condition_that_is_true_at_once_is_not_waited_for_even_with_no_time() -> None:
    assert wait_for(lambda: 3, "three", timeout_s=0) == 3


def test_alive_ends_the_wait_early_and_ignored_errors_mean_not_yet() -> None:
    calls: list[int] = []

    def starting() -> bool:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError
        return True

    assert wait_for(starting, "a server", poll_s=0, ignoring=(ConnectionRefusedError,))
    assert len(calls) == 3

    def ended() -> None:
        raise AssertionError("the process ended")

    with pytest.raises(AssertionError, match="the process ended"):
        wait_for(lambda: False, "a line", alive=ended)
