"""Wall time of `costguard estimate` next to two yardsticks, in one run.

The commands alternate, so machine noise hits all alike; the figures are ratios of their
medians. Targets: <= 1.3 against `python -c "import click, rich.table"` (the libraries
the command cannot do without: the rest of its start-up is costguard's own) and <= 1.5
against `python -c "import pandas"`. The ratio of the medians and the median of the
pairs' ratios are both printed, with the spread of the pairs: on a shared machine a wide
spread says the figure is noise.

costguard's modules are byte-compiled first, as ``pip install`` compiles a wheel's: in an
editable install with ``PYTHONDONTWRITEBYTECODE`` set (as on CI machines) every run would
otherwise compile every module from source again, which no installed costguard does,
while the yardsticks' libraries were compiled when pip installed them.

    python benchmarks/estimate.py [--runs 21]
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: yardstick name -> (its command after the interpreter, the target ratio)
YARDSTICKS = {
    "import click, rich.table": (["-c", "import click, rich.table"], 1.3),
    "import pandas": (["-c", "import pandas"], 1.5),
}


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
    package = importlib.util.find_spec("costguard")
    if package is None or package.origin is None:
        sys.exit("costguard is not installed in this environment: pip install -e .")
    compileall.compile_dir(Path(package.origin).parent, quiet=1)
    commands = {"estimate": costguard_command()}
    commands.update((name, [sys.executable, *argv]) for name, (argv, _) in YARDSTICKS.items())
    for command in commands.values():  # warm the file cache
        wall_time(command)
    seconds: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.runs):
        for name, command in commands.items():
            seconds[name].append(wall_time(command))
    median_s = {name: statistics.median(runs) for name, runs in seconds.items()}
    print(f"runs: {args.runs} each, alternating")
    asked = " ".join(commands["estimate"][1:])
    print(f"costguard {asked}: median {median_s['estimate'] * 1000:.0f} ms")
    for name, (_, target) in YARDSTICKS.items():
        ratio = median_s["estimate"] / median_s[name]
        pairs = sorted(a / b for a, b in zip(seconds["estimate"], seconds[name], strict=True))
        verdict = "meets" if ratio <= target else "MISSES"
        print(
            f'python -c "{name}": median {median_s[name] * 1000:.0f} ms;'
            f" ratio estimate / it: {ratio:.2f} ({verdict} the target <= {target});"
            f" pairs: median {statistics.median(pairs):.2f}, from {pairs[0]:.2f} to {pairs[-1]:.2f}"
        )


if __name__ == "__main__":
    main()
