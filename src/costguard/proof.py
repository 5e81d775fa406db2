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

- what the controller tells each node of a gang (:func:`told_proof`): its rank and the
  rendezvous, bound to the node's own instance and the attempt, signed with an Ed25519
  key (RFC 8032) derived from the job's key for that attempt. The node is given only
  the public half (:func:`told_public`, in its boot script: no secret) and acts on the
  values its metadata holds only when the signature holds (:func:`told_holds`), so
  whoever may write an instance's tags or metadata, but is not this user's controller,
  cannot send a gang's collectives elsewhere, give two nodes one rank, or move a
  node's values to another instance or attempt.

HMAC-SHA256 (RFC 2104) and SHA-256: without the key no one can make a digest that holds,
nor a proof that hashes to a check; nor, without it, an Ed25519 signature that holds.

>>> key = job_key(bytes(32), "cg-a")
>>> check = stop_check(key, "cg-a", 2)
>>> stop_holds(check, stop_proof(key, "cg-a", 2))
True
>>> stop_holds(check, stop_proof(key, "cg-a", 3)), stop_holds(check, check)
(False, False)
"""

from __future__ import annotations

import base64
import binascii
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
from costguard.errors import InputError, MissingDependencyError
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


def _ed25519() -> Any:
    """cryptography's Ed25519 (the cloud extras and the train extra install it)."""
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        module = "cryptography"
        raise MissingDependencyError(module, "train") from None
    return ed25519


def _told_signer(key: bytes, job_id: str, attempt: int) -> Any:
    """The Ed25519 key of attempt ``attempt``'s told values: its seed a digest of the
    job's ``key``, so every controller of this user makes the same one again (a launch
    repeated after a crash, ``launch --attach``)."""
    seed = bytes.fromhex(_digest(key, "told", job_id, attempt))
    return _ed25519().Ed25519PrivateKey.from_private_bytes(seed)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes | None:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None


def _told_message(job_id: str, attempt: int, instance: str, rank: int, rendezvous: str) -> bytes:
    return json.dumps(["told", job_id, attempt, instance, rank, rendezvous]).encode()


def told_public(key: bytes, job_id: str, attempt: int) -> str:
    """The public half of attempt ``attempt``'s told key (43 characters, base64url): what
    the attempt's nodes check their told values by. No secret.

    >>> len(told_public(job_key(bytes(32), "cg-a"), "cg-a", 1))
    43
    """
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    public = _told_signer(key, job_id, attempt).public_key()
    return _b64(public.public_bytes(Encoding.Raw, PublicFormat.Raw))


def told_proof(
    key: bytes, job_id: str, attempt: int, instance: str, rank: int, rendezvous: str
) -> str:
    """The signature of what node ``rank`` (instance ``instance``) of attempt
    ``attempt`` is told: its rank and the ``rendezvous`` (86 characters, base64url)."""
    message = _told_message(job_id, attempt, instance, rank, rendezvous)
    return _b64(_told_signer(key, job_id, attempt).sign(message))


def told_holds(
    public: str, proof: str, job_id: str, attempt: int, instance: str, rank: int, rendezvous: str
) -> bool:
    """Whether ``proof`` is the signature, by the key whose public half is ``public``, of
    node ``rank`` on instance ``instance`` of attempt ``attempt`` meeting at ``rendezvous``.

    >>> key = job_key(bytes(32), "cg-a")
    >>> proof = told_proof(key, "cg-a", 1, "i-0a", 1, "10.0.0.5:29500")
    >>> public = told_public(key, "cg-a", 1)
    >>> told_holds(public, proof, "cg-a", 1, "i-0a", 1, "10.0.0.5:29500")
    True
    >>> told_holds(public, proof, "cg-a", 1, "i-0b", 1, "10.0.0.5:29500")  # another node's
    False
    >>> told_holds(public, proof, "cg-a", 1, "i-0a", 0, "10.0.0.5:29500")  # another rank
    False
    """
    ed25519 = _ed25519()
    from cryptography.exceptions import InvalidSignature

    raw_key, signature = _unb64(public), _unb64(proof)
    if raw_key is None or signature is None or len(raw_key) != 32 or len(signature) != 64:
        return False
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(raw_key).verify(
            signature, _told_message(job_id, attempt, instance, rank, rendezvous)
        )
    except (InvalidSignature, ValueError):
        return False
    return True
