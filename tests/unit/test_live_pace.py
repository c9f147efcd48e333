"""A live console page asks again at its usual pace, or later after a slow answer."""

from __future__ import annotations

import pytest

from jobsapp.web.ui import LIVE_EVERY_MS, LIVE_MAX_MS, live_every


@pytest.mark.parametrize(
    ("took", "every"),
    [(0.0, LIVE_EVERY_MS), (0.5, LIVE_EVERY_MS), (1.2, 12_000), (6.0, LIVE_MAX_MS)],
)
def test_a_slow_page_waits_ten_times_as_long_up_to_a_minute(took: float, every: int) -> None:
    assert live_every(took) == every
