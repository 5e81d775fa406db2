"""Get a result out of a checkpoint store: the verified state, or the weights as a plain file.

:func:`load_state` returns the state dict of the newest checkpoint that verifies (or of
one step), the way a resume would read it: sha256-checked, tensors mapped from a local
file. :func:`export` writes one part of it (the model's weights, by default) as
``.safetensors`` or ``.pt``, atomically: the file appears complete or not at all.

The safetensors file is written here, from the format's public description (an 8-byte
little-endian header length, a JSON header of ``dtype``/``shape``/``data_offsets`` per
tensor, then the raw little-endian bytes), so exporting needs nothing beyond torch.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from costguard.checkpoint import foldersync, sharded
from costguard.checkpoint.manifest import Manifest, restore_order
from costguard.checkpoint.restoring import Restorer
from costguard.checkpoint.store import Store, storage_options_from_env
from costguard.clouds import require
from costguard.errors import CostguardError, InputError
from costguard.files import atomic_write

#: torch dtype name -> safetensors dtype.
SAFETENSORS_DTYPES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}
FORMATS = (".safetensors", ".pt")


def open_store(url: str, storage_options: Mapping[str, Any] | None = None) -> Store:
    """The store at ``url`` for reading: nothing is created, a missing one is an error."""
    options = storage_options if storage_options is not None else storage_options_from_env()
    store = Store.open(url, options, create=False)
    store.check_exists()
    return store


def load_state(
    url: str,
    *,
    step: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The verified state of the newest checkpoint at ``url`` (or of ``step``).

    The state holds ``model``, ``optimizer`` and the other parts the training loop gave
    to :meth:`~costguard.checkpoint.Checkpointer.step`, plus ``step``, ``epoch``, ``rng``
    and ``extra``: ``load_state("s3://b/run1")["model"]`` is a state dict for
    ``model.load_state_dict``. A sharded checkpoint (FSDP2) is assembled whole in this
    process (see :func:`~costguard.checkpoint.sharded.load_whole`).
    """
    state, _ = _load(open_store(url, storage_options), step)
    return state


def _load(store: Store, step: int | None) -> tuple[dict[str, Any], Manifest]:
    restorer = Restorer(store)
    survey = restorer.survey()
    order = restore_order(survey.manifests, survey.sizes)
    if step is not None:
        steps = sorted({m.step for m in order})
        order = [m for m in order if m.step == step]
        if not order:
            shown = ", ".join(str(s) for s in steps[-10:]) or "none"
            msg = f"no complete checkpoint of step {step} at {store.url}"
            raise InputError(msg, hint=f"steps there (newest 10): {shown}")
    problems = []
    for manifest in order:  # as a restore: every one its survey read (at most 64)
        try:
            if manifest.sharded:
                state = sharded.load_whole(store, manifest)
            elif manifest.folder:  # a trainer's own checkpoint (costguard run --sync-dir)
                state = foldersync.folder_state(store, manifest)
            else:
                state = restorer.load(manifest)
        except CostguardError as exc:
            problems.append(f"{manifest.name}: {exc.message}")
            continue
        if not isinstance(state, dict):
            problems.append(f"{manifest.name}: not a costguard training state")
            continue
        return state, manifest
    msg = f"no checkpoint at {store.url} could be read and verified"
    if problems:
        msg += f" ({'; '.join(problems[:3])})"
    raise CostguardError(msg, hint="costguard checkpoint ls URL shows what is there")


def export(
    url: str,
    to: str | os.PathLike[str],
    *,
    step: int | None = None,
    part: str = "model",
    storage_options: Mapping[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Manifest:
    """Write ``part`` of the checkpoint's state to ``to`` (``.safetensors`` or ``.pt``).

    Returns the manifest of the checkpoint exported. ``progress(done, total)`` is called
    with bytes as tensors are written (safetensors).
    """
    target = Path(to)
    if target.suffix not in FORMATS:
        msg = f"cannot export to {target.name!r}: the name must end in .safetensors or .pt"
        raise InputError(msg, hint="e.g. --to model.safetensors")
    if not target.parent.is_dir():
        msg = f"the folder {str(target.parent)!r} does not exist"
        raise InputError(msg, hint="create it first, or choose another --to")
    store = open_store(url, storage_options)
    state, manifest = _load(store, step)
    if part not in state or state[part] is None:
        known = sorted(k for k, v in state.items() if isinstance(v, dict))
        msg = f"checkpoint {manifest.name} has no {part!r} part"
        raise InputError(msg, hint=f"parts in it: {', '.join(known)}")
    chosen = state[part]
    metadata = {
        "costguard_checkpoint": manifest.name,
        "step": str(manifest.step),
        "part": part,
    }
    writer = _write_safetensors if target.suffix == ".safetensors" else _write_torch
    atomic_write(target, lambda file: writer(chosen, file, metadata, progress))
    return manifest


def _write_torch(
    value: Any, file: Any, metadata: Mapping[str, str], progress: Callable[[int, int], None] | None
) -> None:
    require("torch", "train").save(value, file)


def _write_safetensors(
    value: Any, file: Any, metadata: Mapping[str, str], progress: Callable[[int, int], None] | None
) -> None:
    torch = require("torch", "train")
    if sys.byteorder != "little":  # safetensors is little-endian; torch's bytes are native
        msg = "exporting safetensors needs a little-endian machine"
        raise CostguardError(msg, hint="export as .pt instead")
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items()
    ):
        msg = "safetensors holds a flat mapping of names to tensors; this part is not one"
        raise InputError(msg, hint="export it as .pt, or export --part model")
    header: dict[str, Any] = {"__metadata__": dict(metadata)}
    offset = 0
    tensors = []
    for name in sorted(value):
        tensor = value[name].detach()
        dtype = SAFETENSORS_DTYPES.get(str(tensor.dtype).removeprefix("torch."))
        if dtype is None:
            msg = f"tensor {name!r} has dtype {tensor.dtype}, which safetensors cannot hold"
            raise InputError(msg, hint="export as .pt instead")
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": dtype,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        tensors.append(tensor)
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    file.write(struct.pack("<Q", len(text)))
    file.write(text)
    done = 0
    for tensor in tensors:
        flat = tensor.contiguous().reshape(-1).cpu()
        if flat.numel():
            raw = flat.view(torch.uint8).numpy()
            file.write(memoryview(raw))
            done += raw.nbytes
        if progress is not None:
            progress(done, offset)
