"""A checkpoint put back that the trainer's loader refuses (issue 45): complete by every
rule costguard checks, but of another model (here a weights file of another size, as a
changed config or a forger leaves), so the script's own resume fails before it writes
anything. ``costguard run --sync-dir`` names it, moves it aside, puts back the complete
checkpoint before it and runs the script once more; when the trainer then goes on, the
store records the refusal (kept, never deleted) so no later run on any machine puts it
back. A script that fails again from the one before is told the failure is not the
checkpoint's, and nothing is recorded; with nothing before it, it says so and never
starts from step 0 as if fine; a trainer that quietly starts over below what was put back
is told so. On a local and an S3 (moto) store."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from costguard.checkpoint.foldersync import REFUSED, REFUSED_FILE
from costguard.checkpoint.store import Store
from costguard.cli.checkpoint import checkpoint_group
from tests.helpers.stores import make_s3_bucket
from tests.helpers.training import child_env, costguard_command
from tests.integrations.test_foldersync import hf_folder, safetensors
from tests.integrations.test_foldersync_truth import kept, syncer

#: A trainer in Hugging Face's layout: resumes from the newest checkpoint-N in out/ (its
#: loader refuses weights of another size), then saves checkpoint-(N+5); ``fail`` makes it
#: fail after loading, whatever it loaded.
TRAINER = """
import json, os, pathlib, re, sys
out = pathlib.Path("out")
found = sorted((int(m[1]), p) for p in out.glob("checkpoint-*")
               if (m := re.fullmatch(r"checkpoint-([0-9]+)", p.name)))
step = 0
if found and not os.environ.get("FRESH"):
    step, folder = found[-1]
    data = (folder / "model.safetensors").read_bytes()
    header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
    if header["w"]["shape"] != [3001]:
        raise SystemExit(f"size mismatch for w: {header['w']['shape']} in {folder}")
if os.environ.get("FAIL"):
    raise SystemExit("a failure of the script's own")
