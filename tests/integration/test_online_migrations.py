"""A deploy's ``jobsapp db upgrade`` changes tables that the old release's workers write.

A plain ``CREATE INDEX`` takes a SHARE lock for its whole build: it waits for the writers'
open transactions, and every write that comes after it waits behind it, for as long as the
build reads the table (seconds to minutes at 10^7 runs). Built ``CONCURRENTLY``
(``ddl.build_index``) it also waits for the open transactions, but the writes after it go
on. Here: a worker's transaction open on ``job_runs`` (the lock its claim's UPDATE
holds), the upgrade that adds ``ix_job_runs_expiring`` (0030) started, and a second
worker's write must get its lock at once, while the index is being built.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import IntegrityError

from jobsapp.lifecycle.journal.ddl import MIGRATION_LOCK_TIMEOUT_S
from jobsapp.preflight import ExitCode, script_revisions
from jobsapp.settings import EMBEDDED_BROKER
from jobsapp.shipped import alembic_config
from tests.support.databases import drop_postgres, fresh_postgres, migrated_postgres
from tests.support.env import SESSION, service
from tests.support.journal_view import run_row
from tests.support.procs import BIN, finished, launching, ready, service_env
from tests.support.servers import RedisServer
from tests.support.waiting import eventually, waiting_for_a_lock

# What an INSERT, UPDATE or DELETE of a row takes on its table.
WRITERS_LOCK = "LOCK TABLE job_runs IN ROW EXCLUSIVE MODE"
DELAY = "from tests.support.tasks import echo\necho.delay('t')"


def _expiring_index(engine: Engine) -> tuple[bool, str]:
    """Whether 0030's index is valid, and the table it indexes."""
    with engine.connect() as conn:
        valid, table = conn.execute(
            text(
                "SELECT i.indisvalid, i.indrelid::regclass::text FROM pg_index i "
                "JOIN pg_class c ON c.oid = i.indexrelid "
                "WHERE c.relname = 'ix_job_runs_expiring'"
            )
        ).one()
    return bool(valid), str(table)


def test_an_upgrades_index_build_leaves_the_run_table_writable() -> None:
    with migrated_postgres(f"jobsapp_online_index_{SESSION}") as url:
        cfg = alembic_config()
        cfg.set_main_option("sqlalchemy.url", url)
        command.downgrade(cfg, "0029")
        engine = create_engine(url)
        failures: list[BaseException] = []

        def upgrade() -> None:
            try:
                command.upgrade(cfg, "0030")
            except BaseException as exc:  # noqa: BLE001 - asserted below, in the test's thread
                failures.append(exc)

        try:
            with engine.connect() as worker:
                worker.execute(text(WRITERS_LOCK))  # a claim's transaction, still open
                build = threading.Thread(target=upgrade, daemon=True)
                build.start()
                # The build waits for the open transaction (either way it is built).
                eventually(lambda: waiting_for_a_lock(engine), timeout=30)
                with engine.connect() as second:
                    # The next worker's write: before, it queued behind the build's lock
                    # request until the timeout.
                    second.execute(text("SET lock_timeout = '3s'"))
                    second.execute(text(WRITERS_LOCK))
                    second.rollback()
                worker.rollback()
                build.join(timeout=60)
            assert not build.is_alive()
            assert not failures, failures
            assert _expiring_index(engine)[0] is True
        finally:
            engine.dispose()


