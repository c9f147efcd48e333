"""The ``jobsapp`` command: database, maintenance and operator tools."""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import signal
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from jobsapp import __version__, logs, preflight
from jobsapp.attachments.commands import register as add_attachment_commands
from jobsapp.cli_flow import register as add_flow_commands
from jobsapp.preflight import Need, StartupFailure
from jobsapp.progress import working
from jobsapp.settings import SettingsError, get_settings
from jobsapp.shipped import alembic_config

Handler = Callable[[argparse.Namespace], int]

# What each command needs before it starts; a missing one is its StartupFailure line.
_NEEDS: dict[str, tuple[Need, ...]] = {
    "db": (Need.DATABASE,),
    "maintenance run-once": (Need.SCHEMA, Need.STORAGE, Need.BROKER),
    "maintenance run-once relay": (Need.SCHEMA, Need.BROKER),
    "maintenance run-once staging": (Need.SCHEMA, Need.STORAGE),
    "maintenance run-once reaper": (Need.SCHEMA,),
    "maintenance run-once retention": (Need.SCHEMA,),
    "maintenance run-once reconcile": (Need.SCHEMA,),
    "maintenance leader": (Need.SCHEMA,),
    "summary": (Need.SCHEMA,),
    "replay": (Need.SCHEMA,),
    "cancel": (Need.SCHEMA,),
    "reprocess": (Need.SCHEMA,),
    "reconcile": (Need.SCHEMA,),
    "verify": (Need.SCHEMA, Need.STORAGE),
    "queue": (Need.SCHEMA,),
    "domain": (Need.SCHEMA,),
}


def db_upgrade(_args: argparse.Namespace) -> int:
    # Alembic logs the set-up of each of its plugins at INFO as it is imported: seven lines
    # of noise above the migrations it runs, which are what the operator reads.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    # Here, not at the top: Alembic is half of the CLI's imports, and only this command
    # needs it (`jobsapp --help` should not wait for it).
    from alembic import command
    from alembic.util import CommandError
    from sqlalchemy.exc import DBAPIError

    try:
        command.upgrade(alembic_config(), "head")
    except CommandError:
        # A rollback's release step on a database its newer release migrated: the old
        # code runs on the newer schema (preflight.schema_problem), so nothing is missing.
        newer = _newer_revisions()
        if not newer:
            raise
        print(
            f"database at revision {', '.join(newer)}, which a newer jobsapp wrote (this "
            f"one's newest is {', '.join(preflight.script_revisions()[0])}): nothing to "
            "apply; this release runs on it as it is"
        )
        return 0
    except DBAPIError as exc:
        failure = _upgrade_stopped(exc)
        if failure is None:
            raise
        preflight.report(failure)
        return failure.code
    print(f"database at head: {_safe_url(get_settings().database_url)}")
    return 0


def _newer_revisions() -> list[str]:
    """The database's revisions that no migration of this release names."""
    known = preflight.script_revisions()[1]
    current = preflight.current_revisions(get_settings().database_url)
    return [revision for revision in current if revision not in known]


def _upgrade_stopped(exc: Any) -> StartupFailure | None:
    """The line of an upgrade PostgreSQL stopped for a reason the operator can act on, or
    None. The statement that stopped changed nothing; a second run goes on from the last
    revision applied."""
    from sqlalchemy.engine import make_url

    from jobsapp.db import lock_refused, privilege_refused
    from jobsapp.lifecycle.journal.ddl import MIGRATION_LOCK_TIMEOUT_S

    if lock_refused(exc):
        return StartupFailure(
            preflight.ExitCode.MIGRATION_LOCKED,
            f"a migration waited {MIGRATION_LOCK_TIMEOUT_S} s for a table another "
            "transaction holds (a pg_dump, an idle session: see pg_stat_activity) and "
            "stopped, applying nothing of its own, rather than hold every query of "
            "that table behind it; run `jobsapp db upgrade` again once that ends",
        )
    if not privilege_refused(exc):
        return None
    url = get_settings().database_url
    role, schema = _creating_as(url) or (
        make_url(url).username or "of JOBSAPP_DATABASE_URL",
        "public",
    )
    denied = str(exc.orig).splitlines()[0]
    return StartupFailure(
        preflight.ExitCode.MIGRATION_NOT_PERMITTED,
        f"the database role {role} may not change the schema ({denied}): grant it CREATE "
        f"on the schema (GRANT CREATE ON SCHEMA {schema} TO {role}; PostgreSQL 15 and later "
        "give it to the database's owner only) or run `jobsapp db upgrade` as the owner; "
        "run it again then, it goes on from the last revision applied",
    )


