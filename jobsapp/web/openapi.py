"""The OpenAPI 3.1 description of the web API, served at ``/openapi.json``.

Written by hand next to the routes; a test checks that every route of the app's URL map is
described here with its methods, so the two cannot drift apart silently.
"""

from __future__ import annotations

from typing import Any

from jobsapp.web.urls import VARIANT_NAME

JsonObject = dict[str, Any]

_ERROR_TEXT = {
    400: "The request is malformed: no `file` field, a form that cannot be read (a part "
    "header that is not UTF-8), an empty file or a bad Idempotency-Key.",
    404: "No such attachment or variant (a malformed id is unknown too).",
    405: "The route does not take this method.",
    413: "A limit was passed, and the reason names it: the file size (`too_large`), the "
    "request size, more than 16 form parts (`too_many_parts`), a text field over "
    "65536 bytes (`field_too_large`) or a part's headers over 16384 bytes "
    "(`part_header_too_large`).",
    415: "The bytes are not an accepted image format (the declared type is ignored).",
    422: "The image is damaged, truncated or has more pixels than allowed, or the "
    "Idempotency-Key was used before for a different file.",
    500: "An unexpected error; the body carries no internals.",
    503: "The database or object store is unavailable; retry after `Retry-After` seconds.",
}

_BAD_URL = "`bad_url`: the URL is not UTF-8 or holds a control character such as NUL."

_ATTACHMENT_STATES = ["queued", "processing", "ready", "failed"]
_RUN_STATES = ["queued", "running", "succeeded", "failed"]

# The operator routes answer the same statuses for other reasons.
_ADMIN_ERROR_TEXT = {
    400: "A filter names an unknown state or module, the limit is out of range, or the "
    'body is not `{"reason": "..."}` with a reason of 1 to 500 characters.',
    401: "No `Authorization: Bearer` header, or not the configured token.",
    403: "The operator API is disabled: `JOBSAPP_ADMIN_TOKEN` is not set.",
    404: "No run table for the module, or no such job in it.",
    409: "The job is not in the state the action leaves (replay: failed; cancel: queued), "
    "or another active job holds its concurrency key (the reason names it).",
    503: "The database is unavailable; retry after `Retry-After` seconds.",
}
_ADMIN_AUTH: list[dict[str, list[str]]] = [{"adminToken": []}]


def openapi_document() -> JsonObject:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "jobsapp attachments API",
            "version": "1",
            "description": "Upload images; they are validated, made durable, then rendered "
            "into variants by background workers. Every response carries "
            "`X-Content-Type-Options: nosniff`; every error body is an `Error`. Operators "
            "list, replay and cancel jobs under `/v1/admin` (bearer token); Prometheus "
            "scrapes `/metrics`.",
        },
        "paths": {**_paths(), **_admin_paths()},
        "components": {
            "schemas": {**_schemas(), **_admin_schemas()},
            "securitySchemes": {
                "adminToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The value of `JOBSAPP_ADMIN_TOKEN`.",
                },
                "adminSession": {
                    "type": "apiKey",
                    "in": "cookie",
                    "name": "jobsapp_admin",
                    "description": "The admin UI's session, from `POST /admin/login`.",
                },
            },
        },
    }


def _paths() -> JsonObject:
    id_param = _path_param("attachment_id", {"type": "string", "format": "uuid"})
    # Another name is no route (404).
    name_param = _path_param(
        "name", {"type": "string", "pattern": f"^{VARIANT_NAME}$", "examples": ["thumbnail"]}
    )
    return {
        "/v1/attachments": {"post": _upload()},
        "/v1/attachments/{attachment_id}": {
            "get": {
                "summary": "An attachment's state, metadata and variant URLs",
                "operationId": "getAttachment",
                "parameters": [id_param],
                "responses": {"200": _json("The attachment", "Attachment"), **_errors(404, 503)},
            }
        },
        "/v1/attachments/{attachment_id}/variants/{name}": {"get": _variant(id_param, name_param)},
        "/healthz": {
            "get": {
                "summary": "The web process answers and reaches its database",
                "operationId": "healthz",
                "responses": {"200": _json("Alive", "Health"), **_errors(503)},
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "This document",
                "operationId": "openapi",
                "responses": {
                    "200": {
                        "description": "OpenAPI 3.1",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    },
                    **_errors(),
                },
            }
        },
    }


