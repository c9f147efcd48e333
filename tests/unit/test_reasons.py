"""An operator's reason is checked before it reaches the journal."""

from __future__ import annotations

import pytest

from jobsapp.operator import InvalidRequest, checked_reason


def test_a_reason_with_a_nul_is_refused_with_why() -> None:
    # PostgreSQL's text cannot hold NUL: the INSERT of the audit row answered 500.
    with pytest.raises(InvalidRequest, match="NUL"):
        checked_reason("flaky\x00upstream")


def test_a_reason_is_kept_trimmed() -> None:
    assert checked_reason("  upstream is back ") == "upstream is back"
