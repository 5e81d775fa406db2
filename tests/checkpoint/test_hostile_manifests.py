"""Hostile manifests, as anyone who can write the store may write them (issue 43).

Hypothesis writes manifests that are huge, deeply nested, sized NaN or 2^70, name objects
``..``, absolute paths or control characters, clash (a file and a folder of one name, a
name listed twice), lie about their step or format, or are no JSON at all, next to one
valid checkpoint; then ``checkpoint ls``, ``checkpoint verify`` and ``run --sync-dir``
(its resume puts the newest usable checkpoint back before the script starts) run on the
store. Each answers with its documented exit code (0, 2; ``verify`` 1 for a damaged
checkpoint), never an "unexpected" error or a traceback, prints no control character
raw, and ends within 10 s; the whole store at once peaks under 200 MB.
Reproducible: derandomized, a bounded number of examples.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from costguard.checkpoint.manifest import (
    FOLDER_FORMAT_VERSION,
    MANIFEST_FILE,
    checkpoint_name,
)
from costguard.cli import cli

PAYLOAD = b"payload bytes"
DIGEST = hashlib.sha256(PAYLOAD).hexdigest()
#: The controls a forged record might carry; none may reach the output raw.
RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\x00")

#: Hostile values for a field of an object entry or of the manifest.
NUMBERS: list[Any] = [float("nan"), float("inf"), -1, 2**70, 10**400, 1e308, "12", True, None]
NAMES: list[Any] = ["..", "../state.pt", "/etc/passwd", "a/../../x", "x\x1b]0;t\x07",
                    "state.pt\n", "", "a" * 5000, 7, None, "manifest.json", "a//b"]  # fmt: skip
FOLDER_PATHS: list[Any] = ["..", "../outside", "/tmp/abs", "out\x1b[2J", "latest", "latest/x",
                           "a\u202eb", "", None, ["x"]]  # fmt: skip


def entry(name: Any = "state.pt", size: Any = 13, sha: Any = DIGEST) -> dict[str, Any]:
    """An object entry; the default is PAYLOAD's (13 bytes)."""
    return {"name": name, "size_bytes": size, "sha256": sha}


def base(at: int, **fields: Any) -> dict[str, Any]:
    """A valid manifest of a replicated checkpoint at step ``at``, with ``fields`` over it."""
    doc = {"format_version": 1, "name": checkpoint_name(at, f"{at:08x}"), "step": at,
           "epoch": None, "created_unix": 1.0, "library_version": "x", "reason": "schedule",
           "objects": [entry()], "extra": {}}  # fmt: skip
    return {**doc, **fields}


def folder(step: int, path: Any, files: Any) -> dict[str, Any]:
    """A ``--sync-dir`` manifest placing its one object at ``files``."""
    return base(step, format_version=FOLDER_FORMAT_VERSION,
                extra={"folder": {"path": path, "files": files, "kind": "hf"}})  # fmt: skip


def clash(step: int) -> dict[str, Any]:
    """A ``--sync-dir`` manifest whose two files are a file and a folder of one name."""
    doc = folder(step, "ckpt", {"state.pt": "ckpt", "b.bin": "ckpt/x"})
    return {**doc, "objects": [entry(), entry("b.bin")]}


def deep(step: int, levels: int) -> bytes:
    """The manifest at ``step`` with an ``extra`` nested ``levels`` deep (as text: json
    cannot write what it cannot read)."""
    text = json.dumps(base(step, extra={"x": 1}))
    return text.replace('{"x": 1}', '{"a": ' * levels + "{}" + "}" * levels).encode()


@st.composite
def hostile(draw: st.DrawFn, step: int) -> bytes:
    """One forged manifest for the folder of ``step``."""
    kind = draw(st.sampled_from(["entry", "field", "folder", "text", "deep", "clash", "big"]))
    if kind == "entry":
        doc = base(step, objects=[entry(draw(st.sampled_from(NAMES)),
                                        draw(st.sampled_from(NUMBERS)))])  # fmt: skip
    elif kind == "field":
        name = draw(st.sampled_from(["format_version", "name", "step", "created_unix",
                                     "reason", "objects", "extra", "epoch"]))  # fmt: skip
        value = draw(st.sampled_from([*NUMBERS, *NAMES, [], {}, [1], "x\x1b]8;;http://e\x07"]))
        doc = base(step, **{name: value})
    elif kind == "folder":
        path = draw(st.sampled_from(FOLDER_PATHS))
        doc = folder(step, path, {"state.pt": draw(st.sampled_from(FOLDER_PATHS))})
    elif kind == "deep":
        levels = draw(st.sampled_from([50, 5000, 200_000]))
        return deep(step, levels) if draw(st.booleans()) else b"[" * levels
    elif kind == "clash":  # a file and a folder of one name; one name listed twice
        doc = (
            folder(step, "latest", {"state.pt": "latest"})  # `out/latest` is a file there
            if draw(st.booleans())
            else base(step, objects=[entry(), entry()])
        )
    elif kind == "big":  # past the 4 MiB a manifest may have
        return b" " * (4 * 2**20 + 1) + json.dumps(base(step)).encode()
    else:
        return draw(st.binary(max_size=200)) + draw(st.sampled_from([b"", b"\x1b]0;x\x07"]))
    return json.dumps(doc).encode()  # NaN and Infinity as Python writes them


