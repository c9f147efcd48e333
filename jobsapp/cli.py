"""The ``jobsapp`` command: database, maintenance and operator tools."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from alembic import command
from alembic.config import Config

from jobsapp.settings import SettingsError, get_settings

Handler = Callable[[argparse.Namespace], int]


def alembic_config() -> Config:
    """Alembic's config for the migrations shipped next to the package."""
    root = Path(__file__).resolve().parent.parent
    cfg = Config(str(root / "alembic.ini"))
    cfg.set_main_option("script_location", str(root / "migrations"))
    return cfg


def db_upgrade(_args: argparse.Namespace) -> int:
    command.upgrade(alembic_config(), "head")
    print(f"database at head: {_safe_url(get_settings().database_url)}")
    return 0


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def maintenance_run_once(args: argparse.Namespace) -> int:
    from jobsapp.maintenance.tasks import PASSES

    names = [args.pass_name] if args.pass_name else list(PASSES)
    for name in names:
        print(json.dumps({"pass": name, "counts": PASSES[name]()}))
    return 0


def web(args: argparse.Namespace) -> int:
    # Flask and the web app load only for the commands that serve HTTP.
    from werkzeug.serving import run_simple

    from jobsapp.web.app import create_app

    try:
        app = create_app()
    except SettingsError as bad:
        sys.stderr.write(f"jobsapp: configuration error: {bad}\n")
        return 2
    # The development server; production runs the same app under a WSGI server.
    run_simple(args.host, args.port, app, threaded=True)
    return 0


def demo(args: argparse.Namespace) -> int:
    # Flask, Pillow and the Celery app load only for the demo.
    from jobsapp.demo import run_demo

    return run_demo(timeout=args.timeout)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jobsapp", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    db = sub.add_parser("db", help="database schema").add_subparsers(dest="db", required=True)
    db.add_parser("upgrade", help="apply every migration").set_defaults(handler=db_upgrade)
    maint = sub.add_parser("maintenance", help="beat's maintenance passes")
    maint_sub = maint.add_subparsers(dest="maintenance", required=True)
    once = maint_sub.add_parser("run-once", help="run the passes once, now")
    once.add_argument("--pass", dest="pass_name", choices=["reaper", "relay", "retention"])
    once.set_defaults(handler=maintenance_run_once)
    serve = sub.add_parser("web", help="serve the HTTP API (development server)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.set_defaults(handler=web)
    show = sub.add_parser("demo", help="the whole flow on the embedded default, no server")
    show.add_argument("--timeout", type=float, default=90.0, help="seconds to reach ready")
    show.set_defaults(handler=demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    args = _parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        get_settings()
    except SettingsError as bad:
        print(f"jobsapp: configuration error: {bad}", file=sys.stderr)
        return 2
    return handler(args)



if __name__ == "__main__":
    raise SystemExit(main())
