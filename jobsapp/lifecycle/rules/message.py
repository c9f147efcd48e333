"""The broker message: built from journal data, validated on publish and on consume.

Trace context travels twice: in the body (``traceparent``, ``tracestate``) and as Celery
message headers of the same names, so tools that read only headers see it too.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

import fastjsonschema

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator

from jobsapp.lifecycle.rules.errors import InvalidMessage

SCHEMA_VERSION = 1
MAX_BODY_BYTES = 4096
# task ids of one job's attempts share this namespace so a republish keeps its id.
_TASK_ID_NAMESPACE = uuid.UUID("6f1b2f5e-3c1a-4f0e-9a57-1d6f3c2b8e40")
_NAMESPACE_BYTES = _TASK_ID_NAMESPACE.bytes
# RFC 4122's variant bits over the 17th hex digit: 10xx.
_VARIANT_DIGIT = "89ab" * 4
TRACE_HEADERS = ("traceparent", "tracestate")
_INTEGER_FIELDS = frozenset({"schema_version", "attempt", "outbox_id", "pipeline_version"})
# Celery's per-call limits, carried by every message of the job (its ``timelimit`` header).
TIME_LIMITS = ("time_limit", "soft_time_limit")
MAX_TIME_LIMIT = 31_536_000  # a year: jobs.schema.json's maximum


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
    # Only a body the fast check refuses reaches jsonschema: imported then, not by every
    # process that imports the journal (~50 ms of a command's start).
    from jsonschema import Draft202012Validator

    schema = _schema()
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


# --- the fast check ---------------------------------------------------------------------
# Every message a worker receives is checked: jsonschema takes ~0.1 ms per body,
# fastjsonschema's validator (the schema compiled to Python) a few us. Only a body that
# fails goes to jsonschema, for the message naming the violation. fastjsonschema implements
# drafts up to 2019-09, the schema is 2020-12: a keyword outside the ones both read alike
# fails at compile time, so the schema cannot outgrow the check unnoticed
# (bench/bench_validation.py, docs/performance.md).

# Keywords jobs.schema.json uses, each meaning the same in both drafts and both libraries.
_SHARED_KEYWORDS = frozenset(
    {
        "$schema",
        "$id",
        "$defs",
        "$ref",
        "title",
        "description",
        "type",
        "additionalProperties",
        "required",
        "properties",
        "const",
        "pattern",
        "minimum",
        "maximum",
        "maxLength",
    }
)


def _keywords(schema: Mapping[str, Any]) -> set[str]:
    found = set(schema)
    for holder in ("properties", "$defs"):
        for subschema in schema.get(holder, {}).values():
            found |= _keywords(subschema)
    return found


def compile_fast_check(schema: Mapping[str, Any]) -> Callable[[Any], Any]:
    """fastjsonschema's validator of ``schema``: returns the body, raises if it is invalid."""
    unknown = _keywords(schema) - _SHARED_KEYWORDS
    if unknown:
        raise ValueError(f"the fast check may not read {sorted(unknown)} as jsonschema does")
    # Formats are annotations to jsonschema; defaults would change the body.
    return fastjsonschema.compile(dict(schema), use_default=False, use_formats=False)


@cache
def _fast_check() -> Callable[[Any], Any]:
    return compile_fast_check(_schema())


def fast_valid(body: Mapping[str, Any]) -> bool:
    """What jsonschema would say of ``body``, in microseconds (proven in the tests), but for
    a value ending in a newline: a pattern's ``$`` is the end of the string here, as JSON
    Schema defines it, not also before a final newline as in Python's ``re``."""
    try:
        _fast_check()(body)
    except fastjsonschema.JsonSchemaValueException:
        return False
    return True


def id_fields() -> frozenset[str]:
    """The domain id fields the schema lets travel."""
    return frozenset({"attachment_id", "pipeline_version", "variant"})


def new_traceparent() -> str:
    # One read of the OS's random source for the trace and span ids (a third of two reads).
    ids = secrets.token_hex(24)
    return f"00-{ids[:32]}-{ids[32:]}-01"


