"""The hot statements (jobsapp/lifecycle/journal/hot.py) as text, and their golden copies
in tests/golden/: ``<name>.postgresql.sql`` as compiled for psycopg2 (the text a worker
sends when it does not prepare), and ``<name>.sqlite.sql`` where SQLite's text differs.
``GOLDEN_UPDATE=1`` makes ``held`` rewrite a file from the statement instead of
comparing, so a change meant shows in review as a change of its file."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.dialects.postgresql import psycopg2
from sqlalchemy.dialects.sqlite import pysqlite
from sqlalchemy.engine import Dialect

from jobsapp.lifecycle.journal import hot
from jobsapp.lifecycle.journal.registry import JOBS

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
DIALECTS: dict[str, Dialect] = {"postgresql": psycopg2.dialect(), "sqlite": pysqlite.dialect()}
UPDATE = os.environ.get("GOLDEN_UPDATE") == "1"

# Values only shape a statement's text where a list's length or a flag does: the text of
# a list (the reap's batch, the relay's ids) is SQLAlchemy's placeholder, expanded per call.
_AT = datetime(2026, 1, 1, tzinfo=UTC)
_KEYS = [(uuid.UUID(int=1), 1)]
_QUEUE = "celery"


def _reap(requeue_them: bool) -> Callable[[str], tuple[Any, ...]]:
    def built(_dialect: str) -> tuple[Any, ...]:
        reaped = hot.reap(JOBS, _KEYS, requeue_them=requeue_them, cutoff=_AT, reason="", now=_AT)
        return (reaped,)

    return built


def _due_firsts(dialect: str) -> tuple[Any, ...]:
    # PostgreSQL's first step only; SQLite picks in one statement (due_rows).
    return (hot.due_firsts(_AT, 100, _QUEUE, False),) if dialect == "postgresql" else ()


def _due_rows(dialect: str) -> tuple[Any, ...]:
    rows = hot.due_rows(
        dialect, now=_AT, limit=100, default_queue=_QUEUE, lowest_first=False, ids=[1]
    )
    return (rows,)


def _mark_sent(dialect: str) -> tuple[Any, ...]:
    return (hot.MARK_SENT_MANY if dialect == "postgresql" else hot.MARK_SENT_ONE,)


# Each hot statement by name: what it compiles to on a dialect (the job_runs table's).
HOT: dict[str, Callable[[str], tuple[Any, ...]]] = {
    "claim": lambda d: hot.claim(JOBS, d).statements(),
    "heartbeat": lambda d: (hot.heartbeat(JOBS, d),),
    "succeed": lambda d: hot.finish(JOBS, d, True).statements(),
    "fail": lambda d: hot.finish(JOBS, d, False).statements(),
    "requeue": lambda d: hot.requeue(JOBS, d).statements(),
    "stale_runs": lambda _d: (hot.stale_runs(JOBS, cutoff=_AT, limit=100),),
    "reap_requeue": _reap(True),
    "reap_fail": _reap(False),
    "due_firsts": _due_firsts,
    "due_rows": _due_rows,
    "mark_sent": _mark_sent,
}


def compiled(name: str, dialect: str) -> list[str]:
    """The statements of ``name`` as ``dialect`` compiles them."""
    return [str(s.compile(dialect=DIALECTS[dialect])) for s in HOT[name](dialect)]


def path(name: str, dialect: str) -> Path:
    return GOLDEN / f"{name}.{dialect}.sql"


def as_file(statements: list[str]) -> str:
    return "".join(f"{s.strip()};\n\n" for s in statements).rstrip() + "\n"


def kept(name: str, dialect: str) -> list[str]:
    """The golden statements of ``name`` on ``dialect`` (SQLite's: PostgreSQL's unless it
    has a file of its own)."""
    file = path(name, dialect)
    if not file.exists():
        file = path(name, "postgresql")
    text = file.read_text().rstrip().removesuffix(";")
    return [s.strip() for s in text.split(";\n\n")]


def sent_pattern(statement: str) -> re.Pattern[str]:
    """A golden statement as a pattern of the text sent: a list's placeholder stands for
    the bound values it expands to."""
    parts = re.split(r"__\[POSTCOMPILE_\w+\]", statement)
    return re.compile(r"[^;]+?".join(re.escape(p) for p in parts), re.DOTALL)
