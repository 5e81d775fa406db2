"""What the reaper tests of every cloud share: the bundled price book and the verdicts of a
report by instance name."""

from __future__ import annotations

from typing import Any

from costguard.pricing.tables import load_catalog
from costguard.reaper.fleet import PriceBook

PRICES = PriceBook(load_catalog())


def verdicts(report: Any) -> dict[str, tuple[str, str]]:
    """``name -> (action, code)`` of every instance the report judged."""
    return {v.instance.name: (str(v.action), str(v.code)) for v in report.plan.verdicts}
