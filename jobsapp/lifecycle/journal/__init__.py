"""Every statement that moves a run between states, with its event and outbox rows.

Each transition is one guarded UPDATE (or an INSERT that conflicts) fenced by state and
attempt, plus its ``job_events`` row (none for the happy path's enqueue, claim and success,
which the run row carries: row_events.py) and, where the transition needs a message, its
``outbox`` row, all in the caller's transaction. The writes of a running attempt are
fenced by its claim's token too (``claim_token``).

Nothing else in jobsapp moves a run between states. Two operator moves here have no
transition of ``states.ALLOWED`` (the run stays queued): run_now.py makes a queued run due
at once, revive.py gives dead outbox rows back to the relay, each with its audit event.
Beside the transitions, outbox_queries.py marks an outbox row after a transition
wrote it (published, backed off, dead, settled); outside the journal,
maintenance/retention.py deletes what
aged out, and attachments/reprocess.py advances a running reprocess run's progress columns
under its claim's fence; none moves a run's state.

Time is the database's: a transition given no ``now`` stamps and compares with
PostgreSQL's ``now()`` inside its own statement (no extra round trip), so workers, beat
and producers with skewed clocks agree. SQLite has no clock of its own; it is one file on
one host, and the host's clock stands in (docs/lifecycle.md). An explicit ``now`` (tests,
backfills) is used as given.

One file per transition (``states.ALLOWED`` names the file of each), over what they share:

- enqueue_one.py: Transition.ENQUEUE one job at a time; enqueue_many.py: a batch (its one
  statement on PostgreSQL: unnested.py)
- reopen.py: Transition.RERUN, REPLAY (terminal -> queued; a limited key's run joins its
  key's line)
- claiming.py: Transition.CLAIM (and by insert, for a foreign message)
- beat.py: the heartbeat (running -> running, no event)
- finish.py: Transition.SUCCEED, FAIL, RETRY, SNOOZE
- cancel.py: Transition.CANCEL of a queued run (a workflow step's blocks what waits for it),
  and an operator's cancel of what is left of a workflow (``cancel_rest``)
- revoking.py: a revoke: CANCEL of a queued run, or a running one's cancel request
  (CANCEL_REQUEST) and its worker's Transition.CANCEL (``honour_cancel``)
- expire.py: Transition.EXPIRE (queued past ``expires_at``)
- reap.py: Transition.REAP_REQUEUE, REAP_FAIL (the reaper's queries)
- workflow.py: a canvas's steps, and the runs a step's SUCCEED or FAIL starts (in its
  transaction); step_children.py: what a step's success sent, read back as Celery's
  ``children`` of its result (no write)
- kept_result.py: update_state's progress of a running attempt (fenced by its claim),
  ``forget`` of a finished run's value, and the ``children`` of a succeeding attempt's
  body (its calls' results, written with its success); none moves the state
- reads.py: the reads of one run (load, snoozes, the holder of a key)
- run.py: ``Run``, a run row as read, its shared columns typed
- task_ids.py: the active run an attempt's Celery task id names (a revoke by that id)
- key_slots.py: a limited key's line (``limit=N``, ``fair``): admit, grant, release; the run
  stays queued (parked while it waits), so no transition of its own
- new_run.py: ``NewJob`` and the row a new run starts as
- events.py, outbox_rows.py: the event and outbox rows a transition writes
- run_now.py: a queued run made due at once (an operator's run now; no state change)
- revive.py: dead outbox rows back to the relay (an operator's retry; no state change)
- row_events.py: the enqueue, claim and success a run row carries instead of event rows,
  read back as events (``history``), and the rollup's cursor over them
- plans.py: the statement compiler (prebuilt plans per run table and dialect, ``_run``)
- hot.py: the hot statements, named and kept together (claim, heartbeat, finish, requeue,
  the reaper's, the relay's pick and mark); their text is in tests/golden/
- clock.py, _sql.py: whose clock, the two tables and the statement helpers
- fence.py: the claim fence every running attempt's write is built with

and what they stand on: tables.py and flow_tables.py (the tables, mirrored by the
migrations), registry.py (the run tables and their task settings), ddl.py (the
dialect's DDL), prepared.py (statements prepared once per connection); and what reads
or counts beside them: outbox_queries.py (the relay's and console's outbox
statements), totals.py (the counters /metrics reads), flow_rows.py (flow control's
rows: tokens, pauses, hand-backs).

Callers use this package's names (``journal.claim``, ``journal.OUTBOX``); the files import
only downward (the tables and the clock at the bottom, the transitions at the top). No
file is named like a function this package exports, so ``journal.claim`` is always the
function and ``journal.claiming`` its file.
"""

