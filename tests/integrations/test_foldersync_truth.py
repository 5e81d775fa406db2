"""What ``--sync-dir`` keeps is the truth (issue 45 items 1-3, issue 43 item 8), on a local
and an S3 (moto) store: a checkpoint is kept only when the trainer finished every file of it
(Accelerate's registered objects after its mark, sharded weights and their index, DCP and
DeepSpeed folders); only this run's checkpoints go up, and one that is not this run's never
takes its place; a link is never followed out of the folder and a restore never writes
through one; a store checkpoint that is not whole, or whose file list cannot be placed,
gives way to the previous one with a line that says so.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from costguard.checkpoint.completion import items_in
from costguard.checkpoint.foldersync import FOREIGN, FolderSync, object_names
from costguard.checkpoint.inventory import verify
from costguard.checkpoint.manifest import (
    FOLDER_FORMAT_VERSION,
    Manifest,
    ObjectEntry,
    checkpoint_name,
)
from costguard.checkpoint.restoring import Restorer
from costguard.checkpoint.store import Store
from tests.helpers.stores import make_s3_bucket
from tests.helpers.waiting import wait_for
from tests.integrations.test_foldersync import (
    accelerate_folder,
    folder_files,
    hf_folder,
    killed_at_the_manifest,
    safetensors,
)


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """An empty local or moto S3 store."""
    if request.param == "local":
        return Store.open(str(tmp_path / "store"))
    endpoint = request.getfixturevalue("aws_env")
    make_s3_bucket(endpoint, "truth")
    return Store.open("s3://truth/run1", {"skip_instance_cache": True})


def syncer(store: Store, root: Path, lines: list[str]) -> FolderSync:
    return FolderSync(store, root, keep=3, say=lines.append, settle_s=0.0)


def kept(store: Store) -> list[tuple[int, str]]:
    survey = Restorer(store).survey()
    return sorted((m.step, m.extra["folder"]["path"]) for m in survey.manifests if m.folder)


def accelerate_save(root: Path, step: int, *, custom: int = 1) -> Path:
    """What ``save_state`` writes, in its order: weights, optimizer, random states (the
    mark), then each registered object's ``custom_checkpoint_N.pkl`` (``torch.save``)."""
    folder = root / f"checkpoint_{step}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(safetensors(os.urandom(500)))
    torch.save({"state": {}, "step": step}, folder / "optimizer.bin")
    torch.save({"random_state": [1, 2, 3]}, folder / "random_states_0.pkl")
    for index in range(custom):
        torch.save({"shadow": torch.ones(4) * step}, folder / f"custom_checkpoint_{index}.pkl")
    return folder


def commit_as_before(
    store: Store, step: int, path: str, files: dict[str, bytes], kind: str = "accelerate"
) -> str:
    """A sync checkpoint committed as an earlier costguard did (no check of its files)."""
    name = checkpoint_name(step, os.urandom(4).hex())
    names = object_names(files)
    objects = []
    for obj, rel in names.items():

        def produce(upload: Any, data: bytes = files[rel]) -> None:
            upload.write(data)

        size, digest = store.write_stream(f"{name}/{obj}", produce)
        objects.append(ObjectEntry(obj, size, digest))
    manifest = Manifest(
        name=name,
        step=step,
        created_unix=1e9 + step,
        objects=tuple(objects),
        library_version="0",
        format_version=FOLDER_FORMAT_VERSION,
        reason=f"sync:{kind}",
        extra={"folder": {"path": path, "kind": kind, "files": names}},
    )
    store.put(manifest.manifest_path, manifest.to_json().encode())
    return name


