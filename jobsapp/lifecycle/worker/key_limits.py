"""A worker's side of a limited key (``limit=N``, ``fair``): letting go of the key's slot.

A limited run frees its slot in the transaction that ends it (its succeed or fail, a
body's ``completing``, a revoke's cancel), and a ``fair`` run in the one after its claim;
the oldest waiter of the key is granted the slot there (journal/key_slots.py) and its message
is published after COMMIT by this worker, as a producer publishes its own. Runs of other
tasks keep their one-statement autocommit writes.
"""

from __future__ import annotations

from datetime import timedelta

from celery import Celery
from sqlalchemy import Connection, Engine

from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import Run, key_slots
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.transport import outbox


def let_go(
    conn: Connection, spec: RunTable, row: Run, written: bool
) -> tuple[bool, key_slots.Granted]:
    """After an outcome ``written`` in ``conn``: a limited run frees its key's slot."""
    if not written or row.key_limit is None:
        return written, key_slots.Granted()
    return True, key_slots.release(conn, spec, row.job_id)


def publish_granted(app: Celery, granted: key_slots.Granted) -> None:
    """The fast path of the runs a freed slot made due; the relay publishes what fails.
    Their callers sent them, not the task whose end (or claim) freed the slot."""
    if granted.messages:
        due = [journal.on_local_clock(m, timedelta(0)) for m in granted.messages]
        outbox.publish_now(app, due, by_running_task=False)


def after_fair_claim(app: Celery, engine: Engine, spec: RunTable, row: Run) -> None:
    """A ``fair`` run holds its key's slot only while its message waits in the broker:
    claimed, it lets the key's next run be published behind the other keys' messages."""
    publish_granted(app, fair_claimed(engine, spec, row))


def fair_claimed(engine: Engine, spec: RunTable, row: Run) -> key_slots.Granted:
    """The slot of the ``fair`` run just claimed goes to its key's next run, made due."""
    with engine.begin() as conn:
        return key_slots.release(conn, spec, row.job_id)