new = out / f"checkpoint-{step + 5}"
new.mkdir(parents=True)
(new / "model.safetensors").write_bytes((out.parent / "weights").read_bytes())
(new / "optimizer.pt").write_bytes(os.urandom(100))
(new / "trainer_state.json").write_text(json.dumps({"global_step": step + 5}))
print("RESUMED FROM", step)
"""


@pytest.fixture(params=["local", "s3"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "store")
    make_s3_bucket(request.getfixturevalue("aws_env"), "refused")
    return "s3://refused/run1"


def fill(url: str, tmp_path: Path, steps: list[int], bad: int | None) -> None:
    """The store holds this run's checkpoints at ``steps``; the one at ``bad`` has weights
    of another size (whole, complete: only the trainer's loader can tell)."""
    run = tmp_path / "earlier"
    sync = syncer(Store.open(url, {"skip_instance_cache": True}), run, [])
    for step in steps:
        folder = hf_folder(run, step)
        if step == bad:
            (folder / "model.safetensors").write_bytes(safetensors(b"x" * 100))
        sync.sync(finished=True)
    shutil.rmtree(run)
    (tmp_path / "weights").write_bytes(safetensors(b"w" * 3001))


def run(
    here: Path, url: str, *, fail: bool = False, fresh: bool = False
) -> subprocess.CompletedProcess[str]:
    """``costguard run --sync-dir out`` of the trainer in ``here`` (a machine of its own:
    its state folder there)."""
    env = child_env(
        here,
        COSTGUARD_CLOUD="none",
        XDG_STATE_HOME=str(here / "state"),
        **{k: v for k, v in os.environ.items() if k.startswith("AWS_")},
        **({"FAIL": "1"} if fail else {}),
        **({"FRESH": "1"} if fresh else {}),
    )
    return subprocess.run(
        [*costguard_command(), "run", "--checkpoint", url, "--sync-dir", "out", "--",
         sys.executable, "-c", TRAINER],
        cwd=here, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_checkpoint_the_loader_refuses_gives_way_to_the_one_before(
    tmp_path: Path, url: str
) -> None:
    fill(url, tmp_path, [10, 20, 30], bad=30)
    result = run(tmp_path, url)
    assert result.returncode == 0, result.stderr
    said = result.stderr
    assert "failed (exit 1) before writing a checkpoint, right after costguard put back " \
           "checkpoint-30 (step 30" in said  # fmt: skip
    assert "running the script again from checkpoint-20 (step 20" in said
    assert "recorded as refused and kept" in said
    assert "RESUMED FROM 20" in result.stdout
    store = Store.open(url, {"skip_instance_cache": True})
    (refused,) = [p for p in store.listing() if p.endswith(REFUSED_FILE)]
    assert refused.startswith("ckpt-000000000030-")
    assert [p.name.split(".")[0] for p in (tmp_path / "out" / REFUSED).iterdir()] == [
        "checkpoint-30"
    ]
    assert [s for s, _ in kept(store)] == [20, 25, 30]  # 30 kept, never deleted
    for args in (["ls", url], ["verify", url]):  # the record is no damage to a checkpoint
        assert CliRunner().invoke(checkpoint_group, args).exit_code == 0, args
    # A new machine (out/ gone): the refused one is named and never put back again.
    shutil.rmtree(tmp_path / "out")
    again = run(tmp_path, url)
    assert again.returncode == 0, again.stderr
    assert "was refused by the trainer's loader in an earlier run" in again.stderr
    assert "RESUMED FROM 25" in again.stdout
    assert "failed" not in again.stderr


def test_a_failure_that_is_not_the_checkpoints_records_nothing(tmp_path: Path, url: str) -> None:
    fill(url, tmp_path, [10, 20], bad=None)
    result = run(tmp_path, url, fail=True)
    assert result.returncode == 1, result.stderr
    assert "running the script again from checkpoint-10 (step 10" in result.stderr
    assert "failed again from ckpt-000000000010-" in result.stderr
    assert "the failure is not ckpt-000000000020-" in result.stderr
    store = Store.open(url, {"skip_instance_cache": True})
    assert not [p for p in store.listing() if p.endswith(REFUSED_FILE)]


def test_with_nothing_before_it_the_run_never_starts_from_step_0(tmp_path: Path, url: str) -> None:
    fill(url, tmp_path, [30], bad=30)
    result = run(tmp_path, url)
    assert result.returncode == 1, result.stderr
    assert "no complete checkpoint before it to fall back to; not starting from step 0" in (
        result.stderr
    )
    assert "RESUMED FROM" not in result.stdout


def test_a_trainer_that_starts_over_below_what_was_put_back_is_told(
    tmp_path: Path, url: str
) -> None:
    """A script whose resume quietly starts from step 0 (a loader refusing, caught, or no
    resume at all): its checkpoint-5 was never kept, and nothing was said."""
    fill(url, tmp_path, [10, 20], bad=None)
    result = run(tmp_path, url, fresh=True)
    assert result.returncode == 0, result.stderr
    assert "RESUMED FROM 0" in result.stdout
    assert (
        "warning: the trainer wrote checkpoint-5 (step 5) although checkpoint-20 (step 20) "
        "was put back: it did not resume from it"
    ) in result.stderr


def test_a_notice_while_it_falls_back_ends_the_run_instead_of_a_second_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGTERM that comes after the script failed, while costguard puts back the
    checkpoint before the refused one (a download, on a store), is a notice: the machine is
    going away, so the script is not run once more (it used to be, told nothing)."""
    from costguard.checkpoint.foldersync import FolderSync
    from costguard.checkpoint.supervisor import supervise

    url = str(tmp_path / "store")
    fill(url, tmp_path, [10, 20, 30], bad=30)
    fall_back = FolderSync.fall_back

    def noticed_meanwhile(self: FolderSync, *args: object, **kwargs: object) -> object:
        signal.raise_signal(signal.SIGTERM)  # runs costguard's handler here, at once
        return fall_back(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(FolderSync, "fall_back", noticed_meanwhile)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    said: list[str] = []
    code = supervise(
        [sys.executable, "-c", TRAINER], url=url, every_steps=None, every_minutes=None,
        keep=3, cloud="none", signal_mode="auto", quiet=False, say=said.append,
        sync_dir="out",
    )  # fmt: skip
    assert code == 1, said
    assert "SIGTERM after the script ended: finishing its report" in said
    assert "not running the script again: a notice (SIGTERM) came after it ended" in said
    assert not [line for line in said if line.startswith("running the script again")], said
    assert not list((tmp_path / "out").glob("checkpoint-25")), "the script ran again"
