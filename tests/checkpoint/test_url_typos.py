"""A mistyped store URL is refused (exit 2, the URL it probably meant), never a local folder:
everywhere a store URL is read, the command line and the library alike."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from costguard.checkpoint.store import Store
from costguard.errors import InputError

#: (typed, the URL it probably meant, or None where the hint shows the forms instead)
TYPOS = [
    ("s3:/my-bucket/run1", "s3://my-bucket/run1"),
    ("s3:my-bucket/run1", "s3://my-bucket/run1"),
    ("s3//my-bucket/run1", "s3://my-bucket/run1"),
    ("s3:///my-bucket/run1", "s3://my-bucket/run1"),
    ("S3://my-bucket/run1", "s3://my-bucket/run1"),
    ("Gs://lab-ckpt/r", "gs://lab-ckpt/r"),
    ("gcs:/lab-ckpt/r", "gcs://lab-ckpt/r"),
    ("az:runs/r", "az://runs/r"),
    ("abfs//runs/r", "abfs://runs/r"),
    ("s4://my-bucket/run1", "s3://my-bucket/run1"),
    ("https://my-bucket.s3.amazonaws.com/run1", "s3://my-bucket/run1"),
    ("https://s3.eu-west-1.amazonaws.com/my-bucket/run1", "s3://my-bucket/run1"),
    ("https://my-bucket.s3.us-west-2.amazonaws.com/run1", "s3://my-bucket/run1"),
    ("https://storage.googleapis.com/lab-ckpt/r", "gs://lab-ckpt/r"),
    ("https://acct.blob.core.windows.net/runs/r", "az://runs/r"),
    ("http:/storage.googleapis.com/lab-ckpt/r", "gs://lab-ckpt/r"),
    ("file:/tmp/run1", "file:///tmp/run1"),
    ("gs:/", None),
    ("az:/", None),
    ("s3:", None),
    ("http://minio.lab:9000/ckpt", None),
    ("x://b/run1", None),
]


def assert_refused(error: str, hint: str, typed: str, meant: str | None) -> None:
    assert error.startswith("Error: ")  # naming the flag or argument first on the command line
    assert error.endswith(f" {typed!r} looks like a store URL but is not one")
    if meant is not None:
        assert hint.startswith(f"Hint: it probably means {meant}")
        assert "***" not in hint  # nothing in it reads as a credential
    else:
        assert hint.startswith("Hint: ")
        assert "://" in hint  # the forms a store URL takes


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working folder: nothing may appear in it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COSTGUARD_JOBS_DIR", str(tmp_path.parent / "jobs"))
    return tmp_path


COMMANDS: list[Callable[[str], list[str]]] = [
    lambda url: ["checkpoint", "ls", url],
    lambda url: ["checkpoint", "verify", url],
    lambda url: ["run", "--checkpoint", url, "--", "python", "-c", "pass"],
    lambda url: ["launch", "--checkpoint", url, "--provider", "local", "--gpu", "a10g", "--yes"],
    lambda url: ["launch", "--attach", url],
    lambda url: ["jobs", "status", url],
    lambda url: ["slurm", "script", "--checkpoint", url, "--", "python", "train.py"],
]


@pytest.mark.parametrize(("typed", "meant"), TYPOS)
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c("URL")[:2]))
def test_every_command_refuses_a_mistyped_url(
    command: Callable[[str], list[str]],
    typed: str,
    meant: str | None,
    here: Path,
    run_cli: Callable[..., Any],
) -> None:
    result = run_cli(*command(typed))
    assert result.exit_code == 2, result.stderr
    error, hint = result.stderr.splitlines()[:2]
    assert_refused(error, hint, typed, meant)
    assert list(here.iterdir()) == []  # no folder named after the typo


@pytest.mark.parametrize(("typed", "meant"), TYPOS)
def test_the_library_refuses_a_mistyped_url(typed: str, meant: str | None, here: Path) -> None:
    with pytest.raises(InputError) as info:
        Store.open(typed)
    assert_refused(f"Error: {info.value.message}", f"Hint: {info.value.hint}", typed, meant)
    assert list(here.iterdir()) == []


def test_a_folder_of_that_name_stays_possible(here: Path) -> None:
    """The hint's escape for a folder that really is called ``s3:b``; other colons pass."""
    for folder in ("./s3:b", "run:1", "runs/s3-copy", "C:/x"):
        assert Path(Store.open(folder).root).is_dir()


def test_a_checkpointer_refuses_a_mistyped_url(here: Path) -> None:
    from costguard.checkpoint.checkpointer import Checkpointer

    with pytest.raises(InputError, match="looks like a store URL"):
        Checkpointer("s3:/my-bucket/run1")
    assert list(here.iterdir()) == []
