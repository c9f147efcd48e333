"""Flow control's statements on both dialects: the rate's token, pauses and their audit;
its migration down and up again."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, inspect

from jobsapp.lifecycle.journal import flow as statements
from jobsapp.shipped import alembic_config
from tests.conftest import migrate, migrated_postgres
from tests.support.env import SESSION


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
