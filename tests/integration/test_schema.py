"""The migrations create the run-table contract, identical to the models, on both dialects."""

from __future__ import annotations

import uuid

import pytest
from alembic.autogenerate import compare_metadata
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Column, Engine, Integer, insert, inspect, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from jobsapp.db import utcnow
from jobsapp.lifecycle.journal.ddl import create_run_table
from jobsapp.lifecycle.journal.tables import Base, JobRun, RunMixin
from jobsapp.schema import metadata

RUNS = JobRun.__table__


def _row(key: str, state: str) -> dict[str, object]:
    now = utcnow()
    terminal = state in ("succeeded", "failed")
    return {
        "job_id": uuid.uuid4(),
        "task_name": "t",
        "concurrency_key": key,
        "state": state,
        "attempts": 1,
        "max_attempts": 3,
        "created_at": now,
        "updated_at": now,
        "heartbeat_at": now if state == "running" else None,
        "finished_at": now if terminal else None,
        "params": {},
    }


def test_migrations_match_the_models(db: Engine) -> None:
    with db.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    assert diff == []


class _Spare(DeclarativeBase):
    """A metadata of its own for a domain's table that only one test creates."""

    type_annotation_map = Base.type_annotation_map


class _WidgetRun(RunMixin, _Spare):
    __tablename__ = "widget_runs"
    widget: Mapped[int] = mapped_column(Integer)


def test_a_run_table_a_domain_creates_today_matches_the_model(db: Engine) -> None:
    """docs/domains.md: a new domain's migration calls ``create_run_table``; its table gets
    every index of the contract (the reaper's expiry, the scheduled page, ...), not only
    those of the day the first run tables were made."""
    name = _WidgetRun.__tablename__
    with db.begin() as conn, Operations.context(MigrationContext.configure(conn)):
        create_run_table(name, Column("widget", Integer(), nullable=False))
    try:
        with db.connect() as conn:
            only_it = {"include_name": lambda n, kind, _: kind != "table" or n == name}
            diff = compare_metadata(MigrationContext.configure(conn, opts=only_it), _Spare.metadata)
        assert diff == []
    finally:
        with db.begin() as conn:
            conn.execute(text(f"DROP TABLE {name}"))


def test_every_contract_table_exists(db: Engine) -> None:
    tables = set(inspect(db).get_table_names())
    assert {"job_runs", "outbox", "leases", "job_events", "alembic_version"} <= tables


def test_partial_unique_index_is_visible_in_pg_indexes(pg: Engine) -> None:
    with pg.connect() as conn:
        indexdef = conn.execute(
            text("SELECT indexdef FROM pg_indexes WHERE indexname = 'uq_job_runs_active_key'")
        ).scalar_one()
    assert "UNIQUE" in indexdef
    assert "WHERE" in indexdef
    assert "queued" in indexdef
    assert "running" in indexdef


def test_two_active_rows_with_one_key_are_refused(db: Engine) -> None:
    with db.begin() as conn:
        conn.execute(insert(RUNS).values(_row("k1", "queued")))
    with pytest.raises(IntegrityError), db.begin() as conn:
        conn.execute(insert(RUNS).values(_row("k1", "running")))


def test_terminal_rows_free_the_key(db: Engine) -> None:
    with db.begin() as conn:
        conn.execute(insert(RUNS).values(_row("k2", "succeeded")))
        conn.execute(insert(RUNS).values(_row("k2", "failed")))
        conn.execute(insert(RUNS).values(_row("k2", "queued")))
    with db.connect() as conn:
        count = conn.execute(text("SELECT count(*) FROM job_runs WHERE concurrency_key='k2'"))
        assert count.scalar_one() == 3


def test_a_terminal_row_needs_finished_at(db: Engine) -> None:
    row = _row("k3", "succeeded") | {"finished_at": None}
    with pytest.raises(IntegrityError), db.begin() as conn:
        conn.execute(insert(RUNS).values(row))


def test_state_is_checked(db: Engine) -> None:
    with pytest.raises(IntegrityError), db.begin() as conn:
        conn.execute(insert(RUNS).values(_row("k4", "done")))
