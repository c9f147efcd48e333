"""The OpenAPI 3.1 description of the web API, served at ``/openapi.json``.

Written by hand next to the routes; a test checks that every route of the app's URL map is
described here with its methods, so the two cannot drift apart silently.
"""

from __future__ import annotations

from typing import Any

JsonObject = dict[str, Any]

_ERROR_TEXT = {
    400: "The request is malformed: no `file` field, an empty file or a bad Idempotency-Key.",
    404: "No such attachment or variant (a malformed id is unknown too).",
    405: "The route does not take this method.",
    413: "The file is larger than the upload limit.",
    415: "The bytes are not an accepted image format (the declared type is ignored).",
    422: "The image is damaged, truncated or has more pixels than allowed, or the "
    "Idempotency-Key was used before for a different file.",
    500: "An unexpected error; the body carries no internals.",
    503: "The database or object store is unavailable; retry after `Retry-After` seconds.",
}

_ATTACHMENT_STATES = ["queued", "processing", "ready", "failed"]


def openapi_document() -> JsonObject:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "jobsapp attachments API",
            "version": "1",
            "description": "Upload images; they are validated, made durable, then rendered "
            "into variants by background workers. Every response carries "
            "`X-Content-Type-Options: nosniff`; every error body is an `Error`.",
        },
        "paths": _paths(),
        "components": {"schemas": _schemas()},
    }


def _paths() -> JsonObject:
    id_param = _path_param("attachment_id", {"type": "string", "format": "uuid"})
    name_param = _path_param("name", {"type": "string", "examples": ["thumbnail"]})
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
                "summary": "Liveness of the web process (does not touch the database)",
                "operationId": "healthz",
                "responses": {"200": _json("Alive", "Health"), **_errors()},
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


def _errors(*statuses: int) -> JsonObject:
    """Error responses; every route can also answer 405 and 500."""
    return {str(s): _json(_ERROR_TEXT[s], "Error") for s in sorted({*statuses, 405, 500})}


def _path_param(name: str, schema: JsonObject) -> JsonObject:
    return {"name": name, "in": "path", "required": True, "schema": schema}