def task_id_for(job_id: uuid.UUID, attempt: int) -> str:
    """The Celery task id of one attempt: stable across republishes of that attempt.

    The first attempt's is the job's own id, the caller's ``r.id``: what Celery's task
    and publish signals, ``inspect().active()``, ``query_task`` and Flower name is then
    the id the caller holds, as in Celery (a caller's own non-UUID ``task_id`` is the one
    exception: its job id is derived from it, ``job_id_of_task``). A later attempt's is
    ``str(uuid.uuid5(_TASK_ID_NAMESPACE, f"{job_id}:{attempt}"))`` (tests/unit hold the
    two equal), written out: the UUID object in between costs more than the hash. Celery
    re-sends a retry under its task's id; each attempt here is a run of its own in
    Flower, its ``parent_id`` the attempt before it and its ``root_id`` the job."""
    if attempt == 1:
        return str(job_id)
    name = _NAMESPACE_BYTES + f"{job_id}:{attempt}".encode()
    # SHA-1 is what RFC 4122 names for version 5, not a security measure.
    digest = hashlib.sha1(name, usedforsecurity=False).hexdigest()
    variant = _VARIANT_DIGIT[int(digest[16], 16)]
    return f"{digest[:8]}-{digest[8:12]}-5{digest[13:16]}-{variant}{digest[17:20]}-{digest[20:32]}"


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
    limits: Mapping[str, float | None] | None = None,
) -> BuiltBody:
    body = BuiltBody(
        {
            "schema_version": SCHEMA_VERSION,
            "job_id": str(job_id),
            "module": module,
            "attempt": attempt,
            "enqueued_at": enqueued_at.isoformat(),
            "traceparent": traceparent or new_traceparent(),
        }
    )
    body.update({k: str(v) if isinstance(v, uuid.UUID) else v for k, v in ids.items()})
    body.update({k: v for k, v in (limits or {}).items() if v is not None})
    validate_body(body)
    return body


def validate_body(body: Any) -> None:
    """Raise InvalidMessage naming the first violation of ``jobs.schema.json``."""
    if not isinstance(body, dict):
        raise InvalidMessage("message kwargs are not an object")
    if not fast_valid(body):
        _refuse(body)
    _check_python_types(body)


def _refuse(body: dict[str, Any]) -> None:
    """Raise the reason an invalid body is refused: its size first, else the schema's word
    (jsonschema may find none where only a value's final newline failed the fast check:
    ``_check_python_types`` words that one).

    Only an invalid body is measured: the schema bounds every field (no other key, each
    string's pattern or length, each number's range), so a valid body is well under the
    limit (tests/unit/test_message.py holds the largest one), and serializing every body
    to count its bytes cost a JSON encoding per message on both sides of the broker."""
    if len(json.dumps(body, default=str)) > MAX_BODY_BYTES:
        raise InvalidMessage(f"message body is over {MAX_BODY_BYTES} bytes")
    error = next(iter(_validator().iter_errors(body)), None)
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        raise InvalidMessage(f"schema violation at {where}: {error.message[:200]}")


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
    """The job a Celery task id names, whether a caller passed it to ``apply_async`` or
    ``send_task`` sent it: the id itself when it is a UUID, so that a redelivery finds the
    same run and ``AsyncResult(task_id)`` names it; any other string is mapped to one,
    stably (never change the mapping: callers store their ids)."""
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
    return Envelope(
        job_id=job_id,
        module=module,
        attempt=1,
        outbox_id=None,
        concurrency_key=None,
        ids={},
        traceparent=traceparent,
    )


def time_limits(body: Mapping[str, Any]) -> dict[str, float]:
    """``send_task``'s ``time_limit``/``soft_time_limit`` of a body that carries them."""
    return {k: body[k] for k in TIME_LIMITS if k in body}


def trace_headers(body: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(body[k]) for k in TRACE_HEADERS if k in body}
