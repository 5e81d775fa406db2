"""A script for the exit-line tests: it writes a Hugging Face-shaped checkpoint
(``out/checkpoint-N/`` with ``trainer_state.json`` saying ``global_step`` N of
``max_steps`` M), prints ``READY`` and waits; what it does on SIGTERM is ``--on-term``:
``exit0`` (Lightning without the callback: stops and exits 0), ``die`` (the default
action), ``ignore`` (it prints ``TERM ignored`` and goes on: the test sees each one land).
It prints ``NOTICE`` for each notice ``costguard run`` relays to it (a line of the relay
file), and acts on none.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--done", type=int, required=True)
    parser.add_argument("--max", type=int, required=True)
    parser.add_argument("--on-term", choices=["exit0", "die", "ignore"], required=True)
    options = parser.parse_args()
    if options.on_term == "exit0":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    elif options.on_term == "ignore":
        signal.signal(signal.SIGTERM, lambda *_: print("TERM ignored", flush=True))
    folder = Path(options.out, f"checkpoint-{options.done}")
    folder.mkdir(parents=True)
    header = json.dumps({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}).encode()
    weights = len(header).to_bytes(8, "little") + header + b"abcd"
    (folder / "model.safetensors").write_bytes(weights)
    state = {"global_step": options.done, "max_steps": options.max}
    (folder / "trainer_state.json").write_text(json.dumps(state))
    print("READY", flush=True)
    notices, seen = Path(os.environ["COSTGUARD_NOTICE_FILE"]), 0
    while True:
        time.sleep(0.05)
        lines = notices.read_text().count("\n") if notices.exists() else 0
        for _ in range(seen, lines):
            print("NOTICE", flush=True)
        seen = lines


if __name__ == "__main__":
    main()
