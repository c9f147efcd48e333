"""The broker message: built from journal data, validated on publish and on consume.

Trace context travels twice: in the body (``traceparent``, ``tracestate``) and as Celery
message headers of the same names, so tools that read only headers see it too.
"""

from __future__ import annotations

import json
import numbers
import re
import secrets
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator

from jobsapp.lifecycle.errors import InvalidMessage

SCHEMA_VERSION = 1
MAX_BODY_BYTES = 4096
# task ids of one job's attempts share this namespace so a republish keeps its id.
_TASK_ID_NAMESPACE = uuid.UUID("6f1b2f5e-3c1a-4f0e-9a57-1d6f3c2b8e40")
TRACE_HEADERS = ("traceparent", "tracestate")
_INTEGER_FIELDS = frozenset({"schema_version", "attempt", "outbox_id", "pipeline_version"})


@dataclass(frozen=True)
class Envelope:
    """A validated message: what a worker may trust before it reads the journal."""

    job_id: uuid.UUID
    module: str
    attempt: int
    outbox_id: int | None
    concurrency_key: str | None
    ids: dict[str, Any]
    traceparent: str | None


def _schema() -> dict[str, Any]:
    text = resources.files("jobsapp.schemas").joinpath("jobs.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


@cache
def _validator() -> Draft202012Validator:
    schema = _schema()
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


# --- the fast check ---------------------------------------------------------------------
# Every message a worker receives is checked; jsonschema takes ~0.3 ms per body. The
# schema's few keywords are compiled here into plain predicates with jsonschema's own
# semantics (``re.search`` for patterns, keywords ignoring other types, 1.0 an integer,
# a bool no number), so a body passes in microseconds. Only a body that fails goes to
# jsonschema, for the message naming the violation. A keyword not handled here fails
# at import: the schema cannot outgrow the check unnoticed.

Check = Callable[[Any], bool]
_ANNOTATIONS = frozenset({"description", "title", "$schema", "$id", "$defs"})


def _number(value: Any) -> bool:
    return isinstance(value, numbers.Number) and not isinstance(value, bool)


def _of_type(name: str) -> Check:
    kinds: dict[str, Check] = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and v.is_integer()),
    }
    return kinds[name]


def _const(expected: Any) -> Check:
    if not _number(expected):
        raise ValueError(f"the fast check compares numbers only, not {expected!r}")
    return lambda v: _number(v) and v == expected


def _pattern(regex: str) -> Check:
    search = re.compile(regex).search
    return lambda v: not isinstance(v, str) or search(v) is not None


_KEYWORDS: dict[str, Callable[[Any], Check]] = {
    "type": _of_type,
    "const": _const,
    "pattern": _pattern,
    "minimum": lambda low: lambda v: not _number(v) or v >= low,
    "maximum": lambda high: lambda v: not _number(v) or v <= high,
    "maxLength": lambda most: lambda v: not isinstance(v, str) or len(v) <= most,
}


def _property_check(prop: Mapping[str, Any], defs: Mapping[str, Any]) -> Check:
    if "$ref" in prop:
        prop = {**defs[prop["$ref"].removeprefix("#/$defs/")], **prop}
    checks = [_KEYWORDS[k](v) for k, v in prop.items() if k not in _ANNOTATIONS | {"$ref"}]
    return lambda v: all(check(v) for check in checks)


@cache
def _fast_checks() -> tuple[frozenset[str], dict[str, Check]]:
    """The required fields and each allowed field's check, compiled from the schema."""
    schema = _schema()
    root = {k: v for k, v in schema.items() if k not in _ANNOTATIONS}
    expected = {"type": "object", "additionalProperties": False}
    if {k: root.pop(k, None) for k in expected} != expected or set(root) != {
        "required", "properties",
    }:  # fmt: skip
        raise ValueError("the fast check knows a closed object of properties only")
    defs = schema.get("$defs", {})
    checks = {name: _property_check(p, defs) for name, p in root["properties"].items()}
    return frozenset(root["required"]), checks


def fast_valid(body: Mapping[str, Any]) -> bool:
    """What jsonschema would say of ``body``, in microseconds (proven in the tests)."""
    required, checks = _fast_checks()
    return required <= body.keys() and all(
        name in checks and checks[name](value) for name, value in body.items()
    )


