"""Which of a trainer's checkpoints in a sync dir are finished (``costguard run --sync-dir``).

The rules per trainer, with no store and no thread: :mod:`costguard.checkpoint.foldersync`
runs them and uploads what they call finished. Hugging Face's ``Trainer`` writes
``checkpoint-N/`` folders, Accelerate's ``save_state`` writes a folder (``checkpoint_N/``
with automatic naming), Lightning writes ``.ckpt`` files. Finished means what each trainer
writes last is there:

- Hugging Face: ``trainer_state.json`` is written after the weights and the optimizer;
- Accelerate: ``random_states_0.pkl`` comes after the models, optimizers and schedulers;
- Lightning: a ``.ckpt`` is a zip archive (``torch.save``) whose central directory, at its
  very end, is written last: a file cut short is not a readable zip.

An :class:`Item` also records each file's size and time, so the syncer can wait until
nothing has changed for a while before it uploads.

Which folder may be a sync dir at all is one rule for every command that takes
``--sync-dir`` (``run``, ``launch``, ``slurm script``/``submit``): :func:`sync_dir_path`.
"""

from __future__ import annotations

import contextlib
import os
import pickletools
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from costguard.errors import InputError
from costguard.logs import get_logger

logger = get_logger(__name__)

#: Bounds on one look at the folder (a sync dir is a trainer's output, not a dataset).
MAX_ENTRIES = 100_000
MAX_DEPTH = 8
_HF = re.compile(r"checkpoint-([0-9]+)")
_ACCELERATE = re.compile(r"checkpoint_([0-9]+)")
_LIGHTNING_STEP = re.compile(r"step=(\d+)")
_DIGITS = re.compile(r"(\d+)")
HF_MARK = "trainer_state.json"
ACCELERATE_MARK = "random_states_0.pkl"


def sync_dir_path(text: str, *, here: bool) -> str:
    """``--sync-dir`` checked, or an :class:`~costguard.errors.InputError` (exit 2, before
    any store or cloud is touched): not empty, not a URL (the store is ``--checkpoint``),
    no ``..`` part (where it lands would depend on the folder the job starts in and on
    links: the folder itself is named).

    ``here``: the folder is on this machine (``costguard run``, ``slurm script`` on a
    shared file system, ``launch --provider local``): an existing file is refused and the
    path is made absolute, since the job may start in another folder. Otherwise (a cloud
    instance's path) it is kept as given, relative to the instance's workdir.

    >>> sync_dir_path(" out/ ", here=False)
    'out/'
    >>> sync_dir_path("s3://b/out", here=False)
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: --sync-dir 's3://b/out' is a URL, not the trainer's output folder
    """
    text = text.strip()
    hint = "the folder the trainer writes its checkpoints in, e.g. --sync-dir out/"
    if not text:
        msg = "--sync-dir is empty"
        raise InputError(msg, hint=hint)
    if "://" in text:
        msg = f"--sync-dir {text[:200]!r} is a URL, not the trainer's output folder"
        raise InputError(msg, hint=f"the store goes in --checkpoint; {hint}")
    if ".." in PurePosixPath(text).parts:
        msg = f"--sync-dir {text[:200]!r} leaves the folder it names (a '..' part)"
        raise InputError(msg, hint=f"a folder under the workdir or an absolute path; {hint}")
    if not here:
        return text
    path = Path(text).expanduser()
    if path.is_file():
        msg = f"--sync-dir {text[:200]!r} is a file, not the trainer's output folder"
        raise InputError(msg, hint=hint)
    return str(path.resolve())


@dataclass(frozen=True)
class Item:
    """One checkpoint of the trainer's in the sync dir, as one look found it."""

    #: Its path under the sync dir (POSIX): a folder, or a Lightning ``.ckpt`` file.
    path: str
    kind: str  # "transformers" | "accelerate" | "lightning"
    step: int | None
    #: (path under the sync dir, size, mtime_ns) of each file, sorted.
    files: tuple[tuple[str, int, int], ...]
    #: Whether the trainer's mark of a finished save is there.
    marked: bool

    @property
    def sizes(self) -> tuple[tuple[str, int], ...]:
        return tuple((path, size) for path, size, _ in self.files)


def folder_kind(name: str, names: Iterable[str]) -> str | None:
    """Which trainer wrote folder ``name`` holding files ``names``, or ``None`` if it is
    no checkpoint folder.

    >>> folder_kind("checkpoint-40", ["model.safetensors", "trainer_state.json"])
    'transformers'
    >>> folder_kind("step_3", ["model.safetensors", "random_states_0.pkl"])
    'accelerate'
    >>> folder_kind("checkpoint_2", []), folder_kind("logs", ["events.out"])
    ('accelerate', None)
    """
    present = set(names)
    if _HF.fullmatch(name) or HF_MARK in present:
        return "transformers"
    if _ACCELERATE.fullmatch(name) or ACCELERATE_MARK in present:
        return "accelerate"
    return None


