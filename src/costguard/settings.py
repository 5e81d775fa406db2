"""Settings: one frozen object, built once from flags > ``COSTGUARD_*`` env > config file.

The CLI builds it and passes it down explicitly; library code never reads the
environment behind the caller's back.

The config file is TOML, at ``$COSTGUARD_CONFIG`` or
``$XDG_CONFIG_HOME/costguard/config.toml`` (``~/.config/costguard/config.toml``)::

    pricing_dir = "/data/mirror/costguard-pricing"
    debug = false
    gcp_endpoint = "https://private.googleapis.com"   # optional
    azure_endpoint = "https://management.usgovcloudapi.net"   # optional
    cache_dir = "/scratch/me/costguard-pricing"   # where `pricing refresh` writes
    stale_warning = true                          # warn when the prices are old
    azure_prices_endpoint = "https://prices.azure.com"   # optional
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from costguard.errors import InputError

ENV_PREFIX = "COSTGUARD_"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class Settings(NamedTuple):
    """Everything a command may need to know about its environment (a named tuple: it is
    defined on every command's start, where a frozen dataclass costs a millisecond)."""

    #: A directory of price tables to use instead of the bundled ones.
    pricing_dir: Path | None = None
    #: Show tracebacks for unexpected errors.
    debug: bool = False
    #: Base URL for Google Cloud API calls (a mirror, a private endpoint, a test server).
    gcp_endpoint: str | None = None
    #: Base URL for Azure Resource Manager calls (sovereign clouds, test servers).
    azure_endpoint: str | None = None
    #: Where ``costguard pricing refresh`` writes the tables it builds; ``None`` means
    #: ``$XDG_CACHE_HOME/costguard/pricing`` (``~/.cache/costguard/pricing``).
    cache_dir: Path | None = None
    #: Warn when the price tables in use are old (``--no-stale-warning`` turns it off once).
    stale_warning: bool = True
    #: Base URL of the Azure Retail Prices API (a mirror or a test server).
    azure_prices_endpoint: str | None = None

    @property
    def pricing_cache_dir(self) -> Path:
        """Where the refreshed price tables live.

        >>> Settings(cache_dir=Path("/tmp/prices")).pricing_cache_dir.name
        'prices'
        """
        return self.cache_dir or Path("~/.cache/costguard/pricing").expanduser()

    @property
    def parsed_tables(self) -> Path:
        """Where the price tables, once parsed and checked, are kept for the next run
        (:mod:`costguard.pricing.parsed`): beside the refreshed tables.

        >>> Settings(cache_dir=Path("/tmp/prices")).parsed_tables
        PosixPath('/tmp/prices.parsed')
        """
        cache = self.pricing_cache_dir
        return cache.with_name(f"{cache.name}.parsed")

    @classmethod
    def load(
        cls,
        flags: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Settings:
        """Merge flags (not ``None``) over ``COSTGUARD_*`` variables over the config file."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        # The XDG base directory is the default's default: any explicit setting wins.
        if env.get("XDG_CACHE_HOME"):
            values["cache_dir"] = Path(env["XDG_CACHE_HOME"]) / "costguard" / "pricing"
        values.update(_read_config(config_path(env)))
        for name in cls._fields:
            text = env.get(ENV_PREFIX + name.upper())
            if text is not None:
                values[name] = text
        values.update({k: v for k, v in (flags or {}).items() if v is not None})
        return cls._coerce(values)

    @classmethod
    def _coerce(cls, values: Mapping[str, Any]) -> Settings:
        known = set(cls._fields)
        unknown = sorted(set(values) - known)
        if unknown:
            msg = f"unknown setting(s): {', '.join(unknown)}"
            raise InputError(msg, hint=f"known settings: {', '.join(sorted(known))}")
        pricing_dir = values.get("pricing_dir")
        cache_dir = values.get("cache_dir")
        return cls(
            pricing_dir=Path(pricing_dir).expanduser() if pricing_dir else None,
            debug=_as_bool("debug", values.get("debug", False)),
            gcp_endpoint=str(values["gcp_endpoint"]) if values.get("gcp_endpoint") else None,
            azure_endpoint=(
                str(values["azure_endpoint"]) if values.get("azure_endpoint") else None
            ),
            cache_dir=Path(cache_dir).expanduser() if cache_dir else None,
            stale_warning=_as_bool("stale_warning", values.get("stale_warning", True)),
            azure_prices_endpoint=(
                str(values["azure_prices_endpoint"])
                if values.get("azure_prices_endpoint")
                else None
            ),
        )


def config_path(env: Mapping[str, str]) -> Path:
    """Where the config file is looked for."""
    explicit = env.get(ENV_PREFIX + "CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    base = env.get("XDG_CONFIG_HOME") or str(Path("~/.config").expanduser())
    return Path(base) / "costguard" / "config.toml"


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    import tomllib  # only where there is a config file

    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, OSError) as exc:
        msg = f"cannot read the config file {path}: {exc}"
        raise InputError(msg, hint="fix it, or point COSTGUARD_CONFIG at another file") from None


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    msg = f"setting {name} must be true or false, not {value!r}"
    raise InputError(msg, hint=f"e.g. {ENV_PREFIX}{name.upper()}=1")
