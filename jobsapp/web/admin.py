"""The operator side of the web app: the admin summary as JSON, replay, cancel, and the
Prometheus metrics; the browser's pages under ``/admin`` are ``jobsapp.web.ui``.

Everything under ``/v1/admin`` needs ``Authorization: Bearer $JOBSAPP_ADMIN_TOKEN``; with
no token configured the operator API is off (403), so a deployment that forgot the
variable is closed rather than open. ``/metrics`` (this process) and ``/metrics/cluster``
(the journal, see ``monitor.metrics``) carry no job ids or errors; they are open unless
``JOBSAPP_METRICS_TOKEN`` is set, then they need that bearer token (a scraper's own, not
the operator's).
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
from typing import Any

from flask import Response, current_app, jsonify, request
from flask.typing import ResponseReturnValue
from flask_openapi3.blueprint import APIBlueprint
from flask_openapi3.models.tag import Tag
from flask_openapi3.openapi import OpenAPI
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from jobsapp import flow_control, operator
from jobsapp.db import console_engine
from jobsapp.lifecycle.flow.gating import Kind
from jobsapp.lifecycle.journal import outbox_queries
from jobsapp.monitor import metrics, summary
from jobsapp.settings import get_settings
from jobsapp.web import access, auth, schemas, throttle, ui
from jobsapp.web.openapi import (
    ADMIN_AUTH,
    ADMIN_ERROR_TEXT,
    METRICS_AUTH,
    Answer,
    admin_errors,
    errors,
    json_answer,
)

log = logging.getLogger(__name__)

_METRICS = "jobsapp.metrics"
_PROCESS_METRICS = "jobsapp.metrics.process"
_RETRY_AFTER_S = "5"
# What "the database is down" looks like; an IntegrityError is a bug and stays a 500.
_DB_DOWN = (OperationalError, InterfaceError, PoolTimeout)
_REFUSAL_STATUS = {operator.NotFound: 404, operator.Conflict: 409}

admin = APIBlueprint("admin", __name__, abp_tags=[Tag(name="operators")], abp_security=ADMIN_AUTH)
scrape = APIBlueprint(
    "metrics", __name__, abp_tags=[Tag(name="operations")], abp_security=METRICS_AUTH
)


def init_app(app: OpenAPI) -> None:
    """Register the operator routes and the metrics registry on ``app``."""
    app.extensions[_METRICS] = metrics.journal_registry(
        console_engine, lambda: get_settings().stale_after, metrics.celery_app
    )
    app.extensions[_PROCESS_METRICS] = metrics.process_registry()
    app.register_api(admin)
    app.register_api(scrape)
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
    if not access.enabled():
        return _error(
            403,
            "forbidden",
            "operator API disabled: neither JOBSAPP_ADMIN_TOKEN nor "
            "JOBSAPP_AUTH_PROXY_HEADER is set",
        )
    try:
        who = access.identity_of(request)
    except access.Refused as refused:
        return _refusal(refused)
    if who is None:
        return _unauthorized("jobsapp-admin")
    if request.method == "POST" and not who.may_act:
        log.warning("operator API refused %s to viewer %s", request.path, who.name)
        return _error(403, "forbidden", access.may_not_act(who))
    return None


def _refusal(refused: access.Refused) -> ResponseReturnValue:
    code = "too_many_attempts" if refused.status == 429 else "forbidden"
    response, status = _error(refused.status, code, refused.reason)
    if refused.retry_after is not None:
        response.headers["Retry-After"] = str(refused.retry_after)
    return response, status


def _unauthorized(realm: str) -> ResponseReturnValue:
    response, status = _error(401, "unauthorized", "Send Authorization: Bearer <token>.")
    response.headers["WWW-Authenticate"] = f'Bearer realm="{realm}"'
    return response, status


def _actor(declared: str) -> str:
    """The audited name of this request's action (the guard let only an operator in)."""
    who = access.identity_of(request)
    assert who is not None, "the guard let nobody in"
    return access.audit_name(who, declared)


@scrape.before_request
def _authenticate_scraper() -> ResponseReturnValue | None:
    token = get_settings().metrics_token
    if token is None:
        return None
    given = auth.bearer(request)
    try:
        # Constant time: the comparison must not tell how much of a guess was right.
        known = throttle.checked(
            access.client_address(request),
            "metrics token",
            lambda: given is not None and hmac.compare_digest(given.encode(), token.encode()),
        )
    except throttle.Throttled as wait:
        return _refusal(access.Refused(429, str(wait), wait.retry_after))
    return None if known else _unauthorized("jobsapp-metrics")


# ------------------------------------------------------------------------- summary


