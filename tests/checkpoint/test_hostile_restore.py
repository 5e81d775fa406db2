"""Checkpointer.restore() and ``costguard run``'s resume on a store a bucket writer has
filled (issue 43): next to one genuine checkpoint (step 10) hypothesis writes newer ones
whose manifests verify (sizes and sha256 match) but whose ``state.pt`` is not a state
this run can take (another shape, a list, a string where the RNG state goes, a rank list
that is not one, a pickle that would run code, no zip at all), ones whose bytes do not
match their manifest, and the forged manifests of :mod:`test_hostile_manifests`.

Whatever is there, the restore puts back the genuine checkpoint, bit for bit, naming each
forged one it passed over, or refuses with costguard's own error: never another
exception (a traceback under ``costguard run``), never a forged tensor left in the model.
Derandomized, a bounded number of examples."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from costguard.checkpoint import Checkpointer, load_state
from costguard.checkpoint.incremental import REFS_KEY
from costguard.checkpoint.manifest import MANIFEST_FILE, checkpoint_name
from costguard.errors import CostguardError
from tests.checkpoint.test_hostile_manifests import hostile
from tests.checkpoint.test_trust import FAST
from tests.helpers.faults import train
from tests.helpers.training import child_env


class RunsCode:
    """What a forged pickle would run on load (``weights_only`` refuses it)."""

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str]]:
        return (print, ("PWNED",))


def saved(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


#: What a forger puts in a state.pt, from the genuine state: each loads with
#: ``weights_only`` (or is refused by it), and none is a state this model can take.
PAYLOADS: dict[str, Callable[[dict[str, Any]], bytes]] = {
    "a list": lambda s: saved([1, 2, 3]),
    "a tensor": lambda s: saved(torch.zeros(3)),
    "no model": lambda s: saved({k: v for k, v in s.items() if k != "model"}),
    "model is text": lambda s: saved({**s, "model": "abc"}),
    "other shapes": lambda s: saved({**s, "model": {k: torch.ones(5, 5) for k in s["model"]}}),
    "rng is text": lambda s: saved({**s, "model": forged_weights(s), "rng": "x"}),
    "rng torch wrong": lambda s: saved(
        {**s, "model": forged_weights(s), "rng": {"torch": torch.zeros(3)}}
    ),
    "rng python wrong": lambda s: saved(
        {**s, "model": forged_weights(s), "rng": {"python": {"version": 3}}}
    ),
    "ranks is text": lambda s: saved({**s, "model": forged_weights(s), "ranks": "x"}),
    "ranks hold text": lambda s: saved({**s, "model": forged_weights(s), "ranks": ["x"]}),
    "extra is a list": lambda s: saved({**s, "model": forged_weights(s), "extra": [1]}),
    "optimizer is odd": lambda s: saved(
        {**s, "model": forged_weights(s), "optimizer": {"state": 5}}
    ),
    "pool refs odd": lambda s: saved({**s, REFS_KEY: [{"sha256": 5}]}),
    "runs code": lambda s: pickle.dumps(RunsCode()),
    "not a zip": lambda s: b"\x80\x04not a torch file",
}


def forged_weights(state: dict[str, Any]) -> dict[str, Any]:
    """The genuine model's keys and shapes, every value 7: a forger's weights that fit."""
    return {k: torch.full_like(v, 7.0) for k, v in state["model"].items()}


def tiny() -> tuple[torch.nn.Linear, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def genuine(root: Path) -> dict[str, torch.Tensor]:
    """The run's own checkpoint at step 10 (10 steps done) in ``root``; its weights."""
    model, opt = tiny()
    train(model, opt)
    with Checkpointer(str(root), every_steps=100, retry=FAST, incremental=False) as ckpt:
        ckpt.save(9, model=model, optimizer=opt, extra={"seen": 10})
        ckpt.flush()
    return {k: v.clone() for k, v in model.state_dict().items()}


