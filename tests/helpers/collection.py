"""What ``--doctest-modules`` need not import (a pytest plugin that tests/conftest.py loads,
so that it holds for src/ as well as tests/)."""

from __future__ import annotations

from fnmatch import fnmatch
from pathlib import Path

import pytest


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A module that is not a test module and holds no doctest is not collected.

    ``--doctest-modules`` imports every ``.py`` file to look for doctests: the training
    scripts that tests run as processes, and the trainer integrations, which import
    transformers and Lightning. In each xdist worker that was about 12 s of CPU for
    nothing (mypy and the tests that use them still check these modules).
    """
    if collection_path.suffix != ".py" or collection_path.name == "conftest.py":
        return None
    if any(fnmatch(collection_path.name, glob) for glob in config.getini("python_files")):
        return None
    return ">>>" not in collection_path.read_text(encoding="utf-8") or None
