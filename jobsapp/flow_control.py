"""Operator actions of flow control: pause and resume a queue or a domain, and what is
paused now. The CLI (``jobsapp queue|domain pause|resume``), the admin API and the admin
pages share these; each action is audited (``flow_actions``: who, why, when).

The statements are lifecycle/journal/flow.py's; the gate that honours a pause is
lifecycle/flow.py's (the relay holds the outbox rows, workers hand deliveries back).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from jobsapp import operator
from jobsapp.lifecycle import flow
from jobsapp.lifecycle.flow import Kind
from jobsapp.lifecycle.journal import flow as statements

MAX_QUEUE = 200


@dataclass(frozen=True)
class Paused:
    kind: str
    name: str
    paused_at: datetime
    paused_by: str
    reason: str | None

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "paused_at": self.paused_at.isoformat(),
                "paused_by": self.paused_by, "reason": self.reason}  # fmt: skip


def checked_name(kind: Kind, name: str) -> str:
    """A registered domain's module, or a queue name Celery could route to."""
    name = name.strip()
    if kind is Kind.DOMAIN:
        return operator.run_table(name).module
    if not 0 < len(name) <= MAX_QUEUE or not name.isprintable() or " " in name:
        raise operator.InvalidRequest(f"a queue name is 1 to {MAX_QUEUE} printable "
                                      "characters without spaces")  # fmt: skip
    return name


def pause(engine: Engine, kind: Kind, name: str, *, actor: str, reason: str) -> bool:
    """Pause (audited); False when it was paused already. Returns once workers see it."""
    return flow.pause(engine, kind, checked_name(kind, name), actor=operator.operator_actor(actor),
                      reason=operator.checked_reason(reason))  # fmt: skip


def resume(engine: Engine, kind: Kind, name: str, *, actor: str, reason: str) -> bool:
    """Resume (audited); False when it was not paused."""
    return flow.resume(engine, kind, checked_name(kind, name),
                       actor=operator.operator_actor(actor),
                       reason=operator.checked_reason(reason))  # fmt: skip


def paused(engine: Engine) -> list[Paused]:
    """Every paused queue and domain, oldest pause first."""
    return [Paused(**row) for row in flow.paused(engine)]


def history(engine: Engine, limit: int = 20) -> list[dict[str, Any]]:
    """The newest pauses and resumes first (the audit trail)."""
    with engine.connect() as conn:
        return statements.audit_trail(conn, limit=limit)
