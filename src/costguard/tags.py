"""The tags costguard writes on instances and reads back: one name, one place.

AWS and Azure spell them as below; GCP labels take no ``:`` and are lower case, so
``costguard:keep`` is the label ``costguard-keep`` there (each adapter translates).
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
