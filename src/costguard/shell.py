"""Commands shown to a person, to paste into a shell as they are."""

from __future__ import annotations

import shlex


def command(*words: object) -> str:
    """``words`` as one command in backticks, each word quoted as a shell needs it (a
    folder with a space, a glob, a ``$`` stay one word, as typed). The CLI never breaks
    a command in backticks over two lines (:func:`costguard.cli.wrap_words`).

    >>> command("costguard", "launch", "--attach", "runs/my run")
    "`costguard launch --attach 'runs/my run'`"
    >>> command("costguard", "jobs", "status", "s3://bucket/run1")
    '`costguard jobs status s3://bucket/run1`'
    """
    return f"`{shlex.join(str(word) for word in words)}`"
