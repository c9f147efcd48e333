"""The admin UI: server-rendered pages for an operator's browser under ``/admin``.

Overview, a filtered and paged jobs list, one job with its timeline, replay and cancel
with a reason, and bulk replay behind a confirmation page. Every action is a form POST
that carries the session's CSRF token, and the server answers with a redirect
(POST/redirect/GET) or a page. The one script is ours (``static/live.js``, the only
source the Content-Security-Policy allows): it refreshes a live page's main region in
place, from the same URL asked with ``X-Jobsapp-Live``, and every page works without it.
A browser logs in with the admin token (``jobsapp.web.auth``); a GET with the bearer
token is served too, so ``curl`` can read a page.
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
from pathlib import Path
from time import monotonic
from typing import Any

from flask import Response, current_app, flash, g, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from flask_openapi3.blueprint import APIBlueprint
from flask_openapi3.models.tag import Tag
from flask_openapi3.openapi import OpenAPI
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from werkzeug.datastructures import MultiDict
from werkzeug.exceptions import HTTPException

from jobsapp import flow_control, operator
from jobsapp.attachments import service
from jobsapp.db import console_engine, utcnow
from jobsapp.lifecycle.flow.gating import Kind
from jobsapp.lifecycle.journal import Run
from jobsapp.lifecycle.rules.message import task_id_for
from jobsapp.lifecycle.rules.scrub import known_secrets_from_env, scrub
from jobsapp.lifecycle.rules.states import ALL_STATES, State, Transition
from jobsapp.maintenance import periodic
from jobsapp.monitor import browse, queues, summary, workers, workflows
from jobsapp.monitor import charts as charts_data
from jobsapp.settings import get_settings
from jobsapp.web import access, auth, throttle
from jobsapp.web.openapi import (
    ADMIN_AUTH,
    FORM_BODY,
    OPEN,
    SESSION_AUTH,
    Answer,
    html_form,
    html_page,
    script_answer,
)
from jobsapp.web.schemas import JobPath, VariantPath
from jobsapp.web.variants import variant_answer

log = logging.getLogger(__name__)

# How many failed jobs one confirmation page lists and one bulk replay takes.
BULK_MAX = 200
# Dead outbox rows listed on the overview (the count covers them all).
DEAD_SHOWN = 20
PARAMS_LIMIT = 20_000
MAX_QUEUE = 200
# A list row's arguments are cut here (the job page shows them whole).
ARGS_SHOWN = 160
# A job's result is shown on one line up to here; the whole value unfolds below it.
RESULT_SHOWN = 200
_PAGE_HEADERS = {
    # Only our own script, fetching only from us; no other site may frame a page or
    # receive a form, none is cached.
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; connect-src 'self'; "
    "style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'",
    "Cache-Control": "no-store",
    "Referrer-Policy": "same-origin",
    # The live header picks the main region alone: never one answer for the other.
    "Vary": "Cookie, X-Jobsapp-Live",
}
# A live page polls its own URL this often (milliseconds), unless paused, or less often
# when its reads are slow (``live_every``).
LIVE_EVERY_MS = 5000
LIVE_MAX_MS = 60_000
# A page waits this many times as long as it took before it asks again.
LIVE_SLOWDOWN = 10
LIVE_HEADER = "X-Jobsapp-Live"
LIVE_EVERY_HEADER = "X-Jobsapp-Live-Every"
_SCRIPT = Path(__file__).with_name("static") / "live.js"
_DB_DOWN = (OperationalError, InterfaceError, PoolTimeout)


@dataclass(frozen=True)
class ShownResult:
    """A run's stored result as the job page shows it: one line, and the whole value
    (indented) when the line had to be cut; both scrubbed as the parameters are."""

    line: str
    whole: str | None


@dataclass(frozen=True)
class Replayed:
    """One line of the bulk replay's result page; ``key`` is ``module:job_id``."""

    key: str
    done: bool
    message: str


# Pages answer a bad filter or form with a page, not a JSON refusal: their parameters are
# described (paths) but read by the views.
ui = APIBlueprint(
    "ui",
    __name__,
    url_prefix="/admin",
    template_folder="templates",
    abp_tags=[Tag(name="admin UI")],
)
_PAGE_AUTH = [*SESSION_AUTH, *ADMIN_AUTH]