def forge(root: Path, step: int, payload: bytes, *, matching: bool = True) -> None:
    """A checkpoint at ``step`` holding ``payload``: its manifest is the genuine one's
    with the payload's size and sha256 (``matching``), or the genuine ones (the bytes then
    do not verify)."""
    (source,) = root.glob("ckpt-000000000010-*")
    doc = json.loads((source / MANIFEST_FILE).read_text())
    name = checkpoint_name(step, f"{step:08x}")
    doc.update(name=name, step=step)
    if matching:
        doc["objects"] = [
            {**o, "size_bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
            for o in doc["objects"]
        ]
    (root / name).mkdir()
    (root / name / "state.pt").write_bytes(payload)
    (root / name / MANIFEST_FILE).write_text(json.dumps(doc))


def fill(root: Path, forged: list[tuple[str, bool]], manifests: list[bytes]) -> None:
    """The forged checkpoints at steps 20, 21, ...: a payload of ``PAYLOADS`` (verifying
    its manifest, or not), then the forged manifests."""
    (source,) = root.glob("ckpt-000000000010-*/state.pt")
    state = torch.load(source, weights_only=True)
    for step, (kind, matching) in enumerate(forged, start=20):
        forge(root, step, PAYLOADS[kind](state), matching=matching)
    for step, text in enumerate(manifests, start=20 + len(forged)):
        name = checkpoint_name(step, f"{step:08x}")
        (root / name).mkdir()
        (root / name / "state.pt").write_bytes(b"payload bytes")
        (root / name / MANIFEST_FILE).write_bytes(text)


@settings(
    max_examples=20,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    forged=st.lists(st.tuples(st.sampled_from(sorted(PAYLOADS)), st.booleans()), max_size=4),
    manifests=st.lists(st.integers(40, 45).flatmap(hostile), max_size=2),
)
def test_restore_puts_back_only_the_genuine_checkpoint(
    tmp_path_factory: pytest.TempPathFactory, forged: list[tuple[str, bool]], manifests: list[bytes]
) -> None:
    root = tmp_path_factory.mktemp("ckpt")
    weights = genuine(root)
    fill(root, forged, manifests)
    model, opt = tiny()
    extra: dict[str, Any] = {}
    ckpt = Checkpointer(str(root), every_steps=100, retry=FAST, check=False)
    try:
        step = ckpt.restore(model=model, optimizer=opt, extra=extra)
    except CostguardError:
        step = None  # refused by name; the Checkpointer's error, never another
    finally:
        ckpt.close(final=False)
    assert step == 10, forged
    assert extra == {"seen": 10}
    for key, value in model.state_dict().items():
        assert torch.equal(value, weights[key]), (key, forged)


SCRIPT = """
import torch
from costguard.checkpoint import Checkpointer
torch.manual_seed(0)
model = torch.nn.Linear(6, 3)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
ckpt = Checkpointer.from_env()
print("STEP", ckpt.restore(model=model, optimizer=opt, extra={}), flush=True)
print("SUM", float(model.weight.sum()), flush=True)
ckpt.close(final=False)
"""


def test_costguard_run_resumes_past_every_forgery_at_once(tmp_path: Path) -> None:
    """``costguard run``: the script's Checkpointer resumes from the genuine step 10
    past one forged checkpoint of each kind (all newer), no traceback, no code run: a
    restore tried the newest 8 that did not load, then refused, saying none could be used."""
    root = tmp_path / "ckpt"
    weights = genuine(root)
    # One of each kind, 16 in all: more than a restore once tried (8) before it refused.
    fill(root, [(kind, True) for kind in sorted(PAYLOADS)] + [("other shapes", False)], [])
    done = subprocess.run(
        [sys.executable, "-m", "costguard", "run", "--checkpoint", str(root), "--",
         sys.executable, "-c", SCRIPT],
        env=child_env(tmp_path), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "Traceback" not in out
    assert "PWNED" not in out
    assert "\x1b" not in out  # torch's refusal of a pickle that runs code has ANSI codes
    assert "STEP 10" in done.stdout, out[-3000:]
    assert f"SUM {float(weights['weight'].sum())}" in done.stdout
    assert "ckpt-000000000035-00000023" in done.stderr  # the newest forgery, named


def test_an_export_reads_past_every_forgery_that_does_not_load(tmp_path: Path) -> None:
    """``load_state`` (and so ``costguard checkpoint export``) passes over a forger's newer
    checkpoints that verify but do not load, as a restore does: twelve of them (more than
    the 8 an export once tried) hide the genuine step 10 from neither."""
    root = tmp_path / "ckpt"
    weights = genuine(root)
    fill(root, [("a list", True)] * 9 + [("a tensor", True)] * 3, [])
    state = load_state(str(root))
    assert state["step"] == 10
    assert set(state["model"]) == set(weights)
    assert all(torch.equal(state["model"][k], weights[k]) for k in weights)