def _creating_as(url: str) -> tuple[str, str] | None:
    """The role the upgrade ran as and the schema it creates in (the first of its
    ``search_path``), asked on a connection of its own: Alembic's ended with the error."""
    from sqlalchemy import text
    from sqlalchemy.exc import SQLAlchemyError

    engine = preflight.probe_engine(url)  # its connect timeout: the database may be gone
    try:
        with engine.connect() as conn:
            role, schema = conn.execute(text("SELECT current_user, current_schema()")).one()
    except SQLAlchemyError:
        return None
    finally:
        engine.dispose()
    return str(role), str(schema or "public")


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def maintenance_run_once(args: argparse.Namespace) -> int:
    from jobsapp.maintenance.beat_tasks import PASSES
    from jobsapp.maintenance.retention import RetentionRefused

    names = [args.pass_name] if args.pass_name else list(PASSES)
    code = 0
    for name in names:
        try:
            with working(f"maintenance: {name}"):
                counts = PASSES[name]()
        except RetentionRefused as refused:
            # The other passes still run; the exit status tells a script this one did not.
            sys.stderr.write(f"jobsapp: {name} refused to run: {refused}\n")
            code = 1
            continue
        print(json.dumps({"pass": name, "counts": counts}))
    return code


def maintenance_leader(_args: argparse.Namespace) -> int:
    """Beat's health check: maintenance runs only while some beat holds a live lease."""
    from jobsapp.db import get_engine
    from jobsapp.maintenance import lease
    from jobsapp.maintenance.scheduler import LEASE_NAME

    passes = [lease.STAMP_PREFIX + task for task in maintenance_passes()]
    with get_engine().connect() as conn:
        held = lease.holder_of(conn, LEASE_NAME)
        now = lease.database_now(conn)
        late = lease.overdue(conn, passes, now)
    if held is None or held[1] <= now:
        print("jobsapp: no beat holds the maintenance lease", file=sys.stderr)
        return 1
    if late:
        said = ", ".join(
            f"{name.removeprefix(lease.STAMP_PREFIX)} (last run: "
            f"{'never' if at is None else at.isoformat()})"
            for name, at in sorted(late.items())
        )
        print(
            f"jobsapp: beat {held[0]} leads, but maintenance passes are overdue: {said}",
            file=sys.stderr,
        )
        return 1
    print(
        f"beat leader: {held[0]} (lease until {held[1].isoformat()}); "
        f"{len(passes)} maintenance passes on time"
    )
    return 0


def maintenance_passes() -> list[str]:
    """The tasks of the shipped maintenance entries: the passes a healthy beat runs."""
    from jobsapp.celery_app import shipped_settings
    from jobsapp.maintenance.entries import MAINTENANCE_PREFIX

    tasks = {spec.get("task", "") for spec in shipped_settings()["beat_schedule"].values()}
    return sorted(t for t in tasks if t.startswith(MAINTENANCE_PREFIX))


def web(args: argparse.Namespace) -> int:
    # Flask and the web app load only for the commands that serve HTTP.
    from werkzeug.serving import run_simple

    from jobsapp.web.app import create_app

    try:
        preflight.check_web()
        app = create_app()
    except SettingsError as bad:
        preflight.report(preflight.configuration_failure(bad))
        return 2
    except StartupFailure as failure:
        preflight.report(failure)
        return failure.code
    # The development server; production runs the same app under a WSGI server.
    run_simple(args.host, args.port, app, threaded=True)
    return 0


