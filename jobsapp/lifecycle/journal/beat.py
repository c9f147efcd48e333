"""The heartbeat: running -> running under the claim's token, stamping ``heartbeat_at``.

No Transition member: it changes no state and appends no event. Called by
lifecycle/worker/heartbeat.py, which takes a False answer as a lost lease.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import Connection

from jobsapp.lifecycle.journal import hot
from jobsapp.lifecycle.journal.clock import _stamp
from jobsapp.lifecycle.journal.registry import RunTable


def heartbeat(
    conn: Connection,
    spec: RunTable,
    job_id: uuid.UUID,
    attempt: int,
    *,
    token: uuid.UUID,
    now: datetime | None = None,
) -> bool:
    """running -> running under the claim ``token``; False means the lease is lost."""
    params = {
        "r_job_id": job_id,
        "r_attempts": attempt,
        "r_claim_token": token,
        "r_now": _stamp(conn, now),
    }
    return conn.execute(hot.heartbeat(spec, conn.dialect.name), params).rowcount == 1
