"""The tags costguard writes on instances and reads back: one name, one place.

AWS and Azure spell them as below; GCP labels take no ``:`` and are lower case, so
``costguard:keep`` is the label ``costguard-keep`` there (:func:`gcp_label`,
:func:`from_gcp_label`).
"""

from __future__ import annotations

import functools
import re
import unicodedata

from costguard.errors import InputError

#: Protects an instance from every reaper run.
KEEP_TAG = "costguard:keep"
#: A time (ISO 8601 or Unix seconds) before which the reaper leaves the instance alone;
#: the launcher sets it to the job's ``--timeout-hours``.
EXPIRES_TAG = "costguard:expires-at"
#: Written by the reaper's two-phase mode on the first idle run: when it was found idle.
MARK_TAG = "costguard:idle-since"

#: On every instance the launcher creates, so ``costguard reap`` and ``--attach`` can find
#: them: the job, who launched it, which attempt, and the idle window the reaper applies.
JOB_TAG = "costguard:job"
OWNER_TAG = "costguard:owner"
ATTEMPT_TAG = "costguard:attempt"
IDLE_MINUTES_TAG = "costguard:idle-minutes"
#: On each node of a gang (``--nodes``), written by the controller once every node is up
#: (all or none): the node's rank, and where the nodes meet (node 0's private address and
#: the rendezvous port). The node reads them from its own metadata service, never from the
#: checkpoint store, whose writers could otherwise send it elsewhere.
NODE_RANK_TAG = "costguard:node-rank"
RENDEZVOUS_TAG = "costguard:rendezvous"
#: The controller's signature of both, for that instance and attempt
#: (:func:`costguard.proof.told_proof`), which the node checks before it acts on them.
NODE_PROOF_TAG = "costguard:node-proof"
#: On the instances of an array's tasks (``costguard launch --array``): the array's job id
#: and the task's index, so ``costguard reap``, billing exports and people can tell which
#: sweep and which task an instance runs (each task's own job id is in ``costguard:job``).
ARRAY_TAG = "costguard:array"
ARRAY_TASK_TAG = "costguard:array-task"

_PREFIX = "costguard:"
_GCP_PREFIX = "costguard-"


def gcp_label(tag: str) -> str:
    """The GCP label key of a costguard tag.

    >>> gcp_label(KEEP_TAG)
    'costguard-keep'
    """
    return tag.replace(_PREFIX, _GCP_PREFIX, 1) if tag.startswith(_PREFIX) else tag


def from_gcp_label(label: str) -> str:
    """A GCP label key in the tags' spelling (other labels as they are).

    >>> from_gcp_label("costguard-keep"), from_gcp_label("team")
    ('costguard:keep', 'team')
    """
    return _PREFIX + label.removeprefix(_GCP_PREFIX) if label.startswith(_GCP_PREFIX) else label


#: What billing exports put before a user's tag key: CUR 2.0's ``resource_tags`` map
#: ``user_``, its ``tags`` column ``resourceTags/user:``, Cost Explorer ``user:``.
_EXPORT_PREFIXES = ("resourcetags", "user")
_SEPARATORS = re.compile(r"[\W_]+")


@functools.lru_cache(maxsize=4096)
def tag_key(key: str) -> str:
    """A tag key reduced to the one form every spelling of it shares, for comparing keys
    (the reaper's rules, spend's grouping, burn's job): NFKC (full-width and other
    compatibility forms as their plain letters), case-folded, every run of characters
    that are not letters or digits as one ``:``, none at either end, and the prefixes
    billing exports add before costguard's own keys dropped.

    A person may write ``COSTGUARD-KEEP``; GCP labels take no ``:`` (``costguard-job``);
    CUR 2.0 writes ``user_costguard_job`` and ``resourceTags/user:costguard:job``.

    >>> {tag_key(k) for k in ("costguard:keep", "COSTGUARD-KEEP", " Costguard_Keep ",
    ...                       "costguard keep", "\uff43ostguard:keep", "user:costguard:keep")}
    {'costguard:keep'}
    >>> {tag_key(k) for k in ("costguard:job", "costguard-job", "user_costguard_job",
    ...                       "resourceTags/user:costguard:job", "Costguard:Job ")}
    {'costguard:job'}
    >>> tag_key("costguard:jobs") == tag_key("costguard:job"), tag_key("user-Team")
    (False, 'user:team')
    """
    words = [w for w in _SEPARATORS.split(unicodedata.normalize("NFKC", key).casefold()) if w]
    start = 0
    while start < len(words) and words[start] in _EXPORT_PREFIXES:
        start += 1
    if words[start : start + 1] == ["costguard"]:
        words = words[start:]
    return ":".join(words)


#: Job ids: what costguard makes (``cg-alice-20261202-201512-a1b2c3``) and all that any boundary
#: accepts (``job.json``, ``COSTGUARD_JOB_ID``, a ``costguard:job`` tag or label, a folder
#: name): ASCII lower-case letters, digits and inner hyphens, at most 48 characters, so the
#: id is also a GCP label value, fits ``costguard-<job>-<attempt>`` in a 63-character GCP
#: name, and holds nothing a filter (``*``, ``?``, ``%``), a path (``/``, ``..``) or a shell
#: reads as syntax. ``fullmatch``: a trailing newline is not accepted either.
JOB_ID = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,46}[a-z0-9])?", re.ASCII)
#: An attempt number as the ``costguard:attempt`` tag holds it.
ATTEMPT = re.compile(r"[1-9][0-9]{0,5}", re.ASCII)


def is_job_id(text: object) -> bool:
    r"""Whether ``text`` is a job id by :data:`JOB_ID` (anything not a ``str`` is not).

    >>> [is_job_id(t) for t in ("cg-20261202-201512-a1b2c3", "*", "a/../b", "run-1\n", 7)]
    [True, False, False, False, False]
    """
    return isinstance(text, str) and JOB_ID.fullmatch(text) is not None


def check_job_id(text: object, where: str) -> str:
    """``text`` if it is a job id, else :class:`InputError` naming ``where`` it came from.

    >>> check_job_id("*", "job.json")
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: the job id in job.json is not a costguard job id: '*'
    """
    if is_job_id(text):
        return str(text)
    shown = repr(text) if len(repr(text)) <= 60 else repr(text)[:57] + "..."
    msg = f"the job id in {where} is not a costguard job id: {shown}"
    raise InputError(
        msg,
        hint="a job id is lower-case letters, digits and inner hyphens, at most 48 "
        "characters (costguard makes them: cg-<owner>-<date>-<time>-<hex>); was the file edited?",
    )
