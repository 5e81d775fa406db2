"""The provider table: every entry resolves, lazily, and a missing piece says what to do."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from costguard.errors import InputError, MissingDependencyError
from costguard.providers import ADAPTERS, Adapter, adapter_class, providers

#: What each feature's commands call on the class (a price source: the function) the table
#: names.
ENTRY_POINTS = {
    "launcher": "__init__",
    "fleet": "for_options",
    "alarm": "for_scope",
    "price source": "__call__",
}


@pytest.mark.parametrize(
    ("feature", "provider"),
    [(feature, provider) for feature, table in ADAPTERS.items() for provider in table],
)
def test_every_entry_names_a_class_with_its_features_entry_point(
    feature: str, provider: str
) -> None:
    found = adapter_class(feature, provider)
    if feature == "fleet":
        assert found.provider == provider
    if feature == "price source":
        assert inspect.isfunction(found)
        assert "mirror" in inspect.signature(found).parameters
    else:
        assert inspect.isclass(found)
    assert found.__name__ == ADAPTERS[feature][provider].name
    assert callable(getattr(found, ENTRY_POINTS[feature]))


def test_every_feature_covers_the_same_clouds() -> None:
    assert set(ENTRY_POINTS) == set(ADAPTERS)
    for feature in ADAPTERS:
        assert providers(feature) == ["aws", "gcp", "azure"]


def test_an_unknown_provider_names_the_known_ones() -> None:
    with pytest.raises(InputError, match="unknown provider 'ibm'") as caught:
        adapter_class("alarm", "ibm")
    assert caught.value.hint == "use aws, gcp, azure"


@pytest.fixture
def extra_adapter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A feature whose ``sdk`` adapter imports an SDK that is not installed."""
    (tmp_path / "costguard_probe_adapter.py").write_text(
        "import costguard_probe_sdk_not_installed\n\nclass Probe:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(
        ADAPTERS,
        "probe",
        {
            "sdk": Adapter("costguard_probe_adapter", "Probe", "aws"),
            "absent": Adapter("costguard_probe_absent", "Probe", None),
        },
    )
    yield "probe"
    sys.modules.pop("costguard_probe_adapter", None)


def test_a_missing_sdk_names_the_extra_that_installs_it(extra_adapter: str) -> None:
    with pytest.raises(MissingDependencyError) as caught:
        adapter_class(extra_adapter, "sdk")
    assert caught.value.extra == "aws"
    assert 'pip install ".[aws]"' in (caught.value.hint or "")


def test_an_adapter_missing_from_the_build_is_bad_input(extra_adapter: str) -> None:
    with pytest.raises(InputError, match="the absent probe is not part of this costguard build"):
        adapter_class(extra_adapter, "absent", absent_hint="try local")
