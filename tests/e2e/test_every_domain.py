"""Every command sees every registered domain, whichever modules it happened to import.

The commands run as real ``jobsapp`` subprocesses on a migrated Postgres of this module's
own; jobs are planted by the test process. Replayed messages go to an in-memory broker, so
no other suite's worker can take them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from jobsapp.attachments.models import ATTACHMENT_RUNS
from jobsapp.db import make_engine
from jobsapp.lifecycle import journal
from jobsapp.schema import metadata
from tests.support.databases import migrated_postgres
from tests.support.env import SESSION
from tests.support.planted import failed_job, queued_attachment_job

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
DOMAINS = {"jobs", "attachments", "reprocess"}


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    with migrated_postgres(f"jobsapp_e2e_every_domain_{SESSION}") as url:
        yield url


@pytest.fixture
def db(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url)
    with engine.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            conn.execute(table.delete())
    yield engine
    engine.dispose()


def jobsapp(database_url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # Only what a shell of an operator holds: no JOBSAPP_IMPORTS, nothing imported ahead.
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBSAPP_")}
    env |= {
        "JOBSAPP_DATABASE_URL": database_url,
        "JOBSAPP_BROKER_URL": "memory://",
        "JOBSAPP_STORAGE_URL": f"file://{tmp_path / 'objects'}",
        "JOBSAPP_VAR_DIR": str(tmp_path / "var"),
        "USER": "dana",
    }
    return subprocess.run(
        [str(BIN / "jobsapp"), *args],
        cwd=tmp_path,
        env=env,
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )


def test_replay_and_cancel_act_on_an_attachment_job(
    db: Engine, database_url: str, tmp_path: Path
) -> None:
    doomed = failed_job(db, ATTACHMENT_RUNS, queued_attachment_job(db))
    waiting = queued_attachment_job(db)

    replayed = jobsapp(
        database_url,
        tmp_path,
        "replay",
        str(doomed),
        "--module",
        "attachments",
        "--reason",
        "staging restored",
    )
    cancelled = jobsapp(
        database_url,
        tmp_path,
        "cancel",
        str(waiting),
        "--module",
        "attachments",
        "--reason",
        "wrong file",
    )

    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout.startswith(f"replayed attachments job {doomed}: attempt 2 queued")
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.strip() == f"cancelled attachments job {waiting}"
    with db.connect() as conn:
        rows = [journal.load(conn, ATTACHMENT_RUNS, job_id) for job_id in (doomed, waiting)]
    assert [r and r.columns[c] for r, c in zip(rows, ("state", "outcome"), strict=True)] == [
        "queued",
        "cancelled",
    ]


def test_a_replay_from_a_shell_without_the_task_modules_grants_one_attempt_found_by_id(
    db: Engine, database_url: str, tmp_path: Path
) -> None:
    """Issue 36: the same replay granted 5/5 from such a shell and a fresh budget from the
    console; now one attempt from everywhere, and the job id alone names the job."""
    doomed = failed_job(db, ATTACHMENT_RUNS, queued_attachment_job(db))

    replayed = jobsapp(database_url, tmp_path, "replay", str(doomed), "--reason", "once more")
    unknown = jobsapp(
        database_url, tmp_path, "replay", str(doomed), "--module", "billing", "--reason", "x"
    )

    assert replayed.returncode == 0, replayed.stderr
    with db.connect() as conn:
        row = journal.load(conn, ATTACHMENT_RUNS, doomed)
    assert row is not None
    assert (row.state, row.attempts, row.max_attempts) == ("queued", 1, 2)
    assert unknown.returncode == 1
    assert "no run table is registered for 'billing' (known: attachments, jobs" in unknown.stderr


def test_reconcile_and_summary_report_every_domain(
    db: Engine, database_url: str, tmp_path: Path
) -> None:
    queued_attachment_job(db)

    again = jobsapp(database_url, tmp_path, "reconcile", "--dry-run")
    shown = jobsapp(database_url, tmp_path, "summary", "--json")

    assert again.returncode == 0, again.stderr
    assert {json.loads(line)["module"] for line in again.stdout.splitlines()} == DOMAINS
    assert shown.returncode == 0, shown.stderr
    assert [row["module"] for row in json.loads(shown.stdout)] == ["attachments"]
