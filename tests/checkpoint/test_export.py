"""The result out of the store: ``load_state``, ``costguard checkpoint export`` (read back
with the reference safetensors reader), and ``checkpoint ls`` as a person reads it."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from costguard.checkpoint import Checkpointer, load_state
from costguard.cli import cli
from tests.helpers.faults import train
from tests.helpers.stores import Backend


def trained(url: str, steps: int = 7) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    model.register_buffer("count", torch.tensor([3], dtype=torch.int64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with Checkpointer(url, every_steps=3) as ckpt:
        for step in range(steps):
            train(model, opt)
            ckpt.step(step, model=model, optimizer=opt)
    return model, opt


def test_export_writes_the_final_weights_as_safetensors_and_pt(
    backend: Backend, tmp_path: Path
) -> None:
    model, _ = trained(backend.url)
    runner = CliRunner()
    st = tmp_path / "model.safetensors"
    done = runner.invoke(cli, ["checkpoint", "export", backend.url, "--to", str(st)])
    assert done.exit_code == 0, done.output
    assert "step 7" in done.output  # the final step that close() committed
    exported = load_file(str(st))
    expected = model.state_dict()
    assert exported.keys() == expected.keys()
    for name, tensor in expected.items():
        assert exported[name].dtype == tensor.dtype
        assert torch.equal(exported[name], tensor)
    pt = tmp_path / "model.pt"
    done = runner.invoke(cli, ["checkpoint", "export", backend.url, "--step", "6", "--to", str(pt)])
    assert done.exit_code == 0, done.output
    older = torch.load(pt, weights_only=True)
    assert older.keys() == expected.keys()
    assert not torch.equal(older["0.weight"], expected["0.weight"])  # step 6, not 7
    state = load_state(backend.url)
    assert state["step"] == 7
    assert torch.equal(state["model"]["2.bias"], expected["2.bias"])


def test_export_refuses_what_it_cannot_write_and_writes_nothing(tmp_path: Path) -> None:
    url = str(tmp_path / "ckpt")
    trained(url)
    runner = CliRunner()
    cases = [
        (["--to", str(tmp_path / "model.bin")], "must end in .safetensors or .pt"),
        (["--to", str(tmp_path / "o.safetensors"), "--part", "optimizer"], "flat mapping"),
        (["--to", str(tmp_path / "m.pt"), "--part", "nope"], "has no 'nope' part"),
        (["--to", str(tmp_path / "m.pt"), "--step", "5"], "no complete checkpoint of step 5"),
        (["--to", str(tmp_path / "no" / "m.pt")], "does not exist"),
    ]
    for args, message in cases:
        done = runner.invoke(cli, ["checkpoint", "export", url, *args])
        assert done.exit_code == 2, (args, done.output)
        assert message in done.output, done.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_ls_is_newest_first_with_a_header_and_never_stars_a_bad_checkpoint(
    tmp_path: Path,
) -> None:
    url = str(tmp_path / "ckpt")
    trained(url)
    runner = CliRunner()
    listed = runner.invoke(cli, ["checkpoint", "ls", url])
    assert listed.exit_code == 0, listed.output
    lines = listed.output.splitlines()
    assert lines[0].split()[:3] == ["CHECKPOINT", "STEP", "STATUS"]
    steps = [int(line.split()[2]) for line in lines[1:4] if line.startswith("*")] + [
        int(line.split()[1]) for line in lines[1:4] if not line.startswith("*")
    ]
    assert sorted(steps, reverse=True) == [7, 6, 3]
    assert lines[1].startswith("* ckpt-000000000007-")
    assert all(len(line) <= 80 for line in lines)
    # Damage the newest payload (same size, other bytes): verify calls it BAD, and ls
    # stars the one a resume really starts from.
    newest = next((tmp_path / "ckpt").glob("ckpt-000000000007-*/state.pt"))
    raw = bytearray(newest.read_bytes())
    raw[-100] ^= 0xFF
    newest.write_bytes(bytes(raw))
    verified = runner.invoke(cli, ["checkpoint", "verify", url])
    assert verified.exit_code == 1
    assert verified.output.startswith("BAD  ckpt-000000000007-")
    listed = runner.invoke(cli, ["checkpoint", "ls", url, "--format", "json"])
    doc = json.loads(listed.output)
    assert [(c["step"], c["status"], c["latest"]) for c in doc["checkpoints"]] == [
        (7, "corrupt", False),
        (6, "complete", True),
        (3, "complete", False),
    ]


def test_ls_on_a_missing_store_fails_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "missing" / "a" / "b"
    done = CliRunner().invoke(cli, ["checkpoint", "ls", str(missing)])
    assert done.exit_code == 2  # bad input, as `jobs status` of a missing folder
    assert "does not exist" in done.output
    assert not (tmp_path / "missing").exists()
    monkeypatch.setenv("COSTGUARD_STORAGE_OPTIONS", "{not json")
    done = CliRunner().invoke(cli, ["checkpoint", "ls", str(tmp_path)])
    assert done.exit_code == 2
    assert "COSTGUARD_STORAGE_OPTIONS (9 characters) is not a JSON object" in done.output
    assert "unexpected" not in done.output


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_long_restore_shows_progress_on_a_terminal_only(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from costguard.checkpoint import restoring

    trained(backend.url)
    monkeypatch.setattr(restoring, "PROGRESS_MIN_BYTES", 0)
    for stream, shown in ((io.StringIO(), False), (_Terminal(), True)):
        monkeypatch.setattr(sys, "stderr", stream)
        model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
        model.register_buffer("count", torch.tensor([0], dtype=torch.int64))
        with Checkpointer(backend.url, check=False) as ckpt:
            assert ckpt.restore(model=model) == 7
        assert ("restoring step 7" in stream.getvalue()) == shown, stream.getvalue()


def test_ls_of_a_missing_path_in_a_bucket_fails_as_a_missing_folder_does(
    aws_env: str, tmp_path: Path
) -> None:
    """Issue 49 item 9: `checkpoint ls s3://bucket/nothere` exited 0 ("No checkpoints")
    where a missing local folder exits 2 (bad input, as for `jobs status`)."""
    import boto3

    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="runs")
    local = CliRunner().invoke(cli, ["checkpoint", "ls", str(tmp_path / "nothere")])
    remote = CliRunner().invoke(cli, ["checkpoint", "ls", "s3://runs/nothere"])
    assert local.exit_code == remote.exit_code == 2, remote.output
    assert "Error: no checkpoint store at s3://runs/nothere" in remote.output
    boto3.client("s3", region_name="us-east-1").put_object(
        Bucket="runs", Key="there/job/job.json", Body=b"{}"
    )
    there = CliRunner().invoke(cli, ["checkpoint", "ls", "s3://runs/there"])
    assert there.exit_code == 0, there.output
    assert "No checkpoints at s3://runs/there" in there.output


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_an_export_gets_the_mode_the_umask_gives(tmp_path: Path, umask: int, mode: int) -> None:
    """Issue 49 item 9: exported .safetensors were created 0600 whatever the umask (the
    temporary file's mode), unreadable by the group a shared folder is for."""
    url = str(tmp_path / "ckpt")
    trained(url, steps=3)
    target = tmp_path / "model.safetensors"
    done = subprocess.run(
        [sys.executable, "-m", "costguard", "checkpoint", "export", url, "--to", str(target)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=lambda: os.umask(umask),
    )
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(target.stat().st_mode) == mode


def test_a_restores_progress_counts_the_objects_bytes_once(aws_env: str) -> None:
    """Issue 49 item 9: a 302 MB restore from S3 showed a bar out of 604.2 MB (the
    download and the hash of the downloaded file, counted as one)."""
    import boto3

    from costguard.checkpoint.export import open_store
    from costguard.checkpoint.restoring import Restorer

    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="runs")
    trained("s3://runs/run1")
    store = open_store("s3://runs/run1")
    restorer = Restorer(store)
    (manifest, *_) = restorer.survey().manifests[::-1]
    heard: list[tuple[int, int]] = []
    with restorer.payload_file(manifest, lambda done, total: heard.append((done, total))):
        pass
    (payload,) = [o for o in manifest.objects if not o.pool]
    assert heard
    assert {total for _, total in heard} == {payload.size_bytes}
    assert heard[-1][0] == payload.size_bytes