View = Callable[..., Answer]


def _page_route(
    rule: str, operation_id: str, summary: str, **options: Any
) -> Callable[[View], View]:
    return ui.get(
        rule,
        operation_id=operation_id,
        summary=summary,
        description="",
        security=options.pop("security", _PAGE_AUTH),
        responses=html_page(),
        **options,
    )


def _form_route(
    rule: str, operation_id: str, summary: str, **options: Any
) -> Callable[[View], View]:
    return ui.post(
        rule,
        operation_id=operation_id,
        summary=summary,
        description="",
        security=SESSION_AUTH,
        responses=html_form(),
        openapi_extensions=FORM_BODY,
        **options,
    )


def init_app(app: OpenAPI) -> None:
    auth.init_app(app)
    app.register_api(ui)


def not_found_page(path: str, reason: str | None) -> Response | None:
    """What an ``/admin/...`` URL that found nothing answers, instead of the API's JSON
    404: a trailing slash goes to the page without it (``/admin/`` is the overview); a
    page that found nothing it names says ``reason``, the page's own; any other URL is the
    console's own 404 page, with its menu. None: not a console URL."""
    if not path.startswith("/admin/"):
        return None
    trimmed = path.rstrip("/") or "/admin"
    routed = _has_page(trimmed)
    if routed and trimmed != path:
        return redirect(trimmed, code=308)  # type: ignore[return-value]
    message = (reason if routed else None) or f"No page at {path}. The pages are in the menu above."
    html = render_template(
        "admin/error.html",
        layout="admin/base.html",
        live=0,
        code=404,
        message=message,
        **_helpers(),
    )
    return Response(html, 404, headers=_PAGE_HEADERS, mimetype="text/html")


def _has_page(path: str) -> bool:
    try:
        current_app.url_map.bind("").match(path, method="GET")
    except HTTPException:
        return False
    return True


def live_every(took: float) -> int:
    """Milliseconds a live page waits before its next refresh, after one that took
    ``took`` seconds to answer: the usual pace, or ``LIVE_SLOWDOWN`` times as long as a
    slow one took, up to ``LIVE_MAX_MS``; so an open tab keeps the database busy a tenth
    of the time at most, however large the journal."""
    return min(LIVE_MAX_MS, max(LIVE_EVERY_MS, round(took * 1000 * LIVE_SLOWDOWN)))


def _page(template: str, status: int = 200, *, live: bool = False, **context: Any) -> Response:
    """A page; a live one asked by its script (``LIVE_HEADER``) is its main region only,
    and says when to ask again (``LIVE_EVERY_HEADER``)."""
    region = live and request.headers.get(LIVE_HEADER) == "1"
    layout = "admin/_live.html" if region else "admin/base.html"
    every = live_every(monotonic() - g.get("started", monotonic())) if live else 0
    html = render_template(f"admin/{template}", layout=layout, live=every, **context)
    headers = {**_PAGE_HEADERS, **({LIVE_EVERY_HEADER: str(every)} if live else {})}
    return Response(html, status, headers=headers, mimetype="text/html")


def _error_page(status: int, message: str) -> Response:
    return _page("error.html", status, code=status, message=message)


@ui.context_processor
def _helpers() -> dict[str, Any]:
    return {
        "csrf_token": auth.csrf_token,
        "csrf_field": auth.CSRF_FIELD,
        "identity": _shown_identity,
        "may_act": _may_act,
        "age": summary.human_age,
        "ts": _timestamp,
        "states": ALL_STATES,
        "filters": summary.FILTERS,
        "shown_args": _shown_args,
        "now": utcnow(),
    }


def _shown_identity() -> access.Identity | None:
    """Who the header names as signed in (the 404 page is shown before any guard)."""
    try:
        return access.identity_of(request)
    except access.Refused:
        return None


def _may_act() -> bool:
    """Whether the page offers its forms: a viewer's would only be refused."""
    who = _shown_identity()
    return who is not None and who.may_act


