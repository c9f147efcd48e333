"""The admin UI: server-rendered pages for an operator's browser under ``/admin``.

Overview, a filtered and paged jobs list, one job with its timeline, replay and cancel
with a reason, and bulk replay behind a confirmation page. No script runs on any page
(the Content-Security-Policy forbids it): every action is a form POST that carries the
session's CSRF token, and the server answers with a redirect (POST/redirect/GET) or a
page. A browser logs in with the admin token (``jobsapp.web.auth``); a GET with the
bearer token is served too, so ``curl`` can read a page.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import cache
from typing import Any

from flask import Response, flash, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from flask_openapi3.blueprint import APIBlueprint
from flask_openapi3.models.tag import Tag
from flask_openapi3.openapi import OpenAPI
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from werkzeug.datastructures import MultiDict

from jobsapp import operator
from jobsapp.attachments import service
from jobsapp.db import get_engine
from jobsapp.lifecycle.message import task_id_for
from jobsapp.lifecycle.scrub import known_secrets_from_env, scrub
from jobsapp.lifecycle.states import ALL_STATES, State, Transition
from jobsapp.maintenance import periodic
from jobsapp.monitor import browse, summary
from jobsapp.settings import get_settings
from jobsapp.web import auth
from jobsapp.web.openapi import ADMIN_AUTH, FORM_BODY, SESSION_AUTH, Answer, html_form, html_page
from jobsapp.web.schemas import JobPath

log = logging.getLogger(__name__)

# How many failed jobs one confirmation page lists and one bulk replay takes.
BULK_MAX = 200
# Dead outbox rows listed on the overview (the count covers them all).
DEAD_SHOWN = 20
PARAMS_LIMIT = 20_000
_PAGE_HEADERS = {
    # No script may run, no other site may frame a page or receive a form, none is cached.
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "Cache-Control": "no-store",
    "Referrer-Policy": "same-origin",
}
_DB_DOWN = (OperationalError, InterfaceError, PoolTimeout)


@dataclass(frozen=True)
class Replayed:
    """One line of the bulk replay's result page; ``key`` is ``module:job_id``."""

    key: str
    done: bool
    message: str


# Pages answer a bad filter or form with a page, not a JSON refusal: their parameters are
# described (paths) but read by the views.
ui = APIBlueprint("ui", __name__, url_prefix="/admin", template_folder="templates",
                  abp_tags=[Tag(name="admin UI")])  # fmt: skip
_PAGE_AUTH = [*SESSION_AUTH, *ADMIN_AUTH]


View = Callable[..., Answer]


def _page_route(
    rule: str, operation_id: str, summary: str, **options: Any
) -> Callable[[View], View]:
    return ui.get(rule, operation_id=operation_id, summary=summary, description="",
                  security=options.pop("security", _PAGE_AUTH), responses=html_page(),
                  **options)  # fmt: skip


def _form_route(
    rule: str, operation_id: str, summary: str, **options: Any
) -> Callable[[View], View]:
    return ui.post(rule, operation_id=operation_id, summary=summary, description="",
                   security=SESSION_AUTH, responses=html_form(), openapi_extensions=FORM_BODY,
                   **options)  # fmt: skip


def init_app(app: OpenAPI) -> None:
    auth.init_app(app)
    app.register_api(ui)


def _page(template: str, status: int = 200, **context: Any) -> Response:
    html = render_template(f"admin/{template}", **context)
    return Response(html, status, headers=_PAGE_HEADERS, mimetype="text/html")


def _error_page(status: int, message: str) -> Response:
    return _page("error.html", status, code=status, message=message)


@ui.context_processor
def _helpers() -> dict[str, Any]:
    return {"csrf_token": auth.csrf_token, "csrf_field": auth.CSRF_FIELD,
            "signed_in": auth.signed_in, "actor": auth.actor, "age": summary.human_age,
            "ts": _timestamp, "states": ALL_STATES}  # fmt: skip