from __future__ import annotations

from jobsapp.lifecycle.journal._sql import EVENTS, OUTBOX, add_to_values, upsert
from jobsapp.lifecycle.journal.beat import heartbeat
from jobsapp.lifecycle.journal.cancel import cancel, cancel_rest
from jobsapp.lifecycle.journal.claiming import claim, claim_by_insert
from jobsapp.lifecycle.journal.clock import clock
from jobsapp.lifecycle.journal.enqueue_many import conflict_outcome, enqueue_many
from jobsapp.lifecycle.journal.enqueue_one import (
    EnqueueOutcome,
    EnqueueResult,
    enqueue,
    enqueue_existing,
    enqueue_new,
)
from jobsapp.lifecycle.journal.events import Event, record_event
from jobsapp.lifecycle.journal.expire import expire, expire_due
from jobsapp.lifecycle.journal.finish import fail, requeue, succeed
from jobsapp.lifecycle.journal.kept_result import (
    forget_result,
    keep_children,
    kept_children,
    write_progress,
)
from jobsapp.lifecycle.journal.new_run import NewJob, new_claim_token
from jobsapp.lifecycle.journal.outbox_rows import (
    Outgoing,
    PendingMessage,
    add_outbox,
    on_local_clock,
    outgoing,
)
from jobsapp.lifecycle.journal.plans import Plan
from jobsapp.lifecycle.journal.reads import (
    active_holder,
    attempt_failure,
    load,
    load_with_clock,
    locate,
    snoozes,
)
from jobsapp.lifecycle.journal.reap import StaleRun, ended_by, find_stale, reap
from jobsapp.lifecycle.journal.reopen import KeyBusy, Reopened, reopen
from jobsapp.lifecycle.journal.revive import revive
from jobsapp.lifecycle.journal.revoking import (
    Revoked,
    cancel_requested,
    honour_cancel,
    repeat_request,
    revoke,
)
from jobsapp.lifecycle.journal.row_events import history
from jobsapp.lifecycle.journal.run import Run
from jobsapp.lifecycle.journal.run_now import bring_forward
from jobsapp.lifecycle.journal.task_ids import job_of_attempt

__all__ = [
    "EVENTS",
    "OUTBOX",
    "EnqueueOutcome",
    "EnqueueResult",
    "Event",
    "KeyBusy",
    "NewJob",
    "Outgoing",
    "PendingMessage",
    "Plan",
    "Reopened",
    "Revoked",
    "Run",
    "StaleRun",
    "active_holder",
    "add_outbox",
    "add_to_values",
    "attempt_failure",
    "bring_forward",
    "cancel",
    "cancel_requested",
    "cancel_rest",
    "claim",
    "claim_by_insert",
    "clock",
    "conflict_outcome",
    "ended_by",
    "enqueue",
    "enqueue_existing",
    "enqueue_many",
    "enqueue_new",
    "expire",
    "expire_due",
    "fail",
    "find_stale",
    "forget_result",
    "heartbeat",
    "history",
    "honour_cancel",
    "job_of_attempt",
    "keep_children",
    "kept_children",
    "load",
    "load_with_clock",
    "locate",
    "new_claim_token",
    "on_local_clock",
    "outgoing",
    "reap",
    "record_event",
    "reopen",
    "repeat_request",
    "requeue",
    "revive",
    "revoke",
    "snoozes",
    "succeed",
    "upsert",
    "write_progress",
]
