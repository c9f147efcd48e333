"""The indexes an enqueue and a claim maintain: the finished and delivered indexes hold
only rows that have the timestamp, and the queries that need them still find them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine, Select, select, text

from jobsapp.db import utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import registry

PARTIAL = [
    (spec.table.name, f"ix_{spec.table.name}_finished", "finished_at")
    for spec in registry.all_tables()
]
PARTIAL.append(("outbox", "ix_outbox_delivered", "delivered_at"))


@pytest.mark.parametrize(("table", "index", "column"), PARTIAL)
def test_a_row_without_the_timestamp_takes_no_index_entry(
    pg: Engine, table: str, index: str, column: str
) -> None:
    with pg.connect() as conn:
        found = conn.execute(
            text("SELECT indexdef FROM pg_indexes WHERE indexname = :i"), {"i": index}
        ).scalar_one()
    assert found.endswith(f"WHERE ({column} IS NOT NULL)"), found


def _plan(pg: Engine, query: Select[tuple[object]]) -> str:
    with pg.begin() as conn:
        # Any usable index beats a sequential scan then, whatever the table's size.
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        compiled = query.compile(pg, compile_kwargs={"literal_binds": True})
        return "\n".join(conn.exec_driver_sql(f"EXPLAIN {compiled}").scalars())


@pytest.mark.parametrize("spec", list(registry.all_tables()), ids=lambda s: s.module)
def test_a_cutoff_on_finished_at_still_finds_the_finished_index(
    pg: Engine, spec: registry.RunTable
) -> None:
    # Retention's and reconcile's condition (each adds a state filter, which other
    # indexes serve too): the partial index must be implied by the cutoff alone.
    table = spec.table
    old = select(table.c.job_id).where(table.c.finished_at < utcnow() - timedelta(days=7))
    assert f"ix_{table.name}_finished" in _plan(pg, old)


def test_retention_of_delivered_messages_still_uses_the_delivered_index(pg: Engine) -> None:
    out = journal.OUTBOX
    old = select(out.c.id).where(out.c.delivered_at < utcnow() - timedelta(days=7))
    assert "ix_outbox_delivered" in _plan(pg, old)
