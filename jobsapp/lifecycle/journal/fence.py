"""The claim fence: the WHERE of every write a running attempt makes, in one place.

A running attempt's write lands only while the row is still the run it claimed: running, at
its attempt number, under its claim's token (two claims of one attempt exist once a
database crash lost the first), and, for a write that carries its work on (a heartbeat, a
finish, a domain's effect), not asked to stop by a revoke: the attempt may only end
cancelled then (revoking.py). docs/lifecycle.md, "The claim fence".

The prebuilt plans (plans.py) pass bind parameters, the statements built per call pass
values; the domains (attachments/) use it for their own rows' writes.
tests/unit/test_fence.py fails on a copy of it written by hand anywhere in the package.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, String, Table, literal_column

from jobsapp.lifecycle.rules.states import State


def held(
    table: Table, job_id: Any, attempt: Any, token: Any, *, unless_stopped: bool = True
) -> tuple[ColumnElement[bool], ...]:
    """The run ``job_id`` of ``table`` is still held by the claim (``attempt``, ``token``);
    with ``unless_stopped``, and no revoke asked that attempt to stop."""
    claim = (
        table.c.job_id == job_id,
        in_state(table, State.RUNNING),
        table.c.attempts == attempt,
        table.c.claim_token == token,
    )
    return (*claim, table.c.cancel_requested_at.is_(None)) if unless_stopped else claim


def in_state(table: Table, state: State) -> ColumnElement[bool]:
    """``state = <state>`` in a form no index on ``state`` can serve, for the statements
    that name their row by job_id. A prepared statement's generic plan is built at a
    connection's sixth EXECUTE and kept until the table is next analyzed; built while a
    never-analyzed table is small, the primary key and ix_<table>_state_updated tie at an
    estimated row each, and a plan on the state index then reads every row of that state
    on each call as the table grows (docs/performance.md, "Flow control")."""
    return table.c.state.concat(literal_column("''", String)) == state.value