@admin.get(
    "/v1/admin/jobs",
    summary="The newest jobs of every run table, and counts by module and state",
    description="Each run table is read in its own home; newest first by `updated_at`. "
    "`age_seconds` is the time spent in the current state.",
    operation_id="adminJobs",
    responses={200: json_answer(schemas.JobSummary, "The summary"), **admin_errors(400)},
)
def jobs(query: schemas.SummaryQuery) -> Answer:
    rows = summary.summarize(
        console_engine(), states=tuple(query.state) or None, module=query.module, limit=query.limit
    )
    counts = summary.counts(console_engine())
    return jsonify({"jobs": [row.as_json() for row in rows], "counts": counts})


# ------------------------------------------------------------------------- actions


@admin.post(
    "/v1/admin/jobs/<module>/<uuid:job_id>/replay",
    summary="Replay a failed job: a new attempt of the same job_id",
    description="failed -> queued, with an audit row (actor `operator:<actor>`, the "
    "reason); the message is published after the commit (or by the relay).",
    operation_id="adminReplay",
    responses={200: json_answer(schemas.Replayed, "Queued again"), **admin_errors(400, 404, 409)},
)
def replay(path: schemas.JobPath, body: schemas.OperatorAction) -> Answer:
    # With the shared token and no provider the actor is self-declared: the audit row names
    # who says they acted; behind a provider, who the provider says it is.
    done = operator.replay(
        console_engine(), path.module, path.job_id, actor=_actor(body.actor), reason=body.reason
    )
    return jsonify(
        {
            "module": done.module,
            "job_id": str(done.job_id),
            "state": "queued",
            "attempt": done.attempt,
            "published": done.published,
            "waiting": done.waiting,
        }
    )


@admin.post(
    "/v1/admin/jobs/<module>/<uuid:job_id>/cancel",
    summary="Cancel a queued or running job",
    description="A queued job: queued -> failed with outcome `cancelled`. A running job: "
    "asked to stop, as `app.control.revoke` asks (kept in the journal): its attempt is told "
    "at its next heartbeat and ends failed/cancelled; `terminate` also kills it where the "
    "pool can. Each with an audit row. 409 `cancel_pending`: already asked to stop (send "
    "`terminate`); `not_active`: it has ended.",
    operation_id="adminCancel",
    responses={
        200: json_answer(schemas.Cancelled, "Cancelled, or asked to stop"),
        **admin_errors(400, 404, 409),
    },
)
def cancel(path: schemas.JobPath, body: schemas.CancelAction) -> Answer:
    done = operator.cancel(
        console_engine(),
        path.module,
        path.job_id,
        actor=_actor(body.actor),
        reason=body.reason,
        terminate=body.terminate,
    )
    return jsonify(
        {
            "module": done.module,
            "job_id": str(done.job_id),
            "state": "running" if done.running else "failed",
            "outcome": None if done.running else "cancelled",
            "attempts": done.attempts,
            "cancel_requested": done.running,
            "terminate_sent": done.terminate_sent,
        }
    )


@admin.post(
    "/v1/admin/reconcile",
    summary="A reconcile pass now: failed runs worth another try are replayed",
    description="The body may be empty. 409 `never_retaken` for a code the domain never retakes.",
    operation_id="adminReconcile",
    responses={
        200: json_answer(schemas.Reconciled, "One report per domain"),
        **admin_errors(400, 404, 409),
    },
)
def reconcile_failed(body: schemas.ReconcileRequest) -> Answer:
    from jobsapp.celery_app import app as celery_app
    from jobsapp.maintenance import reconcile

    asked = reconcile.Request(
        error_code=operator.checked_error_code(body.error_code),
        dry_run=body.dry_run,
        actor=f"{reconcile.ACTOR}:{_actor(body.actor)}",
    )
    try:
        reports = reconcile.run_all(console_engine(), celery_app, asked, module=body.module)
    except reconcile.NeverRetaken as never:
        return _error(409, "never_retaken", str(never))
    return jsonify({"passes": [r.as_json() for r in reports]})


# ---------------------------------------------------------------- dead outbox rows


@admin.get(
    "/v1/admin/outbox/dead",
    summary="Outbox rows the relay gave up on (dead), newest first",
    operation_id="adminDeadOutbox",
    responses={
        200: json_answer(schemas.DeadOutbox, "Dead outbox rows, with why"),
        **admin_errors(400),
    },
)
def dead_outbox(query: schemas.DeadOutboxQuery) -> Answer:
    with console_engine().connect() as conn:
        rows = outbox_queries.dead_rows(conn, limit=query.limit)
        total = outbox_queries.count_dead(conn)
    return jsonify({"total": total, "dead": [_dead_json(r) for r in rows]})


