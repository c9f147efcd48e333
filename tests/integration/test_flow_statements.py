"""Flow control's statements on both dialects: the rate's token, pauses and their audit;
its migration down and up again."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, inspect

from jobsapp.lifecycle import flow, journal
from jobsapp.lifecycle.journal import flow as statements
from jobsapp.lifecycle.registry import JOBS
from jobsapp.shipped import alembic_config
from tests.conftest import migrate, migrated_postgres
from tests.support import flow_tasks
from tests.support.env import SESSION
from tests.support.journal_view import outbox_rows, run_row


def test_a_token_is_taken_once_per_interval_and_a_refusal_says_how_long(db: Engine) -> None:
    with db.begin() as conn:
        first = statements.take_token(conn, "t", "k", 60.0)
    with db.begin() as conn:
        second = statements.take_token(conn, "t", "k", 60.0)
        other_key = statements.take_token(conn, "t", "other", 60.0)
    assert first is None
    assert other_key is None  # a rate key of its own
    assert second == pytest.approx(60.0, abs=5.0)


def test_a_refused_token_rolls_back_with_its_transaction(db: Engine) -> None:
    with db.connect() as conn, conn.begin() as tx:
        assert statements.take_token(conn, "t", "undone", 60.0) is None
        tx.rollback()
    with db.begin() as conn:
        assert statements.take_token(conn, "t", "undone", 60.0) is None


def test_pause_and_resume_write_once_each_with_an_audit_row(db: Engine) -> None:
    with db.begin() as conn:
        assert statements.pause(conn, "queue", "q", actor="operator:a", reason="r")
        assert not statements.pause(conn, "queue", "q", actor="operator:b", reason="r")
        assert statements.any_paused(conn, {("queue", "q")})
        assert not statements.any_paused(conn, {("domain", "q")})
        assert statements.resume(conn, "queue", "q", actor="operator:a", reason="done")
        assert not statements.resume(conn, "queue", "q", actor="operator:a", reason="done")
        trail = statements.audit_trail(conn, limit=5)
    assert [(a["action"], a["actor"]) for a in trail] == [("resume", "operator:a"),
                                                          ("pause", "operator:a")]  # fmt: skip


FLOW_TABLES = {"flow_pauses", "flow_actions", "flow_rates"}


def _flow_tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return FLOW_TABLES & set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _down_and_up(url: str) -> None:
    cfg = alembic_config()
    cfg.set_main_option("sqlalchemy.url", url)
    below = ScriptDirectory.from_config(cfg).get_revision("0017").down_revision
    assert isinstance(below, str)
    command.downgrade(cfg, below)
    assert _flow_tables(url) == set()
    command.upgrade(cfg, "head")
    assert _flow_tables(url) == FLOW_TABLES


def test_migration_0017_goes_down_and_up_again(tmp_path: Path) -> None:
    sqlite = f"sqlite:///{tmp_path}/flow.db"
    migrate(sqlite)
    _down_and_up(sqlite)
    with migrated_postgres(f"jobsapp_flow_{SESSION}") as postgres:
        _down_and_up(postgres)


def _claim(job_id: uuid.UUID) -> flow.Claim:
    return lambda conn: journal.claim(conn, JOBS, job_id, 1, worker="w")


def test_a_claim_over_its_rate_rolls_back_and_is_handed_back(db: Engine, redis_clean: None) -> None:
    tenant = uuid.uuid4().hex
    first, second = (flow_tasks.per_tenant.delay(tenant, "t") for _ in range(2))
    gate = flow_tasks.per_tenant._gate
    assert isinstance(flow.gated_claim(db, JOBS, gate, _claim(first.job_id)), Mapping)
    held = flow.gated_claim(db, JOBS, gate, _claim(second.job_id))
    assert isinstance(held, flow.Held)
    assert held.delay == pytest.approx(60.0, abs=5.0)
    assert run_row(db, second.job_id)["attempts"] == 0  # the claim rolled back
    assert flow.hand_back(db, JOBS, gate, second.job_id, 1, held)
    row = run_row(db, second.job_id)
    assert (row["state"], row["attempts"]) == ("queued", 0)
    assert row["next_retry_at"] is not None
    [message] = outbox_rows(db, second.job_id)
    assert message["published_at"] is None
    assert message["available_at"] == row["next_retry_at"]
