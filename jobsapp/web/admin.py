"""The operator side of the web app: the admin summary as JSON, replay, cancel, and the
Prometheus metrics; the browser's pages under ``/admin`` are ``jobsapp.web.ui``.

Everything under ``/v1/admin`` needs ``Authorization: Bearer $JOBSAPP_ADMIN_TOKEN``; with
no token configured the operator API is off (403), so a deployment that forgot the
variable is closed rather than open. ``/metrics`` carries no job ids or errors; it is open
unless ``JOBSAPP_METRICS_TOKEN`` is set, then it needs that bearer token (a scraper's own,
not the operator's).
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
from typing import Any
from uuid import UUID

from flask import Blueprint, Flask, Response, current_app, jsonify, request
from flask.typing import ResponseReturnValue
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from jobsapp import operator
from jobsapp.db import get_engine
from jobsapp.lifecycle import outbox_queries
from jobsapp.monitor import metrics, summary
from jobsapp.settings import get_settings
from jobsapp.web import auth, ui

log = logging.getLogger(__name__)

_METRICS = "jobsapp.metrics"
_RETRY_AFTER_S = "5"
# What "the database is down" looks like; an IntegrityError is a bug and stays a 500.
_DB_DOWN = (OperationalError, InterfaceError, PoolTimeout)
_REFUSAL_STATUS = {operator.NotFound: 404, operator.Conflict: 409}

admin = Blueprint("admin", __name__)
scrape = Blueprint("metrics", __name__)


def init_app(app: Flask) -> None:
    """Register the operator routes and the metrics registry on ``app``."""
    app.extensions[_METRICS] = metrics.journal_registry(
        get_engine, lambda: get_settings().stale_after
    )
    app.register_blueprint(admin)
    app.register_blueprint(scrape)
    ui.init_app(app)


def _error(status: int, code: str, reason: str) -> tuple[Response, int]:
    return jsonify({"error": code, "reason": reason}), status


# ---------------------------------------------------------------------------- errors


def _unavailable(exc: Exception) -> ResponseReturnValue:
    # The cause may name hosts: it goes to the log, not to the client.
    log.warning("admin answering 503: database unavailable (%s)", type(exc).__name__)
    response, status = _error(503, "unavailable", "The database is unavailable; retry later.")
    response.headers["Retry-After"] = _RETRY_AFTER_S
    return response, status


def _bad_input(exc: ValueError) -> ResponseReturnValue:
    code = "bad_filter" if isinstance(exc, summary.BadFilter) else "bad_request"
    return _error(400, code, str(exc))


def _refused(exc: operator.Refused) -> ResponseReturnValue:
    return _error(_REFUSAL_STATUS.get(type(exc), 409), exc.code, str(exc))


for _blueprint in (admin, scrape):
    for _down in _DB_DOWN:
        _blueprint.register_error_handler(_down, _unavailable)
admin.register_error_handler(summary.BadFilter, _bad_input)
admin.register_error_handler(operator.InvalidRequest, _bad_input)
admin.register_error_handler(operator.Refused, _refused)


# ------------------------------------------------------------------- authentication


@admin.before_request
def _authenticate() -> ResponseReturnValue | None:
    if get_settings().admin_token is None:
        return _error(403, "forbidden", "operator API disabled: JOBSAPP_ADMIN_TOKEN is not set")
    if not auth.token_matches(auth.bearer(request)):
        response, status = _error(401, "unauthorized", "Send Authorization: Bearer <token>.")
        response.headers["WWW-Authenticate"] = 'Bearer realm="jobsapp-admin"'
        return response, status
    return None


@scrape.before_request
def _authenticate_scraper() -> ResponseReturnValue | None:
    token = get_settings().metrics_token
    given = auth.bearer(request)
    # Constant time: the comparison must not tell how much of a guess was right.
    if token is None or (given is not None and hmac.compare_digest(given.encode(), token.encode())):
        return None
    response, status = _error(401, "unauthorized", "Send Authorization: Bearer <token>.")
    response.headers["WWW-Authenticate"] = 'Bearer realm="jobsapp-metrics"'
    return response, status


# ------------------------------------------------------------------------- summary


@admin.get("/v1/admin/jobs")
def jobs() -> ResponseReturnValue:
    rows = summary.summarize(get_engine(), **_filters())
    counts = summary.counts(get_engine())
    return jsonify({"jobs": [row.as_json() for row in rows], "counts": counts})


def _filters() -> dict[str, Any]:
    """The summary filters of the query string, checked (BadFilter: a 400)."""
    states = [s for value in request.args.getlist("state") for s in value.split(",") if s]
    module = request.args.get("module") or None
    summary.checked_tables(module)
    return {"states": summary.checked_states(states or None), "module": module, "limit": _limit()}


def _limit() -> int:
    """The ``limit`` of the query string: every route that takes one parses it here."""
    raw = request.args.get("limit", str(summary.DEFAULT_LIMIT))
    # ASCII digits only, and few: int() refuses "²" and numbers of thousands of digits.
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 9):
        raise summary.BadFilter(f"limit must be an integer from 1 to {summary.MAX_LIMIT}")
    return summary.checked_limit(int(raw))


# ------------------------------------------------------------------------- actions


@admin.post("/v1/admin/jobs/<module>/<uuid:job_id>/replay")
def replay(module: str, job_id: UUID) -> ResponseReturnValue:
    actor, reason = _action_body()
    done = operator.replay(get_engine(), module, job_id, actor=actor, reason=reason)
    return jsonify({"module": done.module, "job_id": str(done.job_id), "state": "queued",
                    "attempt": done.attempt, "published": done.published})  # fmt: skip


@admin.post("/v1/admin/jobs/<module>/<uuid:job_id>/cancel")
def cancel(module: str, job_id: UUID) -> ResponseReturnValue:
    actor, reason = _action_body()
    done = operator.cancel(get_engine(), module, job_id, actor=actor, reason=reason)
    return jsonify({"module": done.module, "job_id": str(done.job_id), "state": "failed",
                    "outcome": "cancelled", "attempts": done.attempts})  # fmt: skip


def _action_body() -> tuple[str, str]:
    """(actor, reason) of ``{"reason": ..., "actor"?: ...}``.

    The actor is self-declared (the token is shared): the audit row names who says they
    acted, not who was authenticated.
    """
    body = request.get_json(silent=True)
    if not isinstance(body, dict) or set(body) - {"reason", "actor"}:
        raise operator.InvalidRequest('send a JSON object {"reason": "...", "actor": "..."}')
    reason, actor = body.get("reason"), body.get("actor", "api")
    if not isinstance(reason, str) or not isinstance(actor, str):
        raise operator.InvalidRequest('"reason" (required) and "actor" must be strings')
    return actor, reason


@admin.post("/v1/admin/reconcile")
def reconcile_failed() -> ResponseReturnValue:
    """``{"actor"?, "module"?, "error_code"?, "dry_run"?}``: a reconcile pass, now."""
    from jobsapp.celery_app import app as celery_app
    from jobsapp.maintenance import reconcile

    body = request.get_json(silent=True)
    if body is None:
        body = {}
    if not isinstance(body, dict) or set(body) - {"actor", "module", "error_code", "dry_run"}:
        raise operator.InvalidRequest('send {"module"?, "error_code"?, "dry_run"?, "actor"?}')
    actor, module, code = body.get("actor", "api"), body.get("module"), body.get("error_code")
    dry_run = body.get("dry_run", False)
    if not (isinstance(actor, str) and isinstance(dry_run, bool)
            and all(v is None or isinstance(v, str) for v in (module, code))):  # fmt: skip
        raise operator.InvalidRequest('"actor", "module", "error_code": strings; "dry_run": bool')
    asked = reconcile.Request(error_code=code, dry_run=dry_run, actor=f"{reconcile.ACTOR}:{actor}")
    try:
        reports = reconcile.run_all(get_engine(), celery_app, asked, module=module)
    except reconcile.NeverRetaken as never:
        return _error(409, "never_retaken", str(never))
    return jsonify({"passes": [r.as_json() for r in reports]})


# ---------------------------------------------------------------- dead outbox rows


@admin.get("/v1/admin/outbox/dead")
def dead_outbox() -> ResponseReturnValue:
    """Outbox rows the relay gave up on, newest first, with why."""
    limit = _limit()
    with get_engine().connect() as conn:
        rows = outbox_queries.dead_rows(conn, limit=limit)
        total = outbox_queries.count_dead(conn)
    return jsonify({"total": total, "dead": [_dead_json(r) for r in rows]})


def _dead_json(row: outbox_queries.DeadRow) -> dict[str, Any]:
    when = {"created_at": row.created_at.isoformat(), "dead_at": row.dead_at.isoformat()}
    return {**dataclasses.asdict(row), "job_id": str(row.job_id), **when}


@admin.post("/v1/admin/outbox/dead/retry")
def retry_dead_outbox() -> ResponseReturnValue:
    """``{"reason": ..., "actor"?: ..., "ids"?: [outbox ids]}``; no ids: every dead row."""
    body = request.get_json(silent=True)
    if not isinstance(body, dict) or set(body) - {"reason", "actor", "ids"}:
        raise operator.InvalidRequest('send {"reason": "...", "actor": "...", "ids": [1, 2]}')
    ids = body.get("ids")
    if ids is not None and not (isinstance(ids, list) and all(type(i) is int for i in ids)):
        raise operator.InvalidRequest('"ids" must be a list of outbox row ids (integers)')
    reason, actor = body.get("reason"), body.get("actor", "api")
    if not isinstance(reason, str) or not isinstance(actor, str):
        raise operator.InvalidRequest('"reason" (required) and "actor" must be strings')
    revived = operator.retry_dead_outbox(get_engine(), ids, actor=actor, reason=reason)
    return jsonify({"revived": revived})


# ------------------------------------------------------------------------- metrics


@scrape.get("/metrics")
def prometheus() -> ResponseReturnValue:
    text = metrics.exposition(current_app.extensions[_METRICS])
    return Response(text, headers={"Content-Type": CONTENT_TYPE_LATEST})
