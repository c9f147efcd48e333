"""Flow control's statements on both dialects: the rate's token, pauses and their audit;
its migration down and up again."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, inspect

from jobsapp.lifecycle import journal
from jobsapp.lifecycle.flow import gating
from jobsapp.lifecycle.journal import flow_rows as statements
from jobsapp.lifecycle.journal.registry import JOBS
from jobsapp.lifecycle.worker import delivery
from jobsapp.shipped import alembic_config
from tests.support import flow_tasks
from tests.support.databases import migrate, migrated_postgres
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
    assert [(a["action"], a["actor"]) for a in trail] == [
        ("resume", "operator:a"),
        ("pause", "operator:a"),
    ]


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
    sqlite = f"sqlite:///{tmp_path}/gating.db"
    migrate(sqlite)
    _down_and_up(sqlite)
    with migrated_postgres(f"jobsapp_flow_{SESSION}") as postgres:
        _down_and_up(postgres)


def _claim(job_id: uuid.UUID) -> gating.Claim:
    return lambda conn: journal.claim(conn, JOBS, job_id, 1, worker="w")


def test_a_claim_over_its_rate_rolls_back_and_is_handed_back(db: Engine, redis_clean: None) -> None:
    tenant = uuid.uuid4().hex
    first, second = (flow_tasks.per_tenant.delay(tenant, "t") for _ in range(2))
    gate = delivery.gate(flow_tasks.per_tenant)
    assert isinstance(gating.gated_claim(db, JOBS, gate, _claim(first.job_id)), journal.Run)
    held = gating.gated_claim(db, JOBS, gate, _claim(second.job_id))
    assert isinstance(held, gating.Held)
    assert held.delay == pytest.approx(60.0, abs=5.0)
    assert run_row(db, second.job_id)["attempts"] == 0  # the claim rolled back
    assert gating.hand_back(db, JOBS, gate, second.job_id, 1, held)
    row = run_row(db, second.job_id)
    assert (row["state"], row["attempts"]) == ("queued", 0)
    assert row["next_retry_at"] is not None
    [message] = outbox_rows(db, second.job_id)
    assert message["published_at"] is None
    assert message["available_at"] == row["next_retry_at"]


@pytest.fixture
def process_clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The clock this process's view of the pauses ages by, moved by the test; the view
    starts empty (read again at the first look)."""
    now = [100.0]
    monkeypatch.setattr(gating, "_clock", lambda: now[0])
    monkeypatch.setattr(gating, "_seen", {})
    return now


@contextmanager
def _reads_of(engine: Engine, table: str) -> Iterator[list[str]]:
    """The statements run on ``engine`` meanwhile that name ``table``."""
    seen: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_rest: object) -> None:
        if table in statement:
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def test_with_no_rate_and_nothing_paused_claims_read_the_pauses_once_a_second(
    db: Engine, redis_clean: None, process_clock: list[float]
) -> None:
    """The unconfigured claim is the one statement of a claim without flow control: the
    pauses are read once per ``PAUSES_SEEN_WITHIN`` per process, not once per claim."""
    token = uuid.uuid4().hex
    jobs = [flow_tasks.plain.delay(token).job_id for _ in range(16)]
    process_clock[0] = 200.0  # the enqueues' view is stale: the first claim reads again
    with _reads_of(db, "flow_pauses") as reads:
        for i, job_id in enumerate(jobs):
            process_clock[0] = 200.0 + i / 8  # 16 claims over two seconds
            row = gating.gated_claim(db, JOBS, delivery.gate(flow_tasks.plain), _claim(job_id))
            assert isinstance(row, journal.Run)
    assert len(reads) == 2


def test_a_pause_holds_every_claim_that_starts_pauses_seen_within_after_its_commit(
    db: Engine, redis_clean: None, process_clock: list[float]
) -> None:
    token = uuid.uuid4().hex
    early, late = (flow_tasks.plain.delay(token).job_id for _ in range(2))
    gate = delivery.gate(flow_tasks.plain)
    assert gating.paused_pairs(db) == frozenset()  # this process's view, read at 100.0
    with db.begin() as conn:
        assert statements.pause(conn, "domain", JOBS.module, actor="operator:t", reason="bound")
    try:
        # Within the bound a claim may still go by the view read before the commit: it runs.
        process_clock[0] = 100.0 + gating.PAUSES_SEEN_WITHIN - 0.125
        assert isinstance(gating.gated_claim(db, JOBS, gate, _claim(early)), journal.Run)
        process_clock[0] = 100.0 + gating.PAUSES_SEEN_WITHIN
        assert gating.gated_claim(db, JOBS, gate, _claim(late)) == gating.Held(None)
    finally:
        with db.begin() as conn:
            statements.resume(conn, "domain", JOBS.module, actor="operator:t", reason="bound")
    assert run_row(db, late)["attempts"] == 0