def demo(args: argparse.Namespace) -> int:
    # Flask, Pillow and the Celery app load only for the demo.
    from jobsapp.demo import run_demo

    return run_demo(timeout=args.timeout)


# ------------------------------------------------------------------------ operators


def summary(args: argparse.Namespace) -> int:
    from jobsapp.db import get_engine
    from jobsapp.monitor import summary as monitor

    if args.workflow is not None:
        return _workflow_summary(args.workflow, as_json=args.json)
    try:
        rows = _summary_rows(args)
    except monitor.BadFilter as bad:
        print(f"jobsapp: {bad}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([row.as_json() for row in rows], indent=2))
    else:
        print(_summary_table(rows))
        print()
        print(_counts_table(monitor.outcome_counts(get_engine(), module=args.module)))
        _print_workflows_line()
    return 0


def _print_workflows_line() -> None:
    """``workflows: 2 running, 40 succeeded, 1 failed``, when there are any."""
    from jobsapp.db import get_engine
    from jobsapp.monitor.workflows import workflow_counts

    counts = workflow_counts(get_engine())
    if any(counts.values()):
        print()
        print("workflows: " + ", ".join(f"{n} {state}" for state, n in counts.items()))


def _workflow_summary(workflow_id: uuid.UUID, *, as_json: bool) -> int:
    """A workflow's steps and their states (docs/workflows.md)."""
    from jobsapp.db import get_engine
    from jobsapp.monitor.workflows import workflow_steps

    steps = workflow_steps(get_engine(), workflow_id)
    if not steps:
        print(f"jobsapp: no workflow {workflow_id}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps([step.as_json() for step in steps], indent=2))
        return 0
    lines = [(s.path, s.task_name, str(s.job_id), s.state, s.outcome or "") for s in steps]
    print(_aligned(("STEP", "TASK", "JOB_ID", "STATE", "OUTCOME"), lines))
    return 0


def _summary_rows(args: argparse.Namespace) -> list[Any]:
    from jobsapp.db import get_engine
    from jobsapp.monitor import browse, summary

    if args.attachment is None:
        return summary.summarize(
            get_engine(), states=args.state, module=args.module, limit=args.limit
        )
    wanted = browse.JobFilter(
        module=args.module, states=summary.checked_states(args.state), attachment_id=args.attachment
    )
    limit = summary.checked_limit(args.limit)
    return browse.find_jobs(get_engine(), wanted, limit=limit).rows


def _summary_table(rows: Sequence[Any]) -> str:
    from jobsapp.monitor.summary import human_age

    header = ("MODULE", "TASK", "JOB_ID", "STATE", "ATTEMPTS", "AGE", "ERROR")
    lines = [
        (
            r.module,
            r.task_name,
            str(r.job_id),
            r.state,
            f"{r.attempts}/{r.max_attempts}",
            human_age(r.age_seconds),
            r.last_error or "",
        )
        for r in rows
    ]
    return _aligned(header, lines)


def _counts_table(counts: Sequence[Any]) -> str:
    """Jobs per module, state and outcome: the whole journal at a glance."""
    lines = [(c.module, c.state, c.outcome or "-", str(c.jobs)) for c in counts]
    return _aligned(("MODULE", "STATE", "OUTCOME", "JOBS"), lines)


def _aligned(header: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *lines, strict=True)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in (header, *lines)
    )


def replay(args: argparse.Namespace) -> int:
    from jobsapp import operator
    from jobsapp.db import get_engine

    def act() -> str:
        module = args.module or operator.module_of(get_engine(), args.job_id)
        done = operator.replay(
            get_engine(), module, args.job_id, actor=_actor(args), reason=args.reason
        )
        return (
            f"replayed {done.module} job {done.job_id}: attempt {done.attempt} queued, {done.then}"
        )

    return _operator_action(act)


def cancel(args: argparse.Namespace) -> int:
    from jobsapp import operator
    from jobsapp.db import get_engine

    def act() -> str:
        module = args.module or operator.module_of(get_engine(), args.job_id)
        done = operator.cancel(
            get_engine(),
            module,
            args.job_id,
            actor=_actor(args),
            reason=args.reason,
            terminate=args.terminate,
        )
        if not done.running:
            return f"cancelled {done.module} job {done.job_id}"
        sent = "; terminate sent to its worker process" if done.terminate_sent else ""
        return (
            f"{done.module} job {done.job_id} (attempt {done.attempts}) asked to stop at "
            f"its next heartbeat{sent}"
        )

    return _operator_action(act)


def _operator_action(act: Callable[[], str]) -> int:
    """Run an operator action: 0 done, 1 refused (the reason on stderr), 2 bad input."""
    from jobsapp import operator

    try:
        print(act())
    except operator.Refused as refused:
        print(f"jobsapp: refused ({refused.code}): {refused}", file=sys.stderr)
        return 1
    except operator.InvalidRequest as bad:
        print(f"jobsapp: {bad}", file=sys.stderr)
        return 2
    return 0


def _actor(args: argparse.Namespace) -> str:
    if args.actor:
        return str(args.actor)
    try:
        return os.environ.get("USER") or getpass.getuser()
    except (KeyError, OSError):  # no $USER and no passwd entry (a bare container)
        return "unknown"


def reconcile(args: argparse.Namespace) -> int:
    """Take failed runs again per the domains' reconcile policies: 0 done, 2 bad input."""
    from jobsapp import operator
    from jobsapp.celery_app import app
    from jobsapp.db import get_engine
    from jobsapp.maintenance import reconcile as passes

    request = passes.Request(
        error_code=args.error_code, dry_run=args.dry_run, actor=f"{passes.ACTOR}:{_actor(args)}"
    )
    try:
        reports = passes.run_all(get_engine(), app, request, module=args.module)
    except (operator.Refused, passes.NeverRetaken, operator.InvalidRequest) as bad:
        print(f"jobsapp: {bad}", file=sys.stderr)
        return 2
    for report in reports:
        print(json.dumps(report.as_json()))
    return 0


def _add_reconcile_command(sub: Any) -> None:
    again = sub.add_parser("reconcile", help="take failed runs worth another try again")
    again.add_argument("--module", help="only this run table (jobs, attachments, ...)")
    again.add_argument(
        "--error-code", help="only failures with this code (any code the domain does not forbid)"
    )
    again.add_argument(
        "--dry-run",
        action="store_true",
        help="take nothing again: list what a pass would take and, for each "
        "failed run it leaves alone, the rule that holds it back",
    )
    again.add_argument("--actor", help="who acts (default: $USER), for the audit rows")
    again.set_defaults(handler=reconcile)


def _add_operator_commands(sub: Any) -> None:
    from jobsapp.monitor.summary import FILTERS

    show = sub.add_parser("summary", help="the newest jobs of every run table")
    show.add_argument(
        "--state",
        action="append",
        choices=FILTERS,
        help="only this state (repeatable); failed leaves out cancelled and "
        "expired jobs, which cancelled and expired list",
    )
    show.add_argument("--module", help="only this run table (jobs, attachments, ...)")
    show.add_argument("--attachment", type=uuid.UUID, help="only the jobs of this attachment")
    show.add_argument(
        "--limit",
        type=int,
        default=100,
        help="list at most this many jobs (default 100); counts cover all",
    )
    show.add_argument("--json", action="store_true", help="JSON instead of a table")
    show.add_argument("--workflow", type=uuid.UUID, help="the steps of this workflow instead")
    show.set_defaults(handler=summary)
    for name, handler, what in (
        ("replay", replay, "failed -> queued, one new attempt (replay again for another)"),
        ("cancel", cancel, "queued -> failed/cancelled; a running job is asked to stop"),
    ):
        action = sub.add_parser(name, help=f"{what}; leaves an audit row")
        action.add_argument("job_id", type=uuid.UUID, help="the job's id")
        action.add_argument(
            "--module",
            help="its run table (jobs, attachments, ...); by default the one that holds the job id",
        )
        action.add_argument("--reason", required=True, help="why, for the audit row")
        action.add_argument("--actor", help="who acts (default: $USER), as operator:<actor>")
        action.set_defaults(handler=handler)
        if name == "cancel":
            action.add_argument(
                "--terminate",
                action="store_true",
                help="a running job: also kill its worker process",
            )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jobsapp", description=__doc__)
    parser.add_argument("--version", action="version", version=f"jobsapp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    db = sub.add_parser("db", help="database schema").add_subparsers(dest="db", required=True)
    db.add_parser("upgrade", help="apply every migration").set_defaults(handler=db_upgrade)
    maint = sub.add_parser("maintenance", help="beat's maintenance passes")
    maint_sub = maint.add_subparsers(dest="maintenance", required=True)
    once = maint_sub.add_parser("run-once", help="run the passes once, now")
    passes = ["reaper", "relay", "retention", "staging", "reconcile"]
    once.add_argument("--pass", dest="pass_name", choices=passes)
    once.set_defaults(handler=maintenance_run_once)
    leader = maint_sub.add_parser(
        "leader", help="the beat holding the maintenance lease; exit 1 when none does"
    )
    leader.set_defaults(handler=maintenance_leader)
    serve = sub.add_parser("web", help="serve the HTTP API (development server)")
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default 127.0.0.1: this machine only)",
    )
    serve.add_argument("--port", type=int, default=8000, help="the port (default 8000)")
    serve.set_defaults(handler=web)
    show = sub.add_parser("demo", help="the whole flow on the embedded default, no server")
    show.add_argument("--timeout", type=float, default=90.0, help="seconds to reach ready")
    show.set_defaults(handler=demo)
    _add_operator_commands(sub)
    _add_reconcile_command(sub)
    add_attachment_commands(sub)
    add_flow_commands(sub, _operator_action, _actor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _run(argv)
    except BrokenPipeError:
        return _reader_gone()


def _options(needs: Sequence[Need]) -> dict[str, Any] | None:
    """How the app connects to its broker (a Sentinel's master name, TLS), for a command
    that publishes; the app is not built for the others."""
    if Need.BROKER not in needs:
        return None
    from jobsapp.celery_app import app

    return preflight.broker_options(app)


def _run(argv: Sequence[str] | None) -> int:
    # Parsed first: --help and --version need no settings, so a bad one cannot stop them.
    args = _parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        logs.configure()
        preflight.quiet_noisy_loggers()
        needs = _needs(args)
        preflight.require(*needs, settings=get_settings(), broker=_options(needs))
    except SettingsError as bad:
        preflight.report(preflight.configuration_failure(bad))
        return preflight.ExitCode.CONFIGURATION
    except StartupFailure as failure:
        preflight.report(failure)
        return failure.code
    return handler(args)


def _reader_gone() -> int:
    """Our stdout's reader left (``jobsapp summary | head``): stop without a word, with the
    status of a Unix tool that SIGPIPE ended."""
    # The interpreter flushes stdout once more on its way out: let that flush go nowhere.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + signal.SIGPIPE


def _needs(args: argparse.Namespace) -> tuple[Need, ...]:
    """The needs of the most specific key of ``_NEEDS`` that names this command:
    ``maintenance run-once relay``, else ``maintenance run-once``, else ``maintenance``."""
    words = [
        str(w)
        for w in (
            args.command,
            getattr(args, "maintenance", None),
            getattr(args, "pass_name", None),
        )
        if w
    ]
    for end in range(len(words), 0, -1):
        needs = _NEEDS.get(" ".join(words[:end]))
        if needs is not None:
            return needs
    return ()


if __name__ == "__main__":
    raise SystemExit(main())