def test_an_accelerate_save_cut_off_after_its_mark_is_never_kept(
    store: Store, tmp_path: Path
) -> None:
    out, lines = tmp_path / "out", list[str]()
    sync = syncer(store, out, lines)
    sync.prepare()
    accelerate_save(out, 10)
    assert [m.step for m in sync.sync(finished=True)] == [10]
    # A SIGTERM while custom_checkpoint_0.pkl was written: the mark is there, the file empty.
    cut = accelerate_save(out, 20)
    (cut / "custom_checkpoint_0.pkl").write_bytes(b"")
    # Another one cut short in the middle of the zip (torch.save writes its directory last).
    half = accelerate_save(out, 30)
    whole = (half / "custom_checkpoint_0.pkl").read_bytes()
    (half / "custom_checkpoint_0.pkl").write_bytes(whole[: len(whole) // 2])
    # And one killed before it began the file: this run's earlier save had one.
    (accelerate_save(out, 40) / "custom_checkpoint_0.pkl").unlink()
    assert sync.sync(finished=True) == []
    assert kept(store) == [(10, "checkpoint_10")]
    assert any("checkpoint_40" in line and "custom_checkpoint_0.pkl" in line for line in lines)
    found = {i.path: i.problem for i in items_in(out)}
    assert "empty" in found["checkpoint_20"]
    assert "cut short" in found["checkpoint_30"]


def test_sharded_dcp_and_deepspeed_folders_are_kept_only_with_every_part(
    store: Store, tmp_path: Path
) -> None:
    out, lines = tmp_path / "out", list[str]()
    sync = syncer(store, out, lines)
    sharded = hf_folder(out, 10)
    (sharded / "model.safetensors").unlink()
    index = {
        "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
        }
    }
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    (sharded / "model-00001-of-00002.safetensors").write_bytes(safetensors(b"a" * 100))
    dcp = hf_folder(out, 20) / "pytorch_model_fsdp_0"
    dcp.mkdir()
    (dcp / "__0_0.distcp").write_bytes(os.urandom(100))
    deepspeed = hf_folder(out, 30) / "global_step30"
    deepspeed.mkdir()
    torch.save({"module": {}}, deepspeed / "mp_rank_00_model_states.pt")
    assert sync.sync(finished=True) == []
    problems = {i.path: i.problem for i in items_in(out)}
    assert "model-00002-of-00002.safetensors" in problems["checkpoint-10"]
    assert ".metadata" in problems["checkpoint-20"]
    assert "latest" in problems["checkpoint-30"]
    (sharded / "model-00002-of-00002.safetensors").write_bytes(safetensors(b"b" * 100))
    (dcp / ".metadata").write_bytes(b"\x80\x04N.")
    (deepspeed.parent / "latest").write_text("global_step30")
    assert [m.step for m in sync.sync(finished=True)] == [10, 20, 30]


def test_a_store_checkpoint_that_is_not_whole_gives_way_to_the_previous_one(
    store: Store, tmp_path: Path
) -> None:
    """What an earlier costguard kept of a cut-off save: every restart restored it and the
    trainer crashed in ``load_state``. Now it is skipped, with one line, and 10 comes back."""
    good = accelerate_save(tmp_path / "a", 10)
    commit_as_before(
        store, 10, "checkpoint_10", {f"checkpoint_10/{k}": v for k, v in folder_files(good).items()}
    )
    bad = folder_files(accelerate_save(tmp_path / "b", 20))
    bad["custom_checkpoint_0.pkl"] = b""
    commit_as_before(store, 20, "checkpoint_20", {f"checkpoint_20/{k}": v for k, v in bad.items()})
    out, lines = tmp_path / "out", list[str]()
    restored = syncer(store, out, lines).prepare()
    assert [m.step for m in restored] == [10]
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["checkpoint_10"]
    (said,) = [line for line in lines if "trying the previous one" in line]
    assert "custom_checkpoint_0.pkl" in said
    # `costguard checkpoint verify` says the same (it said ok).
    checked = {v.step: (v.ok, v.problem) for v in verify(store)}
    assert checked[10] == (True, "")
    assert checked[20][0] is False
    assert "custom_checkpoint_0.pkl" in checked[20][1]


def test_checkpoints_of_another_run_are_never_kept_nor_resumed_from(
    store: Store, tmp_path: Path
) -> None:
    run, lines = tmp_path / "run", list[str]()
    first = syncer(store, run, lines)
    for step in (10, 30, 40):
        hf_folder(run, step)
        first.sync(finished=True)
    assert [s for s, _ in kept(store)] == [10, 30, 40]
    # A new machine whose out/ holds another run's checkpoint-45 and -90.
    out = tmp_path / "out"
    hf_folder(out, 45)
    hf_folder(out, 90)
    again = syncer(store, out, lines)
    restored = again.prepare()
    assert [m.step for m in restored] == [40]
    # The trainer resumes from the run's own: the others are out of its way, not deleted.
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["checkpoint-40"]
    assert sorted(p.name.split(".")[0] for p in (out / FOREIGN).iterdir()) == [
        "checkpoint-45",
        "checkpoint-90",
    ]
    assert sum("not this run's" in line for line in lines) == 2
    hf_folder(out, 50)  # what the trainer writes next
    assert [m.step for m in again.sync(finished=True)] == [50]
    assert [s for s, _ in kept(store)] == [30, 40, 50]


def hf_logged(root: Path, step: int, losses: dict[int, float]) -> dict[str, bytes]:
    """A Hugging Face checkpoint whose trainer_state.json logs ``losses`` up to ``step``;
    its files by path under the sync dir."""
    folder = hf_folder(root, step)
    history = [{"step": s, "loss": loss} for s, loss in sorted(losses.items()) if s <= step]
    state = {"global_step": step, "max_steps": 100, "log_history": history}
    (folder / "trainer_state.json").write_text(json.dumps(state))
    return {f"checkpoint-{step}/{k}": v for k, v in folder_files(folder).items()}


def test_another_runs_checkpoints_an_earlier_costguard_uploaded_are_told_apart(
    store: Store, tmp_path: Path
) -> None:
    """Before ``.costguard-foreign/``, costguard uploaded another run's checkpoint-45 and
    -90 found in out/: a new machine put back 90 and the trainer resumed another run's
    model. Their trainer history does not continue the run's: named, never put back, and
    neither counted nor deleted by retention."""
    ours = {s: 1.0 / s for s in range(5, 101, 5)}
    theirs = {s: 2.0 + 1.0 / s for s in range(5, 101, 5)}
    for step in (10, 30, 40):
        commit_as_before(store, step, f"checkpoint-{step}",
                         hf_logged(tmp_path / "a", step, ours), "transformers")  # fmt: skip
    for step in (45, 90):
        commit_as_before(store, step, f"checkpoint-{step}",
                         hf_logged(tmp_path / "b", step, theirs), "transformers")  # fmt: skip
    out, lines = tmp_path / "out", list[str]()
    sync = syncer(store, out, lines)
    restored = sync.prepare()
    assert [m.step for m in restored] == [40]
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["checkpoint-40"]
    named = [line for line in lines if "is not this run's: its trainer's history" in line]
    assert len(named) == 2, lines
    assert "checkpoint-90, step 90" in " ".join(named)
    # The trainer goes on from 40: its 50 is kept, and retention (keep 3) counts the run's.
    hf_logged(out, 50, ours)
    assert [m.step for m in sync.sync(finished=True)] == [50]
    assert [s for s, _ in kept(store)] == [30, 40, 45, 50, 90]


def test_with_an_empty_store_what_was_there_before_is_named_and_never_uploaded(
    store: Store, tmp_path: Path
) -> None:
    out, lines = tmp_path / "out", list[str]()
    hf_folder(out, 90)
    sync = syncer(store, out, lines)
    sync.prepare()
    assert any("checkpoint-90" in line and "never uploaded" in line for line in lines)
    assert sync.sync(finished=True) == []
    hf_folder(out, 100)
    assert [m.step for m in sync.sync(finished=True)] == [100]
    assert kept(store) == [(100, "checkpoint-100")]


def test_this_runs_own_save_not_uploaded_yet_goes_up_on_the_next_start(
    store: Store, tmp_path: Path
) -> None:
    """Same machine: the save this run's costguard began to upload (its ledger) is the
    run's own, not another run's; it is neither moved aside nor left out."""
    out, lines = tmp_path / "out", list[str]()
    sync = syncer(store, out, lines)
    hf_folder(out, 10)
    sync.sync(finished=True)
    hf_folder(out, 20)
    killed_at_the_manifest(store, sync)  # costguard run killed before the manifest
    again = syncer(store, out, lines)
    again.prepare()
    assert not any("not this run's" in line for line in lines)
    assert [m.step for m in again.sync(finished=True)] == [20]


def test_links_out_of_the_folder_are_named_and_never_followed(store: Store, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = b"aws_secret_access_key = abc"
    (outside / "credentials").write_bytes(secret)
    out, lines = tmp_path / "out", list[str]()
    folder = hf_folder(out, 10)
    (folder / "credentials").symlink_to(outside / "credentials")
    (folder / "gone.bin").symlink_to(tmp_path / "nothing-here")
    (folder / "home").symlink_to(outside)
    (folder / "weights.safetensors").symlink_to("model.safetensors")  # inside: read
    sync = syncer(store, out, lines)
    (manifest,) = sync.sync(finished=True)
    paths = set(manifest.extra["folder"]["files"].values())
    assert "checkpoint-10/weights.safetensors" in paths
    assert not paths & {"checkpoint-10/credentials", "checkpoint-10/gone.bin", "checkpoint-10/home"}
    for name in ("credentials", "gone.bin", "home"):
        assert sum(f"checkpoint-10/{name}" in line for line in lines) == 1, lines
    everything = b"".join(store.get(p) for p in store.listing())
    assert secret not in everything
    # A Lightning last.ckpt linked to its step file is kept; one linked out is not.
    torch.save({"global_step": 20, "state_dict": {}}, out / "epoch=0-step=20.ckpt")
    (out / "last.ckpt").symlink_to("epoch=0-step=20.ckpt")
    torch.save({"global_step": 99}, outside / "x.ckpt")
    (out / "stolen.ckpt").symlink_to(outside / "x.ckpt")
    steps = sorted((m.step, m.extra["folder"]["path"]) for m in sync.sync(finished=True))
    assert "stolen.ckpt" not in {p for _, p in steps}
    assert (20, "last.ckpt") in steps
    assert any("stolen.ckpt" in line and "out of the folder" in line for line in lines)


def test_a_restore_never_writes_through_a_link_and_a_clash_falls_back(
    store: Store, tmp_path: Path
) -> None:
    run, lines = tmp_path / "run", list[str]()
    sync = syncer(store, run, lines)
    hf_folder(run / "latest", 10)
    hf_folder(run / "other", 5)
    sync.sync(finished=True)
    # A forged newer checkpoint: a file and a folder of one name.
    commit_as_before(
        store, 30, "checkpoint-30", {"checkpoint-30/a": b"1", "checkpoint-30/a/b": b"2"}
    )
    out, outside = tmp_path / "out", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    (out / "latest").symlink_to(outside)
    restored = syncer(store, out, lines).prepare()
    assert list(outside.iterdir()) == []
    assert [m.step for m in restored] == [5]
    assert any("cannot be put in the folder safely" in line for line in lines)
    assert any("is a link" in line for line in lines)
    assert (out / "other" / "checkpoint-5" / "trainer_state.json").is_file()


def test_a_save_goes_up_on_the_file_systems_event_not_the_next_poll(
    store: Store, tmp_path: Path
) -> None:
    """The look without events is an hour away: only the folder's events can bring the
    save up while the script runs."""
    out, lines = tmp_path / "out", list[str]()
    sync = FolderSync(store, out, keep=3, say=lines.append, poll_s=3600.0)
    sync.prepare()
    sync.start()
    try:
        hf_folder(out, 10)
        wait_for(lambda: kept(store), "the save in the store", poll_s=0.1)
        assert kept(store) == [(10, "checkpoint-10")], lines
    finally:
        sync.finish()


def test_the_trainers_rotation_deleting_a_folder_mid_upload_takes_nothing_from_it(
    store: Store, tmp_path: Path
) -> None:
    folder = hf_folder(tmp_path / "out", 10)
    uploaded, lines = folder_files(folder), list[str]()
    sync, original = syncer(store, folder.parent, lines), store.write_stream

    def rotated(path: str, produce: Any, **kw: Any) -> tuple[int, str]:
        if folder.exists():
            shutil.rmtree(folder)  # save_total_limit removes it as the upload begins
        return original(path, produce, **kw)

    store.write_stream = rotated  # type: ignore[method-assign]
    assert [m.step for m in sync.sync(finished=True)] == [10]
    store.write_stream = original  # type: ignore[method-assign]
    new_machine = tmp_path / "new"
    assert [m.step for m in syncer(store, new_machine, lines).prepare()] == [10]
    assert folder_files(new_machine / "checkpoint-10") == uploaded


def test_lightnings_last_and_step_file_of_one_step_are_one_save_for_retention(
    store: Store, tmp_path: Path
) -> None:
    out, lines = tmp_path / "out", list[str]()
    sync = FolderSync(store, out, keep=2, say=lines.append, settle_s=0.0)
    out.mkdir()
    for step in (10, 20, 30):
        torch.save({"global_step": step}, out / f"epoch=0-step={step}.ckpt")
        torch.save({"global_step": step}, out / "last.ckpt")
        sync.sync(finished=True)
    assert kept(store) == [
        (20, "epoch=0-step=20.ckpt"),
        (20, "last.ckpt"),
        (30, "epoch=0-step=30.ckpt"),
        (30, "last.ckpt"),
    ]


def test_a_run_whose_trainer_started_over_is_still_this_run(store: Store, tmp_path: Path) -> None:
    """The store's first checkpoint does not define the run: a trainer that started over
    below what was put back (its loader refused it, or the script does not resume) goes on
    in a history of its own, which a later machine puts back; the earlier history is named
    and kept, not put back. (Told by the first checkpoint's log_history, the new history was
    'not this run's' and never put back: every later machine resumed the old one.)"""
    before = {s: 1.0 / s for s in range(5, 101, 5)}
    after = {s: 3.0 + 1.0 / s for s in range(5, 101, 5)}
    lines: list[str] = []
    first = syncer(store, tmp_path / "first", lines)
    first.prepare()
    for step in (10, 20):
        hf_logged(tmp_path / "first", step, before)
        first.sync(finished=True)
    out = tmp_path / "second"
    second = syncer(store, out, lines)
    assert [m.step for m in second.prepare()] == [20]
    for step in (5, 10, 15, 20, 25):  # started over at 0
        if step == 20:
            shutil.rmtree(out / "checkpoint-20")
        hf_logged(out, step, after)
        second.sync(finished=True)
    assert any("did not resume from it" in line for line in lines)
    third = syncer(store, tmp_path / "third", lines)
    (restored,) = third.prepare()
    assert restored.step == 25
    named = [line for line in lines if "is not this run's" in line]
    assert len(named) == 2, lines  # the first history's 10 and 20
    assert all("recorded it in another run" in line for line in named)
    assert not any("checkpoint-25" in line for line in named)


def lightning_ckpt(root: Path, step: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"epoch=0-step={step}.ckpt"
    torch.save({"global_step": step, "state_dict": {"w": torch.full((3,), float(step))}}, path)
    return path


@pytest.mark.parametrize("kind", ["accelerate", "lightning"])
def test_another_runs_accelerate_or_lightning_checkpoint_is_told_apart_by_the_runs_record(
    store: Store, tmp_path: Path, kind: str
) -> None:
    """An older costguard (another machine) uploaded another run's step-90 checkpoint into
    the store after this run had resumed step 40 with this costguard: Accelerate and
    Lightning folders carry nothing that ties them to a run, but this run's checkpoints
    carry costguard's record (resumed from 40), so the 90 is named and never put back
    (the old code put it back, and the trainer resumed another run's model)."""

    def write(root: Path, step: int) -> dict[str, bytes]:
        if kind == "lightning":
            path = lightning_ckpt(root, step)
            return {path.name: path.read_bytes()}
        folder = accelerate_folder(root, step, 2)
        return {f"{folder.name}/{k}": v for k, v in folder_files(folder).items()}

    def path(step: int) -> str:
        return f"epoch=0-step={step}.ckpt" if kind == "lightning" else f"checkpoint_{step}"

    for step in (10, 30, 40):
        commit_as_before(store, step, path(step), write(tmp_path / f"old{step}", step), kind)
    out, lines = tmp_path / "out", list[str]()
    sync = syncer(store, out, lines)
    assert [m.step for m in sync.prepare()] == [40]
    write(out, 50)
    assert [m.step for m in sync.sync(finished=True)] == [50]
    commit_as_before(store, 90, path(90), write(tmp_path / "other", 90), kind)
    again, lines = syncer(store, tmp_path / "again", []), list[str]()
    again.say = lines.append
    assert [m.step for m in again.prepare()] == [50]
    named = [line for line in lines if "is not this run's" in line]
    assert len(named) == 1, lines
    assert f"{path(90)}, step 90" in named[0]
    assert "(step 40)" in named[0]  # where this run's record says it resumed
