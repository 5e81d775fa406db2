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

A mark is not proof on its own: Accelerate writes ``custom_checkpoint_N.pkl`` (objects
given to ``register_for_checkpointing``) *after* its mark, Hugging Face and Accelerate
shard weights behind an index, DeepSpeed and FSDP write folders of their own. So every
file must also be whole by its own format (:func:`whole`: a ``torch.save`` zip's central
directory, a pickle's STOP, a safetensors header and the bytes it declares, JSON that
parses) and every part a folder names must be there (a weights index's shards, DCP's
``.metadata``, DeepSpeed's ``latest`` and the folder it names).

A symbolic link is never followed out of the sync dir: a link to a file inside it is read
as that file; a dangling one, one pointing out of the folder and one to a folder are left
out of the item and named in :attr:`Item.links` (the rest of the checkpoint is kept).

An :class:`Item` also records each file's size and time, so the syncer can wait until
nothing has changed for a while before it uploads.

Which folder may be a sync dir at all is one rule for every command that takes
``--sync-dir`` (``run``, ``launch``, ``slurm script``/``submit``): :func:`sync_dir_path`.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickletools
import re
import struct
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
#: JSON files read whole to check they parse; bigger ones are taken as they are.
MAX_JSON_BYTES = 64 * 2**20
#: A safetensors header's bound (the format's own limit is 100 MB).
MAX_HEADER_BYTES = 100_000_000
#: Files of one checkpoint folder looked at (a trainer's folder holds tens).
MAX_FILES = 10_000
_INDEX = re.compile(r".*\.(safetensors|bin)\.index\.json")


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
    #: Whether the trainer finished it: its mark there, every file whole, every part there.
    marked: bool
    #: Why it is not finished ("" when it is).
    problem: str = ""
    #: (path under the sync dir, why) of each link left out: dangling, out of the folder.
    links: tuple[tuple[str, str], ...] = ()

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


def lightning_step(path: Path, *, name: str | None = None) -> int | None:
    """The step of a finished Lightning ``.ckpt``: ``step=N`` in its name, else the
    ``global_step`` its pickle records (read as opcodes: nothing in it is executed);
    ``None`` for a file that is not a readable zip archive (cut short, or still written).
    ``name``: the name the file is found by (a link's, when ``path`` is where it leads).
    """
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
            named = _LIGHTNING_STEP.search(name or path.name)
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
    hidden ones skipped; links not followed), oldest step first."""
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
                elif entry.name.endswith(".ckpt") and (
                    entry.is_file(follow_symlinks=False) or entry.is_symlink()
                ):
                    found.append(_file_item(root, path))
    return sorted(found, key=lambda i: (-1 if i.step is None else i.step, i.path))


def inside(root: Path, path: Path) -> Path | None:
    """The regular file ``path`` (under ``root``) stands for: itself, or where its links
    lead when that is a file inside ``root``; ``None`` for a dangling link, one leading
    out of ``root`` or to anything but a file."""
    try:
        target = Path(os.path.realpath(path))
        real_root = Path(os.path.realpath(root))
        if not target.is_relative_to(real_root) or not target.is_file():
            return None
    except (OSError, ValueError):
        return None
    return target


def _link_problem(root: Path, path: Path) -> str:
    """Why the link at ``path`` is left out (it is one ``inside`` refused)."""
    try:
        target = str(path.readlink())
    except OSError:
        target = "?"
    real = Path(os.path.realpath(path))
    if not real.exists():
        return f"a dangling link (to {target})"
    if not real.is_relative_to(Path(os.path.realpath(root))):
        return f"a link out of the folder (to {target})"
    return f"a link to a folder (to {target}), not followed"


def _entry(root: Path, path: Path) -> tuple[str, int, int] | None:
    """(path under ``root``, size, mtime_ns) of the file ``path`` stands for, or ``None``
    for a link that is left out."""
    real = path if not path.is_symlink() else inside(root, path)
    if real is None:
        return None
    info = real.stat(follow_symlinks=False)
    return path.relative_to(root).as_posix(), info.st_size, info.st_mtime_ns


def _folder_item(root: Path, folder: Path) -> Item | None:
    files: list[Path] = []
    for dirpath, dirnames, names in os.walk(folder):
        files.extend(Path(dirpath, n) for n in names)
        # os.walk lists links to folders with the folders and does not follow them.
        files.extend(Path(dirpath, d) for d in dirnames if Path(dirpath, d).is_symlink())
        if len(files) > MAX_FILES:
            break
    kind = folder_kind(folder.name, (f.name for f in files if f.parent == folder))
    if kind is None:
        return None
    mark = HF_MARK if kind == "transformers" else ACCELERATE_MARK
    entries, links = [], []
    for path in files:
        entry = _entry(root, path)
        if entry is None:
            links.append((path.relative_to(root).as_posix(), _link_problem(root, path)))
        else:
            entries.append(entry)
    problem = ""
    if len(files) > MAX_FILES:
        problem = f"more than {MAX_FILES} files"
    elif not (folder / mark).is_file():
        problem = f"no {mark}"
    else:
        problem = folder_problem(folder, [root / e[0] for e in entries])
    return Item(
        path=folder.relative_to(root).as_posix(),
        kind=kind,
        step=folder_step(folder.name),
        files=tuple(sorted(entries)),
        marked=not problem,
        problem=problem,
        links=tuple(sorted(links)),
    )


def _file_item(root: Path, path: Path) -> Item:
    rel = path.relative_to(root).as_posix()
    real = inside(root, path) if path.is_symlink() else path
    if real is None:
        problem = _link_problem(root, path)
        return Item(rel, "lightning", None, (), False, problem, ((rel, problem),))
    step = lightning_step(real, name=path.name)
    entry = _entry(root, path)
    return Item(
        path=rel,
        kind="lightning",
        step=step,
        files=(entry,) if entry else (),
        marked=step is not None,
        problem="" if step is not None else "not a readable zip archive (cut short)",
    )


def item_at(root: Path, path: str) -> Item | None:
    """The item at ``path`` under ``root`` as it is now, or ``None``."""
    target = root / path
    with contextlib.suppress(OSError):
        if target.is_dir() and not target.is_symlink():
            return _folder_item(root, target)
        if target.is_file() or target.is_symlink():
            return _file_item(root, target)
    return None


#: (path, size, mtime_ns) -> what :func:`whole` found, so a look at an unchanged folder
#: reads no file again.
_WHOLE: dict[tuple[str, int, int], str] = {}


def whole(path: Path, name: str | None = None) -> str:
    """Why the file at ``path`` is not whole by its own format ("" when it is): a zip
    (``torch.save``) whose central directory cannot be read, a pickle without its STOP,
    a safetensors file shorter than its header declares, JSON that does not parse, an
    empty file. ``name``: the name its format is told by, when the file at ``path`` has
    another (a copy read from a store).

    >>> import pickle, tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> (folder / "a.pkl").write_bytes(pickle.dumps({"x": 1})[:-1]) and whole(folder / "a.pkl")
    'a.pkl is cut short (a pickle without its end)'
    >>> (folder / "b.json").write_text('{"global_step": 3}') and whole(folder / "b.json")
    ''
    """
    info = path.stat()
    key = (f"{path}\0{name}", info.st_size, info.st_mtime_ns)
    if key not in _WHOLE:
        if len(_WHOLE) > MAX_ENTRIES:
            _WHOLE.clear()
        _WHOLE[key] = _why_not_whole(path, info.st_size, name or path.name)
    return _WHOLE[key]


def _why_not_whole(path: Path, size: int, name: str) -> str:
    if size == 0:
        return f"{name} is empty"
    try:
        with path.open("rb") as file:
            head = file.read(8)
            if head[:4] == b"PK\x03\x04":
                try:
                    with zipfile.ZipFile(file) as archive:
                        archive.namelist()
                except (zipfile.BadZipFile, ValueError, EOFError):
                    return f"{name} is cut short (no zip directory at its end)"
                return ""
            if name.endswith(".safetensors"):
                return _safetensors_problem(file, head, size, name)
            if name.endswith(".json") and size <= MAX_JSON_BYTES:
                try:
                    json.loads(head + file.read())
                except ValueError:
                    return f"{name} is not whole JSON"
                return ""
            if name.endswith((".pkl", ".pickle")) and head[:1] == b"\x80":
                file.seek(-1, os.SEEK_END)
                if file.read(1) != b".":
                    return f"{name} is cut short (a pickle without its end)"
    except OSError as exc:
        return f"{name} cannot be read ({exc.strerror or exc})"
    return ""


def _safetensors_problem(file: Any, head: bytes, size: int, name: str) -> str:
    if len(head) < 8:
        return f"{name} is cut short"
    (length,) = struct.unpack("<Q", head)
    if length > MAX_HEADER_BYTES or 8 + length > size:
        return f"{name} is cut short (its header)"
    try:
        header = json.loads(file.read(length))
        ends = [
            int(v["data_offsets"][1])
            for k, v in header.items()
            if k != "__metadata__" and isinstance(v, dict)
        ]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return f"{name} has no readable header"
    if 8 + length + max(ends, default=0) > size:
        return f"{name} is cut short (its header declares more bytes)"
    return ""


def folder_problem(folder: Path, files: list[Path]) -> str:
    """Why the checkpoint ``folder`` (holding ``files``) is not whole ("" when it is):
    a file cut short, a shard its index names missing, a DCP folder without its
    ``.metadata`` (written last), a DeepSpeed ``latest`` naming no folder, or DeepSpeed
    states without ``latest``."""
    names = {f.relative_to(folder).as_posix() for f in files}
    for path in files:
        problem = whole(path)
        if problem:
            return f"{path.relative_to(folder).as_posix()}: {problem}"
    for path in files:
        rel = path.relative_to(folder)
        if _INDEX.fullmatch(path.name):
            missing = _missing_shards(path, names, rel.parent)
            if missing:
                return f"{rel.as_posix()} names {missing}, which is not there"
        if path.name.endswith(".distcp") and (rel.parent / ".metadata").as_posix() not in names:
            return f"{rel.parent.as_posix()}/ has no .metadata (DCP writes it last)"
        if path.name.endswith("_states.pt") and not _deepspeed_latest(folder, rel, names):
            return f"{rel.parent.as_posix()}/ is DeepSpeed's, with no 'latest' naming it"
    return ""


def _missing_shards(index: Path, names: set[str], parent: PurePosixPath | Path) -> str:
    try:
        weight_map = json.loads(index.read_bytes())["weight_map"]
        shards = {str(v) for v in weight_map.values()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return ""  # not an index this check knows: judged as a file only
    for shard in sorted(shards):
        if (Path(parent) / shard).as_posix().removeprefix("./") not in names:
            return shard
    return ""


def _deepspeed_latest(folder: Path, states: Path, names: set[str]) -> bool:
    """Whether a ``latest`` file next to DeepSpeed's tag folder names it (DeepSpeed writes
    ``latest`` once every state of the tag is written)."""
    tag = states.parent
    latest = folder / tag.parent / "latest"
    if (tag.parent / "latest").as_posix().removeprefix("./") not in names:
        return False
    try:
        return latest.read_text(errors="replace").strip() == tag.name
    except OSError:
        return False
