"""Start-up checks: a missing dependency becomes one line naming its setting and an exit code.

Every process checks what it needs once, before it announces itself (a worker's "ready",
beat's first lease, the web's first request), one round trip per dependency and never on
a job's path. A failed check is a ``StartupFailure``: the line an operator acts on and the
documented exit code of ``docs/errors.md``. A supervisor (compose ``restart:``, systemd)
restarts the process; it passes once the dependency is back.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum, IntEnum
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

from jobsapp.settings import Settings, SettingsError, get_settings, served_api_problem
from jobsapp.shipped import MIGRATIONS

log = logging.getLogger(__name__)

# A dead host must not hold a process at start for the kernel's two-minute TCP timeout.
CONNECT_TIMEOUT_S = 5
UPGRADE_COMMAND = "jobsapp db upgrade"
# Loggers that narrate every request at INFO (botocore's credential lookup, each retry):
# noise to an operator; their warnings still show.
NOISY_LOGGERS = ("botocore", "boto3", "s3transfer", "urllib3")


class ExitCode(IntEnum):
    """What a process's exit status means; the table in docs/errors.md."""

    CONFIGURATION = 2
    DATABASE_UNREACHABLE = 10
    DATABASE_NOT_MIGRATED = 11
    BROKER_UNREACHABLE = 12
    S3_UNREACHABLE = 13
    BUCKET_MISSING = 14
    S3_ACCESS_DENIED = 15
    MIGRATION_LOCKED = 16
    MIGRATION_NOT_PERMITTED = 17
    DATABASE_NOT_PERMITTED = 18
    # gunicorn stops (instead of restarting the worker forever) only on its own boot
    # error code, so a web served by gunicorn exits with this one; its line names why.
    GUNICORN_BOOT_ERROR = 3


class Need(Enum):
    DATABASE = "database"
    SCHEMA = "schema"  # implies DATABASE
    BROKER = "broker"
    STORAGE = "storage"


@dataclass(frozen=True)
class StartupFailure(Exception):
    code: ExitCode
    line: str

    def __str__(self) -> str:
        return self.line


# ------------------------------------------------------------------ pure verdicts


def schema_problem(
    current: Iterable[str], heads: Iterable[str], known: Iterable[str]
) -> str | None:
    """Why the database's Alembic revisions do not fit this code, or None when they do.

    A revision this code does not know was written by a newer jobsapp (a rolling deploy
    migrates first): that is not refused, the old code keeps working on an expanded schema.
    """
    current, heads = sorted(set(current)), sorted(set(heads))
    if not current:
        return f"it has no jobsapp tables (this jobsapp needs revision {', '.join(heads)})"
    if set(current) - set(known) or current == heads:
        return None
    return f"it is at revision {', '.join(current)}, this jobsapp needs {', '.join(heads)}"


def reason_of(exc: BaseException) -> str:
    """The first line of the innermost cause, without the driver's decoration."""
    inner = exc
    while getattr(inner, "orig", None) is not None:
        inner = inner.orig  # type: ignore[attr-defined]
    text = next((ln.strip() for ln in str(inner).splitlines() if ln.strip()), "")
    return text or type(inner).__name__