def _timestamp(value: datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%SZ")


# ------------------------------------------------------------------- guard, errors


@ui.before_request
def _clock() -> None:
    """When the request began: a live page's pace follows how long it took."""
    g.started = monotonic()


@ui.before_request
def _guard() -> ResponseReturnValue | None:
    if not access.enabled():
        return _error_page(
            403,
            "The operator UI is disabled: neither JOBSAPP_ADMIN_TOKEN nor "
            "JOBSAPP_AUTH_PROXY_HEADER is set.",
        )
    if request.method == "POST" and not auth.csrf_ok(request.form.get(auth.CSRF_FIELD)):
        return _error_page(400, "The form's CSRF token is missing or stale; reload the page.")
    if request.endpoint in ("ui.login", "ui.log_in", "ui.live_script"):
        return None
    return _authorized()


def _authorized() -> ResponseReturnValue | None:
    """Anyone known sees the pages; only an operator acts."""
    try:
        who = access.identity_of(request)
    except access.Refused as refused:
        return _refused_page(refused)
    if who is None:
        return redirect(url_for("ui.login", next=request.full_path))
    if request.method == "POST" and request.endpoint != "ui.logout" and not who.may_act:
        log.warning("admin UI refused %s %s to viewer %s", request.method, request.path, who.name)
        return _error_page(403, access.may_not_act(who))
    return None


def _refused_page(refused: access.Refused) -> Response:
    response = _error_page(refused.status, refused.reason)
    if refused.retry_after is not None:
        response.headers["Retry-After"] = str(refused.retry_after)
    return response


def _actor() -> str:
    """Who the audit rows of this request's action name (the guard let only an operator in)."""
    who = access.identity_of(request)
    assert who is not None, "the guard let nobody in"
    return access.audit_name(who, auth.actor())


@ui.errorhandler(summary.BadFilter)
@ui.errorhandler(operator.InvalidRequest)
def _bad_input(exc: ValueError) -> ResponseReturnValue:
    return _error_page(400, str(exc))


@ui.errorhandler(operator.NotFound)
def _not_found(exc: operator.NotFound) -> ResponseReturnValue:
    return _error_page(404, str(exc))


@ui.errorhandler(browse.SearchTooSlow)
def _search_too_slow(exc: browse.SearchTooSlow) -> ResponseReturnValue:
    # 503: the live script backs off, as for a slow page; the text says what to do.
    return _error_page(503, f"Not answered: {exc}.")


def _unavailable(exc: Exception) -> ResponseReturnValue:
    log.warning("admin UI answering 503: database unavailable (%s)", type(exc).__name__)
    response = _error_page(503, "The database is unavailable; retry in a moment.")
    response.headers["Retry-After"] = "5"
    return response


for _down in (*_DB_DOWN, service.ServiceUnavailable):
    ui.register_error_handler(_down, _unavailable)


# ------------------------------------------------------------------------- login


@_page_route("/login", "adminLoginForm", "The login form", security=OPEN)
def login() -> Answer:
    return _page("login.html", next=_next())


@_form_route("/login", "adminLogin", "Log in with the admin token")
def log_in() -> Answer:
    given = request.form.get("token")
    try:
        known = throttle.checked(
            access.client_address(request), "admin login", lambda: auth.token_matches(given)
        )
    except throttle.Throttled as wait:
        return _refused_page(access.Refused(429, str(wait), wait.retry_after))
    if not known:
        return _page("login.html", 401, next=_next(), error="That is not the admin token.")
    # Behind a provider the audit trail names identities, never what was typed here.
    typed = get_settings().auth_proxy is None and request.form.get("name", "").strip()
    name = typed or auth.DEFAULT_ACTOR
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


@ui.get(
    "/live.js",
    operation_id="adminLiveScript",
    summary="The live pages' script",
    description="",
    security=OPEN,
    responses=script_answer(),
)
def live_script() -> Answer:
    """Public: it holds nothing but the refresh loop, and the login page has no use for it."""
    headers = {**_PAGE_HEADERS, "Cache-Control": "public, max-age=300"}
    return Response(_SCRIPT.read_bytes(), 200, headers=headers, mimetype="text/javascript")


# ---------------------------------------------------------------------- the pages


@_page_route("", "adminOverview", "Counts, oldest queued, stale runs, outbox")
def overview() -> Answer:
    from jobsapp.celery_app import app as celery_app

    stale_after = get_settings().stale_after
    health = summary.health(console_engine(), stale_after)
    dead_total, dead = browse.dead_outbox(console_engine(), limit=DEAD_SHOWN)
    return _page(
        "overview.html",
        live=True,
        health=health,
        active_cap=f"{summary.ACTIVE_CAP:,}",
        stale_after=stale_after,
        dead_total=dead_total,
        dead=dead,
        modules=_modules(),
        paused=flow_control.paused(console_engine()),
        periodic=periodic.overview(console_engine(), celery_app),
    )


@_page_route("/jobs", "adminJobsPage", "Jobs: filtered, paged newest first")
def jobs() -> Answer:
    wanted = job_filter(request.args)
    raw = request.args.get("after")
    after = browse.parse_cursor(raw) if raw else None
    found = browse.find_jobs(console_engine(), wanted, after=after)
    more = None if found.next is None else _with(request.args, after=found.next.encode())
    bulk = url_for("ui.bulk_confirm", **_args(request.args, after=None))
    return _page(
        "jobs.html",
        live=True,
        page=found,
        wanted=wanted,
        modules=_modules(),
        next_url=more,
        first_url=_with(request.args, after=None),
        bulk_url=bulk,
    )


@_page_route(
    "/attachments/<uuid:attachment_id>/variants/<variant:name>",
    "adminVariant",
    "A variant's bytes, as the job page links them (the console's session admits them)",
)
def attachment_variant(path: VariantPath) -> Answer:
    return variant_answer(path.attachment_id, path.name)


@_page_route("/jobs/<module>/<uuid:job_id>", "adminJob", "One job: attempts, timeline, attachment")
def job(path: JobPath) -> Answer:
    spec = operator.run_table(path.module)
    detail = browse.job_detail(console_engine(), spec.module, path.job_id)
    if detail is None:
        raise operator.NotFound("unknown_job", f"no {spec.module} job {path.job_id}")
    attachment = None
    if detail.attachment_id is not None:
        attachment = service.get_attachment(detail.attachment_id)
    # Each traceback is shown once: with the first attempt that raised it.
    tracebacks: dict[str, int] = {}
    for attempt in detail.attempts:
        if attempt.detail:
            tracebacks.setdefault(attempt.detail, attempt.number)
    workflow_id = detail.run.workflow_id
    steps = workflows.workflow_steps(console_engine(), workflow_id) if workflow_id else []
    return _page(
        "job.html",
        live=True,
        job=detail,
        run=detail.run,
        attachment=attachment,
        params=_params(detail.run.columns.get(spec.params_column or "")),
        tracebacks=tracebacks,
        workflow=steps,
        result=shown_result(detail.run),
        task_ids=attempt_task_ids(path.job_id, detail.events),
    )


def shown_result(run: Run) -> ShownResult | None:
    """What the body returned, for a succeeded run (or any run that kept a result)."""
    value = run.result
    if value is None and run.state != State.SUCCEEDED.value:
        return None
    line = _scrubbed(json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(", ", ": ")))
    if len(line) <= RESULT_SHOWN:
        return ShownResult(line, None)
    whole = _scrubbed(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))
    return ShownResult(line[:RESULT_SHOWN], whole)


