"""Count API records as they stream past, and report the count as it grows.

Library code never prints: the CLI passes a callback that moves a progress bar.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

_T = TypeVar("_T")

#: Report every this many records (a callback per record would cost more than parsing).
REPORT_EVERY = 500


class RecordCounter:
    """Wraps record streams; ``total`` is how many went past.

    >>> seen = []
    >>> counter = RecordCounter(seen.append)
    >>> list(counter(iter("abc")))
    ['a', 'b', 'c']
    >>> counter.total, seen
    (3, [3])
    """

    def __init__(self, progress: Callable[[int], object] | None = None) -> None:
        self.total = 0
        self._progress = progress

    def __call__(self, records: Iterable[_T]) -> Iterator[_T]:
        """Yield ``records``, counting them."""
        for record in records:
            self.total += 1
            if self._progress is not None and self.total % REPORT_EVERY == 0:
                self._progress(self.total)
            yield record
        if self._progress is not None:
            self._progress(self.total)
