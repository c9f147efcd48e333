"""A throwaway third domain, declared in one place: every plane picks it up.

``widget_runs`` exists only in this test (its own metadata, created and dropped here) and
is registered only for it; the view is regenerated over the registered tables with the
migration helper. Then the relay, the reaper, reconcile, the summary (API and CLI), the
view and ``/metrics/cluster`` each see the widgets next to the two real domains.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import JSON, Engine, select, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from jobsapp import cli
from jobsapp.celery_app import app
from jobsapp.db import utcnow
from jobsapp.lifecycle import journal, lifecycle_task
from jobsapp.lifecycle.journal import EVENTS, OUTBOX, registry
from jobsapp.lifecycle.journal.ddl import RUNS_VIEW, runs_view_sql
from jobsapp.lifecycle.journal.registry import ReconcilePolicy, RunTable, StalePolicy
from jobsapp.lifecycle.journal.tables import Base, RunMixin
from jobsapp.lifecycle.rules.states import Outcome
from jobsapp.maintenance import reaper, reconcile, relay
from jobsapp.web.app import create_app
from tests.support.attachments import environment
from tests.support.databases import use_database
from tests.support.journal_view import held_by
from tests.support.planted import rolled_up

TOKEN = f"widgets-{uuid.uuid4().hex}"
REAL_MODULES = {"jobs", "attachments", "reprocess"}


class _WidgetBase(DeclarativeBase):
    # Not jobsapp's metadata: the migrations-vs-models check must not see this table.
    type_annotation_map = Base.type_annotation_map


class WidgetRun(RunMixin, _WidgetBase):
    __tablename__ = "widget_runs"

    params: Mapped[dict[str, Any]] = mapped_column(JSON)


# The whole declaration of the domain: its table, module, stale and reconcile policies.
WIDGETS = RunTable(
    module="widgets",
    table=WidgetRun.__table__,  # type: ignore[arg-type]
    stale_policy=StalePolicy.FAIL,
    params_column="params",
    reconcile=ReconcilePolicy(retake=frozenset({"WidgetJam"}), cool_down=timedelta(0)),
)


@lifecycle_task(app, name="tests.widgets.assemble", run_table=WIDGETS, max_attempts=1)
def assemble(size: int) -> None:
    """Never run here: the test plays the worker's transitions itself."""


def ago(seconds: float) -> datetime:
    return utcnow() - timedelta(seconds=seconds)


def _replace_view(engine: Engine) -> None:
    pairs = [(spec.module, spec.table.name) for spec in registry.all_tables()]
    with engine.begin() as conn:
        conn.execute(text(f"DROP VIEW IF EXISTS {RUNS_VIEW}"))
        conn.execute(text(runs_view_sql(pairs)))


@pytest.fixture
def widgets(
    postgres_url: str, redis_clean: None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Engine]:
    engine = use_database(postgres_url)
    WidgetRun.__table__.create(engine)
    monkeypatch.setitem(registry._REGISTRY, WIDGETS.module, WIDGETS)
    _replace_view(engine)
    try:
        yield engine
    finally:
        monkeypatch.delitem(registry._REGISTRY, WIDGETS.module)
        _replace_view(engine)
        WidgetRun.__table__.drop(engine)


def enqueue(engine: Engine, size: int) -> uuid.UUID:
    job = assemble.new_job((size,), {}, None)
    with engine.begin() as conn:
        journal.enqueue(conn, job, now=ago(300), actor="test")
    return job.job_id


def claim(engine: Engine, job_id: uuid.UUID) -> None:
    with engine.begin() as conn:
        assert journal.claim(conn, WIDGETS, job_id, 1, worker="w@h:1", now=ago(200))


def widget_state(engine: Engine, job_id: uuid.UUID) -> tuple[str, str | None]:
    table = WIDGETS.table
    with engine.connect() as conn:
        row = conn.execute(
            select(table.c.state, table.c.outcome).where(table.c.job_id == job_id)
        ).one()
    return row.state, row.outcome


