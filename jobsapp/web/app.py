"""The attachments HTTP API: upload, status and variant download.

Every answer is JSON, errors included, or a variant's bytes; each carries
``X-Content-Type-Options: nosniff`` so that no browser ever guesses an upload into HTML.
The web layer only parses HTTP: validation, storage and the journal belong to
``jobsapp.attachments.service``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any
from uuid import UUID

from flask import Blueprint, Flask, Response, current_app, jsonify, request
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import HTTPException, NotFound

from jobsapp import logs, preflight
from jobsapp.attachments import service
from jobsapp.attachments.pipeline import get_pipeline
from jobsapp.attachments.validation import DEFAULT_LIMITS, Limits, RejectedUpload
from jobsapp.db import get_engine
from jobsapp.lifecycle import tracing
from jobsapp.lifecycle.message import TRACE_HEADERS
from jobsapp.monitor import browse
from jobsapp.settings import SettingsError
from jobsapp.web import admin
from jobsapp.web.health import health
from jobsapp.web.multipart import FormLimits, missing_file, read_file
from jobsapp.web.openapi import openapi_document
from jobsapp.web.urls import VariantNameConverter, raw_url, url_problem

log = logging.getLogger(__name__)

MAX_UPLOAD_ENV = "JOBSAPP_MAX_UPLOAD_BYTES"
# The request may exceed the file by the multipart boundary and part headers; anything
# beyond that is refused while reading, before the body is held in memory.
MULTIPART_OVERHEAD = 64 * 1024
# Printable ASCII only: the key is stored and echoed in logs, so no control characters.
_IDEMPOTENCY_KEY = re.compile(r"[\x20-\x7e]{1,200}")
_RETRY_AFTER_S = "5"
_LIMITS = "jobsapp.limits"

api = Blueprint("api", __name__)


def create_app(limits: Limits | None = None) -> Flask:
    """The WSGI app; ``limits`` defaults to the environment (JOBSAPP_MAX_UPLOAD_BYTES)."""
    preflight.check_served_web()
    limits = limits or limits_from_env(os.environ)
    if not logging.getLogger().handlers:
        # Under gunicorn nothing configured the root logger: the app's records get the
        # CLI's scrubbed (and, with JOBSAPP_LOG_FORMAT=json, JSON) handler.
        logs.configure()
    # No static folder: nothing here is a file to serve, and its route would be undocumented.
    app = Flask(__name__, static_folder=None)
    app.config["MAX_CONTENT_LENGTH"] = limits.max_bytes + MULTIPART_OVERHEAD
    app.extensions[_LIMITS] = limits
    app.url_map.converters["variant"] = VariantNameConverter
    # Registered first: it runs before every other hook, the admin's authentication included.
    app.before_request(_refuse_unreadable_url)
    app.register_blueprint(api)
    app.register_blueprint(health)
    # The operator routes (/v1/admin, /admin) and /metrics: see jobsapp.web.admin.
    admin.init_app(app)
    app.register_error_handler(RejectedUpload, _rejected)
    app.register_error_handler(service.ServiceUnavailable, _unavailable)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected)
    app.after_request(_security_headers)
    return app


def limits_from_env(env: Mapping[str, str]) -> Limits:
    """Upload limits; only the byte limit is configurable, for small deployments and tests."""
    raw = env.get(MAX_UPLOAD_ENV)
    if not raw:
        return DEFAULT_LIMITS
    try:
        return Limits(max_bytes=int(raw))
    except ValueError:
        raise SettingsError(f"{MAX_UPLOAD_ENV}={raw!r} must be a positive integer") from None


# ------------------------------------------------------------------------------ routes


@api.post("/v1/attachments")
def upload() -> ResponseReturnValue:
    key = _idempotency_key()
    limits: Limits = current_app.extensions[_LIMITS]
    data, filename = _read_file(limits)
    # The client's traceparent, if any, is the parent of the processing job's trace.
    with tracing.span("upload", _trace_headers(), consumer=False):
        accepted = service.accept_upload(data, filename, key, limits=limits)
    body = {
        "id": str(accepted.attachment_id),
        "state": accepted.state,
        "links": _links(accepted.attachment_id, _promised_variants()),
    }
    # A replayed Idempotency-Key names work accepted earlier: 200, not a second 202.
    status = 202 if accepted.created else 200
    return jsonify(body), status, {"Location": _self_url(accepted.attachment_id)}


@api.get("/v1/attachments/<uuid:attachment_id>")
def show(attachment_id: UUID) -> ResponseReturnValue:
    view = service.get_attachment(attachment_id)
    if view is None:
        raise NotFound("No attachment has this id.")
    # The operator's cross-link: which job is working (or last worked) on this attachment.
    return jsonify({**public_view(view), "job": browse.attachment_job(get_engine(), attachment_id)})


@api.get("/v1/attachments/<uuid:attachment_id>/variants/<variant:name>")
def variant(attachment_id: UUID, name: str) -> ResponseReturnValue:
    read = service.open_variant(attachment_id, name)
    if read is None:
        raise NotFound("This attachment has no such variant, or it is not ready yet.")
    if read.url is not None:
        # The signature expires: a cached redirect must not outlive it.
        headers = {"Location": read.url, "Cache-Control": "no-store"}
        return Response(status=302, headers=headers, mimetype="text/plain")
    response = Response(read.stream, content_type=read.content_type, direct_passthrough=True)
    response.content_length = read.size
    # A variant's bytes never change under its SHA-256, so it is the natural strong ETag.
    response.set_etag(read.sha256)
    return response


@api.get("/openapi.json")
def openapi() -> ResponseReturnValue:
    return jsonify(openapi_document())


# ------------------------------------------------------------------------- the upload


def _idempotency_key() -> str | None:
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    if not _IDEMPOTENCY_KEY.fullmatch(key):
        raise RejectedUpload(
            400,
            "bad_idempotency_key",
            "Idempotency-Key must be 1 to 200 printable ASCII characters.",
        )
    return key


def _trace_headers() -> dict[str, str]:
    return {name: value for name in TRACE_HEADERS if (value := request.headers.get(name))}


def _read_file(limits: Limits) -> tuple[bytes, str | None]:
    if request.mimetype != "multipart/form-data":
        raise missing_file()
    # request.stream stops at MAX_CONTENT_LENGTH (413 past it). The raw client name goes to
    # the service, which keeps only a sanitised display name.
    boundary = request.mimetype_params.get("boundary", "")
    return read_file(request.stream, boundary, FormLimits(max_file_bytes=limits.max_bytes))


def _promised_variants() -> tuple[str, ...]:
    # The variants the upload's pipeline version promises: where they will be once ready.
    return tuple(spec.name for spec in get_pipeline(service.UPLOAD_PIPELINE_VERSION).variants)


# -------------------------------------------------------------------------- the views


def public_view(view: Mapping[str, Any]) -> dict[str, Any]:
    """The service's view with URLs in place of storage keys.

    Storage keys are the deployment's layout; clients address bytes by URL only, so the
    layout can change without breaking them.
    """
    attachment_id = UUID(str(view["id"]))
    variants = [_public_variant(attachment_id, v) for v in view.get("variants", [])]
    shown = {k: v for k, v in view.items() if k not in ("variants", "original")}
    if view.get("original") is not None:
        shown["original"] = _without_key(view["original"])
    names = tuple(v["name"] for v in variants)
    return {**shown, "variants": variants, "links": _links(attachment_id, names)}


def _public_variant(attachment_id: UUID, variant: Mapping[str, Any]) -> dict[str, Any]:
    return {**_without_key(variant), "url": _variant_url(attachment_id, variant["name"])}


def _without_key(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k != "object_key"}


def _links(attachment_id: UUID, variant_names: tuple[str, ...]) -> dict[str, Any]:
    return {
        "self": _self_url(attachment_id),
        "variants": {name: _variant_url(attachment_id, name) for name in variant_names},
    }


def _self_url(attachment_id: UUID) -> str:
    return f"/v1/attachments/{attachment_id}"


def _variant_url(attachment_id: UUID, name: str) -> str:
    return f"{_self_url(attachment_id)}/variants/{name}"


# ------------------------------------------------------------------- errors, headers


def error_response(status: int, code: str, reason: str) -> tuple[Response, int]:
    return jsonify({"error": code, "reason": reason}), status


def _rejected(exc: RejectedUpload) -> ResponseReturnValue:
    return error_response(exc.status, exc.code, exc.reason)


def _unavailable(exc: service.ServiceUnavailable) -> ResponseReturnValue:
    # The cause may name hosts or buckets: it goes to the log, not to the client.
    log.warning("answering 503: %s", exc)
    response, status = error_response(
        503, "unavailable", "A backing service is unavailable; retry later."
    )
    response.headers["Retry-After"] = _RETRY_AFTER_S
    return response, status


def _refuse_unreadable_url() -> ResponseReturnValue | None:
    problem = url_problem(*raw_url(request.environ))
    return None if problem is None else error_response(400, "bad_url", problem)


def _http_error(exc: HTTPException) -> ResponseReturnValue:
    status = exc.code or 500
    if status == 413:
        # Only the body's own limit is left to Werkzeug; the form's limits answer themselves.
        limits: Limits = current_app.extensions[_LIMITS]
        reason = (f"The request is larger than the limit of "
                  f"{limits.max_bytes + MULTIPART_OVERHEAD} bytes: a file of at most "
                  f"{limits.max_bytes} bytes and its form.")  # fmt: skip
        return error_response(413, "too_large", reason)
    code = (exc.name or "error").lower().replace(" ", "_")
    response, _ = error_response(status, code, exc.description or exc.name)
    # 405 must still say which methods the route takes.
    for name, value in exc.get_headers():
        if name.lower() != "content-type":
            response.headers[name] = value
    return response, status


def _unexpected(exc: Exception) -> ResponseReturnValue:
    log.exception("unexpected error on %s %s", request.method, request.path, exc_info=exc)
    return error_response(500, "internal_error", "An unexpected error occurred.")


def _security_headers(response: Response) -> Response:
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response