def folder_step(name: str) -> int | None:
    """The step a checkpoint folder's name carries (its last number), or ``None``.

    >>> folder_step("checkpoint-120"), folder_step("checkpoint_3"), folder_step("final")
    (120, 3, None)
    """
    numbers = _DIGITS.findall(name)
    return int(numbers[-1]) if numbers else None


def lightning_step(path: Path) -> int | None:
    """The step of a finished Lightning ``.ckpt``: ``step=N`` in its name, else the
    ``global_step`` its pickle records (read as opcodes: nothing in it is executed);
    ``None`` for a file that is not a readable zip archive (cut short, or still written).
    """
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
            named = _LIGHTNING_STEP.search(path.name)
            if named:
                return int(named.group(1))
            if len(pickles) != 1:
                return None
            data = archive.read(pickles[0])
    except (OSError, zipfile.BadZipFile, ValueError, EOFError):
        return None
    return _pickled_int(data, "global_step")


def _pickled_int(data: bytes, key: str) -> int | None:
    """The int that follows the first string ``key`` in a pickle (a dict's item).

    >>> import pickle
    >>> _pickled_int(pickle.dumps({"epoch": 1, "global_step": 300, "x": [1]}), "global_step")
    300
    """
    previous: Any = None
    try:
        for opcode, arg, _ in pickletools.genops(data):
            if opcode.name in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):
                continue
            if previous == key:
                return arg if isinstance(arg, int) and not isinstance(arg, bool) else None
            previous = arg if isinstance(arg, str) else None
    except (ValueError, EOFError):
        return None
    return None


def items_in(root: Path) -> list[Item]:
    """Every trainer checkpoint under ``root`` (bounded walk; costguard's own folders and
    hidden ones skipped), oldest step first."""
    found: list[Item] = []
    seen = 0
    stack = [(root, 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        seen += len(entries)
        if seen > MAX_ENTRIES:
            logger.warning(
                "costguard: more than %d entries under %s; looked no further", MAX_ENTRIES, root
            )
            break
        for entry in entries:
            if entry.name.startswith("."):
                continue
            path = Path(entry.path)
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False):
                    item = _folder_item(root, path)
                    if item is not None:
                        found.append(item)
                    elif depth < MAX_DEPTH:
                        stack.append((path, depth + 1))
                elif entry.is_file() and entry.name.endswith(".ckpt"):
                    found.append(_file_item(root, path))
    return sorted(found, key=lambda i: (-1 if i.step is None else i.step, i.path))


def _stat(root: Path, path: Path) -> tuple[str, int, int]:
    info = path.stat()
    return path.relative_to(root).as_posix(), info.st_size, info.st_mtime_ns


def _folder_item(root: Path, folder: Path) -> Item | None:
    files: list[Path] = []
    for dirpath, _, names in os.walk(folder):
        files.extend(Path(dirpath, n) for n in names)
    kind = folder_kind(folder.name, (f.name for f in files if f.parent == folder))
    if kind is None:
        return None
    mark = HF_MARK if kind == "transformers" else ACCELERATE_MARK
    return Item(
        path=folder.relative_to(root).as_posix(),
        kind=kind,
        step=folder_step(folder.name),
        files=tuple(sorted(_stat(root, f) for f in files)),
        marked=(folder / mark).is_file(),
    )


def _file_item(root: Path, path: Path) -> Item:
    step = lightning_step(path)
    return Item(
        path=path.relative_to(root).as_posix(),
        kind="lightning",
        step=step,
        files=(_stat(root, path),),
        marked=step is not None,
    )


def item_at(root: Path, path: str) -> Item | None:
    """The item at ``path`` under ``root`` as it is now, or ``None``."""
    target = root / path
    with contextlib.suppress(OSError):
        if target.is_dir():
            return _folder_item(root, target)
        if target.is_file():
            return _file_item(root, target)
    return None


def mark_of(item: Item) -> str:
    """What the trainer that wrote ``item`` writes last (what a finished save has).

    >>> mark_of(Item("checkpoint-10", "transformers", 10, (), marked=False))
    'trainer_state.json'
    """
    return {"transformers": HF_MARK, "accelerate": ACCELERATE_MARK}.get(
        item.kind, "zip directory at its end"
    )
