"""The attachments HTTP API: upload, status and variant download.

Every answer is JSON, errors included, or a variant's bytes; each carries
``X-Content-Type-Options: nosniff`` so that no browser ever guesses an upload into HTML.
The web layer only parses HTTP: validation, storage and the journal belong to
``jobsapp.attachments.service``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any
from uuid import UUID

from flask import Flask, Response, current_app, jsonify, request
from flask.typing import ResponseReturnValue
from flask_openapi3.blueprint import APIBlueprint
from flask_openapi3.models.tag import Tag
from werkzeug.exceptions import ClientDisconnected, HTTPException, NotFound

from jobsapp import logs, preflight
from jobsapp.attachments import service
from jobsapp.attachments.pipeline import get_pipeline
from jobsapp.attachments.validation import DEFAULT_LIMITS, Limits, RejectedUpload
from jobsapp.db import console_engine
from jobsapp.lifecycle.rules.message import TRACE_HEADERS
from jobsapp.lifecycle.transport import tracing
from jobsapp.monitor import browse
from jobsapp.settings import SettingsError, get_settings
from jobsapp.web import admin, api_auth, schemas, ui
from jobsapp.web.health import health
from jobsapp.web.multipart import BodyEnded, FormLimits, missing_file, read_file
from jobsapp.web.openapi import (
    API_AUTH,
    OPEN,
    Answer,
    create_openapi_app,
    errors,
    json_answer,
    openapi_document,
)
from jobsapp.web.upload_bound import Busy, Slots
from jobsapp.web.urls import VariantNameConverter, raw_url, url_problem
from jobsapp.web.variants import variant_answer

log = logging.getLogger(__name__)

MAX_UPLOAD_ENV = "JOBSAPP_MAX_UPLOAD_BYTES"
# The request may exceed the file by the multipart boundary and part headers; anything
# beyond that is refused while reading, before the body is held in memory.
MULTIPART_OVERHEAD = 64 * 1024
_RETRY_AFTER_S = "5"
_LIMITS = "jobsapp.limits"
_UPLOADS = "jobsapp.uploads"

api = APIBlueprint("api", __name__, abp_tags=[Tag(name="attachments")], abp_security=API_AUTH)
# What describes the API needs no credentials.
described = APIBlueprint("described", __name__, abp_tags=[Tag(name="attachments")])


def create_app(limits: Limits | None = None) -> Flask:
    """The WSGI app; ``limits`` defaults to the environment (JOBSAPP_MAX_UPLOAD_BYTES)."""
    preflight.check_served_web()
    limits = limits or limits_from_env(os.environ)
    if not logging.getLogger().handlers:
        # Under gunicorn nothing configured the root logger: the app's records get the
        # CLI's scrubbed (and, with JOBSAPP_LOG_FORMAT=json, JSON) handler.
        logs.configure()
    app = create_openapi_app(__name__)
    app.config["MAX_CONTENT_LENGTH"] = limits.max_bytes + MULTIPART_OVERHEAD
    app.extensions[_LIMITS] = limits
    # Uploads hold a thread and up to a file in memory each: a bounded number at once.
    app.extensions[_UPLOADS] = Slots(get_settings().upload_concurrency)
    app.url_map.converters["variant"] = VariantNameConverter
    # Registered first: it runs before every other hook, the admin's authentication included.
    app.before_request(_refuse_unreadable_url)
    app.register_api(api)
    app.register_api(described)
    app.register_api(health)
    # The operator routes (/v1/admin, /admin) and /metrics: see jobsapp.web.admin.
    admin.init_app(app)
    app.register_error_handler(RejectedUpload, _rejected)
    app.register_error_handler(service.ServiceUnavailable, _unavailable)
    app.register_error_handler(Busy, _busy)
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


_LOCATION = {"Location": {"description": "URL of the attachment", "schema": {"type": "string"}}}
_UPLOAD_BODY = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": ["file"],
                "properties": {"file": {"type": "string", "contentMediaType": "image/*"}},
            }
        }
    },
}


_UPLOAD_ERROR_TEXT = {
    503: "`busy`: this web process is handling its limit of uploads at once "
    "(`JOBSAPP_UPLOAD_CONCURRENCY`), or `unavailable`: the database or object store is; "
    "retry after `Retry-After` seconds.",
}


# The form is read by jobsapp.web.multipart as it streams in, within its limits: it is
# described here, not handed to the library to parse.
@api.post(
    "/v1/attachments",
    summary="Upload an image",
    description="The format comes from the bytes, not from the file name or declared type. "
    "The file name is kept only as a sanitised `display_name`.",
    operation_id="uploadAttachment",
    openapi_extensions={"requestBody": _UPLOAD_BODY},
    responses={
        202: json_answer(schemas.Accepted, "Accepted: durable and queued", headers=_LOCATION),
        200: json_answer(
            schemas.Accepted, "An Idempotency-Key replay: the earlier attachment", headers=_LOCATION
        ),
        **errors(400, 401, 403, 408, 413, 415, 422, 503, text=_UPLOAD_ERROR_TEXT),
    },
)
def upload(header: schemas.UploadHeaders) -> Answer:
    key = header.idempotency_key
    limits: Limits = current_app.extensions[_LIMITS]
    uploads: Slots = current_app.extensions[_UPLOADS]
    # Taken before a byte of the body is read: a refused client has sent little.
    with uploads.held():
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


@api.get(
    "/v1/attachments/<uuid:attachment_id>",
    summary="An attachment's state, metadata and variant URLs",
    operation_id="getAttachment",
    responses={
        200: json_answer(schemas.Attachment, "The attachment"),
        **errors(401, 403, 404, 503),
    },
)
def show(path: schemas.AttachmentPath) -> Answer:
    attachment_id = path.attachment_id
    view = service.get_attachment(attachment_id)
    if view is None:
        raise NotFound("No attachment has this id.")
    # The operator's cross-link: which job is working (or last worked) on this attachment.
    return jsonify(
        {**public_view(view), "job": browse.attachment_job(console_engine(), attachment_id)}
    )


@api.get(
    "/v1/attachments/<uuid:attachment_id>/variants/<variant:name>",
    summary="A rendered variant's bytes",
    operation_id="getVariant",
    responses={
        200: {
            "description": "The bytes, streamed (local storage)",
            "content": {"image/*": {"schema": {"type": "string", "contentMediaType": "image/*"}}},
        },
        302: {
            "description": "Redirect to a short-lived presigned URL (S3 storage)",
            "headers": {"Location": {"schema": {"type": "string", "format": "uri"}}},
        },
        **errors(401, 403, 404, 503),
    },
)
def variant(path: schemas.VariantPath) -> Answer:
    return variant_answer(path.attachment_id, path.name)


@api.before_request
def _authenticate() -> ResponseReturnValue | None:
    return api_auth.refusal(request)


@described.get(
    "/openapi.json",
    summary="This document",
    operation_id="openapi",
    security=OPEN,
    responses={
        200: {
            "description": "OpenAPI 3.1",
            "content": {"application/json": {"schema": {"type": "object"}}},
        },
        **errors(),
    },
)
def openapi() -> Answer:
    return jsonify(openapi_document(current_app))


# ------------------------------------------------------------------------- the upload


def _trace_headers() -> dict[str, str]:
    return {name: value for name in TRACE_HEADERS if (value := request.headers.get(name))}


def _read_file(limits: Limits) -> tuple[bytes, str | None]:
    if request.mimetype != "multipart/form-data":
        raise missing_file()
    # request.stream stops at MAX_CONTENT_LENGTH (413 past it). The raw client name goes to
    # the service, which keeps only a sanitised display name.
    boundary = request.mimetype_params.get("boundary", "")
    form = FormLimits(max_file_bytes=limits.max_bytes)
    try:
        return read_file(request.stream, boundary, form, request.content_length)
    except (ClientDisconnected, BodyEnded):
        # The body ended before its Content-Length: the client went away, or gunicorn's
        # worker cut a body that took longer than its deadline (web/server.py).
        raise RejectedUpload(
            408,
            "body_timeout",
            "The body did not arrive in full within "
            f"{get_settings().web_read_timeout:g} seconds of the request's headers.",
        ) from None


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


def _busy(exc: Busy) -> ResponseReturnValue:
    response, status = error_response(
        503,
        "busy",
        f"This web process is handling as many uploads as it admits at once ({exc.limit}); "
        "retry after Retry-After seconds.",
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
        reason = (
            f"The request is larger than the limit of {limits.max_bytes + MULTIPART_OVERHEAD} bytes"
        )
        if request.mimetype == "multipart/form-data":
            reason += f": a file of at most {limits.max_bytes} bytes and its form"
        return error_response(413, "too_large", reason + ".")
    if status == 404 and (page := ui.not_found_page(request.path, exc.description)) is not None:
        return page
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
