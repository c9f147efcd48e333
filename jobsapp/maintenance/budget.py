"""How long one maintenance pass may go on: a wall-clock budget and the beat lease.

Beat runs its passes one after another in one thread. A pass that runs past the lease
lets a standby take over while this beat still works, and every other pass (the reaper
behind the relay) waits for it; so a pass checks its budget between batches and stops
there, leaving the rest to its next tick.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

# Well inside beat's 30 s lease, which is renewed every ten seconds.
DEFAULT_BUDGET = timedelta(seconds=8)


def _always() -> bool:
    return True


@dataclass
class Budget:
    """``allows_more()`` is False once the time is spent or the lease is lost."""

    seconds: float
    # Beat passes its lease renewal; elsewhere (CLI, a worker) nobody else may act.
    still_leading: Callable[[], bool] = _always
    _deadline: float = field(init=False)

    def __post_init__(self) -> None:
        self._deadline = time.monotonic() + self.seconds

    @classmethod
    def of(cls, limit: timedelta, still_leading: Callable[[], bool] = _always) -> Budget:
        return cls(limit.total_seconds(), still_leading)

    def allows_more(self) -> bool:
        return time.monotonic() < self._deadline and self.still_leading()


_lease_check: Callable[[], bool] = _always


def guard_with(check: Callable[[], bool]) -> None:
    """Beat's scheduler: every pass in this process re-checks (renews) the lease with
    ``check`` between its batches, and stops when it returns False."""
    global _lease_check  # noqa: PLW0603 - one beat per process; see the module doc
    _lease_check = check


def for_pass(limit: timedelta) -> Budget:
    return Budget.of(limit, _lease_check)
