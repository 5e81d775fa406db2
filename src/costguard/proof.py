"""Proof that a record in a store was written by this user's costguard, not by whoever
else can write to the bucket.

A lab's bucket is written by labmates, leaked keys and every job's instance role; what
they write is not what the user asked for. This user's costguard keeps a secret key
outside the bucket (``job.key`` next to the config file, mode 0600, made on the first
launch) and signs with it:

- the job's spec (:func:`spec_proof`): ``launch --attach`` runs a job only when its spec
  carries this user's digest of it, so a forged command, instance or price is refused;
- each stop request (:func:`stop_proof`): a secret of the job's key (:func:`job_key`)
  for one attempt, which only the request reveals. The attempt is given its SHA-256
  (:func:`stop_check`, ``COSTGUARD_STOP_CHECK``), which is no secret: it may stand in
  an instance's user-data, where anyone who can describe the instance reads it, and
  it makes no request. ``costguard run`` honours a request only when its proof hashes
  to that check: for its own job and attempt.

HMAC-SHA256 (RFC 2104) and SHA-256: without the key no one can make a digest that holds,
nor a proof that hashes to a check.

>>> key = job_key(bytes(32), "cg-a")
>>> check = stop_check(key, "cg-a", 2)
>>> stop_holds(check, stop_proof(key, "cg-a", 2))
True
>>> stop_holds(check, stop_proof(key, "cg-a", 3)), stop_holds(check, check)
(False, False)
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from costguard import contract
from costguard.errors import InputError
from costguard.settings import config_path

#: The environment variable that gives an attempt its stop check (no secret).
ENV_STOP_CHECK = contract.ENV_STOP_CHECK
#: A stop proof or check: a SHA-256-sized digest in lower-case hex.
STOP_CHECK = re.compile(r"[0-9a-f]{64}")
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


def stop_proof(key: bytes, job_id: str, attempt: int) -> str:
    """What a stop request for attempt ``attempt`` of job ``job_id`` carries: a digest
    only the job's ``key`` makes, revealed by the request alone."""
    return _digest(key, "stop", job_id, attempt)


def stop_check(key: bytes, job_id: str, attempt: int) -> str:
    """What attempt ``attempt`` is given to check its stop requests by: the SHA-256 of
    their proof (hex). Public: it proves a request, it cannot make one."""
    return hashlib.sha256(bytes.fromhex(stop_proof(key, job_id, attempt))).hexdigest()


def stop_holds(check: str | None, proof: str) -> bool:
    """Whether a stop request's ``proof`` hashes to the attempt's ``check``."""
    if not check or not STOP_CHECK.fullmatch(check) or not STOP_CHECK.fullmatch(proof):
        return False
    return hmac.compare_digest(hashlib.sha256(bytes.fromhex(proof)).hexdigest(), check)


def check_from_env(env: Mapping[str, str]) -> str | None:
    """The attempt's stop check as ``costguard launch`` passed it, ``None`` if absent or
    not one."""
    text = env.get(ENV_STOP_CHECK, "").strip()
    return text if STOP_CHECK.fullmatch(text) else None


def stop_request(
    store: contract.Store,
    job_id: str,
    attempt: int,
    check: str | None,
    say: Callable[[str], None] | None = None,
) -> str | None:
    """Why attempt ``attempt`` of job ``job_id`` is asked to save and stop, ``None`` when
    it is not (``check``: the attempt's :func:`stop_check`). A request for another job
    or attempt is none; one that is not a costguard record, or whose proof does not hold
    (not made with the job's key: anyone else who can write the bucket), is named in a
    warning and is none: the job goes on."""
    doc = contract.read_or_warn(store, contract.STOP_FILE, contract.STOP, say=say)
    if doc is None or doc["job_id"] != job_id or doc["attempt"] != attempt:
        return None
    if not stop_holds(check, doc["proof"]):
        message = f"{contract.STOP_FILE} in {store.url} is not signed with this job's key"
        contract.warn(contract.RecordError(message), say)
        return None
    return doc["reason"] or "stop requested"