def _upload() -> JsonObject:
    location = {"Location": {"description": "URL of the attachment", "schema": {"type": "string"}}}
    return {
        "summary": "Upload an image",
        "description": "The format comes from the bytes, not from the file name or declared "
        "type. The file name is kept only as a sanitised `display_name`.",
        "operationId": "uploadAttachment",
        "parameters": [
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "description": "Repeating a key returns the attachment accepted first.",
                "schema": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 200,
                    "pattern": "^[\\x20-\\x7E]+$",
                },
            }
        ],
        "requestBody": {
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
        },
        "responses": {
            "202": {**_json("Accepted: durable and queued", "Accepted"), "headers": location},
            "200": {
                **_json("An Idempotency-Key replay: the earlier attachment", "Accepted"),
                "headers": location,
            },
            **_errors(400, 413, 415, 422, 503),
        },
    }


def _variant(id_param: JsonObject, name_param: JsonObject) -> JsonObject:
    return {
        "summary": "A rendered variant's bytes",
        "operationId": "getVariant",
        "parameters": [id_param, name_param],
        "responses": {
            "200": {
                "description": "The bytes, streamed (local storage)",
                "content": {
                    "image/*": {"schema": {"type": "string", "contentMediaType": "image/*"}}
                },
            },
            "302": {
                "description": "Redirect to a short-lived presigned URL (S3 storage)",
                "headers": {"Location": {"schema": {"type": "string", "format": "uri"}}},
            },
            **_errors(404, 503),
        },
    }


def _schemas() -> JsonObject:
    return {
        "Error": _object(
            {
                "error": {"type": "string", "description": "A stable machine-readable code"},
                "reason": {"type": "string", "description": "For humans"},
            }
        ),
        "Health": _object({"status": {"const": "ok"}}),
        "Links": _object(
            {
                "self": {"type": "string"},
                "variants": {"type": "object", "additionalProperties": {"type": "string"}},
            }
        ),
        "Accepted": _object(
            {
                "id": {"type": "string", "format": "uuid"},
                "state": {"enum": _ATTACHMENT_STATES},
                "links": {"$ref": "#/components/schemas/Links"},
            }
        ),
        "Variant": _object(
            {
                "name": {"type": "string"},
                "pipeline_version": {"type": "integer"},
                "sha256": {"type": "string"},
                "size": {"type": "integer"},
                "width": {"type": "integer"},
                "height": {"type": "integer"},
                "content_type": {"type": "string"},
                "url": {"type": "string"},
            }
        ),
        "Attachment": _attachment_schema(),
    }


def _attachment_schema() -> JsonObject:
    nullable_int = {"type": ["integer", "null"]}
    nullable_str = {"type": ["string", "null"]}
    return _object(
        {
            "id": {"type": "string", "format": "uuid"},
            "state": {"enum": _ATTACHMENT_STATES},
            "content_type": {"type": "string"},
            "size": {"type": "integer"},
            "sha256": {"type": "string"},
            "width": {"type": "integer"},
            "height": {"type": "integer"},
            "display_name": {"type": "string"},
            "published_version": nullable_int,
            "error_code": nullable_str,
            "created_at": {"type": "string", "format": "date-time"},
            "updated_at": {"type": "string", "format": "date-time"},
            "original": {
                "oneOf": [
                    {"type": "null"},
                    _object({"sha256": {"type": "string"}, "size": {"type": "integer"}}),
                ],
                "description": "The upload as received; it is not served (it keeps EXIF).",
            },
            "variants": {"type": "array", "items": {"$ref": "#/components/schemas/Variant"}},
            "links": {"$ref": "#/components/schemas/Links"},
            "job": {
                "oneOf": [{"type": "null"}, _attachment_job_schema()],
                "description": "The attachment's current job (its newest run), for operators.",
            },
        }
    )


