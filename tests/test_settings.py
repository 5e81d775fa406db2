from __future__ import annotations

from pathlib import Path

import pytest

from costguard.errors import InputError
from costguard.settings import Settings, config_path


def test_defaults(tmp_path: Path) -> None:
    settings = Settings.load(env={"XDG_CONFIG_HOME": str(tmp_path)})
    assert settings == Settings()


def test_flags_over_env_over_file(tmp_path: Path) -> None:
    config = tmp_path / "costguard" / "config.toml"
    config.parent.mkdir()
    config.write_text('pricing_dir = "/from/file"\ndebug = true\n')
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    assert Settings.load(env=env) == Settings(pricing_dir=Path("/from/file"), debug=True)
    env["COSTGUARD_PRICING_DIR"] = "/from/env"
    env["COSTGUARD_DEBUG"] = "0"
    assert Settings.load(env=env) == Settings(pricing_dir=Path("/from/env"), debug=False)
    flagged = Settings.load({"pricing_dir": Path("/from/flag"), "debug": None}, env=env)
    assert flagged == Settings(pricing_dir=Path("/from/flag"), debug=False)


def test_config_path_override(tmp_path: Path) -> None:
    assert config_path({"COSTGUARD_CONFIG": str(tmp_path / "x.toml")}) == tmp_path / "x.toml"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("debug = 'maybe'", "true or false"),
        ("colour = 1", "unknown setting"),
        ("this is not toml", "cannot read"),
    ],
)
def test_bad_config_is_input_error(tmp_path: Path, content: str, message: str) -> None:
    config = tmp_path / "c.toml"
    config.write_text(content)
    with pytest.raises(InputError, match=message):
        Settings.load(env={"COSTGUARD_CONFIG": str(config)})
