"""The wheel carries the price tables: it works installed far from this repository."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT)],
        check=True,
        timeout=300,
        capture_output=True,
    )
    (built,) = out.glob("costguard-*.whl")
    return built


@pytest.mark.slow
def test_wheel_contains_tables_and_typing_marker(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for table in (
        "tables.toml",
        "gpu_instances.csv",
        "cpu_instances.csv",
        "storage.csv",
        "transfer.csv",
        "regions.csv",
        "datasets.csv",
        "README.md",
    ):
        assert f"costguard/_tables/{table}" in names
    assert "costguard/py.typed" in names
    assert "costguard/_bootstrap/user-data.sh" in names  # the launcher's boot script
    assert not any(name.startswith(("tests/", "pricing/")) for name in names)


@pytest.mark.slow
def test_wheel_estimates_outside_the_repository(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSTGUARD_")}
    env["PYTHONPATH"] = str(site)
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    code = (
        "import json, sys, costguard\n"
        "from costguard.cli import cli\n"
        "print(json.dumps({'file': costguard.__file__}))\n"
        "sys.exit(cli.main(['estimate', '--gpu', 'a10g', '--hours', '8', '--count', '4',"
        " '--region', 'us-east-1', '--on-demand', '--format', 'json'], standalone_mode=False))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    first, rest = done.stdout.split("\n", 1)
    assert json.loads(first)["file"].startswith(str(site))
    doc = json.loads(rest)
    assert doc["options"][0]["compute_usd"] == "32.192"
    assert doc["pricing_source"]["directory"].startswith(str(site))
