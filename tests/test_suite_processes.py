"""What keeps the suite's own processes cheap (ARCHITECTURE.md, "Keep the suite fast"):
every Python process the tests start collects its oldest objects rarely, and each worker
has frozen what its collection imported."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.startup.sitecustomize import OLDEST_EVERY
from tests.helpers.training import child_env

PROBE = "import gc; print(gc.get_threshold()[2])"


def test_every_child_collects_its_oldest_objects_rarely(tmp_path: Path) -> None:
    for env in (dict(os.environ), child_env(tmp_path)):
        done = subprocess.run(
            [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
        )
        assert int(done.stdout) == OLDEST_EVERY, env.get("PYTHONPATH")
    assert gc.get_threshold()[2] == OLDEST_EVERY  # this process too


def test_what_collection_imported_is_frozen() -> None:
    assert gc.get_freeze_count() > 10_000