def _timestamp(value: datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%SZ")


# ------------------------------------------------------------------- guard, errors


@ui.before_request
def _guard() -> ResponseReturnValue | None:
    if get_settings().admin_token is None:
        return _error_page(403, "The operator UI is disabled: JOBSAPP_ADMIN_TOKEN is not set.")
    if request.method == "POST" and not auth.csrf_ok(request.form.get(auth.CSRF_FIELD)):
        return _error_page(400, "The form's CSRF token is missing or stale; reload the page.")
    if request.endpoint in ("ui.login", "ui.log_in") or auth.signed_in():
        return None
    if request.method == "GET" and auth.token_matches(auth.bearer(request)):
        return None
    return redirect(url_for("ui.login", next=request.full_path))


@ui.errorhandler(summary.BadFilter)
@ui.errorhandler(operator.InvalidRequest)
def _bad_input(exc: ValueError) -> ResponseReturnValue:
    return _error_page(400, str(exc))


@ui.errorhandler(operator.NotFound)
def _not_found(exc: operator.NotFound) -> ResponseReturnValue:
    return _error_page(404, str(exc))


def _unavailable(exc: Exception) -> ResponseReturnValue:
    log.warning("admin UI answering 503: database unavailable (%s)", type(exc).__name__)
    response = _error_page(503, "The database is unavailable; retry in a moment.")
    response.headers["Retry-After"] = "5"
    return response


for _down in (*_DB_DOWN, service.ServiceUnavailable):
    ui.register_error_handler(_down, _unavailable)


# ------------------------------------------------------------------------- login


@_page_route("/login", "adminLoginForm", "The login form", security=[])
def login() -> Answer:
    return _page("login.html", next=_next())


@_form_route("/login", "adminLogin", "Log in with the admin token")
def log_in() -> Answer:
    if not auth.token_matches(request.form.get("token")):
        log.warning("admin login refused: wrong token from %s", request.remote_addr)
        return _page("login.html", 401, next=_next(), error="That is not the admin token.")
    name = request.form.get("name", "").strip() or auth.DEFAULT_ACTOR
    try:
        operator.operator_actor(name)
    except operator.InvalidRequest as bad:
        return _page("login.html", 400, next=_next(), error=str(bad))
    auth.log_in(name)
    return redirect(_next(), 303)


def _next() -> str:
    target = request.values.get("next", "")
    # Only a page of this UI: a login link must not redirect to another site.
    if target.startswith("/admin") and "//" not in target and "\\" not in target:
        return target
    return url_for("ui.overview")


@_form_route("/logout", "adminLogout", "End the session")
def logout() -> Answer:
    auth.log_out()
    return redirect(url_for("ui.login"), 303)


# ---------------------------------------------------------------------- the pages


@_page_route("", "adminOverview", "Counts, oldest queued, stale runs, outbox")
def overview() -> Answer:
    from jobsapp.celery_app import app as celery_app

    stale_after = get_settings().stale_after
    health = summary.health(get_engine(), stale_after)
    dead_total, dead = browse.dead_outbox(get_engine(), limit=DEAD_SHOWN)
    return _page("overview.html", health=health, stale_after=stale_after,
                 dead_total=dead_total, dead=dead, modules=_modules(),
                 periodic=periodic.overview(get_engine(), celery_app))  # fmt: skip


@_page_route("/jobs", "adminJobsPage", "Jobs: filtered, paged newest first")
def jobs() -> Answer:
    wanted = job_filter(request.args)
    raw = request.args.get("after")
    after = browse.parse_cursor(raw) if raw else None
    found = browse.find_jobs(get_engine(), wanted, after=after)
    more = None if found.next is None else _with(request.args, after=found.next.encode())
    bulk = url_for("ui.bulk_confirm", **_args(request.args, after=None))
    return _page("jobs.html", page=found, wanted=wanted, modules=_modules(), next_url=more,
                 first_url=_with(request.args, after=None), bulk_url=bulk)  # fmt: skip


@_page_route("/jobs/<module>/<uuid:job_id>", "adminJob", "One job: attempts, timeline, attachment")
def job(path: JobPath) -> Answer:
    spec = operator.run_table(path.module)
    detail = browse.job_detail(get_engine(), spec.module, path.job_id)
    if detail is None:
        raise operator.NotFound("unknown_job", f"no {spec.module} job {path.job_id}")
    attachment = None
    if detail.attachment_id is not None:
        attachment = service.get_attachment(detail.attachment_id)
    return _page("job.html", job=detail, run=detail.run, attachment=attachment,
                 params=_params(detail.run.get(spec.params_column or "")),
                 task_ids=attempt_task_ids(path.job_id, detail.events))  # fmt: skip


def attempt_task_ids(job_id: uuid.UUID, events: Sequence[browse.EventRow]) -> dict[int, str]:
    """The Celery task id of each claimed attempt, as Flower lists it: the one jobsapp
    published the attempt under, except for an attempt a worker claimed by inserting
    the run (a message from outside the journal), whose task id is the producer's; for a
    plain Celery call (``send_task`` by name) that is the job id itself."""
    claims = [e for e in events if e.transition == Transition.CLAIM.value]
    return {e.attempt: str(job_id) if e.from_state is None else task_id_for(job_id, e.attempt)
            for e in claims}  # fmt: skip


def _params(params: object) -> str | None:
    if params is None:
        return None
    shown = json.dumps(params, indent=2, sort_keys=True, default=str)
    return scrub(shown, limit=PARAMS_LIMIT, secrets=_secrets())


@cache
def _secrets() -> tuple[str, ...]:
    return known_secrets_from_env(os.environ)


# ----------------------------------------------------------------------- actions


@_form_route("/jobs/<module>/<uuid:job_id>/replay", "adminJobReplay", "Replay a failed job")
def replay(path: JobPath) -> Answer:
    def act(reason: str) -> str:
        done = operator.replay(get_engine(), path.module, path.job_id, actor=auth.actor(),
                               reason=reason)  # fmt: skip
        later = "" if done.published else "; the relay will publish its message"
        return f"Replayed: attempt {done.attempt} is queued{later}."

    return _act(path.module, path.job_id, act)


@_form_route("/jobs/<module>/<uuid:job_id>/cancel", "adminJobCancel", "Cancel a queued job")
def cancel(path: JobPath) -> Answer:
    def act(reason: str) -> str:
        operator.cancel(get_engine(), path.module, path.job_id, actor=auth.actor(),
                        reason=reason)  # fmt: skip
        return "Cancelled."

    return _act(path.module, path.job_id, act)


def _act(module: str, job_id: uuid.UUID, act: Callable[[str], str]) -> Answer:
    """Run the action; its result or refusal is shown on the job page it redirects to."""
    try:
        flash(act(request.form.get("reason", "")), "ok")
    except (operator.Conflict, operator.InvalidRequest) as refused:
        flash(str(refused), "error")
    return redirect(url_for("ui.job", module=module, job_id=job_id), 303)


@_form_route("/outbox/retry", "adminRetryDead", "Dead outbox rows back")
def retry_dead() -> Answer:
    """Every dead outbox row back to the relay (after the cause was fixed), audited."""
    try:
        revived = operator.retry_dead_outbox(get_engine(), None, actor=auth.actor(),
                                             reason=request.form.get("reason", ""))  # fmt: skip
        flash(f"{revived} dead outbox rows are due again.", "ok")
    except operator.InvalidRequest as refused:
        flash(str(refused), "error")
    return redirect(url_for("ui.overview"), 303)


@_form_route("/reconcile", "adminReconcileForm", "A reconcile pass, by hand")
def reconcile_failed() -> Answer:
    """A reconcile pass by hand, over one domain or all: what beat does on its cadence."""
    from jobsapp.celery_app import app as celery_app
    from jobsapp.maintenance import reconcile

    form = request.form
    asked = reconcile.Request(error_code=form.get("error_code") or None,
                              dry_run=bool(form.get("dry_run")),
                              actor=f"{reconcile.ACTOR}:{auth.actor()}")  # fmt: skip
    module = form.get("module") or None
    if module is not None:
        operator.run_table(module)  # an unknown module is a 404, not an empty pass
    try:
        reports = reconcile.run_all(get_engine(), celery_app, asked, module=module)
    except reconcile.NeverRetaken as never:
        return _error_page(409, str(never))
    return _page("reconciled.html", reports=reports)


@_page_route("/replay", "adminBulkConfirm", "Confirm the replay of a filter's failed jobs")
def bulk_confirm() -> Answer:
    """The failed jobs of the list's filter that a bulk replay would take: a page to confirm."""
    wanted = job_filter(request.args)
    failed = replace(wanted, states=tuple(s for s in wanted.states if s == State.FAILED.value))
    found = browse.JobPage([], 0, None)
    if failed.states:
        found = browse.find_jobs(get_engine(), failed, limit=BULK_MAX)
    return _page("confirm.html", page=found, limit=BULK_MAX,
                 back_url=url_for("ui.jobs", **_args(request.args, after=None)))  # fmt: skip


@_form_route("/replay", "adminBulkReplay", "Replay the confirmed failed jobs")
def bulk_replay() -> Answer:
    """Replays exactly the jobs the confirmation page listed, not the filter's set now."""
    reason = operator.checked_reason(request.form.get("reason", ""))
    keys = request.form.getlist("job")[:BULK_MAX]
    return _page("replayed.html", results=[_replay_one(key, reason) for key in keys])


def _replay_one(key: str, reason: str) -> Replayed:
    module, _, raw = key.partition(":")
    try:
        job_id = uuid.UUID(raw)
    except ValueError:
        return Replayed(key, False, "not a job id")
    try:
        done = operator.replay(get_engine(), module, job_id, actor=auth.actor(), reason=reason)
    except operator.Refused as refused:
        return Replayed(key, False, str(refused))
    return Replayed(key, True, f"attempt {done.attempt} queued")


# ----------------------------------------------------------------------- filters


def job_filter(args: MultiDict[str, str]) -> browse.JobFilter:
    """The jobs list's filter from its query string (BadFilter: a 400 page)."""
    states = [s for value in args.getlist("state") for s in value.split(",") if s]
    module = args.get("module") or None
    summary.checked_tables(module)
    return browse.JobFilter(
        module=module, states=summary.checked_states(states or None),
        task=(args.get("task") or "").strip() or None,
        min_age=_age(args.get("min_age")), max_age=_age(args.get("max_age")),
        text=browse.checked_text(args.get("q")), attachment_id=_attachment(args.get("attachment")),
    )  # fmt: skip


def _age(raw: str | None) -> float | None:
    return browse.parse_age(raw) if raw and raw.strip() else None


def _attachment(raw: str | None) -> uuid.UUID | None:
    if not raw or not raw.strip():
        return None
    try:
        return uuid.UUID(raw.strip())
    except ValueError:
        raise summary.BadFilter(f"attachment must be an attachment's id; got {raw!r}") from None


def _modules() -> list[str]:
    return [spec.module for spec in summary.checked_tables(None)]


def _args(args: Mapping[str, Any], **changes: str | None) -> dict[str, Any]:
    """The query's parameters (every value of each) with ``changes``; None removes one."""
    found: dict[str, Any] = {k: v for k, v in MultiDict(args).lists() if k not in changes}
    found.update({k: v for k, v in changes.items() if v is not None})
    return found


def _with(args: Mapping[str, Any], **changes: str | None) -> str:
    return url_for("ui.jobs", **_args(args, **changes))
