"""The tags costguard writes on instances and reads back: one name, one place.

AWS and Azure spell them as below; GCP labels take no ``:`` and are lower case, so
``costguard:keep`` is the label ``costguard-keep`` there (:func:`gcp_label`,
:func:`from_gcp_label`).
"""

from __future__ import annotations

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
