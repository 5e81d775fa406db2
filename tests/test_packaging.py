"""The wheel carries the price tables and the SLURM template: it works installed far from
this repository (one wheel, built once for the test run: pytest-xdist's workers share it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from costguard.slurm.batch import TEMPLATE_NAME
from tests.helpers.training import SharedRuns

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def wheel(shared_runs: SharedRuns) -> Path:
    def build(out: Path) -> None:
        pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet"]
        subprocess.run(
            [*pip, "-w", str(out), str(ROOT)],
            check=True,
            timeout=300,
            capture_output=True,
        )

    (built,) = shared_runs.folder(["costguard wheel"], build).glob("costguard-*.whl")
    return built


def run_installed(wheel: Path, tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    """``python -c CODE`` with ``wheel`` unpacked as the only costguard, in a folder of its own."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSTGUARD_")}
    env["PYTHONPATH"] = str(site)
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


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
        "gpu_parts.csv",
        "interruptions.csv",
        "README.md",
    ):
        assert f"costguard/_tables/{table}" in names
    assert "costguard/py.typed" in names
    assert "costguard/_bootstrap/user-data.sh" in names  # the launcher's boot script
    assert not any(name.startswith(("tests/", "pricing/")) for name in names)


@pytest.mark.slow
def test_wheel_estimates_outside_the_repository(wheel: Path, tmp_path: Path) -> None:
    code = (
        "import json, sys, costguard\n"
        "from costguard.cli import cli\n"
        "print(json.dumps({'file': costguard.__file__}))\n"
        "sys.exit(cli.main(['estimate', '--gpu', 'a10g', '--hours', '8', '--count', '4',"
        " '--region', 'us-east-1', '--on-demand', '--format', 'json'], standalone_mode=False))\n"
    )
    done = run_installed(wheel, tmp_path, code)
    assert done.returncode == 0, done.stderr
    first, rest = done.stdout.split("\n", 1)
    assert json.loads(first)["file"].startswith(str(tmp_path / "site"))
    doc = json.loads(rest)
    assert doc["options"][0]["compute_usd"] == "32.192"
    assert doc["pricing_source"]["directory"].startswith(str(tmp_path / "site"))


@pytest.mark.slow
def test_wheel_carries_the_slurm_template_and_writes_scripts_elsewhere(
    wheel: Path, tmp_path: Path
) -> None:
    assert f"costguard/_slurm/{TEMPLATE_NAME}" in zipfile.ZipFile(wheel).namelist()
    code = (
        "from costguard.cli import cli\n"
        "cli.main(['slurm', 'script', '--time', '1:00:00', '--checkpoint', 's3://b/r',"
        " '--', 'python', 'train.py'])\n"
    )
    done = run_installed(wheel, tmp_path, code)
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --signal=B:USR1@120" in done.stdout
    assert "scontrol requeue" in done.stdout


def test_the_train_extra_needs_a_torch_whose_weights_only_holds() -> None:
    """torch < 2.6: ``torch.load(weights_only=True)`` can be bypassed (CVE-2025-32434)."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    for extra, requirements in project["optional-dependencies"].items():
        for line in requirements:
            requirement = Requirement(line)
            if requirement.name == "torch":
                assert not requirement.specifier.contains("2.5.1"), extra
                assert requirement.specifier.contains("2.6.0"), extra
