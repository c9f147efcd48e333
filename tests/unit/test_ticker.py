"""The heartbeat thread meets every run at its due time, whether or not adding it woke it."""

from __future__ import annotations

import threading
import time

from jobsapp.lifecycle.worker.heartbeat import IDLE_WAKE, Ticker, _ticker
from tests.support.waiting import eventually


class Run:
    """What the ticker uses of a run: its due time, its interval, and a stamp that lands."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.added = time.monotonic()
        self.due = self.added + interval
        self.stamps: list[float] = []

    def next_due(self, now: float) -> float:
        return now + self.interval

    def beat(self) -> bool:
        self.stamps.append(time.monotonic())
        return True


def _waiting(ticker: Ticker) -> None:
    """Until the ticker's thread exists and sleeps (its wait releases the lock)."""
    started = Run(60.0)
    ticker.add(started)
    ticker.remove(started)
    thread = next(t for t in threading.enumerate() if t.name == "heartbeat")
    eventually(thread.is_alive, timeout=5)
    time.sleep(0.2)


def test_a_run_due_before_the_thread_wakes_is_beaten_at_its_own_interval() -> None:
    ticker = _ticker()  # the process's own: a ticker's thread outlives it
    _waiting(ticker)
    slow, fast = Run(60.0), Run(0.05)
    ticker.add(slow)
    time.sleep(IDLE_WAKE + 0.5)  # the thread now sleeps until the slow run's due, a minute on
    ticker.add(fast)
    eventually(lambda: len(fast.stamps) >= 3, timeout=10)
    ticker.remove(fast)
    ticker.remove(slow)
    assert slow.stamps == []


def test_a_run_added_while_the_thread_idles_is_beaten_at_its_due_not_before() -> None:
    ticker = _ticker()  # the process's own: a ticker's thread outlives it
    _waiting(ticker)
    run = Run(IDLE_WAKE * 1.5)  # due after the idle thread's own wake: added unannounced
    ticker.add(run)
    eventually(lambda: run.stamps, timeout=run.interval + IDLE_WAKE + 5)
    ticker.remove(run)
    late = run.stamps[0] - (run.added + run.interval)
    # Not early; late by a loaded machine's scheduling at most, not by another idle wait.
    assert 0 <= late < IDLE_WAKE, f"first stamp {late:+.2f}s from its due"
