"""A naive lifecycle, the baseline a team would write first: a transaction per transition.

Enqueue: one transaction inserting the run row and its outbox row, then ``.delay()``.
Claim: ``UPDATE ... WHERE state = 'queued' RETURNING``; finish: an UPDATE fenced by the
attempt. psycopg2, one connection per process, each statement its own commit (3 commits a job).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import psycopg2

SCHEMA = """
CREATE TABLE IF NOT EXISTS naive_runs (
    job_id uuid PRIMARY KEY, state text NOT NULL, attempts int NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(), started_at timestamptz,
    finished_at timestamptz);
CREATE TABLE IF NOT EXISTS naive_outbox (
    id bigserial PRIMARY KEY, job_id uuid NOT NULL, body text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now());
"""
_conn: Any = None


def _connection() -> Any:
    # Opened on first use, so each forked worker child gets its own socket.
    global _conn  # noqa: PLW0603
    if _conn is None:
        _conn = psycopg2.connect(os.environ["BENCH_NAIVE_DSN"])
    return _conn


def create_schema(dsn: str) -> None:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(SCHEMA)
    conn.close()


def enqueue(send: Any) -> None:
    """The run row and its outbox row in one transaction, then publish with ``send``."""
    job_id = str(uuid.uuid4())
    conn = _connection()
    with conn.cursor() as cur:
        cur.execute("INSERT INTO naive_runs (job_id, state) VALUES (%s, 'queued')", (job_id,))
        cur.execute(
            "INSERT INTO naive_outbox (job_id, body) VALUES (%s, %s)",
            (job_id, f'{{"job_id": "{job_id}"}}'),
        )
    conn.commit()
    send(job_id)


def claim(job_id: str) -> int | None:
    conn = _connection()
    with conn.cursor() as cur:
        cur.execute(
            "UPDATE naive_runs SET state = 'running', attempts = attempts + 1, "
            "started_at = now() WHERE job_id = %s AND state = 'queued' "
            "RETURNING attempts",
            (job_id,),
        )
        row = cur.fetchone()
    conn.commit()
    return None if row is None else int(row[0])


def finish(job_id: str, attempt: int) -> None:
    conn = _connection()
    with conn.cursor() as cur:
        cur.execute(
            "UPDATE naive_runs SET state = 'succeeded', finished_at = now() "
            "WHERE job_id = %s AND state = 'running' AND attempts = %s",
            (job_id, attempt),
        )
    conn.commit()
