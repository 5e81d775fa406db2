"""A training loop whose step time is steady, for the pilot's and the projection's accuracy
tests: each step ends on its own tick, ``--sleep`` seconds after the one before, as a loop
bound by a GPU keeps its pace whatever else the host runs. A step that a busy machine woke
a little late is made up by the next, so neither a pilot nor the run it predicts depends on
the machine's load at the time. A stall of a step or more (a save, the first save's
set-up) is not made up: the pace counts it apart from the steps, and the steps after it
keep their length.

Run as a child of ``costguard run`` or ``costguard pilot``. It prints ``LOOP <seconds>``:
the wall time of its steps (after the restore, before the final save), which a pilot's
projection is compared with.
"""

from __future__ import annotations

import argparse
import time

from costguard.checkpoint import Checkpointer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--sleep", type=float, required=True)
    args = parser.parse_args()
    ckpt = Checkpointer.from_env(default="checkpoints/")
    extra = {"done": 0}
    start = ckpt.restore(extra=extra)
    began = tick = time.monotonic()
    for step in range(start, args.steps):
        tick += args.sleep
        time.sleep(max(0.0, tick - time.monotonic()))
        extra["done"] = step + 1
        ckpt.step(step, extra=extra)
        now = time.monotonic()
        if now - tick >= args.sleep:  # a stall, not a late wake-up
            tick = now
    print(f"LOOP {time.monotonic() - began:.4f}", flush=True)
    ckpt.close()


if __name__ == "__main__":
    main()
