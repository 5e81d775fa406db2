"""The launch guard: no costguard budget, no instance.

The spot launcher calls :func:`require_alarm` before it creates anything. A user who
really wants to launch without a budget passes ``override=True`` (``--no-alarm-check``)
and gets a warning instead of a refusal.
"""

from __future__ import annotations

from typing import Protocol

from costguard.errors import CostguardError
from costguard.shell import command


class _HasAlarm(Protocol):
    def has_alarm(self) -> bool: ...


class NoAlarmError(CostguardError):
    """No costguard budget exists on the provider: launching is refused (exit 1)."""


#: The rest of the alarm command the refusal suggests.
_EXAMPLE = ("--budget", "200", "--email", "you@uni.edu")


def require_alarm(provider: str, backend: _HasAlarm, *, override: bool = False) -> str | None:
    """Refuse unless a costguard budget exists; return a warning when overridden.

    ``backend`` is the provider's alarm backend (``AwsAlarms``, ``GcpAlarms``,
    ``AzureAlarms``). With ``override`` nothing is checked, so no cloud call is made.
    """
    if override:
        return (
            f"launching on {provider} without checking for a budget alarm (--no-alarm-check): "
            "nothing will warn you before the bill does"
        )
    if backend.has_alarm():
        return None
    msg = f"no costguard budget alarm on {provider}: set one before launching anything"
    alarm = command("costguard", "alarm", "--provider", provider, *_EXAMPLE)
    raise NoAlarmError(msg, hint=f"{alarm} (or --no-alarm-check to launch anyway)")