def _attachment_job_schema() -> JsonObject:
    return _object(
        {
            "module": {"type": "string"},
            "job_id": {"type": "string", "format": "uuid"},
            "attempt": {"type": "integer"},
            "state": {"enum": _RUN_STATES},
        }
    )


def _object(properties: JsonObject) -> JsonObject:
    # Closed shapes: a field the service adds must be documented here before it ships.
    return {
        "type": "object",
        "properties": properties,
        "required": sorted(properties),
        "additionalProperties": False,
    }


def _json(description: str, schema: str) -> JsonObject:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
    }


def _errors(*statuses: int, text: dict[int, str] | None = None) -> JsonObject:
    """Error responses; every route can also answer 400 (its URL), 405 and 500."""
    text = {**_ERROR_TEXT, **(text or {})}
    text[400] = f"{text[400]} {_BAD_URL}" if 400 in statuses else _BAD_URL
    return {str(s): _json(text[s], "Error") for s in sorted({*statuses, 400, 405, 500})}


def _admin_errors(*statuses: int) -> JsonObject:
    return _errors(401, 403, 503, *statuses, text=_ADMIN_ERROR_TEXT)


def _path_param(name: str, schema: JsonObject) -> JsonObject:
    return {"name": name, "in": "path", "required": True, "schema": schema}


# ------------------------------------------------------------------------ operators


def _admin_paths() -> JsonObject:
    return {
        "/v1/admin/jobs": {"get": _summary_op()},
        "/v1/admin/jobs/{module}/{job_id}/replay": {"post": _replay_op()},
        "/v1/admin/jobs/{module}/{job_id}/cancel": {"post": _cancel_op()},
        "/v1/admin/outbox/dead": {"get": _dead_outbox_op()},
        "/v1/admin/outbox/dead/retry": {"post": _retry_dead_op()},
        "/v1/admin/reconcile": {"post": _reconcile_op()},
        "/metrics": {"get": _metrics_op()},
        **_ui_paths(),
    }


def _summary_params() -> list[JsonObject]:
    return [
        {
            "name": "state",
            "in": "query",
            "required": False,
            "description": "Only these states; repeat the parameter or separate by commas.",
            "schema": {"type": "array", "items": {"enum": _RUN_STATES}},
            "style": "form",
            "explode": True,
        },
        {
            "name": "module",
            "in": "query",
            "required": False,
            "description": "Only this run table (`jobs`, `attachments`, ...).",
            "schema": {"type": "string"},
        },
        {
            "name": "limit",
            "in": "query",
            "required": False,
            "schema": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
        },
    ]


def _summary_op() -> JsonObject:
    return {
        "summary": "The newest jobs of every run table, and counts by module and state",
        "description": "Each run table is read in its own home; newest first by "
        "`updated_at`. `age_seconds` is the time spent in the current state.",
        "operationId": "adminJobs",
        "security": _ADMIN_AUTH,
        "parameters": _summary_params(),
        "responses": {"200": _json("The summary", "JobSummary"), **_admin_errors(400)},
    }


def _action_params() -> list[JsonObject]:
    return [
        _path_param("module", {"type": "string", "examples": ["jobs", "attachments"]}),
        _path_param("job_id", {"type": "string", "format": "uuid"}),
    ]


def _action_body() -> JsonObject:
    return {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/OperatorAction"}}
        },
    }


def _replay_op() -> JsonObject:
    return {
        "summary": "Replay a failed job: a new attempt of the same job_id",
        "description": "failed -> queued, with an audit row (actor `operator:<actor>`, the "
        "reason); the message is published after the commit (or by the relay).",
        "operationId": "adminReplay",
        "security": _ADMIN_AUTH,
        "parameters": _action_params(),
        "requestBody": _action_body(),
        "responses": {"200": _json("Queued again", "Replayed"), **_admin_errors(400, 404, 409)},
    }


def _cancel_op() -> JsonObject:
    return {
        "summary": "Cancel a queued job",
        "description": "queued -> failed with outcome `cancelled`, with an audit row. A "
        "running job cannot be cancelled: it finishes or the reaper frees it.",
        "operationId": "adminCancel",
        "security": _ADMIN_AUTH,
        "parameters": _action_params(),
        "requestBody": _action_body(),
        "responses": {
            "200": _json("Cancelled", "Cancelled"),
            **_admin_errors(400, 404, 409),
        },
    }


