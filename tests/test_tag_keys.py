"""One tag-key rule (``costguard.tags.tag_key``) for every reader of tags: the reaper's
rules, ``spend``'s grouping of billing exports and ``burn``'s job.

The reaper used NFKC, case folding and ``:``/``-``/``_``/``.``/``/``/blanks as separators;
``spend`` used lower case, any other character as a separator and dropped the export
prefixes, without NFKC. The spellings below are those on which the two disagreed: each
reader now reads each of them as the tag, and no other key as it.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from costguard.billing.spend import is_tag
from costguard.reaper.policy import tag_values
from costguard.tags import JOB_TAG, KEEP_TAG, OWNER_TAG, tag_key

#: Spellings one of the old rules missed: full-width letters (spend), punctuation other
#: than the reaper's five separators (reaper), a billing export's prefix (reaper),
#: separators at the ends (reaper).
DISAGREED = [
    "\uff43\uff4f\uff53\uff54\uff47\uff55\uff41\uff52\uff44:keep",
    "costguard@keep",
    "costguard+keep",
    "user:costguard:keep",
    "resourceTags/user:costguard:keep",
    "-costguard-keep-",
]
#: Keys that are not the keep tag, by either old rule or the new one.
NOT_KEEP = ["costguard:keeper", "costguard:kee", "xcostguard:keep", "costguard:keep:x",
            "user:keep", "costguardkeep", "costguard:k\u00e9ep"]  # fmt: skip


@pytest.mark.parametrize("key", DISAGREED)
def test_the_spellings_the_two_rules_disagreed_on_are_the_tag_for_every_reader(key: str) -> None:
    assert tag_values({key: "true"}, KEEP_TAG) == ("true",)  # the reaper keeps the instance
    assert is_tag(key, KEEP_TAG)  # spend groups by it


@pytest.mark.parametrize("key", NOT_KEEP)
def test_other_keys_are_not_the_tag_for_any_reader(key: str) -> None:
    assert tag_values({key: "true"}, KEEP_TAG) == ()
    assert not is_tag(key, KEEP_TAG)


def test_export_prefixes_are_dropped_only_before_costguard_keys() -> None:
    """``--protect-tag user-team`` stays its own key: only the prefix a billing export
    puts before costguard's tags is dropped."""
    assert tag_key("user-team") != tag_key("team")
    assert tag_key("user_costguard_owner") == tag_key(OWNER_TAG)


KEYS = st.text(st.characters(codec="utf-8"), max_size=40)


@given(KEYS, st.sampled_from([KEEP_TAG, JOB_TAG, OWNER_TAG]))
def test_the_reaper_and_spend_read_every_key_alike(key: str, tag: str) -> None:
    assert (tag_values({key: "v"}, tag) == ("v",)) == is_tag(key, tag)
    assert tag_key(tag_key(key)) == tag_key(key)
