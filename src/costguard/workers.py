"""Worker threads that an exception, Ctrl-C included, does not wait for.

``concurrent.futures.ThreadPoolExecutor`` as a context manager waits for every call
submitted, on an exception's way out too: a Ctrl-C in the main thread then waits for the
price pages or billing files still being read (a refresh went on for 21.5 s). Use
:func:`worker_pool` where the workers only read (their results are given to the main
thread, which writes): it waits on success only; on an exception it cancels the calls not
started and returns at once. The console entry point (:func:`costguard.cli.main`) then
ends the process after a Ctrl-C without joining the threads left, once the main thread has
unwound (its own clean-up done).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager


@contextmanager
def worker_pool(workers: int, name: str) -> Iterator[ThreadPoolExecutor]:
    """A thread pool of ``workers`` threads named ``name-N``, waited for on success only.

    >>> with worker_pool(2, "demo") as pool:
    ...     sorted(pool.map(abs, [-2, 1]))
    [1, 2]
    """
    pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix=name)
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
