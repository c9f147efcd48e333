"""The pure rules of key limits: what a task's runs write as ``key_limit``, and which slot
numbers are free."""

from __future__ import annotations

import pytest

from jobsapp.lifecycle.journal.key_slots import free_slots
from jobsapp.lifecycle.producer.newjob import key_limit_of


@pytest.mark.parametrize(
    ("limit", "fair", "window", "expected"),
    [(1, False, 2, None), (3, False, 2, 3), (1, True, 2, 2), (1, True, 1, 1)],
)
def test_a_tasks_key_limit(limit: int, fair: bool, window: int, expected: int | None) -> None:
    assert key_limit_of("t", limit, fair, window) == expected


@pytest.mark.parametrize(("limit", "fair", "window"), [(0, False, 2), (1, True, 0), (3, True, 2)])
def test_a_wrong_declaration_is_refused(limit: int, fair: bool, window: int) -> None:
    with pytest.raises(ValueError, match="t: "):
        key_limit_of("t", limit, fair, window)


def test_free_slots_are_the_lowest_numbers_nobody_holds() -> None:
    assert free_slots([1, 0], 3) == [2]
    assert free_slots([], 2) == [0, 1]
    assert free_slots([0, 1, 2], 3) == []
