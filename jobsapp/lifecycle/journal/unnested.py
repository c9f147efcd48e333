"""Transition.ENQUEUE of a batch on PostgreSQL in one statement: every column as one array.

A multi-row ``INSERT ... VALUES`` of 1,000 runs is some 29,000 bound values that psycopg2
renders into the text one by one and Postgres parses, analyses and plans one by one (and
the outbox's rows as many again): about 0.2 s of the server's time and as much of the
producer's per 1,000 jobs on the test machine. Here each column of the batch travels as
one text literal of a Postgres array, which the server reads with its array input
function and ``unnest`` turns back into rows; the runs and their outbox rows are written
by one statement (the single enqueue's plan, plans.py, as a batch):

    WITH input AS (SELECT * FROM unnest(CAST(:c0 AS uuid[]), ...) WITH ORDINALITY ...),
         ins AS (INSERT INTO <runs> SELECT ... FROM input ORDER BY n
                 ON CONFLICT DO NOTHING RETURNING job_id, concurrency_key, ...),
         ob AS (INSERT INTO outbox SELECT ... FROM ins JOIN input ... RETURNING id, job_id)
    SELECT ... FROM ins JOIN ob ...

The rows are inserted in the batch's order, so a twin later in the batch (the same job_id,
or the same key) conflicts with the earlier one as a second enqueue would; enqueue_many.py
answers the conflicts. Each value is first what the column's type would bind (its
SQLAlchemy bind processor: a JSON column's text, a UTC datetime), then written as an array
element: NULL, or a double-quoted string with its backslashes and quotes escaped.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from sqlalchemy import BigInteger, Connection, String, bindparam, text
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.selectable import TextualSelect

from jobsapp.db import UtcDateTime, utcnow
from jobsapp.lifecycle.journal._sql import OUTBOX
from jobsapp.lifecycle.journal.new_run import NewJob
from jobsapp.lifecycle.journal.outbox_rows import Outgoing, PendingMessage, outgoing
from jobsapp.lifecycle.journal.plans import _available_at, _row_columns
from jobsapp.lifecycle.journal.registry import RunTable

# The input's columns besides the run's: the first message's body, the first attempt's
# delay, and the job's place in the batch.
_BODY, _DELAY, _N = "_body", "_delay", "_n"
_RETURNED = ("job_id", "concurrency_key", "next_retry_at", "updated_at")


def first_positions(jobs: Sequence[NewJob]) -> dict[tuple[uuid.UUID, str], int]:
    """(job_id, key) -> the first job of the batch with both: the one whose row went in."""
    first: dict[tuple[uuid.UUID, str], int] = {}
    for i, job in enumerate(jobs):
        first.setdefault((job.job_id, job.concurrency_key), i)
    return first


def insert_with_messages(
    conn: Connection,
    spec: RunTable,
    jobs: Sequence[NewJob],
    rows: Sequence[Mapping[str, Any]],
    now: datetime | None,
) -> tuple[dict[int, Mapping[str, Any]], dict[int, PendingMessage]]:
    """Insert the batch's runs (``rows``, as ``_new_row`` made them) with their first
    messages; position -> the run as inserted, and -> its message, for each job that won."""
    # The bodies' (informational) enqueued_at: one reading of this process's clock, as
    # the single enqueue's; the rows' clock is the database's, in the statement.
    enqueued_at = now or utcnow()
    out = [
        outgoing(
            spec, row, attempt=1, now=enqueued_at, available_at=None, traceparent=job.traceparent
        )
        for job, row in zip(jobs, rows, strict=True)
    ]
    statement, columns = _statement(spec, conn.dialect)
    params = _arrays(conn.dialect, spec, columns, rows, out, jobs)
    params["now"] = now
    first = first_positions(jobs)
    won: dict[int, Mapping[str, Any]] = {}
    messages: dict[int, PendingMessage] = {}
    for row in conn.execute(statement, params):
        i = first[(row.job_id, row.concurrency_key)]
        inserted = row._asdict()
        won[i] = {**rows[i], **inserted}
        messages[i] = out[i].pending(int(row.outbox_id), _available_at(inserted))
    return won, messages


def _arrays(
    dialect: Dialect,
    spec: RunTable,
    columns: Sequence[str],
    rows: Sequence[Mapping[str, Any]],
    out: Sequence[Outgoing],
    jobs: Sequence[NewJob],
) -> dict[str, Any]:
    """One array literal per input column."""
    table = spec.table
    params = {
        f"c{k}": array_literal([row[name] for row in rows], _processor(table.c[name].type, dialect))
        for k, name in enumerate(columns)
    }
    body = _processor(OUTBOX.c.body.type, dialect)
    params[_BODY] = array_literal([dict(o.body) for o in out], body)
    params[_DELAY] = array_literal([_interval(job.delay) for job in jobs], None)
    return params


def _processor(sql_type: Any, dialect: Dialect) -> Callable[[Any], Any] | None:
    return sql_type.dialect_impl(dialect).bind_processor(dialect)  # type: ignore[no-any-return]


def _interval(delay: timedelta | None) -> str | None:
    """A Python delay in PostgreSQL's interval input, exact to the microsecond."""
    if delay is None:
        return None
    return f"{delay.days} days {delay.seconds} seconds {delay.microseconds} microseconds"