def _scrubbed(text: str) -> str:
    # The value is bounded by the result cap when stored: mask secrets, never cut it.
    return scrub(text, limit=2 * len(text) + 100, secrets=_secrets())


def attempt_task_ids(job_id: uuid.UUID, events: Sequence[browse.EventRow]) -> dict[int, str]:
    """The Celery task id of each claimed attempt, as Flower lists it: the one jobsapp
    published the attempt under (the first attempt's is the job id, as is a plain
    ``send_task``'s whose worker claimed it by inserting the run)."""
    claims = [e for e in events if e.transition == Transition.CLAIM.value]
    return {e.attempt: task_id_for(job_id, e.attempt) for e in claims}


def _shown_args(args: str | None) -> str:
    """A list row's arguments: the head of their JSON, scrubbed as the job page's are."""
    return scrub(args, limit=ARGS_SHOWN, secrets=_secrets()) if args else ""


@_page_route("/queues", "adminQueues", "Queues: depth in the journal and the broker, rate")
def queues_page() -> Answer:
    from jobsapp.celery_app import app as celery_app

    view = queues.queues_view(console_engine(), celery_app, default_queue())
    return _page(
        "queues.html",
        live=True,
        view=view,
        active_cap=f"{summary.ACTIVE_CAP:,}",
        window=queues.RATE_WINDOW,
        paused=_paused_by_pair(),
        modules=_modules(),
        rates=flow_control.rates(console_engine(), celery_app),
    )


