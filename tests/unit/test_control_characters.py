"""The control characters a ``Text`` or ``Url`` option refuses: C0 (U+0000-U+001F), DEL
and C1 (U+007F-U+009F), and the line and paragraph separators (U+2028, U+2029), each
anywhere in the value; every other character of the Basic Multilingual Plane (and one
past it) passes that check. Checked over every code point, as the set of them is kept
apart from any pattern (costguard/cli/params.py)."""

from __future__ import annotations

import click
import pytest

from costguard.cli.params import Text, Url

CONTROLS = {*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029}


def _refused(kind: click.ParamType, value: str) -> bool:
    try:
        kind.convert(value, None, None)
    except click.BadParameter:
        return True
    return False


def test_text_refuses_exactly_the_control_characters_anywhere() -> None:
    text = Text()
    refused = {
        point
        for point in (*range(0xD800), *range(0xE000, 0x10000), 0x1F600)
        if _refused(text, f"a{chr(point)}b")
    }
    assert refused == CONTROLS


@pytest.mark.parametrize("point", sorted(CONTROLS))
def test_url_refuses_each_control_character(point: int) -> None:
    assert _refused(Url(), f"s3://bucket/a{chr(point)}b")
    assert not _refused(Url(), "s3://bucket/a\u00a0b\u2027\u202a")