def test_an_index_an_interrupted_build_left_invalid_is_built_again() -> None:
    """A concurrent build that failed (a cancelled deploy, a lost connection) leaves its
    index behind, invalid: never used, yet ``IF NOT EXISTS`` would take it as built."""
    with migrated_postgres(f"jobsapp_invalid_index_{SESSION}") as url:
        cfg = alembic_config()
        cfg.set_main_option("sqlalchemy.url", url)
        command.downgrade(cfg, "0029")
        engine = create_engine(url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                # A build that fails half way, under the index's name: it stays, invalid.
                conn.execute(text("CREATE TABLE interrupted (x int)"))
                conn.execute(text("INSERT INTO interrupted VALUES (1), (1)"))
                with pytest.raises(IntegrityError):
                    conn.execute(
                        text(
                            "CREATE UNIQUE INDEX CONCURRENTLY ix_job_runs_expiring "
                            "ON interrupted (x)"
                        )
                    )
            command.upgrade(cfg, "0030")
            assert _expiring_index(engine) == (True, "job_runs")
        finally:
            engine.dispose()


def test_a_migration_that_cannot_lock_its_table_stops_in_one_line(tmp_path: Path) -> None:
    """ALTER TABLE waits for every transaction open on its table, and every query of the
    table after it waits behind it. A pg_dump (or an idle psql session) holds its tables
    for as long as it runs: the migration waited as long, and the journal with it. It now
    stops after ``MIGRATION_LOCK_TIMEOUT_S``, applying nothing of its own, and says so."""
    with migrated_postgres(f"jobsapp_locked_migration_{SESSION}") as url:
        cfg = alembic_config()
        cfg.set_main_option("sqlalchemy.url", url)
        command.downgrade(cfg, "0031")  # 0032 adds a column to workflow_steps
        env = service_env(
            database_url=url,
            broker_url=EMBEDDED_BROKER,
            var_dir=tmp_path / "var",
            settings={"JOBSAPP_REDIS_URL": ""},  # no Redis: the journal alone dedups
        )
        engine = create_engine(url)
        try:
            with engine.connect() as dump:
                dump.execute(text("SELECT count(*) FROM workflow_steps"))  # its snapshot, open
                started = time.monotonic()
                upgrade = _jobsapp(env, "db", "upgrade")
                took = time.monotonic() - started
                dump.rollback()
            assert upgrade.returncode == ExitCode.MIGRATION_LOCKED, upgrade.stderr
            assert took < MIGRATION_LOCK_TIMEOUT_S + 20
            line = upgrade.stderr.strip().splitlines()[-1]  # after Alembic's progress lines
            assert line.startswith(f"jobsapp: a migration waited {MIGRATION_LOCK_TIMEOUT_S} s")
            # Nothing of it applied; run again once the transaction ended, it is.
            assert _jobsapp(env, "db", "upgrade").returncode == 0
        finally:
            engine.dispose()


def _upgrading_env(database_url: str, tmp_path: Path) -> dict[str, str]:
    """What ``jobsapp db upgrade`` needs: the database; the rest embedded."""
    return service_env(
        database_url=database_url,
        broker_url=EMBEDDED_BROKER,
        var_dir=tmp_path / "var",
        settings={"JOBSAPP_REDIS_URL": ""},
    )


def _jobsapp(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return finished([str(BIN / "jobsapp"), *args], env)


def test_an_upgrade_leaves_no_setting_on_its_connection() -> None:
    """Through PgBouncer's transaction pooling a session's ``SET`` stays on the server
    connection for the next client: the migrations' lock timeout is ``SET LOCAL``, on the
    connection handed to Alembic too, around a concurrent build's commit included."""
    with migrated_postgres(f"jobsapp_upgrade_settings_{SESSION}") as url:
        cfg = alembic_config()
        cfg.set_main_option("sqlalchemy.url", url)
        command.downgrade(cfg, "0029")
        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")  # 0030 builds an index concurrently
                conn.commit()
                assert conn.execute(text("SHOW lock_timeout")).scalar_one() == "0"
        finally:
            engine.dispose()


def test_an_upgrade_inside_its_callers_transaction_builds_its_indexes_in_it() -> None:
    """A fresh database migrated in a transaction of the caller's (``python -m bench
    maintenance`` does, a test harness may): Alembic cannot step out of it for a
    concurrent build (its ``autocommit_block`` asserted), so the indexes are built in it."""
    admin = service("JOBSAPP_TEST_DATABASE_URL")
    name = f"jobsapp_callers_txn_{SESSION}"
    url = fresh_postgres(admin, name)
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            cfg = alembic_config()
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
        assert _expiring_index(engine)[0] is True
    finally:
        engine.dispose()
        drop_postgres(admin, name)


def test_a_role_that_may_not_create_tables_is_told_what_to_grant(tmp_path: Path) -> None:
    """A managed PostgreSQL 15 gives its application role no CREATE on schema public (only
    the database's owner has it since 15): the first deploy's ``jobsapp db upgrade`` ended
    in a hundred lines of traceback (exit 1). It says in one line what to grant; granted,
    the same command applies."""
    admin = service("JOBSAPP_TEST_DATABASE_URL")
    name, role = f"jobsapp_grants_{SESSION}", f"jobsapp_app_{SESSION}"
    with _role(admin, role) as as_role, migrated_postgres(name, migrated=False) as url:
        env = _upgrading_env(as_role(url), tmp_path)
        refused = _jobsapp(env, "db", "upgrade")
        assert refused.returncode == ExitCode.MIGRATION_NOT_PERMITTED, refused.stderr[-3000:]
        assert refused.stderr.strip().splitlines()[-1] == (
            f"jobsapp: the database role {role} may not change the schema "
            "(permission denied for schema public): grant it CREATE on the schema "
            f"(GRANT CREATE ON SCHEMA public TO {role}; PostgreSQL 15 and later give it to "
            "the database's owner only) or run `jobsapp db upgrade` as the owner; run it "
            "again then, it goes on from the last revision applied"
        )
        assert "Traceback" not in refused.stderr
        _as_owner(url, f'GRANT CREATE ON SCHEMA public TO "{role}"')
        assert _jobsapp(env, "db", "upgrade").returncode == 0


def test_the_grant_names_the_schema_the_roles_search_path_creates_in(tmp_path: Path) -> None:
    """A role whose ``search_path`` starts with a schema of the deployment's: the line named
    ``public`` (and the URL's user), a GRANT that would not have let the upgrade through."""
    admin = service("JOBSAPP_TEST_DATABASE_URL")
    name, role = f"jobsapp_grants_path_{SESSION}", f"jobsapp_path_{SESSION}"
    schema = f"app_{SESSION}"
    with _role(admin, role) as as_role, migrated_postgres(name, migrated=False) as url:
        _as_owner(url, f'CREATE SCHEMA "{schema}"')
        _as_owner(url, f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        _as_owner(url, f'ALTER ROLE "{role}" IN DATABASE "{name}" SET search_path = "{schema}"')
        env = _upgrading_env(as_role(url), tmp_path)
        refused = _jobsapp(env, "db", "upgrade")
        assert refused.returncode == ExitCode.MIGRATION_NOT_PERMITTED, refused.stderr[-3000:]
        assert f"(GRANT CREATE ON SCHEMA {schema} TO {role};" in refused.stderr, refused.stderr
        _as_owner(url, f'GRANT CREATE ON SCHEMA "{schema}" TO "{role}"')
        assert _jobsapp(env, "db", "upgrade").returncode == 0


def test_an_application_role_without_grants_is_told_what_to_grant(
    tmp_path: Path, module_redis: RedisServer
) -> None:
    """Migrated by the database's owner, run by an application role of its own (the
    least-privilege setup): before its grants, the worker exited "database unreachable"
    and a producer's ``.delay()`` raised the driver's error with its SQL and the job's
    arguments. Both say what to grant; granted, the worker runs the job."""
    admin = service("JOBSAPP_TEST_DATABASE_URL")
    name, role = f"jobsapp_app_grants_{SESSION}", f"jobsapp_runner_{SESSION}"
    with _role(admin, role) as as_role, migrated_postgres(name) as url:
        env = service_env(
            database_url=as_role(url),
            broker_url=module_redis.url,
            var_dir=tmp_path / "var",
            settings={"JOBSAPP_REDIS_URL": ""},
        )
        granting = (
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}; "
            f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {role}"
        )
        worker = finished([str(BIN / "celery"), "-A", "jobsapp", "worker"], env, tmp_path)
        line = worker.stderr.strip().splitlines()[-1]
        assert worker.returncode == ExitCode.DATABASE_NOT_PERMITTED, worker.stderr[-3000:]
        assert line.startswith(f"jobsapp: the database role {role} may not use jobsapp's "), line
        assert line.endswith(f"as the tables' owner: {granting}"), line
        delay = finished([sys.executable, "-c", DELAY], env)
        last = delay.stderr.strip().splitlines()[-1]
        assert last.startswith("jobsapp.lifecycle.rules.errors.DatabaseNotPermitted: "), last
        assert "INSERT" not in delay.stderr.replace(granting, "")  # no SQL, no arguments
        _as_owner(url, granting)
        with launching(env, tmp_path) as launcher:
            ready(launcher.worker(f"granted-{SESSION}"))
            (job,) = launcher.enqueue({"task": "tests.echo", "kwargs": {"token": "granted"}})
            engine = create_engine(url)
            eventually(
                lambda: run_row(engine, uuid.UUID(job["job_id"]))["state"] == "succeeded",
                timeout=60,
            )
            engine.dispose()


def _as_owner(url: str, statement: str) -> None:
    owner = create_engine(url, isolation_level="AUTOCOMMIT")
    with owner.connect() as conn:
        conn.exec_driver_sql(statement)
    owner.dispose()


@contextmanager
def _role(admin: str, role: str) -> Iterator[Callable[[str], str]]:
    """A login role of its own, dropped after; yields what turns a URL into its."""
    cluster = create_engine(admin, isolation_level="AUTOCOMMIT")
    with cluster.connect() as conn:
        conn.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
        conn.execute(text(f'CREATE ROLE "{role}" LOGIN'))
    try:
        yield lambda url: url.replace("://postgres@", f"://{role}@", 1)
    finally:
        # After its databases were dropped: a grant or a table of it there would hold it.
        with cluster.connect() as conn:
            conn.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
        cluster.dispose()


def test_a_database_that_takes_no_writes_is_named_at_start(
    tmp_path: Path, module_redis: RedisServer
) -> None:
    """A read replica's or a reader endpoint's URL given for the primary's (a platform that
    lists both), or a role with ``default_transaction_read_only``: the worker started, and
    every claim and enqueue failed. It now stops at start, naming it, exit 18; a producer's
    enqueue says the same."""
    with migrated_postgres(f"jobsapp_read_only_{SESSION}") as url:
        _as_owner(
            url,
            f"ALTER DATABASE jobsapp_read_only_{SESSION} SET default_transaction_read_only = on",
        )
        env = service_env(
            database_url=url,
            broker_url=module_redis.url,
            var_dir=tmp_path / "var",
            settings={"JOBSAPP_REDIS_URL": ""},
        )
        worker = finished([str(BIN / "celery"), "-A", "jobsapp", "worker"], env, tmp_path)
        line = worker.stderr.strip().splitlines()[-1]
        assert worker.returncode == ExitCode.DATABASE_NOT_PERMITTED, worker.stderr[-3000:]
        assert line.startswith("jobsapp: the database at JOBSAPP_DATABASE_URL="), line
        assert line.endswith(
            "takes no writes (transaction_read_only is on: a standby, a reader endpoint, or "
            "default_transaction_read_only for postgres): point JOBSAPP_DATABASE_URL at the "
            "primary"
        ), line
        delay = finished([sys.executable, "-c", DELAY], env)
        last = delay.stderr.strip().splitlines()[-1]
        assert last.startswith("jobsapp.lifecycle.rules.errors.DatabaseNotPermitted: "), last
        assert last.endswith("point JOBSAPP_DATABASE_URL at the primary"), last


def test_a_rollbacks_upgrade_on_a_database_a_newer_release_migrated_applies_nothing(
    tmp_path: Path,
) -> None:
    """A deploy rolled back after its release step migrated: the old release's own release
    step (``jobsapp db upgrade``, run on every deploy) meets a revision it does not know. The
    old code works on the newer schema (a rolling deploy migrates first), so there is nothing
    for it to apply: it said so in a traceback of Alembic's and exit 1, and the rollback's
    deploy stopped there. One line, exit 0, the database's revision left as it was."""
    newer = "0999_from_a_newer_release"
    with migrated_postgres(f"jobsapp_rollback_{SESSION}") as url:
        _as_owner(url, f"UPDATE alembic_version SET version_num = '{newer}'")
        upgraded = _jobsapp(_upgrading_env(url, tmp_path), "db", "upgrade")
        assert upgraded.returncode == 0, upgraded.stderr[-3000:]
        assert "Traceback" not in upgraded.stderr, upgraded.stderr[-3000:]
        heads = ", ".join(script_revisions()[0])
        assert upgraded.stdout.strip().splitlines()[-1] == (
            f"database at revision {newer}, which a newer jobsapp wrote (this one's newest is "
            f"{heads}): nothing to apply; this release runs on it as it is"
        )
        engine = create_engine(url)
        with engine.connect() as conn:
            kept = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalars()
            assert list(kept) == [newer]
        engine.dispose()
