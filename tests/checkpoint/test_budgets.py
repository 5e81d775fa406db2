"""Bounded work on what a store holds (issue 28): one survey reads a bounded amount of
manifest text (newest first; the rest is reported unread and kept), a Restorer keeps a
bounded amount parsed, no read takes an object past the size its reader accepts, and a
restore gives up after a bounded number of checkpoints that do not load. Before, 8
manifests of 4 MiB cost ``checkpoint ls`` 930 MB, and 20,000 folders that do not load
were each tried. The time and memory of ``ls`` on 20,000 folders: benchmarks/ls.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from costguard.checkpoint import load_state, restoring
from costguard.checkpoint import state as state_mod
from costguard.checkpoint.inventory import inventory
from costguard.checkpoint.manifest import MANIFEST_FILE, Manifest, ObjectEntry, checkpoint_name
from costguard.checkpoint.store import Store, TooLargeError
from costguard.errors import CostguardError


def make_folders(root: Path, count: int, payload: bytes = b"not a torch file") -> list[str]:
    """``count`` complete checkpoints (manifest and payload) written as a save would."""
    digest = hashlib.sha256(payload).hexdigest()
    names = []
    for step in range(count):
        name = checkpoint_name(step, f"{step:08x}")
        folder = root / name
        folder.mkdir(parents=True)
        (folder / "state.pt").write_bytes(payload)
        entry = ObjectEntry("state.pt", len(payload), digest)
        (folder / MANIFEST_FILE).write_text(Manifest(name, step, 1.0 + step, (entry,)).to_json())
        names.append(name)
    return names


def counting_gets(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    paths: list[str] = []
    get = Store.get

    def counted(self: Store, path: str, max_bytes: int | None = None) -> bytes:
        paths.append(path)
        return get(self, path, max_bytes)

    monkeypatch.setattr(Store, "get", counted)
    return paths


def test_a_survey_reads_a_bounded_number_of_manifests_newest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = make_folders(tmp_path, 40)
    monkeypatch.setattr(restoring, "SURVEY_MANIFESTS", 10)
    read = counting_gets(monkeypatch)
    entries = inventory(Store.open(tmp_path, create=False), verify_latest=False)
    assert len(read) == 10
    assert {p.split("/")[0] for p in read} == set(names[-10:])
    by_name = {e.name: e for e in entries}
    assert len(entries) == 40  # every folder is reported
    assert by_name[names[-1]].latest
    assert all(by_name[n].status == "complete" for n in names[-10:])
    assert all(by_name[n].status == "unreadable" for n in names[:-10])  # kept, not corrupt
    assert "not read" in by_name[names[0]].problem


def forge_large_manifests(root: Path, steps: list[int]) -> None:
    """Manifests of 4 MiB as anyone who can write the store may write them, at steps newer
    than the valid checkpoints: 60,000 objects none of which is there, 4 MiB of blanks
    around a manifest of nothing, 4 MiB of text that is no JSON."""
    entry = {"name": "x", "size_bytes": 1, "sha256": "0" * 64}
    for n, step in enumerate(steps):
        name = checkpoint_name(step, f"{step:08x}")
        folder = root / name
        folder.mkdir(parents=True)
        if n % 3 == 0:
            objects = [{**entry, "name": f"o{i}"} for i in range(60_000)]
            doc = json.loads(Manifest(name, step, 1.0 + step, ()).to_json())
            doc = {**{k: v for k, v in doc.items() if k != "objects"}, "objects": objects}
            text = json.dumps(doc, separators=(",", ":"))[: 4 * 2**20 - 1]
            if len(text) == 4 * 2**20 - 1:  # cut to the limit: a list closed early
                text = text[: text.rindex("},{") + 1] + "]}"
        elif n % 3 == 1:
            one = (ObjectEntry("state.pt", 1, "0" * 64),)
            text = " " * (4 * 2**20 - 4096) + Manifest(name, step, 1.0, one).to_json()
        else:
            text = "{" * (4 * 2**20 - 1)
        (folder / MANIFEST_FILE).write_text(text)
        assert 4 * 2**20 - 8192 < len(text) <= 4 * 2**20


def test_forged_large_manifests_do_not_hide_a_valid_checkpoint(tmp_path: Path) -> None:
    """Issue 43 item 9: five forged 4 MiB manifests used up a survey's 16 MiB shared by
    all, and valid checkpoints 40, 60 and 61 were never read (`costguard run` refused)."""
    valid = make_folders(tmp_path / "all", 62)
    for name in valid:
        if int(name.split("-")[1]) not in (40, 60, 61):
            (tmp_path / "all" / name / MANIFEST_FILE).unlink()  # no manifest: not a candidate
    forge_large_manifests(tmp_path / "all", [100, 101, 102, 103, 104])
    entries = inventory(Store.open(tmp_path / "all", create=False))
    latest = [e for e in entries if e.latest]
    assert [e.step for e in latest] == [61]
    by_step = {e.step: e for e in entries}
    assert {by_step[s].status for s in (40, 60, 61)} == {"complete"}
    assert all(by_step[s].status in ("corrupt", "incomplete") for s in range(100, 105)), [
        (by_step[s].status, by_step[s].problem) for s in range(100, 105)
    ]


def test_a_restorer_keeps_a_bounded_amount_of_manifests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = make_folders(tmp_path, 30)
    size = len((tmp_path / names[0] / MANIFEST_FILE).read_bytes())
    monkeypatch.setattr(restoring, "CACHED_MANIFEST_BYTES", 5 * size)
    restorer = restoring.Restorer(Store.open(tmp_path, create=False))
    assert len(restorer.survey().manifests) == 30
    read = counting_gets(monkeypatch)
    assert len(restorer.survey().manifests) == 30
    assert len(read) >= 25  # only the last few surveyed stayed parsed


def test_no_read_takes_an_object_past_what_its_reader_accepts(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    store.put("big", b"x" * 5000)
    assert store.get("big", max_bytes=5000) == b"x" * 5000
    with pytest.raises(TooLargeError, match="more than 4999 bytes"):
        store.get("big", max_bytes=4999)
    name = make_folders(tmp_path / "ckpt", 1)[0]
    (tmp_path / "ckpt" / name / MANIFEST_FILE).write_bytes(b" " * (5 * 2**20))
    entries = inventory(Store.open(tmp_path / "ckpt", create=False))
    assert [e.status for e in entries] == ["corrupt"]


def test_a_restore_tries_a_bounded_number_of_checkpoints_that_do_not_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An export and a restore try every checkpoint their survey read (64 of 70), so that
    a forger's newer checkpoints that do not load cannot hide a valid older one."""
    make_folders(tmp_path, 70)  # verified bytes, none of them a torch file
    tried: list[Any] = []
    load_file = state_mod.load_file

    def counted(path: str) -> Any:
        tried.append(path)
        return load_file(path)

    monkeypatch.setattr(state_mod, "load_file", counted)
    with pytest.raises(CostguardError, match="could be read and verified"):
        load_state(str(tmp_path))
    assert len(tried) == restoring.SURVEY_MANIFESTS
    tried.clear()
    chosen, skipped = restoring.Restorer(Store.open(tmp_path, create=False)).choose()
    assert chosen is None
    assert len(tried) == restoring.SURVEY_MANIFESTS
    assert len(skipped) == 70  # each named with why (6 not read: past the survey's 64)
