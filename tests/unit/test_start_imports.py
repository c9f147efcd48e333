"""What a process loads to start: a worker's start check and its modules import neither
Alembic nor boto3 on the embedded default (half a second of every start), and the
revisions the check reads from the migrations' text are the ones Alembic finds."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from alembic.script import ScriptDirectory

from jobsapp.preflight import script_revisions
from jobsapp.shipped import MIGRATIONS
from tests.support.env import bare_env
from tests.support.procs import ROOT

# A worker's start in one process: the modules it imports, then its check of the database
# and the store; the check's line (or "ready") and which of the heavy packages got loaded.
WORKER_START = textwrap.dedent("""
    import sys

    from jobsapp import preflight
    from jobsapp.celery_app import app

    app.loader.import_default_modules()
    try:
        preflight.require(preflight.Need.SCHEMA, preflight.Need.STORAGE)
        print("ready")
    except preflight.StartupFailure as failure:
        print(failure.line)
    print(sorted({name.split(".")[0] for name in sys.modules} & {"alembic", "boto3", "botocore"}))
""")


def _embedded(folder: Path, *argv: str) -> list[str]:
    """``python argv`` in ``folder`` with no JOBSAPP_* variable set; its output's lines."""
    done = subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=folder,
        env={**bare_env(), "PYTHONPATH": str(ROOT)},
    )
    return done.stdout.splitlines()


def test_a_worker_starts_on_an_empty_folder_without_alembic_or_boto3(tmp_path: Path) -> None:
    (heads,), _ = script_revisions()
    assert _embedded(tmp_path, "-c", WORKER_START) == [
        f"database not migrated: JOBSAPP_DATABASE_URL=sqlite:///{tmp_path}/var/jobsapp.db: it "
        f"has no jobsapp tables (this jobsapp needs revision {heads}); run `jobsapp db upgrade`",
        "[]",
    ]


def test_a_worker_starts_on_a_migrated_folder_without_alembic_or_boto3(tmp_path: Path) -> None:
    _embedded(tmp_path, "-m", "jobsapp.cli", "db", "upgrade")
    assert _embedded(tmp_path, "-c", WORKER_START) == ["ready", "[]"]


def _as_alembic_finds(folder: Path) -> tuple[list[str], set[str]]:
    scripts = ScriptDirectory(str(folder))
    return sorted(scripts.get_heads()), {script.revision for script in scripts.walk_revisions()}


def test_the_migrations_heads_and_revisions_are_the_ones_alembic_finds() -> None:
    heads, known = script_revisions()
    assert (sorted(heads), known) == _as_alembic_finds(MIGRATIONS)


# A merge of two branches as a formatter leaves it: annotated, its parents over lines.
MERGE = """
revision: str = "m"
down_revision: tuple[str, ...] | None = (
    "b",
    "c",
)
"""


def test_a_merge_migration_over_several_lines_is_read_as_alembic_reads_it(tmp_path: Path) -> None:
    versions = tmp_path / "versions"
    versions.mkdir()
    for name, down in (("a", None), ("b", "a"), ("c", "a")):
        (versions / f"{name}.py").write_text(f"revision = {name!r}\ndown_revision = {down!r}\n")
    (versions / "m.py").write_text(MERGE)
    heads, known = script_revisions(versions)
    assert (sorted(heads), known) == _as_alembic_finds(tmp_path) == (["m"], {"a", "b", "c", "m"})