def _any_json(description: str) -> JsonObject:
    return {"description": description,
            "content": {"application/json": {"schema": {"type": "object"}}}}  # fmt: skip


def _dead_outbox_op() -> JsonObject:
    return {
        "summary": "Outbox rows the relay gave up on (dead), newest first",
        "description": "`{total, dead: [{id, module, job_id, attempt, task_name, "
        "publish_count, publish_failures, last_error, created_at, dead_at}]}`.",
        "operationId": "adminDeadOutbox",
        "security": _ADMIN_AUTH,
        "parameters": [p for p in _summary_params() if p["name"] == "limit"],
        "responses": {"200": _any_json("Dead outbox rows"), **_admin_errors(400)},
    }


def _retry_dead_op() -> JsonObject:
    return {
        "summary": "Give dead outbox rows back to the relay",
        "description": "Body `{reason, actor?, ids?}` (no ids: every dead row); each row "
        "is due again with a clean failure count and an audit row. Answers `{revived}`.",
        "operationId": "adminRetryDeadOutbox",
        "security": _ADMIN_AUTH,
        "requestBody": {"required": True,
                        "content": {"application/json": {"schema": {"type": "object"}}}},
        "responses": {"200": _any_json("Rows revived"), **_admin_errors(400)},
    }  # fmt: skip


def _reconcile_op() -> JsonObject:
    return {
        "summary": "A reconcile pass now: failed runs worth another try are replayed",
        "description": "Body `{module?, error_code?, dry_run?, actor?}` (may be empty). "
        "Answers `{passes: [{module, pass_id, dry_run, retaken: [{job_id, error_code}], "
        "refused, cut_short}]}`; 409 `never_retaken` for a code the domain never retakes.",
        "operationId": "adminReconcile",
        "security": _ADMIN_AUTH,
        "requestBody": {"required": False,
                        "content": {"application/json": {"schema": {"type": "object"}}}},
        "responses": {"200": _any_json("One report per domain"), **_admin_errors(400, 404, 409)},
    }  # fmt: skip


def _ui_paths() -> JsonObject:
    """The browser's pages (``jobsapp.web.ui``): HTML; a form POST needs the session's
    CSRF token (400 without it) and answers with a 303 to the page that shows the result."""
    job = "/admin/jobs/{module}/{job_id}"
    return {
        "/admin": {"get": _html_op("adminOverview", "Counts, oldest queued, stale runs, outbox")},
        "/admin/login": {"get": _html_op("adminLoginForm", "The login form", auth=False),
                         "post": _form_op("adminLogin", "Log in with the admin token")},
        "/admin/logout": {"post": _form_op("adminLogout", "End the session")},
        "/admin/outbox/retry": {"post": _form_op("adminRetryDead", "Dead outbox rows back")},
        "/admin/reconcile": {"post": _form_op("adminReconcile", "A reconcile pass, by hand")},
        "/admin/jobs": {"get": _html_op("adminJobs", "Jobs: filtered, paged newest first")},
        job: {"get": _html_op("adminJob", "One job: attempts, timeline, attachment", True)},
        f"{job}/replay": {"post": _form_op("adminJobReplay", "Replay a failed job", True)},
        f"{job}/cancel": {"post": _form_op("adminJobCancel", "Cancel a queued job", True)},
        "/admin/replay": {
            "get": _html_op("adminBulkConfirm", "Confirm the replay of a filter's failed jobs"),
            "post": _form_op("adminBulkReplay", "Replay the confirmed failed jobs"),
        },
    }  # fmt: skip


_HTML = {"content": {"text/html": {"schema": {"type": "string"}}}}