def id_fields() -> frozenset[str]:
    """The domain id fields the schema lets travel."""
    return frozenset({"attachment_id", "pipeline_version", "variant"})


def new_traceparent() -> str:
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def task_id_for(job_id: uuid.UUID, attempt: int) -> str:
    """The Celery task id of one attempt: stable across republishes of that attempt."""
    return str(uuid.uuid5(_TASK_ID_NAMESPACE, f"{job_id}:{attempt}"))


class BuiltBody(dict[str, Any]):
    """A body ``build_body`` made from typed values and checked: its publish in this
    process need not check it again (a body read back from the outbox is a plain dict)."""


def build_body(
    *,
    job_id: uuid.UUID,
    module: str,
    attempt: int,
    ids: Mapping[str, Any],
    enqueued_at: datetime,
    traceparent: str | None = None,
) -> BuiltBody:
    body = BuiltBody({
        "schema_version": SCHEMA_VERSION,
        "job_id": str(job_id),
        "module": module,
        "attempt": attempt,
        "enqueued_at": enqueued_at.isoformat(),
        "traceparent": traceparent or new_traceparent(),
    })
    body.update({k: str(v) if isinstance(v, uuid.UUID) else v for k, v in ids.items()})
    validate_body(body)
    return body


def validate_body(body: Any) -> None:
    """Raise InvalidMessage naming the first violation of ``jobs.schema.json``."""
    if not isinstance(body, dict):
        raise InvalidMessage("message kwargs are not an object")
    if len(json.dumps(body, default=str)) > MAX_BODY_BYTES:
        raise InvalidMessage(f"message body is over {MAX_BODY_BYTES} bytes")
    error = None if fast_valid(body) else next(iter(_validator().iter_errors(body)), None)
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        raise InvalidMessage(f"schema violation at {where}: {error.message[:200]}")
    _check_python_types(body)


def _check_python_types(body: Mapping[str, Any]) -> None:
    """What JSON Schema cannot say under Python's regex and number rules.

    Python's ``$`` also matches before a final newline, and the schema's integers admit
    1.0; both would slip a malformed value past the patterns.
    """
    for name, value in body.items():
        if isinstance(value, str) and not value.isprintable():
            raise InvalidMessage(f"field {name} holds a control character")
        if name in _INTEGER_FIELDS and type(value) is not int:
            raise InvalidMessage(f"field {name} must be an integer")


def is_envelope(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """Whether a delivery claims to be a jobsapp message: keyword fields only, with the
    schema's version among them. Anything else is a plain Celery call of the task (a
    ``send_task`` from a service that does not import it, ``apply()``)."""
    return not args and "schema_version" in kwargs


def job_id_of_task(task_id: str) -> uuid.UUID:
    """The job a plain Celery message becomes: its task id, so that a redelivery (same
    id) finds the same run and ``AsyncResult(task_id)`` names it; an id that is no UUID
    is mapped to one, stably."""
    try:
        return uuid.UUID(task_id)
    except ValueError:
        return uuid.uuid5(_TASK_ID_NAMESPACE, f"celery:{task_id}")


def parse(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Envelope:
    """Validate what Celery delivered and turn it into an Envelope."""
    if args:
        raise InvalidMessage("positional arguments are not part of the message contract")
    body = dict(kwargs)
    validate_body(body)
    return Envelope(
        job_id=uuid.UUID(body["job_id"]),
        module=body["module"],
        attempt=body["attempt"],
        outbox_id=body.get("outbox_id"),
        concurrency_key=body.get("concurrency_key"),
        ids={k: body[k] for k in id_fields() if k in body},
        traceparent=body.get("traceparent"),
    )


def adopted(job_id: uuid.UUID, module: str, traceparent: str | None) -> Envelope:
    """The envelope of a plain Celery message's run: attempt 1, no outbox row, no ids."""
    return Envelope(job_id=job_id, module=module, attempt=1, outbox_id=None,
                    concurrency_key=None, ids={}, traceparent=traceparent)  # fmt: skip


def trace_headers(body: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(body[k]) for k in TRACE_HEADERS if k in body}
