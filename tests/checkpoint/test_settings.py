"""The Checkpointer's settings in parts (:mod:`costguard.checkpoint.settings`): every
keyword a script passed before the parts existed still works and means the same as the
part it belongs to; a field given both ways, or a bad value given either way, is refused
the same way; ``from_env`` lays the environment over parts as over keywords."""

from __future__ import annotations

import inspect
from dataclasses import fields
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from costguard.checkpoint import (
    Checkpointer,
    JobSettings,
    RetryPolicy,
    SavePolicy,
    StoreSettings,
)
from costguard.checkpoint.checkpointer import ENV_KEEP, ENV_START_FRESH, ENV_URL
from costguard.checkpoint.pace import ENV_TOTAL_STEPS
from costguard.checkpoint.saving import ENV_EVENTS_FILE
from costguard.checkpoint.settings import PARTS, Keywords
from costguard.errors import InputError

#: The keywords ``Checkpointer(...)`` took before the parts (c997284) but ``notices`` and
#: ``clock``, each with a value that is not its default: every one must still be taken.
BEFORE = {
    "every_steps": 4,
    "every_minutes": 2.5,
    "keep_last": 2,
    "when_busy": "skip",
    "storage_options": {"auto_mkdir": True},
    "retry": RetryPolicy(attempts=2, base_delay_s=0.0),
    "exit_on_notice": False,
    "rank": 0,
    "sync_every": 3,
    "save_niceness": 0,
    "partial_grace_s": 60.0,
    "events_file": "events.jsonl",
    "incremental": False,
    "start_fresh": True,
    "check": False,
    "total_steps": 100,
    "pilot_steps": 10,
}


def parts_of(ckpt: Checkpointer) -> tuple[SavePolicy, StoreSettings, JobSettings]:
    return ckpt.policy, ckpt.storage, ckpt.job


def test_every_part_field_is_a_keyword_and_every_keyword_of_before_is_still_taken() -> None:
    part_fields = {f.name for kind in PARTS.values() for f in fields(kind)}
    assert set(Keywords.__annotations__) == part_fields
    own = set(inspect.signature(Checkpointer).parameters) - {"keywords"}
    assert own == {"url", "policy", "storage", "job", "notices", "exit_on_notice", "clock"}
    # Nothing the old signature took is lost; the parts are all that is new.
    old = set(BEFORE) | {"url", "notices", "clock"}
    assert part_fields | own == old | set(PARTS)


def test_each_keyword_means_the_same_as_its_part(tmp_path: Path) -> None:
    by_keywords = Checkpointer(tmp_path / "a", **BEFORE)  # type: ignore[arg-type]
    in_parts: dict[str, dict[str, Any]] = {part: {} for part in PARTS}
    for name, value in BEFORE.items():
        for part, kind in PARTS.items():
            if name in {f.name for f in fields(kind)}:
                in_parts[part][name] = value
    by_parts = Checkpointer(
        tmp_path / "b",
        policy=SavePolicy(**in_parts["policy"]),
        storage=StoreSettings(**in_parts["storage"]),
        job=JobSettings(**in_parts["job"]),
        exit_on_notice=False,
    )
    assert parts_of(by_keywords) == parts_of(by_parts)
    for ckpt in (by_keywords, by_parts):  # what the Checkpointer acts on
        assert (ckpt.keep_last, ckpt.when_busy, ckpt.sync_every) == (2, "skip", 3)
        assert ckpt.schedule.every_steps == 4
        assert ckpt.schedule.every_minutes == 2.5
        assert ckpt.start_fresh
        assert not ckpt.exit_on_notice
        assert ckpt.pace_records.total_steps == 100
        ckpt.close()


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"keep_last": 0}, "keep_last must be at least 1, not 0"),
        ({"when_busy": "later"}, "when_busy must be 'wait' or 'skip', not 'later'"),
        ({"sync_every": 0}, "sync_every must be at least 1, not 0"),
        ({"every_steps": 0}, "every_steps must be at least 1, not 0"),
        ({"every_minutes": -1.0}, "every_minutes must be a positive number, not -1.0"),
        ({"total_steps": 0}, "total_steps must be at least 1, not 0"),
        ({"pilot_steps": -2}, "pilot_steps must be at least 1, not -2"),
    ],
)
def test_a_bad_value_is_refused_alike_as_a_keyword_or_in_its_part(
    tmp_path: Path, keywords: dict[str, Any], message: str
) -> None:
    ((name, value),) = keywords.items()
    kind = next(k for k in PARTS.values() if name in {f.name for f in fields(k)})
    with pytest.raises(InputError) as as_keyword:
        Checkpointer(tmp_path, **keywords)
    with pytest.raises(InputError) as in_part:  # the part refuses it, as it is made
        kind(**{name: value})
    assert as_keyword.value.message == in_part.value.message == message
    assert not any(tmp_path.iterdir())  # refused before the store was touched


