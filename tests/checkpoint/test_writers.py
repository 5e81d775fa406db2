"""One save path for both layouts (:mod:`costguard.checkpoint.writers`): a replicated state
(written by rank 0 as one payload) and a sharded one (FSDP2 on a gloo rank of one, written
through DCP) go through the same commit, retention, results and events.

The same training, saved once as a plain model and once as the same model sharded, under
the same settings (schedule, retention, incremental, an advisory or urgent notice, a commit
the store refuses, the final save), must give the same sequence of commits and deletions
in the store, the same results, the same events for ``costguard run`` and the same
manifests but for their layout; and in either, no object of a checkpoint is written after
its manifest (the commit is last).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from costguard.checkpoint import Checkpointer
from costguard.checkpoint.manifest import MANIFEST_FILE, parse_manifest, parse_name
from costguard.checkpoint.notices import Notice, NoticeBoard
from costguard.checkpoint.store import Store


def model_and_optimizer(*, sharded: bool) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The same weights either way; sharded on a device mesh of this one rank."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
    model[0].requires_grad_(False)  # a frozen part: what an incremental save stores once
    if sharded:
        mesh = init_device_mesh("cpu", (1,))
        fully_shard(model[0], mesh=mesh)
        fully_shard(model[2], mesh=mesh)
        fully_shard(model, mesh=mesh)
    trained = [p for p in model.parameters() if p.requires_grad]
    return model, torch.optim.SGD(trained, lr=0.1)


def record(
    store: Store, monkeypatch: pytest.MonkeyPatch, refuse: int | None
) -> list[tuple[str, str]]:
    """Every write and delete through ``store``, in order: ``(what, path)``; the commit
    of the checkpoint of step ``refuse`` fails (the store refuses its manifest)."""
    seen: list[tuple[str, str]] = []
    for method in ("put", "put_hashed", "write_stream"):
        real: Callable[..., Any] = getattr(store, method)

        def writing(path: str, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            folder, _, rest = path.partition("/")
            if rest == MANIFEST_FILE and parse_name(folder) == refuse:
                seen.append(("refused", path))
                msg = "the store refused the manifest"
                raise OSError(msg)
            seen.append(("write", path))
            return _real(path, *args, **kwargs)

        monkeypatch.setattr(store, method, writing)
    real_delete = store.delete

    def deleting(paths: Any) -> None:
        paths = list(paths)
        seen.extend(("delete", path) for path in paths)
        real_delete(paths)

    monkeypatch.setattr(store, "delete", deleting)
    return seen


def history(seen: list[tuple[str, str]]) -> list[tuple[str, int]]:
    """The checkpoints' story in the store: each commit and each deletion, by step.

    Checks on the way that nothing of a checkpoint is written after its manifest."""
    story: list[tuple[str, int]] = []
    committed: set[str] = set()
    for what, path in seen:
        folder, _, rest = path.partition("/")
        step = parse_name(folder)
        if step is None:
            continue  # the pool, the pace record: what differs between layouts
        if what == "refused":
            story.append(("refused", step))
        elif what == "write":
            assert folder not in committed, f"{path} written after its checkpoint's commit"
            if rest == MANIFEST_FILE:
                committed.add(folder)
                story.append(("commit", step))
        elif not story or story[-1] != ("delete", step):
            story.append(("delete", step))
    return story


def run(
    url: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    sharded: bool,
    steps: int,
    notice: tuple[int, str] | None,
    refuse: int | None,
    **options: Any,
) -> dict[str, Any]:
    """Train ``steps`` steps under a Checkpointer; what it did, as comparable values."""
    model, opt = model_and_optimizer(sharded=sharded)
    board = NoticeBoard()
    events = url.parent / f"{url.name}.events"
    ckpt = Checkpointer(
        url, notices=board, exit_on_notice=False, events_file=str(events), **options
    )
    seen = record(ckpt.store, monkeypatch, refuse)
    with ckpt:
        for step in range(steps):
            torch.manual_seed(step)
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
            if notice is not None and notice[0] == step:
                board.post(Notice("signal", notice[1], None))
            if ckpt.step(step, model=model, optimizer=opt):
                break
    monkeypatch.undo()
    step_of = {r.name: r.step for r in ckpt.results}
    manifests = [
        parse_manifest((url / r.name / MANIFEST_FILE).read_text(), r.name)
        for r in ckpt.results
        if (url / r.name / MANIFEST_FILE).is_file()
    ]
    return {
        "store": history(seen),
        "results": [
            (r.step, r.reason, r.ok, r.error, sorted(step_of.get(d, -1) for d in r.deleted))
            for r in ckpt.results
        ],
        "events": [
            {k: v for k, v in e.items() if k in ("event", "step", "reason", "ok", "committed")}
            for e in map(json.loads, events.read_text().splitlines())
        ],
        "kept": [(m.step, m.reason, m.epoch, m.library_version) for m in manifests],
        "layouts": {m.sharded for m in manifests},
    }


@pytest.fixture
def folders(tmp_path: Path) -> Callable[[str], Path]:
    made = iter(range(10**6))
    return lambda kind: tmp_path / f"{kind}-{next(made)}"


# One process group and one folder counter serve every example.
@settings(
    max_examples=12,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    steps=st.integers(2, 7),
    every_steps=st.integers(1, 3),
    keep_last=st.integers(1, 3),
    incremental=st.booleans(),
    notice=st.none() | st.tuples(st.integers(0, 6), st.sampled_from(["preempt", "rebalance"])),
    refuse=st.none() | st.integers(1, 7),
)
@example(steps=6, every_steps=1, keep_last=2, incremental=True, notice=(3, "preempt"), refuse=None)
@example(steps=5, every_steps=2, keep_last=1, incremental=False, notice=(1, "rebalance"), refuse=2)
@example(steps=4, every_steps=1, keep_last=1, incremental=True, notice=(2, "preempt"), refuse=3)
def test_a_replicated_and_a_sharded_save_commit_retain_and_report_alike(
    one_rank: None,
    folders: Callable[[str], Path],
    steps: int,
    every_steps: int,
    keep_last: int,
    incremental: bool,
    notice: tuple[int, str] | None,
    refuse: int | None,
) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        runs = {
            layout: run(
                folders(layout),
                monkeypatch,
                sharded=layout == "sharded",
                steps=steps,
                notice=notice,
                refuse=refuse,
                every_steps=every_steps,
                keep_last=keep_last,
                incremental=incremental,
            )
            for layout in ("replicated", "sharded")
        }
    replicated, sharded = runs["replicated"], runs["sharded"]
    assert replicated["layouts"] == {False}
    assert sharded["layouts"] == {True}
    for key in ("store", "results", "events", "kept"):
        assert replicated[key] == sharded[key], key
    # Something happened worth comparing: each save committed but the refused one, which
    # failed; and retention kept at most keep_last.
    commits = [step for what, step in replicated["store"] if what == "commit"]
    results = replicated["results"]
    assert results
    assert commits == [step for step, _, ok, _, _ in results if ok]
    failed = [(step, error) for step, _, ok, error, _ in results if not ok]
    assert all(step == refuse and "refused the manifest" in str(error) for step, error in failed)
    assert len(replicated["kept"]) <= keep_last
