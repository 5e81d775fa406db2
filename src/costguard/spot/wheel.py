"""The wheel of the costguard this controller runs, shipped to its instances with the job.

The name ``costguard`` on the public package index belongs to an unrelated project (a
Terraform cost CLI, 0.2.2 in May 2026, with its own ``costguard`` import package; checked
with ``pip index versions costguard`` and its wheel's METADATA on December 1, 2026). A boot
script that ran ``pip install costguard[train]`` would install that stranger's code on
every instance. So ``costguard launch`` packs the exact files this process imports into a
wheel (:func:`build`), puts it next to the job in the checkpoint store, which the
instance's role may read, and the boot script fetches it, checks its sha256 and installs
that file (``infra/bootstrap/user-data.sh``). The ``package`` option still overrides.

The wheel is built from the imported package folder and the installed distribution's
metadata, so an editable checkout ships its working tree as it is, and the same files give
the same bytes (fixed timestamps and order): the sha256 names the code.
"""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from costguard.errors import CostguardError

DISTRIBUTION = "costguard"
#: Where a wheel is kept in the checkpoint store, next to job/job.json.
STORE_DIR = "job"
#: Data the wheel build copies in from the repository (pyproject's force-include); an
#: editable checkout imports them from there instead.
CHECKOUT_DATA = {"_tables": "pricing", "_bootstrap": "infra/bootstrap", "_slurm": "infra/slurm"}
#: A fixed time for every entry: the same files always make the same wheel.
_EPOCH = (2020, 1, 1, 0, 0, 0)
_WHEEL_FILE = "Wheel-Version: 1.0\nGenerator: costguard\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


@dataclass(frozen=True)
class Wheel:
    """A built wheel: its file name, bytes and sha256 (hex)."""

    name: str
    data: bytes
    sha256: str

    @property
    def store_path(self) -> str:
        """Its path in the checkpoint store."""
        return f"{STORE_DIR}/{self.name}"


def _package_files(package: Path) -> dict[str, Path]:
    """Archive name -> file, for every file of the imported package (no caches)."""
    files = {}
    for path in sorted(package.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            files[f"costguard/{path.relative_to(package).as_posix()}"] = path
    checkout = package.parents[1]  # src/costguard -> the repository
    for inside, outside in CHECKOUT_DATA.items():
        source = checkout / outside
        if not (package / inside).is_dir() and source.is_dir():
            for path in sorted(source.rglob("*")):
                if path.is_file():
                    files[f"costguard/{inside}/{path.relative_to(source).as_posix()}"] = path
    return files


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build(package: Path | None = None) -> Wheel:
    """A wheel of the costguard this process runs (``package``: its folder, for tests)."""
    package = package or Path(__file__).resolve().parents[1]
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        msg = "costguard runs without its package metadata, so it cannot be shipped"
        raise CostguardError(msg, hint="install it (pip install -e . in its checkout)") from None
    version = dist.version
    info = f"costguard-{version}.dist-info"
    entries = {name: path.read_bytes() for name, path in _package_files(package).items()}
    entries[f"{info}/METADATA"] = (dist.read_text("METADATA") or "").encode()
    entries[f"{info}/WHEEL"] = _WHEEL_FILE.encode()
    entry_points = dist.read_text("entry_points.txt")
    if entry_points:
        entries[f"{info}/entry_points.txt"] = entry_points.encode()
    record = [_record_line(name, data) for name, data in entries.items()]
    entries[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            entry = zipfile.ZipInfo(name, date_time=_EPOCH)
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(entry, data)
    data = buffer.getvalue()
    return Wheel(f"costguard-{version}-py3-none-any.whl", data, hashlib.sha256(data).hexdigest())


def upload(store: Any, wheel: Wheel) -> None:
    """Put ``wheel`` next to the job in ``store`` (a :class:`costguard.checkpoint.store.Store`)
    and check that what was written hashes the same."""
    written = store.put_hashed(wheel.store_path, wheel.data)
    if written != wheel.sha256:  # pragma: no cover - the store wrote other bytes than given
        msg = f"the costguard wheel written to {wheel.store_path} does not match its sha256"
        raise CostguardError(msg, hint="run costguard launch again")


def options(wheel: Wheel) -> dict[str, str]:
    """The launch options that tell the boot script which wheel to fetch and trust."""
    return {"wheel": wheel.name, "wheel_sha256": wheel.sha256}
