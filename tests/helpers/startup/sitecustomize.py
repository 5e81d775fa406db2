"""Run at the start of every Python process the tests start: ``tests/conftest.py`` puts
this folder on ``PYTHONPATH`` (the folder holds this file alone: whatever is in it becomes
importable in every child).

The cyclic garbage collector walks every object the process holds at each collection of
its oldest generation. Importing torch and its dynamo leaves 280,000 long-lived objects
that the collector tracks (360,000 with transformers' Trainer), and a process pays
several such walks for garbage that is almost never there: measured with
``gc.callbacks``, 0.92 of a training child's 5.3 CPU-s (17%), and over half of torchrun's
agent thread. Here the oldest generation is collected a hundred times less often; the
young ones, where a process's cyclic garbage is, are collected as before, and nothing
else about the process changes. The tests start hundreds of such processes: in a profile
of the whole suite, the collector was 19% of all the CPU it used.

A ``sitecustomize`` of the interpreter's own (some distributions ship one) is shadowed in
the tests' children; the tests' environments have none.
"""

from __future__ import annotations

import gc

#: Collections of the middle generation between two of the oldest (CPython's default: 10).
OLDEST_EVERY = 1000


def collect_old_objects_rarely() -> None:
    """The oldest generation's threshold raised; the young generations' left as they are."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, OLDEST_EVERY)


collect_old_objects_rarely()