def write_store(root: Path, forged: list[bytes]) -> None:
    """One valid checkpoint (step 10), then the forged manifests at steps 20, 21, ..."""
    for step, text in [(10, json.dumps(base(10)).encode()), *enumerate(forged, start=20)]:
        name = checkpoint_name(step, f"{step:08x}")
        (root / name).mkdir(parents=True)
        (root / name / "state.pt").write_bytes(PAYLOAD)
        (root / name / "b.bin").write_bytes(PAYLOAD)
        (root / name / MANIFEST_FILE).write_bytes(text)
    # A folder clash on disk too: `latest` is a file where a manifest wants a folder.
    (root.parent / "out").mkdir(exist_ok=True)
    (root.parent / "out" / "latest").write_bytes(b"a file")


def answers(args: list[str], codes: tuple[int, ...]) -> None:
    started = time.monotonic()
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    took = time.monotonic() - started
    out = result.stdout + result.stderr
    assert result.exit_code in codes, (args, result.exit_code, out[-1500:])
    assert "unexpected" not in out, out[-1500:]
    assert "Traceback" not in out, out[-1500:]
    for raw in RAW:
        assert raw not in out, (raw, out[-1500:])
    assert took < 10, f"{args[:2]} took {took:.1f} s"


@settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@example((json.dumps(base(20, reason="x\x1b]0;t\x07\u202e")).encode(),))
@given(st.integers(1, 3).flatmap(lambda n: st.tuples(*(hostile(20 + i) for i in range(n)))))
def test_hostile_manifests_get_a_documented_answer_from_every_reader(
    forged: tuple[bytes, ...],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp, "ckpt")
        write_store(root, list(forged))
        url = str(root)
        answers(["checkpoint", "ls", url], (0, 2))
        answers(["checkpoint", "ls", url, "--format", "json"], (0, 2))
        answers(["checkpoint", "verify", url], (0, 1, 2))  # 1: a checkpoint is damaged
        answers(
            ["run", "--checkpoint", url, "--sync-dir", str(Path(tmp, "out")), "--",
             sys.executable, "-c", "pass"],
            (0, 2),
        )  # fmt: skip


def test_every_kind_at_once_stays_under_200_mb(tmp_path: Path) -> None:
    """The store with one manifest of each kind, the largest ones included: each reader's
    peak memory, measured on its own process."""
    forged = [
        b" " * (4 * 2**20 - 200) + json.dumps(base(20)).encode(),  # 4 MiB, read whole
        b" " * (4 * 2**20 + 1),  # over the limit
        b"[" * 200_000,
        deep(23, 200_000),
        json.dumps(base(24, objects=[entry(f"o{i}") for i in range(60_000)])).encode()[: 4 * 2**20],
        json.dumps(base(25, objects=[entry(f"o{i}") for i in range(40_000)])).encode(),
        json.dumps(folder(26, "../outside", {"state.pt": "../outside"})).encode(),
        json.dumps(base(27, objects=[entry(size=float("nan"))])).encode(),
    ]
    root = tmp_path / "ckpt"
    write_store(root, forged)
    measure = (
        "import resource, subprocess, sys; "
        "r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for args in (["checkpoint", "ls", str(root)], ["checkpoint", "verify", str(root)]):
        done = subprocess.run(
            [sys.executable, "-c", measure, sys.executable, "-m", "costguard", *args],
            capture_output=True, text=True, env=env, timeout=120, check=True,
        )  # fmt: skip
        code, peak_kib = map(int, done.stdout.split())
        assert code in (0, 1), (args, code)
        assert peak_kib < 200 * 1024, f"{args[:2]} peaked at {peak_kib // 1024} MB"


def test_a_file_and_folder_clash_in_a_manifest_falls_back(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    write_store(root, [json.dumps(clash(20)).encode()])
    answers(
        ["run", "--checkpoint", str(root), "--sync-dir", str(tmp_path / "out"), "--",
         sys.executable, "-c", "pass"],
        (0, 2),
    )  # fmt: skip
