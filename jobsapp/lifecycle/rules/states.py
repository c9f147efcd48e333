"""The states of a run, who moves a job out of each, and the allowed transitions.

Pure rules: no I/O. ``docs/lifecycle.md`` draws the same machine. Each transition's
statement is in one file of ``lifecycle/journal/``, named beside it in ``ALLOWED``.
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    QUEUED = "queued"
    """Waiting for a worker. Left by the worker's claim (-> running), by an operator's
    cancel or a revoke (-> failed/cancelled), or, past its ``expires_at``, by the worker
    its message reaches or the reaper (-> failed/expired); nobody claims it while
    ``next_retry_at`` is in the future, and the outbox relay publishes it when due."""

    RUNNING = "running"
    """A worker holds the lease and stamps ``heartbeat_at``. Left by that worker's finish
    (-> succeeded, failed, or queued for a retry or a long Retry-After), by that worker's
    cancel once a revoke or an operator asked for one (-> failed/cancelled), or by the
    reaper when the heartbeat goes stale (-> queued, failed/stale, or failed/cancelled if
    a cancel was asked for)."""

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
    EXPIRED = "expired"
    # A plain Celery call of a task no worker had registered when its message came: failed
    # as Celery's consumer fails it (NotRegistered), never run (transport/unregistered.py).
    UNREGISTERED = "unregistered"


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
    EXPIRE = "expire"
    CANCEL_REQUEST = "cancel_request"


ACTIVE_STATES: tuple[str, ...] = (State.QUEUED.value, State.RUNNING.value)
TERMINAL_STATES: tuple[str, ...] = (State.SUCCEEDED.value, State.FAILED.value)
ALL_STATES: tuple[str, ...] = ACTIVE_STATES + TERMINAL_STATES

# For each transition: the states it may leave (None: no row yet) and the state it enters.
# The journal's guards encode the same table; tests/unit/test_states.py keeps them honest.
# Beside each, the file of lifecycle/journal/ that writes it (``journal.X`` re-exports them).
# SKIP and CANCEL_REQUEST, not in the table, are events only: SKIP by journal/events.py
# ``record_event``, called by lifecycle/worker/claim.py; CANCEL_REQUEST (a running attempt asked
# to stop) by journal/revoking.py. The heartbeat (running -> running) is journal/beat.py.
ALLOWED: dict[Transition, tuple[tuple[State | None, ...], State]] = {
    # journal/enqueue_one.py (enqueue, enqueue_new); a batch: journal/enqueue_many.py
    Transition.ENQUEUE: ((None,), State.QUEUED),
    # journal/claiming.py: claim; a foreign producer's message with no row is claimed by
    # inserting it as running (claim_by_insert).
    Transition.CLAIM: ((State.QUEUED, None), State.RUNNING),
    Transition.SUCCEED: ((State.RUNNING,), State.SUCCEEDED),  # journal/finish.py succeed
    Transition.RETRY: ((State.RUNNING,), State.QUEUED),  # journal/finish.py requeue
    Transition.SNOOZE: ((State.RUNNING,), State.QUEUED),  # journal/finish.py requeue
    Transition.FAIL: ((State.RUNNING,), State.FAILED),  # journal/finish.py fail
    Transition.REAP_REQUEUE: ((State.RUNNING,), State.QUEUED),  # journal/reap.py reap
    Transition.REAP_FAIL: ((State.RUNNING,), State.FAILED),  # journal/reap.py reap
    Transition.REPLAY: ((State.FAILED,), State.QUEUED),  # journal/reopen.py reopen
    Transition.RERUN: ((State.SUCCEEDED, State.FAILED), State.QUEUED),  # journal/reopen.py
    # journal/cancel.py cancel (queued, an operator or a revoke); journal/revoking.py
    # honour_cancel (running: its worker, once a revoke asked for it, CANCEL_REQUEST);
    # journal/reap.py reap (running: the reaper, a revoked run whose heartbeat went stale).
    Transition.CANCEL: ((State.QUEUED, State.RUNNING), State.FAILED),
    # journal/expire.py: by the worker whose claim met an expired row, or the reaper.
    Transition.EXPIRE: ((State.QUEUED,), State.FAILED),
}


def can(transition: Transition, current: State | None) -> bool:
    """Whether ``transition`` may leave ``current``."""
    return current in ALLOWED[transition][0]


def is_terminal(state: str) -> bool:
    return state in TERMINAL_STATES


def is_active(state: str) -> bool:
    return state in ACTIVE_STATES