def test_a_third_domain_is_seen_by_every_plane(
    widgets: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = widgets
    waiting, dead, jammed = (enqueue(engine, size) for size in (1, 2, 3))

    # Relay: the widgets' unpublished outbox rows are published like any other.
    relay.run_once(app, engine, relay.RelayConfig(unclaimed_after=timedelta(hours=1)))
    with engine.connect() as conn:
        published = OUTBOX.c.published_at.is_not(None)
        sent = conn.execute(select(OUTBOX.c.job_id).where(OUTBOX.c.module == "widgets", published))
        assert set(sent.scalars()) == {waiting, dead, jammed}

    # Reaper: a dead worker's widget is failed as stale (this domain's stale policy).
    claim(engine, dead)
    reaped = reaper.run_once(engine, reaper.ReaperConfig(stale_after=timedelta(seconds=30)))
    assert reaped["widgets"] == 1
    assert widget_state(engine, dead) == ("failed", "stale")

    # Reconcile: the domain's policy retakes a WidgetJam, not a stale run.
    claim(engine, jammed)
    with engine.begin() as conn:
        assert journal.fail(
            conn,
            WIDGETS,
            jammed,
            1,
            token=held_by(conn, WIDGETS, jammed),
            outcome=Outcome.EXHAUSTED,
            error="WidgetJam: belt stuck",
            actor="w@h:1",
            now=ago(100),
        )
    (report,) = reconcile.run_all(engine, app, reconcile.Request(), module="widgets")
    assert report.retaken == [(jammed, "WidgetJam")]
    assert widget_state(engine, jammed) == ("queued", None)
    assert widget_state(engine, dead) == ("failed", "stale")
    with engine.connect() as conn:
        replays = (EVENTS.c.job_id == jammed) & (EVENTS.c.transition == "replay")
        audit = conn.execute(select(EVENTS.c.actor).where(replays))
        assert list(audit.scalars()) == ["operator:reconcile"]

    # The view regenerated by the migration helper.
    with engine.connect() as conn:
        in_view = conn.execute(text(f"SELECT DISTINCT module FROM {RUNS_VIEW}")).scalars()
        assert set(in_view) >= {"widgets"}
        assert (
            conn.execute(
                text(f"SELECT count(*) FROM {RUNS_VIEW} WHERE module = 'widgets'")
            ).scalar_one()
            == 3
        )

    # jobsapp summary (the CLI), /v1/admin/jobs and /metrics/cluster, once beat's rollup
    # counted the finished runs.
    rolled_up(engine)
    assert cli.main(["summary", "--json", "--module", "widgets"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {(r["module"], r["job_id"]) for r in listed} == {
        ("widgets", str(j)) for j in (waiting, dead, jammed)
    }
    with environment(JOBSAPP_ADMIN_TOKEN=TOKEN):
        client = create_app().test_client()
        auth = {"Authorization": f"Bearer {TOKEN}"}
        api = client.get("/v1/admin/jobs", headers=auth).get_json()
        scraped = client.get("/metrics/cluster").get_data(as_text=True)
        page = client.get("/admin", headers=auth).get_data(as_text=True)
    assert set(api["counts"]) == REAL_MODULES | {"widgets"}
    assert {r["job_id"] for r in api["jobs"] if r["module"] == "widgets"} == {
        str(j) for j in (waiting, dead, jammed)
    }
    assert api["counts"]["widgets"]["queued"] == 2
    queue = app.conf.task_default_queue
    widget = f'module="widgets",queue="{queue}",state="failed",task="tests.widgets.assemble"'
    assert f"jobsapp_jobs{{{widget}}} 1.0" in scraped
    for module in REAL_MODULES | {"widgets"}:
        assert f'jobsapp_jobs{{module="{module}",' in scraped
        assert f"<td>{module}</td>" in page