def test_a_field_given_both_ways_or_an_unknown_keyword_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="keep_last is given twice"):
        Checkpointer(tmp_path, policy=SavePolicy(keep_last=2), keep_last=5)
    with pytest.raises(InputError, match="total_steps is given twice"):
        Checkpointer.from_env(
            tmp_path, env={}, watch=False, job=JobSettings(total_steps=3), total_steps=4
        )
    with pytest.raises(TypeError, match="unexpected keyword argument 'keep'"):
        Checkpointer(tmp_path, keep=2)  # type: ignore[call-arg]


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    given_keep=st.none() | st.integers(1, 5),
    given_total=st.none() | st.integers(1, 50),
    given_events=st.none() | st.just("mine.jsonl"),
    env_keep=st.none() | st.integers(1, 5),
    env_total=st.none() | st.integers(1, 50),
    env_events=st.booleans(),
    env_fresh=st.booleans(),
)
def test_from_env_lays_the_environment_over_parts_as_over_keywords(
    tmp_path: Path,
    given_keep: int | None,
    given_total: int | None,
    given_events: str | None,
    env_keep: int | None,
    env_total: int | None,
    env_events: bool,
    env_fresh: bool,
) -> None:
    env = {ENV_URL: str(tmp_path / "from-env")}
    if env_keep is not None:
        env[ENV_KEEP] = str(env_keep)
    if env_total is not None:
        env[ENV_TOTAL_STEPS] = str(env_total)
    if env_events:
        env[ENV_EVENTS_FILE] = "run.jsonl"
    if env_fresh:
        env[ENV_START_FRESH] = "1"
    keywords: dict[str, Any] = {"check": False}
    if given_keep is not None:
        keywords["keep_last"] = given_keep
    if given_total is not None:
        keywords["total_steps"] = given_total
    if given_events is not None:
        keywords["events_file"] = given_events
    policy_keys = {f.name for f in fields(SavePolicy)}
    job_keys = {f.name for f in fields(JobSettings)}
    parts = {
        "policy": SavePolicy(**{k: v for k, v in keywords.items() if k in policy_keys}),
        "storage": StoreSettings(check=False),
        "job": JobSettings(**{k: v for k, v in keywords.items() if k in job_keys}),
    }
    made = [
        Checkpointer.from_env("unused", env=env, watch=False, **options)
        for options in (keywords, parts)
    ]
    assert parts_of(made[0]) == parts_of(made[1])
    policy, _, job = parts_of(made[0])
    # The environment wins, but for the events file, which a script's own choice keeps.
    assert policy.keep_last == (env_keep or given_keep or 3)
    assert job.total_steps == (env_total or given_total)
    assert job.events_file == (given_events or ("run.jsonl" if env_events else None))
    assert job.start_fresh == env_fresh
    for ckpt in made:
        assert ckpt.store.url.endswith("from-env")
        ckpt.close()