def _dead_json(row: outbox_queries.DeadRow) -> dict[str, Any]:
    when = {"created_at": row.created_at.isoformat(), "dead_at": row.dead_at.isoformat()}
    return {**dataclasses.asdict(row), "job_id": str(row.job_id), **when}


@admin.post(
    "/v1/admin/outbox/dead/retry",
    summary="Give dead outbox rows back to the relay",
    description="Each row is due again with a clean failure count and an audit row.",
    operation_id="adminRetryDeadOutbox",
    responses={200: json_answer(schemas.Revived, "Rows revived"), **admin_errors(400)},
)
def retry_dead_outbox(body: schemas.RetryDeadOutbox) -> Answer:
    revived = operator.retry_dead_outbox(
        console_engine(), body.ids, actor=_actor(body.actor), reason=body.reason
    )
    return jsonify({"revived": revived})


# -------------------------------------------------------------------- flow control


@admin.get(
    "/v1/admin/flow",
    summary="Paused queues and domains, and the newest pauses and resumes",
    operation_id="adminFlow",
    responses={
        200: json_answer(schemas.FlowState, "What is paused, and the audit trail"),
        **admin_errors(),
    },
)
def flow_state() -> Answer:
    engine = console_engine()
    paused = [p.as_json() for p in flow_control.paused(engine)]
    history = [{**row, "at": row["at"].isoformat()} for row in flow_control.history(engine)]
    return jsonify({"paused": paused, "history": history})


def _flow_changed(path: schemas.FlowPath, paused: bool, changed: bool) -> Answer:
    return jsonify({"kind": path.kind, "name": path.name, "paused": paused, "changed": changed})


@admin.post(
    "/v1/admin/flow/<kind>/<name>/pause",
    summary="Pause a queue or a domain: nothing is published or claimed for it",
    description="Audited. Returns once every worker sees the pause (about a second); a "
    "message already in the broker is handed back to the journal when a worker receives it.",
    operation_id="adminFlowPause",
    responses={200: json_answer(schemas.FlowChanged, "Paused"), **admin_errors(400, 404)},
)
def flow_pause(path: schemas.FlowPath, body: schemas.OperatorAction) -> Answer:
    changed = flow_control.pause(
        console_engine(), Kind(path.kind), path.name, actor=_actor(body.actor), reason=body.reason
    )
    return _flow_changed(path, True, changed)


@admin.post(
    "/v1/admin/flow/<kind>/<name>/resume",
    summary="Resume a paused queue or domain: the relay publishes what waited",
    description="Audited.",
    operation_id="adminFlowResume",
    responses={200: json_answer(schemas.FlowChanged, "Resumed"), **admin_errors(400, 404)},
)
def flow_resume(path: schemas.FlowPath, body: schemas.OperatorAction) -> Answer:
    changed = flow_control.resume(
        console_engine(), Kind(path.kind), path.name, actor=_actor(body.actor), reason=body.reason
    )
    return _flow_changed(path, False, changed)


# ------------------------------------------------------------------------- metrics


@scrape.get(
    "/metrics",
    summary="This web process's own Prometheus metrics",
    description="`process_*`, `python_*` and `jobsapp_web_info{version}` of the process "
    "that answered: scrape every replica. The journal's numbers are on `/metrics/cluster`. "
    "Open unless `JOBSAPP_METRICS_TOKEN` is set, then that bearer token.",
    operation_id="metrics",
    responses={
        200: {
            "description": "The Prometheus text exposition format",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        **errors(401, 429, text=ADMIN_ERROR_TEXT),
    },
)
def prometheus() -> Answer:
    return _exposition(_PROCESS_METRICS)


@scrape.get(
    "/metrics/cluster",
    summary="The journal's Prometheus metrics, the same from every replica",
    description="`jobsapp_jobs{module,task,queue,state}`, "
    "`jobsapp_oldest_queued_seconds{module,task,queue}`, `jobsapp_stale_running{module}`, "
    "`jobsapp_outbox_backlog`, `jobsapp_outbox_lag_seconds`, `jobsapp_queue_paused{queue}`, "
    "`jobsapp_domain_paused{module}` and the counters and histograms "
    "of docs/operators.md, read from the database at scrape time. Every replica answers "
    "the same numbers: scrape one target (the load-balanced address), not each replica. "
    "Open unless `JOBSAPP_METRICS_TOKEN` is set, then that bearer token.",
    operation_id="clusterMetrics",
    responses={
        200: {
            "description": "The Prometheus text exposition format",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        **errors(401, 429, 503, text=ADMIN_ERROR_TEXT),
    },
)
def cluster_prometheus() -> Answer:
    return _exposition(_METRICS)


def _exposition(registry: str) -> Answer:
    text = metrics.exposition(current_app.extensions[registry])
    return Response(text, headers={"Content-Type": CONTENT_TYPE_LATEST})