def safe_url(url: str) -> str:
    """``url`` with its password masked, fit for a log line."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def database_setting(url: str) -> str:
    return f"JOBSAPP_DATABASE_URL={safe_url(url)}"


# ------------------------------------------------------------------------- checks


def require(
    *needs: Need,
    settings: Settings | None = None,
    broker: Mapping[str, Any] | None = None,
) -> None:
    """Check each need once; raises the first StartupFailure. ``broker``: how the app
    connects to its broker beyond the URL (``broker_options``), the check connects so."""
    settings = settings or get_settings()
    if Need.DATABASE in needs or Need.SCHEMA in needs:
        check_database(settings.database_url, schema=Need.SCHEMA in needs)
    if Need.STORAGE in needs:
        check_storage(settings)
    if Need.BROKER in needs:
        check_broker(settings.broker_url, broker or {})


def check_database(url: str, *, schema: bool) -> None:
    from sqlalchemy.exc import DBAPIError

    setting = database_setting(url)
    engine = probe_engine(url)
    try:
        with engine.connect() as conn:
            refused = _not_granted(conn, setting) if schema else None
            current = _current_heads(conn) if schema and refused is None else ()
    except DBAPIError as exc:
        line = f"database unreachable at {setting}: {reason_of(exc)}"
        raise StartupFailure(ExitCode.DATABASE_UNREACHABLE, line) from exc
    finally:
        engine.dispose()
    if refused:
        raise StartupFailure(ExitCode.DATABASE_NOT_PERMITTED, refused)
    problem = schema_problem(current, *script_revisions()) if schema else None
    if problem:
        raise StartupFailure(
            ExitCode.DATABASE_NOT_MIGRATED,
            f"database not migrated: {setting}: {problem}; run `{UPGRADE_COMMAND}`",
        )


# A statement met a table or column that is not there: SQLite's words, Postgres' SQLSTATEs;
# or a table the role may not use (insufficient_privilege), or a read-only session.
_MISSING_SQLITE = ("no such table", "no such column")
_JOURNAL_SQLSTATES = ("42P01", "42703", "42501", "25006")
_JOURNAL_FAILURES = (ExitCode.DATABASE_NOT_MIGRATED, ExitCode.DATABASE_NOT_PERMITTED)


def journal_unusable(error: BaseException, url: str) -> StartupFailure | None:
    """The not-migrated or not-permitted failure of the database at ``url`` when
    ``error`` (a statement's) met a missing table or column, or a table the role may not
    use, because of it; None for any other error.

    The statement's error alone cannot say whether the schema is missing or behind, or
    which grants are missing: the database's revision and the role's privileges, read on
    a connection of its own, do.
    """
    orig = getattr(error, "orig", None)
    code = getattr(orig, "pgcode", None) or getattr(orig, "sqlstate", None)
    if code not in _JOURNAL_SQLSTATES and not str(orig).startswith(_MISSING_SQLITE):
        return None
    try:
        check_database(url, schema=True)
    except StartupFailure as failure:
        return failure if failure.code in _JOURNAL_FAILURES else None
    return None


# Whether the session takes writes, and what the role lacks on jobsapp's tables and
# sequences: those of the current schema that the role which ran the migrations owns
# (alembic_version's owner). CASE: the planner may call a privilege function before it
# filters the relation's kind.
_NOT_GRANTED = """
WITH ours AS (
    SELECT c.oid, c.relname AS name, c.relkind = 'S' AS is_sequence FROM pg_class c
    WHERE c.relnamespace = to_regnamespace(current_schema()) AND c.relkind IN ('r', 'p', 'S')
        AND c.relowner = (SELECT relowner FROM pg_class WHERE oid = to_regclass('alembic_version'))
)
SELECT current_user, current_schema(), current_setting('transaction_read_only') = 'on',
    ARRAY(SELECT name FROM ours WHERE NOT is_sequence AND NOT CASE WHEN NOT is_sequence THEN
        has_table_privilege(oid, 'SELECT') AND has_table_privilege(oid, 'INSERT')
        AND has_table_privilege(oid, 'UPDATE') AND has_table_privilege(oid, 'DELETE') END
        ORDER BY name),
    ARRAY(SELECT name FROM ours WHERE is_sequence
        AND NOT CASE WHEN is_sequence THEN has_sequence_privilege(oid, 'USAGE') END
        ORDER BY name)
"""


def _not_granted(conn: Any, setting: str) -> str | None:
    """On PostgreSQL, the line saying why the role may not write the journal (a read-only
    standby or reader endpoint; an application role the owner granted nothing yet), or
    None. Read from the catalogs: the role needs no privilege on the tables to ask."""
    if conn.dialect.name != "postgresql":
        return None
    role, schema, read_only, tables, sequences = conn.exec_driver_sql(_NOT_GRANTED).one()
    if read_only:
        return (
            f"the database at {setting} takes no writes (transaction_read_only is on: a "
            f"standby, a reader endpoint, or default_transaction_read_only for {role}): "
            "point JOBSAPP_DATABASE_URL at the primary"
        )
    if not tables and not sequences:
        return None
    lacking = ", ".join([*tables[:2], *sequences[:1]])
    more = len(tables) + len(sequences) - min(len(tables), 2) - min(len(sequences), 1)
    return (
        f"the database role {role} may not use jobsapp's tables at {setting}: it lacks "
        f"privileges on {lacking}{f' and {more} more' if more else ''}; grant them as the "
        f"tables' owner: GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "
        f"{schema} TO {role}; GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {role}"
    )


def probe_engine(url: str) -> Any:
    """PostgreSQL: one unpooled connection that gives up after CONNECT_TIMEOUT_S. SQLite:
    the ordinary engine, which makes the embedded file's folder on a fresh checkout."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from jobsapp.db import make_engine

    if not url.startswith("postgresql"):
        return make_engine(url)
    return create_engine(
        url, poolclass=NullPool, connect_args={"connect_timeout": CONNECT_TIMEOUT_S}
    )


def current_revisions(url: str) -> tuple[str, ...]:
    """The revisions of the database at ``url``, on a connection of its own."""
    engine = probe_engine(url)
    try:
        with engine.connect() as conn:
            return _current_heads(conn)
    finally:
        engine.dispose()


def _current_heads(conn: Any) -> tuple[str, ...]:
    """The database's revisions, none without the version table: what Alembic's
    ``MigrationContext.get_current_heads`` reads, without importing Alembic at every start."""
    from sqlalchemy import inspect

    if not inspect(conn).has_table("alembic_version"):
        return ()
    return tuple(conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalars())


# What Alembic skips in ``versions/``: an editor's lock file, a package marker.
_NOT_REVISIONS = (".#", "__init__")


def script_revisions(versions: Path = MIGRATIONS / "versions") -> tuple[tuple[str, ...], set[str]]:
    """The heads and every revision of the migrations, as Alembic's ``ScriptDirectory``
    finds them (a unit test holds the two to one answer), from the files' module-level
    assignments: loading Alembic and running every migration cost each start ~0.3 s."""
    known: set[str] = set()
    below: set[str] = set()
    for path in sorted(versions.glob("*.py")):
        if path.name.startswith(_NOT_REVISIONS):
            continue
        ids = _assigned(path, ("revision", "down_revision"))
        if not isinstance(ids.get("revision"), str):
            raise ValueError(f"{path} declares no `revision = ...`, as a migration must")
        known.add(ids["revision"])
        down = ids.get("down_revision")
        below.update([down] if isinstance(down, str) else down or ())
    return tuple(sorted(known - below)), known


def _assigned(path: Path, names: tuple[str, ...]) -> dict[str, Any]:
    """The literal values a module assigns to ``names`` at its top level, however the
    assignment is written (annotated, a tuple over several lines)."""
    found: dict[str, Any] = {}
    for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id in names:
            found[target.id] = ast.literal_eval(value)
    return found


def check_storage(settings: Settings) -> None:
    parts = urlsplit(settings.storage_url)
    if parts.scheme != "s3":
        return  # a local folder is made on first write
    from botocore.exceptions import BotoCoreError, ClientError

    from jobsapp.storage.s3 import make_s3_client

    endpoint = f"JOBSAPP_S3_ENDPOINT_URL={settings.s3_endpoint_url or '(AWS default)'}"
    try:
        make_s3_client(settings.s3_endpoint_url, settings.s3_region).head_bucket(
            Bucket=parts.netloc
        )
    except ClientError as exc:
        raise _bucket_failure(exc, parts.netloc, settings.storage_url, endpoint) from exc
    except BotoCoreError as exc:
        line = f"S3 unreachable at {endpoint}: {reason_of(exc)}"
        raise StartupFailure(ExitCode.S3_UNREACHABLE, line) from exc


def _bucket_failure(exc: Any, bucket: str, storage_url: str, endpoint: str) -> StartupFailure:
    code = str(exc.response.get("Error", {}).get("Code", ""))
    if code in ("404", "NoSuchBucket", "NotFound"):
        return StartupFailure(
            ExitCode.BUCKET_MISSING,
            f"bucket missing: JOBSAPP_STORAGE_URL={storage_url} names bucket "
            f"{bucket!r}, which does not exist at {endpoint}",
        )
    if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        return StartupFailure(
            ExitCode.S3_ACCESS_DENIED,
            f"S3 access denied to bucket {bucket!r} at {endpoint}: check "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
        )
    # A 5xx (or anything else) from the server: it is there but cannot serve the bucket.
    return StartupFailure(
        ExitCode.S3_UNREACHABLE,
        f"S3 unreachable at {endpoint}: it answered {code} to HeadBucket {bucket!r}",
    )


def broker_options(app: Any) -> dict[str, Any]:
    """What a Celery app connects to its broker with beyond the URL, as kombu's Connection
    takes it: Sentinel's ``master_name`` is a transport option, TLS is ``broker_use_ssl``."""
    return {
        "transport_options": dict(app.conf.broker_transport_options or {}),
        "ssl": app.conf.broker_use_ssl,
    }


def check_broker(url: str, options: Mapping[str, Any]) -> None:
    """Connect as the app will (``broker_options``)."""
    if urlsplit(url).scheme in ("filesystem", "memory"):
        return
    from kombu import Connection

    with Connection(url, connect_timeout=CONNECT_TIMEOUT_S, **options) as conn:
        errors: tuple[type[BaseException], ...] = (*conn.connection_errors, OSError)
        try:
            conn.connect()
        except errors as exc:
            raise StartupFailure(
                ExitCode.BROKER_UNREACHABLE,
                f"broker unreachable at JOBSAPP_BROKER_URL={safe_url(url)}: {reason_of(exc)}",
            ) from exc


# ---------------------------------------------------------------- process hooks


def report(failure: StartupFailure) -> None:
    """The failure's one line on stderr; a JSON object when the deployment asked for JSON
    logs (read from the environment itself: the failure may be a bad setting)."""
    line = f"jobsapp: {failure.line}"
    if os.environ.get("JOBSAPP_LOG_FORMAT", "").strip().lower() == "json":
        line = json.dumps(
            {
                "ts": datetime.now(UTC).isoformat(timespec="milliseconds"),
                "level": "CRITICAL",
                "logger": "jobsapp.startup",
                "message": line,
                "exit_code": int(failure.code),
            }
        )
    sys.stderr.write(f"{line}\n")
    sys.stderr.flush()


def exit_with(failure: StartupFailure, code: int | None = None) -> NoReturn:
    """Print the line and leave; SystemExit, because Celery swallows a signal handler's
    ordinary exceptions (and gunicorn would print them as a traceback)."""
    report(failure)
    raise SystemExit(int(failure.code if code is None else code))


def configuration_failure(bad: SettingsError) -> StartupFailure:
    return StartupFailure(ExitCode.CONFIGURATION, f"configuration error: {bad}")


def exit_on_bad_setting(bad: SettingsError) -> NoReturn:
    """A bad setting met while a process builds its app (``celery -A jobsapp``, gunicorn):
    its line and exit 2, or gunicorn's boot error code (see ``check_served_web``)."""
    exit_with(
        configuration_failure(bad), ExitCode.GUNICORN_BOOT_ERROR if _under_gunicorn() else None
    )


def quiet_noisy_loggers() -> None:
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def worker_started(sender: Any = None, **_kwargs: Any) -> None:
    """``worker_init``: before the consumer connects, so no "ready" while a need is missing."""
    options = broker_options(sender.app) if sender is not None else None
    _start_or_exit(Need.SCHEMA, Need.STORAGE, Need.BROKER, broker=options)


def beat_started(**_kwargs: Any) -> None:
    """``beat_init``: before the first tick, so a beat without its database never claims to
    stand by for another. Only the database: with the broker or S3 down the reaper must
    keep its cadence, and the relay and staging passes retry on their own."""
    _start_or_exit(Need.SCHEMA)


def _start_or_exit(*needs: Need, broker: Mapping[str, Any] | None = None) -> None:
    quiet_noisy_loggers()
    try:
        require(*needs, broker=broker)
    except StartupFailure as failure:
        exit_with(failure)


def connect_celery_signals() -> None:
    """Called once by the Celery app module."""
    from celery.signals import beat_init, worker_init

    worker_init.connect(worker_started, weak=False)
    beat_init.connect(beat_started, weak=False)


def check_web() -> None:
    """The web's needs: its schema and its bucket.

    A database that does not answer is not fatal here: ``/healthz`` answers 503 until it
    does, the orchestrator gates traffic on that, and the web heals without a restart.
    A served API without its credentials is a bad setting (``SettingsError``).
    """
    if problem := served_api_problem(get_settings()):
        raise SettingsError(problem)
    try:
        require(Need.SCHEMA)
    except StartupFailure as failure:
        if failure.code != ExitCode.DATABASE_UNREACHABLE:
            raise
        report(StartupFailure(failure.code, f"{failure.line}; serving 503 until it answers"))
    require(Need.STORAGE)


def check_served_web() -> None:
    """``create_app`` under gunicorn (which sets SERVER_SOFTWARE): the web's checks.

    An app built in-process (tests, the demo, ``jobsapp web``, which checks before) is
    left alone.
    """
    if not _under_gunicorn():
        return
    quiet_noisy_loggers()
    try:
        check_web()
    except StartupFailure as failure:
        exit_with(failure, ExitCode.GUNICORN_BOOT_ERROR)
    except SettingsError as bad:
        exit_on_bad_setting(bad)


def _under_gunicorn() -> bool:
    return os.environ.get("SERVER_SOFTWARE", "").startswith("gunicorn/")