def array_literal(values: Sequence[Any], process: Callable[[Any], Any] | None = None) -> str:
    """``values`` (bound as their column would bind them) as a PostgreSQL array literal."""
    if process is not None:
        values = [None if v is None else process(v) for v in values]
    # A column's values are mostly of one type: one formatter for all of them.
    kinds = set(map(type, values))
    element = _ELEMENTS.get(kinds.pop(), _element) if len(kinds) == 1 else _element
    return "{" + ",".join(map(element, values)) + "}"


def _quoted(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _element(value: Any) -> str:
    return _ELEMENTS.get(type(value), _other)(value)


def _other(value: Any) -> str:
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, datetime):
        return _quoted(value.isoformat())
    return _quoted(str(value))


# The common types by exact type (a UUID needs no escaping); the rest, subclasses (an
# enum's str, a bool) among them, go through ``_other``.
_ELEMENTS: dict[type, Callable[[Any], str]] = {
    type(None): lambda _: "NULL",
    int: repr,
    float: repr,
    str: _quoted,
    uuid.UUID: lambda value: f'"{value}"',
}


@cache
def _statement(spec: RunTable, dialect: Dialect) -> tuple[TextualSelect, tuple[str, ...]]:
    """The batch's statement for ``spec`` and the run columns its arrays c0, c1... hold."""
    table = spec.table
    quote = dialect.identifier_preparer.quote
    columns = _row_columns(spec)
    types = [table.c[c].type.compile(dialect=dialect) for c in columns]
    arrays = [f"CAST(:c{k} AS {t}[])" for k, t in enumerate(types)]
    arrays += [f"CAST(:{_BODY} AS json[])", f"CAST(:{_DELAY} AS interval[])"]
    names = ", ".join([*map(quote, columns), _BODY, _DELAY, _N])
    clock = "coalesce(CAST(:now AS timestamptz), now())"
    computed = {
        "created_at": clock,
        "updated_at": clock,
        "next_retry_at": f"coalesce(i.next_retry_at, {clock} + i.{_DELAY})",
    }
    selected = ", ".join(computed.get(c, f"i.{quote(c)}") for c in columns)
    returned = ", ".join(f"ins.{quote(c)}" for c in _RETURNED)
    # Only the table's own names (quoted) and fixed names: every value is bound.
    sql = f"""
WITH input AS (
  SELECT * FROM unnest({", ".join(arrays)}) WITH ORDINALITY AS i({names})
), ins AS (
  INSERT INTO {quote(table.name)} ({", ".join(map(quote, columns))})
  SELECT {selected} FROM input AS i ORDER BY i.{_N}
  ON CONFLICT DO NOTHING
  RETURNING {", ".join(map(quote, _RETURNED))}
), ob AS (
  INSERT INTO {quote(OUTBOX.name)}
    (module, job_id, attempt, task_name, body, created_at, available_at, queue, priority)
  SELECT DISTINCT ON (ins.job_id) CAST(:module AS varchar), ins.job_id, 1, i.task_name,
    i.{_BODY}, ins.updated_at, coalesce(ins.next_retry_at, ins.updated_at), i.queue,
    coalesce(i.priority, 0)
  FROM ins JOIN input AS i
    ON i.job_id = ins.job_id AND i.concurrency_key = ins.concurrency_key
  ORDER BY ins.job_id, i.{_N}
  RETURNING id, job_id
)
SELECT {returned}, ob.id AS outbox_id FROM ins JOIN ob ON ob.job_id = ins.job_id"""  # noqa: S608
    strings = [bindparam(f"c{k}", type_=String()) for k in range(len(columns))]
    stmt = (
        text(sql)
        .bindparams(
            *strings,
            bindparam(_BODY, type_=String()),
            bindparam(_DELAY, type_=String()),
            bindparam("now", type_=UtcDateTime()),
            bindparam("module", value=spec.module, type_=String()),
        )
        .columns(
            job_id=table.c.job_id.type,
            concurrency_key=table.c.concurrency_key.type,
            next_retry_at=UtcDateTime(),
            updated_at=UtcDateTime(),
            outbox_id=BigInteger(),
        )
    )
    return stmt, columns
