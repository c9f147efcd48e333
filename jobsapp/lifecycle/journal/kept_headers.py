"""What a run keeps for its messages' headers, which a publisher outside the calling task
cannot take from it: the root and parent of a call from a task's body or a canvas step
(``LINEAGE``), and a call's display name (``SHADOW``). Beat's relay reads them, and so does a
grant of a limited key's slot (key_slots.py), whose waiter's message is published by
another run's worker.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from sqlalchemy import Connection, select

from jobsapp.lifecycle.journal import registry
from jobsapp.lifecycle.journal.outbox_rows import LINEAGE, SHADOW, PendingMessage


def with_kept_headers(conn: Connection, messages: Sequence[PendingMessage]) -> list[PendingMessage]:
    """``messages`` with what their runs keep for their headers, which a publisher outside
    the calling task (beat's relay, a slot's grant) cannot take from it: a first attempt's
    root and parent (a call
    from a task's body, a canvas step: journal/workflow.py's ``LINEAGE``), which the
    calling task's ``send_task`` would have put there (a later attempt's are jobsapp's
    retry links, transport/outbox.py), and every attempt's display name (``SHADOW``). One
    read per run table that keeps them."""
    by_module: dict[str, list[uuid.UUID]] = {}
    for m in messages:
        by_module.setdefault(str(m.body.get("module")), []).append(m.job_id)
    kept: dict[uuid.UUID, _Kept] = {}
    for module, job_ids in by_module.items():
        kept.update(_kept_headers(conn, module, job_ids))
    return [_with_kept(m, kept[m.job_id]) if m.job_id in kept else m for m in messages]


class _Kept(NamedTuple):
    lineage: tuple[str | None, str | None] | None
    shadow: str | None


def _with_kept(message: PendingMessage, kept: _Kept) -> PendingMessage:
    lineage = kept.lineage if message.attempt == 1 else None
    return replace(message, lineage=lineage, shadow=kept.shadow)


def _kept_headers(
    conn: Connection, module: str, job_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, _Kept]:
    try:
        spec = registry.get(module)
    except KeyError:  # a row no run table of this process's names: published as it is
        return {}
    if spec.params_column is None:
        return {}
    table = spec.table
    params = table.c[spec.params_column]
    stmt = select(table.c.job_id, params[LINEAGE], params[SHADOW])
    found = conn.execute(stmt.where(table.c.job_id.in_(job_ids)))
    return {
        job_id: _Kept(_lineage(lineage), shadow if isinstance(shadow, str) else None)
        for job_id, lineage, shadow in found
        if lineage or shadow
    }


def _lineage(kept: Any) -> tuple[str | None, str | None] | None:
    # A call from outside any task that names only its parent keeps no root: its message
    # is its own root, as in Celery.
    if not kept or not (kept.get("root_id") or kept.get("parent_id")):
        return None
    return kept.get("root_id"), kept.get("parent_id")