def _paused_by_pair() -> dict[tuple[str, str], flow_control.Paused]:
    return {(p.kind, p.name): p for p in flow_control.paused(console_engine())}


@_page_route("/workers", "adminWorkers", "Worker processes seen through their beats")
def workers_page() -> Answer:
    return _page(
        "workers.html",
        live=True,
        workers=workers.seen(console_engine()),
        silent_after=workers.SILENT_AFTER,
    )


@_page_route("/scheduled", "adminScheduled", "Jobs waiting for a later time; periodic entries")
def scheduled() -> Answer:
    from jobsapp.celery_app import app as celery_app

    found = browse.scheduled(console_engine(), default_queue=default_queue())
    return _page(
        "scheduled.html",
        live=True,
        page=found,
        periodic=periodic.overview(console_engine(), celery_app),
    )


@_page_route("/charts", "adminCharts", "Throughput, waits and failures: last hour or day")
def charts() -> Answer:
    window = request.args.get("window") or "hour"
    if window not in charts_data.WINDOWS:
        raise summary.BadFilter(f"window is one of {', '.join(charts_data.WINDOWS)}")
    return _page(
        "charts.html",
        live=True,
        charts=charts_data.charts(console_engine(), window),
        windows=list(charts_data.WINDOWS),
    )


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
        done = operator.replay(
            console_engine(), path.module, path.job_id, actor=_actor(), reason=reason
        )
        later = "" if done.published else f"; {done.then}"
        return f"Replayed: attempt {done.attempt} is queued{later}."

    return _act(path.module, path.job_id, act)


@_form_route(
    "/jobs/<module>/<uuid:job_id>/cancel",
    "adminJobCancel",
    "Cancel a queued job, or ask a running one to stop",
)
def cancel(path: JobPath) -> Answer:
    def act(reason: str) -> str:
        done = operator.cancel(
            console_engine(),
            path.module,
            path.job_id,
            actor=_actor(),
            reason=reason,
            attempts=_seen_attempts(),
            terminate=bool(request.form.get("terminate")),
        )
        return cancel_message(done)

    return _act(path.module, path.job_id, act)


@_form_route(
    "/jobs/<module>/<uuid:job_id>/cancel-workflow",
    "adminWorkflowCancel",
    "Cancel the rest of the workflow a job is a step of",
)
def cancel_workflow(path: JobPath) -> Answer:
    def act(reason: str) -> str:
        done = operator.cancel_workflow(
            console_engine(), path.module, path.job_id, actor=_actor(), reason=reason
        )
        return f"Workflow cancelled: no step starts from now on; {done} queued cancelled."

    return _act(path.module, path.job_id, act)


@_form_route(
    "/jobs/<module>/<uuid:job_id>/run-now",
    "adminJobRunNow",
    "Run a job waiting for a retry or countdown now",
)
def run_now(path: JobPath) -> Answer:
    def act(reason: str) -> str:
        done = operator.run_now(
            console_engine(),
            path.module,
            path.job_id,
            actor=_actor(),
            reason=reason,
            attempts=_seen_attempts(),
        )
        later = "" if done.published else "; the relay will publish its message"
        return f"Due now{later}."

    return _act(path.module, path.job_id, act, back=request.form.get("back"))


