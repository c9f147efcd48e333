"""The states of a run, who moves a job out of each, and the allowed transitions.

Pure rules: no I/O. ``docs/lifecycle.md`` draws the same machine.
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    QUEUED = "queued"
    """Waiting for a worker. Left by the worker's claim (-> running) or by an operator's
    cancel (-> failed/cancelled); nobody claims it while ``next_retry_at`` is in the future,
    and the outbox relay publishes it when due."""

    RUNNING = "running"
    """A worker holds the lease and stamps ``heartbeat_at``. Left by that worker's finish
    (-> succeeded, failed, or queued for a retry or a long Retry-After), or by the reaper
    when the heartbeat goes stale (-> queued or failed/stale, per the run table)."""

    SUCCEEDED = "succeeded"
    """Terminal. Left only by a new enqueue of the same job_id after its dedup window."""

    FAILED = "failed"
    """Terminal, with ``outcome`` and ``last_error``. Left by an operator's replay
    (-> queued, with an audit row) or a new enqueue after the dedup window."""


class Outcome(StrEnum):
    """Why a run ended (or, for ``skipped``, why it never started)."""

    SUCCEEDED = "succeeded"
    PERMANENT = "permanent"
    EXHAUSTED = "exhausted"
    STALE = "stale"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"
    SNOOZE_LIMIT = "snooze_limit"


class Transition(StrEnum):
    ENQUEUE = "enqueue"
    CLAIM = "claim"
    SUCCEED = "succeed"
    RETRY = "retry"
    SNOOZE = "snooze"
    FAIL = "fail"
    REAP_REQUEUE = "reap_requeue"
    REAP_FAIL = "reap_fail"
    REPLAY = "replay"
    RERUN = "rerun"
    CANCEL = "cancel"
    SKIP = "skip"


ACTIVE_STATES: tuple[str, ...] = (State.QUEUED.value, State.RUNNING.value)
TERMINAL_STATES: tuple[str, ...] = (State.SUCCEEDED.value, State.FAILED.value)
ALL_STATES: tuple[str, ...] = ACTIVE_STATES + TERMINAL_STATES

# For each transition: the states it may leave (None: no row yet) and the state it enters.
# The journal's guards encode the same table; tests/unit/test_states.py keeps them honest.
ALLOWED: dict[Transition, tuple[tuple[State | None, ...], State]] = {
    Transition.ENQUEUE: ((None,), State.QUEUED),
    # A foreign producer's message with no row is claimed by inserting it as running.
    Transition.CLAIM: ((State.QUEUED, None), State.RUNNING),
    Transition.SUCCEED: ((State.RUNNING,), State.SUCCEEDED),
    Transition.RETRY: ((State.RUNNING,), State.QUEUED),
    Transition.SNOOZE: ((State.RUNNING,), State.QUEUED),
    Transition.FAIL: ((State.RUNNING,), State.FAILED),
    Transition.REAP_REQUEUE: ((State.RUNNING,), State.QUEUED),
    Transition.REAP_FAIL: ((State.RUNNING,), State.FAILED),
    Transition.REPLAY: ((State.FAILED,), State.QUEUED),
    Transition.RERUN: ((State.SUCCEEDED, State.FAILED), State.QUEUED),
    Transition.CANCEL: ((State.QUEUED,), State.FAILED),
}


def can(transition: Transition, current: State | None) -> bool:
    """Whether ``transition`` may leave ``current``."""
    return current in ALLOWED[transition][0]


def is_terminal(state: str) -> bool:
    return state in TERMINAL_STATES


def is_active(state: str) -> bool:
    return state in ACTIVE_STATES
