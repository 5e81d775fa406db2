"""A listing of checkpoints needs costguard's [stores] extra, not torch (issue 49 item 9):
`checkpoint ls` and `verify` on a bucket run where torch cannot be imported, and every
distribution they load is in [stores] (or costguard's own dependencies), whose closure
holds no torch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import boto3

from costguard.checkpoint import Checkpointer
from costguard.errors import MissingDependencyError

ROOT = Path(__file__).parents[2]

#: Runs the commands with torch and numpy unimportable, then names what was loaded.
PROBE = """
import json, sys
sys.modules["torch"] = None
sys.modules["numpy"] = None
from costguard.cli import cli
for argv in (["checkpoint", "ls", sys.argv[1]], ["checkpoint", "verify", sys.argv[1]]):
    code = cli.main(argv, standalone_mode=False)
    assert code in (0, None), (argv, code)
print(json.dumps(sorted({n.split(".")[0] for n, m in sys.modules.items() if m is not None})))
"""


def _name(requirement: str) -> str:
    return re.split(r"[\\[<>=!~; ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def closure(requirements: list[str]) -> set[str]:
    """The installed distributions ``requirements`` bring, transitively (markers aside)."""
    seen: set[str] = set()
    todo = [_name(r) for r in requirements]
    while todo:
        name = todo.pop()
        if name in seen or name == "costguard":
            continue
        seen.add(name)
        try:
            todo += [_name(r) for r in metadata.requires(name) or () if "extra ==" not in r]
        except metadata.PackageNotFoundError:
            continue
    return seen


def test_a_bucket_is_listed_with_the_stores_extra_and_no_torch(aws_env: str) -> None:
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="runs")
    url = "s3://runs/run1"
    with Checkpointer(url, every_steps=1) as ckpt:
        for step in range(2):
            ckpt.step(step, extra={"done": step + 1})
    done = subprocess.run(
        [sys.executable, "-c", PROBE, url], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "ckpt-000000000001-" in done.stdout
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    stores = closure([*project["dependencies"], *project["optional-dependencies"]["stores"]])
    assert "torch" not in stores
    assert "numpy" not in stores
    owners = metadata.packages_distributions()
    # What the listing imported of the backends (an optional import such as httpx aside)
    backends = {"fsspec", "s3fs", "aiobotocore", "botocore", "aiohttp"}
    used = {_name(d) for module in loaded for d in owners.get(module, ())} & backends
    assert used == backends
    assert used <= stores


def test_the_missing_torch_hint_gives_the_cpu_build_first() -> None:
    hint = MissingDependencyError("torch", "train").hint or ""
    assert hint.startswith("without a CUDA GPU, first: `pip install torch --index-url ")
    assert "https://download.pytorch.org/whl/cpu" in hint
    assert 'pip install ".[train]"' in hint
    stores = MissingDependencyError("s3fs", "stores").hint or ""
    assert "torch" not in stores
