"""A migration that adds a column to every run table, taken down and up again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from alembic import command
from sqlalchemy import create_engine, inspect, text

from jobsapp.shipped import alembic_config
from tests.support.databases import migrate, migrated_postgres
from tests.support.env import SESSION

RUN_TABLES = ("job_runs", "attachment_runs", "reprocess_runs")


def column_and_view(url: str, column: str) -> tuple[list[bool], int]:
    """Which run tables have ``column``, and the rows the runs view reads (it must work)."""
    engine = create_engine(url)
    try:
        has = [any(c["name"] == column for c in inspect(engine).get_columns(t)) for t in RUN_TABLES]
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT count(*) FROM job_runs_all")).scalar_one()
        return has, int(rows)
    finally:
        engine.dispose()


def down_and_up(url: str, column: str, below: str) -> None:
    """Down to revision ``below`` (the column gone, the view intact), then back to head."""
    cfg = alembic_config()
    cfg.set_main_option("sqlalchemy.url", url)
    command.downgrade(cfg, below)
    assert column_and_view(url, column) == ([False] * len(RUN_TABLES), 0)
    command.upgrade(cfg, "head")
    assert column_and_view(url, column) == ([True] * len(RUN_TABLES), 0)


def sqlite_then_postgres(tmp_path: Path, name: str, column: str, below: str) -> None:
    """The round trip on a fresh SQLite file, then on a fresh Postgres database."""
    sqlite = f"sqlite:///{tmp_path}/{name}.db"
    migrate(sqlite)
    down_and_up(sqlite, column, below)
    with migrated_postgres(f"jobsapp_{name}_{SESSION}") as postgres:
        down_and_up(postgres, column, below)


def each_dialect_down_and_up(
    tmp_path: Path, name: str, below: str, present: Callable[[str], set[str]], added: set[str]
) -> None:
    """Down to revision ``below`` on a fresh SQLite file and a fresh Postgres database, what
    the later revisions added (as ``present`` reads it from a URL) gone, then back to head."""
    sqlite = f"sqlite:///{tmp_path}/{name}.db"
    migrate(sqlite)
    with migrated_postgres(f"jobsapp_{name}_{SESSION}") as postgres:
        for url in (sqlite, postgres):
            cfg = alembic_config()
            cfg.set_main_option("sqlalchemy.url", url)
            command.downgrade(cfg, below)
            assert present(url) == set()
            command.upgrade(cfg, "head")
            assert present(url) == added