def cancel_message(done: operator.CancelResult) -> str:
    if not done.running:
        return "Cancelled."
    asked = "Asked to stop: the attempt is told at its next heartbeat and ends cancelled."
    if not done.terminate_sent:
        return asked
    return f"{asked} Terminate sent to its worker process (the reaper then ends the run)."


def _seen_attempts() -> int | None:
    raw = request.form.get("attempts", "")
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 9 else None


def _act(
    module: str, job_id: uuid.UUID, act: Callable[[str], str], back: str | None = None
) -> Answer:
    """Run the action; its result or refusal is shown on the job page it redirects to."""
    try:
        flash(act(request.form.get("reason", "")), "ok")
    except (operator.Conflict, operator.InvalidRequest) as refused:
        flash(str(refused), "error")
    if back == "scheduled":
        return redirect(url_for("ui.scheduled"), 303)
    return redirect(url_for("ui.job", module=module, job_id=job_id), 303)


@_form_route("/flow", "adminFlowForm", "Pause or resume a queue or a domain")
def flow_action() -> Answer:
    """Pause or resume (audited); the queues page says what is paused now."""
    form = request.form
    pausing = form.get("action") == "pause"
    try:
        kind = Kind(form.get("kind", ""))
        act = flow_control.pause if pausing else flow_control.resume
        changed = act(
            console_engine(),
            kind,
            form.get("name", ""),
            actor=_actor(),
            reason=form.get("reason", ""),
        )
        verb = "paused" if pausing else "resumed"
        flash(
            f"{kind} {form.get('name')} {verb}."
            if changed
            else f"{kind} {form.get('name')} was already {verb}.",
            "ok",
        )
    except (ValueError, operator.Refused) as refused:
        flash(str(refused), "error")
    return redirect(url_for("ui.queues_page"), 303)


@_form_route("/outbox/retry", "adminRetryDead", "Dead outbox rows back")
def retry_dead() -> Answer:
    """Every dead outbox row back to the relay (after the cause was fixed), audited."""
    try:
        revived = operator.retry_dead_outbox(
            console_engine(), None, actor=_actor(), reason=request.form.get("reason", "")
        )
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
    try:
        code = operator.checked_error_code(form.get("error_code") or None)
    except operator.InvalidRequest as refused:
        return _error_page(400, str(refused))
    asked = reconcile.Request(
        error_code=code,
        dry_run=bool(form.get("dry_run")),
        actor=f"{reconcile.ACTOR}:{_actor()}",
    )
    module = form.get("module") or None
    if module is not None:
        operator.run_table(module)  # an unknown module is a 404, not an empty pass
    try:
        reports = reconcile.run_all(console_engine(), celery_app, asked, module=module)
    except reconcile.NeverRetaken as never:
        return _error_page(409, str(never))
    return _page("reconciled.html", reports=reports)


@dataclass(frozen=True)
class Bulk:
    """A bulk action: the state its jobs must be in, and how its pages name it."""

    state: str
    verb: str
    done: str
    form: str


REPLAY = Bulk(State.FAILED.value, "Replay", "Replayed", "ui.bulk_replay")
CANCEL = Bulk(State.QUEUED.value, "Cancel", "Cancelled", "ui.bulk_cancel")


@_page_route("/replay", "adminBulkConfirm", "Confirm the replay of failed jobs")
def bulk_confirm() -> Answer:
    """The failed jobs a bulk replay would take (the rows ticked on the list, else the
    list filter's): a page to confirm."""
    return _confirm(REPLAY)


@_page_route("/cancel", "adminBulkCancelConfirm", "Confirm the cancel of queued jobs")
def cancel_confirm() -> Answer:
    """The queued jobs a bulk cancel would take (ticked rows, else the filter's)."""
    return _confirm(CANCEL)


def _confirm(bulk: Bulk) -> Answer:
    picked = _picked(request.args.getlist("job"))
    if picked:
        found = browse.jobs_by_key(console_engine(), picked[:BULK_MAX], default_queue())
        eligible = [r for r in found.rows if r.state == bulk.state]
        found = replace(found, rows=eligible, total=len(eligible))
        skipped = len(picked) - len(eligible)
    else:
        found, skipped = _filtered(bulk), 0
    back = url_for("ui.jobs", **_args(request.args, after=None, job=None))
    return _page(
        "confirm.html", page=found, limit=BULK_MAX, bulk=bulk, skipped=skipped, back_url=back
    )


