"""How long a client waits after failed token checks (web/throttle.py): free at first, then
doubling, never past its cap."""

from __future__ import annotations

from datetime import timedelta

import pytest

from jobsapp.web.throttle import ADDRESS_MAX_WAIT, FREE_FAILURES, wait_after


@pytest.mark.parametrize(
    ("failures", "seconds"), [(1, 0), (5, 0), (6, 2), (7, 4), (10, 32), (13, 256), (14, 300)]
)
def test_an_address_waits_twice_as_long_after_each_failure_past_the_free_ones(
    failures: int, seconds: int
) -> None:
    assert wait_after(failures, FREE_FAILURES, ADDRESS_MAX_WAIT) == timedelta(seconds=seconds)


def test_the_wait_stays_at_its_cap_however_many_failures() -> None:
    assert wait_after(10**9, FREE_FAILURES, ADDRESS_MAX_WAIT) == ADDRESS_MAX_WAIT
