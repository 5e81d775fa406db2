"""Proof that a record in a store was written by this user's costguard, not by whoever
else can write to the bucket.

A lab's bucket is written by labmates, leaked keys and every job's instance role; what
they write is not what the user asked for. This user's costguard keeps a secret key
outside the bucket (``job.key`` next to the config file, mode 0600, made on the first
launch) and signs with it:

- the job's spec (:func:`spec_proof`): ``launch --attach`` runs a job only when its spec
  carries this user's digest of it, so a forged command, instance or price is refused;
- each stop request (:func:`stop_proof`), with a per-job key (:func:`job_key`) that
  ``costguard launch`` gives the job's processes in ``COSTGUARD_JOB_KEY`` (never stored in
  the bucket, never recorded): ``costguard run`` honours a request only when its digest
  holds, for its own attempt.

HMAC-SHA256 (RFC 2104): without the key no one can make a digest that holds.

>>> key = bytes(32)
>>> proof = stop_proof(job_key(key, "cg-a"), "cg-a", 2, "cap", 5.0)
>>> stop_holds(job_key(key, "cg-a"), "cg-a", 2, "cap", 5.0, proof)
True
>>> stop_holds(job_key(key, "cg-a"), "cg-a", 3, "cap", 5.0, proof)
False
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from costguard import contract
from costguard.errors import InputError
from costguard.settings import config_path

#: The environment variable that carries a job's key to its processes (a secret).
ENV_JOB_KEY = contract.ENV_JOB_KEY
KEY_FILE = "job.key"


def key_path(env: Mapping[str, str]) -> Path:
    """Where this user's key lives: ``COSTGUARD_JOB_KEY_FILE``, else beside the config
    file."""
    explicit = env.get(contract.ENV_JOB_KEY_FILE, "").strip()
    return Path(explicit).expanduser() if explicit else config_path(env).parent / KEY_FILE


def user_key(env: Mapping[str, str] | None = None, *, create: bool = False) -> bytes | None:
    """This user's key; ``create``: make one (0600) when there is none. ``None`` when
    there is none and ``create`` is false (or it cannot be read)."""
    path = key_path(os.environ if env is None else env)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if not create:
            return None
        data = secrets.token_bytes(32)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return user_key(env, create=False)
        except OSError as exc:
            msg = f"cannot create the job key {path}: {exc.strerror}"
            raise InputError(msg, hint="set XDG_CONFIG_HOME to a folder you can write") from None
        with os.fdopen(fd, "wb") as file:
            file.write(data)
    except OSError:
        return None
    return data if len(data) >= 16 else None


def _digest(key: bytes, *parts: object) -> str:
    message = json.dumps([str(p) for p in parts]).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def job_key(key: bytes, job_id: str) -> bytes:
    """The key of one job, derived from the user's: what the job's processes get."""
    return hmac.new(key, f"job:{job_id}".encode(), hashlib.sha256).digest()


def spec_proof(key: bytes, spec_doc: Mapping[str, Any]) -> str:
    """This user's digest of a job's spec (every field but the proof itself)."""
    fields = {k: v for k, v in spec_doc.items() if k != "proof"}
    return _digest(key, "spec", json.dumps(fields, sort_keys=True, default=str))


def spec_holds(key: bytes | None, spec_doc: Mapping[str, Any]) -> bool:
    """Whether ``spec_doc`` carries this user's digest of it."""
    proof = str(spec_doc.get("proof") or "")
    return key is not None and hmac.compare_digest(proof, spec_proof(key, spec_doc))


def stop_proof(key: bytes, job_id: str, attempt: int, reason: str, unix: float) -> str:
    """The digest of a stop request for attempt ``attempt`` of job ``job_id``."""
    return _digest(key, "stop", job_id, attempt, reason, repr(float(unix)))


def stop_holds(
    key: bytes | None, job_id: str, attempt: int, reason: str, unix: float, proof: str
) -> bool:
    """Whether a stop request carries the digest only the job's key makes."""
    if key is None:
        return False
    return hmac.compare_digest(proof, stop_proof(key, job_id, attempt, reason, unix))


def key_from_env(env: Mapping[str, str]) -> bytes | None:
    """The job's key as ``costguard launch`` passed it (hex), ``None`` if absent or bad."""
    text = env.get(ENV_JOB_KEY, "")
    try:
        key = bytes.fromhex(text)
    except ValueError:
        return None
    return key if len(key) == 32 else None


def stop_request(
    store: contract.Store,
    job_id: str,
    attempt: int,
    key: bytes | None,
    say: Callable[[str], None] | None = None,
) -> str | None:
    """Why attempt ``attempt`` of job ``job_id`` is asked to save and stop, ``None`` when
    it is not. A request for another job or attempt is none; one that is not a costguard
    record, or whose proof does not hold (not written with the job's key: anyone else who
    can write the bucket), is named in a warning and is none: the job goes on."""
    doc = contract.read_or_warn(store, contract.STOP_FILE, contract.STOP, say=say)
    if doc is None or doc["job_id"] != job_id or doc["attempt"] != attempt:
        return None
    if not stop_holds(key, job_id, attempt, doc["reason"], doc["requested_unix"], doc["proof"]):
        message = f"{contract.STOP_FILE} in {store.url} is not signed with this job's key"
        contract.warn(contract.RecordError(message), say)
        return None
    return doc["reason"] or "stop requested"
