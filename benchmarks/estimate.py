"""Wall time of `costguard estimate` next to `python -c "import pandas"`, in one run.

The two commands alternate, so machine noise hits both alike; the figure is the ratio of
their medians. Target: <= 1.5 (an estimate costs no more than loading pandas).

    python benchmarks/estimate.py [--runs 21]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET = 1.5


def costguard_command() -> list[str]:
    script = Path(sys.executable).with_name("costguard")
    found = str(script) if script.exists() else shutil.which("costguard")
    if found is None:
        sys.exit("costguard is not installed in this environment: pip install -e .")
    return [found, "estimate", "--gpu", "a10g", "--hours", "8", "--count", "4"]


def wall_time(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, timeout=120)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    if importlib.util.find_spec("pandas") is None:
        sys.exit('pandas is needed as the yardstick: pip install -e ".[bench]"')
    os.environ.pop("COSTGUARD_PRICING_DIR", None)
    estimate = costguard_command()
    pandas = [sys.executable, "-c", "import pandas"]
    for command in (estimate, pandas):  # warm the file cache
        wall_time(command)
    estimate_s: list[float] = []
    pandas_s: list[float] = []
    for _ in range(args.runs):
        estimate_s.append(wall_time(estimate))
        pandas_s.append(wall_time(pandas))
    est, pd = statistics.median(estimate_s), statistics.median(pandas_s)
    ratio = est / pd
    print(f"runs: {args.runs} each, alternating")
    print(f"costguard estimate --gpu a10g --hours 8 --count 4: median {est * 1000:.0f} ms")
    print(f'python -c "import pandas":                       median {pd * 1000:.0f} ms')
    verdict = "meets" if ratio <= TARGET else "MISSES"
    print(f"ratio estimate / import pandas: {ratio:.2f} ({verdict} the target <= {TARGET})")


if __name__ == "__main__":
    main()
