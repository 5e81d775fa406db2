"""CI: the README's install lines, in their order, in one fresh venv; `pip check` after each.

pip resolves only what one command asks for, so an extra installed later can move a
dependency from under one installed earlier (s3fs's aiobotocore pins botocore below the
botocore that the boto3 of `costguard[aws]` needs). This replays what a person does from
the README's Install section, with costguard itself from a wheel built from this tree.
The README's own CPU torch line comes before `[train]`, so that it does not pull a CUDA build.

Usage: python .ci/install_order.py [WORKDIR]   (exit 1 at the first line that breaks it)
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def install_lines(readme: str) -> list[str]:
    """The ``$ pip install ...`` lines of the README's Install section, in order."""
    section = readme.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```console\n", 1)[1].split("```", 1)[0]
    return [
        re.sub(r"\s+#.*$", "", line[2:]).strip()
        for line in block.splitlines()
        if line.startswith("$ pip install ")
    ]


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def main(workdir: Path) -> int:
    lines = install_lines((ROOT / "README.md").read_text())
    assert lines, "no `$ pip install` line in the README's Install section"
    env = workdir / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    pip = [str(env / "bin" / "python"), "-m", "pip"]
    built = run([*pip, "wheel", "--no-deps", "-q", "-w", str(workdir), str(ROOT)])
    if built.returncode:
        print(built.stdout + built.stderr)
        return 1
    (wheel,) = workdir.glob("costguard-*.whl")
    for line in lines:
        # ``.`` (the clone) and a bare ``costguard`` both mean this tree's wheel.
        args = [
            re.sub(r"^(?:costguard|\.)(?=\[|$)", str(wheel), arg) for arg in shlex.split(line)[2:]
        ]
        start = time.monotonic()
        installed = run([*pip, "install", "-q", *args])
        if installed.returncode:
            print(f"FAILED to install: {line}\n{installed.stdout}{installed.stderr}")
            return 1
        check = run([*pip, "check"])
        took = time.monotonic() - start
        print(
            f"{'ok    ' if check.returncode == 0 else 'BROKEN'} {line}  ({took:.0f} s)", flush=True
        )
        if check.returncode:
            print(check.stdout + check.stderr)
            return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit(main(Path(sys.argv[1])))
    with tempfile.TemporaryDirectory(prefix="costguard-install-") as tmp:
        sys.exit(main(Path(tmp)))