def _html_op(name: str, summary: str, job: bool = False, *, auth: bool = True) -> JsonObject:
    return {
        "summary": summary, "operationId": name,
        **({"security": [{"adminSession": []}, *_ADMIN_AUTH]} if auth else {}),
        **({"parameters": _action_params()} if job else {}),
        "responses": {
            "200": {"description": "A server-rendered page, every value HTML-escaped", **_HTML},
            "302": {"description": "Not logged in: to the login form"},
            **{str(s): {"description": text, **_HTML} for s, text in _UI_ERRORS.items()},
        },
    }  # fmt: skip


def _form_op(name: str, summary: str, job: bool = False) -> JsonObject:
    return {
        "summary": summary, "operationId": name, "security": [{"adminSession": []}],
        **({"parameters": _action_params()} if job else {}),
        "requestBody": {"content": {"application/x-www-form-urlencoded": {
            "schema": {"type": "object", "required": ["csrf_token"]}}}},
        "responses": {
            "200": {"description": "A page with the outcome", **_HTML},
            "303": {"description": "To the page that shows the outcome"},
            **{str(s): {"description": text, **_HTML} for s, text in _UI_ERRORS.items()},
        },
    }  # fmt: skip


_UI_ERRORS = {
    400: "No or a stale CSRF token, a bad filter or an empty reason.",
    401: "Login with a wrong token.",
    403: "The operator UI is disabled (`JOBSAPP_ADMIN_TOKEN` is not set).",
    404: "No such module or job.",
    405: "The route does not take this method.",
    500: "An unexpected error.",
    503: "The database is unavailable; retry.",
}


def _metrics_op() -> JsonObject:
    return {
        "summary": "Prometheus metrics, read from the journal at scrape time",
        "description": "`jobsapp_jobs{module,state}`, `jobsapp_oldest_queued_seconds{module}`, "
        "`jobsapp_stale_running{module}`, `jobsapp_outbox_backlog`, "
        "`jobsapp_outbox_lag_seconds`. No authentication.",
        "operationId": "metrics",
        "responses": {
            "200": {
                "description": "The Prometheus text exposition format",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            },
            **_errors(503, text=_ADMIN_ERROR_TEXT),
        },
    }


def _admin_schemas() -> JsonObject:
    nullable_str = {"type": ["string", "null"]}
    per_state = _object({state: {"type": "integer", "minimum": 0} for state in _RUN_STATES})
    return {
        "JobRow": _object(
            {
                "module": {"type": "string"},
                "job_id": {"type": "string", "format": "uuid"},
                "task_name": {"type": "string"},
                "state": {"enum": _RUN_STATES},
                "outcome": nullable_str,
                "attempts": {"type": "integer", "minimum": 0},
                "max_attempts": {"type": "integer", "minimum": 1},
                "age_seconds": {"type": "number", "minimum": 0},
                "last_error": {**nullable_str, "description": "Its first line only"},
                "created_at": {"type": "string", "format": "date-time"},
                "updated_at": {"type": "string", "format": "date-time"},
                "worker": nullable_str,
            }
        ),
        "JobSummary": _object(
            {
                "jobs": {"type": "array", "items": {"$ref": "#/components/schemas/JobRow"}},
                "counts": {
                    "type": "object",
                    "description": "module -> state -> rows",
                    "additionalProperties": per_state,
                },
            }
        ),
        "OperatorAction": {
            "type": "object",
            "properties": {
                "reason": {"type": "string", "minLength": 1, "maxLength": 500},
                "actor": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 100,
                    "description": "Who acts (self-declared; default `api`); audited as "
                    "`operator:<actor>`.",
                },
            },
            "required": ["reason"],
            "additionalProperties": False,
        },
        "Replayed": _object(
            {
                "module": {"type": "string"},
                "job_id": {"type": "string", "format": "uuid"},
                "state": {"const": "queued"},
                "attempt": {"type": "integer", "minimum": 1},
                "published": {
                    "type": "boolean",
                    "description": "false: the broker was not reached; the relay publishes it",
                },
            }
        ),
        "Cancelled": _object(
            {
                "module": {"type": "string"},
                "job_id": {"type": "string", "format": "uuid"},
                "state": {"const": "failed"},
                "outcome": {"const": "cancelled"},
                "attempts": {"type": "integer", "minimum": 0},
            }
        ),
    }