def _filtered(bulk: Bulk) -> browse.JobPage:
    wanted = job_filter(request.args)
    only = replace(wanted, states=tuple(s for s in wanted.states if s == bulk.state))
    if not only.states:
        return browse.JobPage([], 0, None)
    return browse.find_jobs(console_engine(), only, limit=BULK_MAX)


def _picked(keys: list[str]) -> list[tuple[str, uuid.UUID]]:
    """``module:job_id`` keys ticked on the list; malformed ones and unknown modules are
    left out (the confirmation page lists only what it found)."""
    modules = set(_modules())
    found = []
    for key in keys:
        module, _, raw = key.partition(":")
        try:
            job_id = uuid.UUID(raw)
        except ValueError:
            continue
        if module in modules:
            found.append((module, job_id))
    return found


@_form_route("/replay", "adminBulkReplay", "Replay the confirmed failed jobs")
def bulk_replay() -> Answer:
    """Replays exactly the jobs the confirmation page listed, not the filter's set now."""

    def one(module: str, job_id: uuid.UUID, reason: str) -> str:
        done = operator.replay(console_engine(), module, job_id, actor=_actor(), reason=reason)
        return f"attempt {done.attempt} queued"

    return _bulk(REPLAY, one)


@_form_route("/cancel", "adminBulkCancel", "Cancel the confirmed queued jobs")
def bulk_cancel() -> Answer:
    """Cancels exactly the jobs the confirmation page listed, each audited."""

    def one(module: str, job_id: uuid.UUID, reason: str) -> str:
        done = operator.cancel(console_engine(), module, job_id, actor=_actor(), reason=reason)
        # A job that started since the confirmation page is asked to stop instead.
        return "asked to stop at its next heartbeat" if done.running else "cancelled"

    return _bulk(CANCEL, one)


def _bulk(bulk: Bulk, act: Callable[[str, uuid.UUID, str], str]) -> Answer:
    reason = operator.checked_reason(request.form.get("reason", ""))
    # One action per job, however many times a crafted POST names it.
    keys = list(dict.fromkeys(request.form.getlist("job")))[:BULK_MAX]
    return _page("replayed.html", bulk=bulk, results=[_one(key, reason, act) for key in keys])


def _one(key: str, reason: str, act: Callable[[str, uuid.UUID, str], str]) -> Replayed:
    module, _, raw = key.partition(":")
    try:
        job_id = uuid.UUID(raw)
    except ValueError:
        return Replayed(key, False, "not a job id")
    try:
        return Replayed(key, True, act(module, job_id, reason))
    except operator.Refused as refused:
        return Replayed(key, False, str(refused))


# ----------------------------------------------------------------------- filters


def job_filter(args: MultiDict[str, str]) -> browse.JobFilter:
    """The jobs list's filter from its query string (BadFilter: a 400 page)."""
    states = [s for value in args.getlist("state") for s in value.split(",") if s]
    module = args.get("module") or None
    summary.checked_tables(module)
    return browse.JobFilter(
        module=module,
        states=summary.checked_states(states or None),
        task=(args.get("task") or "").strip() or None,
        min_age=_age(args.get("min_age")),
        max_age=_age(args.get("max_age")),
        text=browse.checked_text(args.get("q")),
        attachment_id=_attachment(args.get("attachment")),
        queue=_queue(args.get("queue")),
        default_queue=default_queue(),
    )


def _queue(raw: str | None) -> str | None:
    queue = (raw or "").strip()
    if len(queue) > MAX_QUEUE or not queue.isprintable():
        raise summary.BadFilter(f"a queue name is at most {MAX_QUEUE} printable characters")
    return queue or None


@cache
def default_queue() -> str:
    """The queue of a run that names none: the Celery app's default."""
    from jobsapp.celery_app import app as celery_app

    return str(celery_app.conf.task_default_queue)


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
