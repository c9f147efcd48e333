"""Operator actions of flow control: pause and resume a queue or a domain, and what is
paused now. The CLI (``jobsapp queue|domain pause|resume``), the admin API and the admin
pages share these; each action is audited (``flow_actions``: who, why, when).

The statements are lifecycle/journal/gating.py's; the gate that honours a pause is
lifecycle/gating.py's (the relay holds the outbox rows, workers hand deliveries back).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from celery import Celery
from sqlalchemy import Engine

from jobsapp import operator
from jobsapp.lifecycle.flow import gating
from jobsapp.lifecycle.flow.gating import Kind
from jobsapp.lifecycle.journal import flow_rows as statements
from jobsapp.lifecycle.task import LifecycleTask

MAX_QUEUE = 200


@dataclass(frozen=True)
class Paused:
    kind: str
    name: str
    paused_at: datetime
    paused_by: str
    reason: str | None

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "paused_at": self.paused_at.isoformat(),
            "paused_by": self.paused_by,
            "reason": self.reason,
        }


def checked_name(kind: Kind, name: str) -> str:
    """A registered domain's module, or a queue name Celery could route to."""
    name = name.strip()
    if kind is Kind.DOMAIN:
        return operator.run_table(name).module
    if not 0 < len(name) <= MAX_QUEUE or not name.isprintable() or " " in name:
        raise operator.InvalidRequest(
            f"a queue name is 1 to {MAX_QUEUE} printable characters without spaces"
        )
    return name


def pause(engine: Engine, kind: Kind, name: str, *, actor: str, reason: str) -> bool:
    """Pause (audited); False when it was paused already. Returns once workers see it."""
    return gating.pause(
        engine,
        kind,
        checked_name(kind, name),
        actor=operator.operator_actor(actor),
        reason=operator.checked_reason(reason),
    )


def resume(engine: Engine, kind: Kind, name: str, *, actor: str, reason: str) -> bool:
    """Resume (audited); False when it was not paused."""
    return gating.resume(
        engine,
        kind,
        checked_name(kind, name),
        actor=operator.operator_actor(actor),
        reason=operator.checked_reason(reason),
    )


def paused(engine: Engine) -> list[Paused]:
    """Every paused queue and domain, oldest pause first."""
    return [Paused(**row) for row in gating.paused(engine)]


@dataclass(frozen=True)
class RateRow:
    task: str
    rate: str
    rate_key: str | None
    keys: int  # rate keys that have started runs
    next_start: datetime | None  # the latest next allowed start among them


def rates(engine: Engine, app: Celery) -> list[RateRow]:
    """Every registered task with a global rate limit, and its state in the journal."""
    limited = {name: t for name, t in app.tasks.items() if isinstance(t, LifecycleTask) and t.rate}
    if not limited:
        return []
    with engine.connect() as conn:
        state = statements.rate_state(conn, limited)
    rows = []
    for name, task in sorted(limited.items()):
        keys, at = state.get(name, (0, None))
        when = None if at is None else datetime.fromtimestamp(at, UTC)
        rows.append(RateRow(name, str(task.rate), task.rate_key, keys, when))
    return rows


def history(engine: Engine, limit: int = 20) -> list[dict[str, Any]]:
    """The newest pauses and resumes first (the audit trail)."""
    with engine.connect() as conn:
        return statements.audit_trail(conn, limit=limit)
