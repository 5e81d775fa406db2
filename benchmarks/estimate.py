"""Wall and CPU time of `costguard estimate` next to two yardsticks, in one run.

The commands alternate, so machine noise hits all alike; the figures are ratios of their
medians. Targets: <= 1.3 against `python -c "import click, rich.table"` (the libraries
the command cannot do without: the rest of its start-up is costguard's own) and <= 1.5
against `python -c "import pandas"`. The ratio of the medians and the median of the
pairs' ratios are both printed, with the spread of the pairs: on a shared machine a wide
spread says the figure is noise. CPU time (user + system, of the command's process) is
printed beside wall time: it does not count the time a busy machine kept the command
waiting, so it is the steadier figure there.

The first run (a warm-up, not counted) parses the price tables and keeps them, checked,
in the user's cache (``~/.cache/costguard/pricing.parsed``), as any user's first estimate
does; the counted runs read them from there, as every later estimate does.

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


def timed(command: list[str]) -> tuple[float, float]:
    """The wall and CPU seconds of one run of ``command``."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise subprocess.CalledProcessError(process.returncode, command)
    return wall, usage.ru_utime + usage.ru_stime


def report(name: str, estimate: list[float], yardstick: list[float], target: float) -> str:
    """One line: the medians' ratio, its verdict and the pairs' spread."""
    ratio = statistics.median(estimate) / statistics.median(yardstick)
    pairs = sorted(a / b for a, b in zip(estimate, yardstick, strict=True))
    verdict = "meets" if ratio <= target else "MISSES"
    return (
        f"  {name}: median {statistics.median(yardstick) * 1000:.0f} ms; ratio estimate / it:"
        f" {ratio:.2f} ({verdict} the target <= {target}); pairs: median"
        f" {statistics.median(pairs):.2f}, from {pairs[0]:.2f} to {pairs[-1]:.2f}"
    )


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
        timed(command)
    wall: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.runs):
        for name, command in commands.items():
            seconds, used = timed(command)
            wall[name].append(seconds)
            cpu[name].append(used)
    print(f"runs: {args.runs} each, alternating")
    asked = " ".join(commands["estimate"][1:])
    print(
        f"costguard {asked}: median {statistics.median(wall['estimate']) * 1000:.0f} ms wall,"
        f" {statistics.median(cpu['estimate']) * 1000:.0f} ms CPU"
    )
    for name, (_, target) in YARDSTICKS.items():
        print(f'python -c "{name}":')
        print(report("wall", wall["estimate"], wall[name], target))
        print(report("CPU", cpu["estimate"], cpu[name], target))


if __name__ == "__main__":
    main()
