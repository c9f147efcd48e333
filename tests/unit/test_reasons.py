"""An operator's reason is checked before it reaches the journal."""

from __future__ import annotations

import re

import pytest

from jobsapp.operator import InvalidRequest, checked_reason


@pytest.mark.parametrize(
    ("reason", "named"),
    [
        # PostgreSQL's text cannot hold NUL: the INSERT of the audit row answered 500.
        ("flaky\x00upstream", "U+0000"),
        # Kept, they rewrote what a terminal (jobsapp queue list) or a page showed.
        ("line1\nline2", "U+000A"),
        ("deploy \x1b[31mRED", "U+001B"),
        ("deploy \u202egpj.exe", "U+202E"),
    ],
)
def test_a_reason_with_a_character_nobody_sees_is_refused_naming_it(
    reason: str, named: str
) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(named)):
        checked_reason(reason)


def test_a_reason_in_any_script_is_kept() -> None:
    assert checked_reason("Отложено: релиз 2.3 ✓") == "Отложено: релиз 2.3 ✓"


def test_a_reason_is_kept_trimmed() -> None:
    assert checked_reason("  upstream is back ") == "upstream is back"
