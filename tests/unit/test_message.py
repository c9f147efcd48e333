"""The broker message contract: jobs.schema.json, build_body, parse, task ids, trace headers."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone
from importlib import resources
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from jobsapp.lifecycle.rules.errors import InvalidMessage
from jobsapp.lifecycle.rules.message import (
    _TASK_ID_NAMESPACE,
    MAX_BODY_BYTES,
    SCHEMA_VERSION,
    Envelope,
    build_body,
    id_fields,
    job_id_of_task,
    new_traceparent,
    parse,
    task_id_for,
    trace_headers,
    validate_body,
)

JOB_ID = uuid.UUID("0b7e3f4a-9c1d-4e2f-8a6b-5c4d3e2f1a0b")
ATTACHMENT_ID = uuid.UUID("1c8f4a5b-0d2e-4f3a-9b7c-6d5e4f3a2b1c")
WHEN = datetime(2025, 3, 1, 12, 30, 45, 123456, tzinfo=UTC)
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACESTATE = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
REQUIRED = ("schema_version", "job_id", "module", "attempt", "enqueued_at")


def schema() -> dict[str, Any]:
    text = resources.files("jobsapp.schemas").joinpath("jobs.schema.json").read_text()
    return json.loads(text)


SCHEMA = schema()
VALIDATOR = Draft202012Validator(SCHEMA)


def minimal() -> dict[str, Any]:
    """What a foreign producer that knows only the contract sends."""
    return {
        "schema_version": 1,
        "job_id": str(JOB_ID),
        "module": "attachments",
        "attempt": 1,
        "enqueued_at": "2025-03-01T12:30:45Z",
    }


def full() -> dict[str, Any]:
    return {
        **minimal(),
        "outbox_id": 7,
        "concurrency_key": "attachment:1c8f4a5b",
        "attachment_id": str(ATTACHMENT_ID),
        "pipeline_version": 3,
        "variant": "thumb_small",
        "traceparent": TRACEPARENT,
        "tracestate": TRACESTATE,
    }


def rejected(body: dict[str, Any], args: tuple[Any, ...] = ()) -> str:
    with pytest.raises(InvalidMessage) as info:
        parse(args, body)
    return str(info.value)


# --- the schema file ------------------------------------------------------------------------


def test_schema_is_valid_draft_2020_12() -> None:
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(SCHEMA)


def test_schema_closes_the_object() -> None:
    assert SCHEMA["type"] == "object"
    assert SCHEMA["additionalProperties"] is False
    assert set(SCHEMA["required"]) == set(REQUIRED)


def test_schema_pins_the_version_the_code_speaks() -> None:
    assert SCHEMA["properties"]["schema_version"] == {"const": SCHEMA_VERSION}


def test_every_domain_id_field_is_declared() -> None:
    assert id_fields() <= set(SCHEMA["properties"])


def test_every_string_field_is_constrained() -> None:
    """A string with no pattern or enum would let a URL or a path travel."""
    for name, prop in SCHEMA["properties"].items():
        resolved = SCHEMA["$defs"]["uuid"] if prop.get("$ref") == "#/$defs/uuid" else prop
        if resolved.get("type") == "string":
            assert "pattern" in resolved, name


# --- build_body -----------------------------------------------------------------------------


def test_build_body_is_valid_against_the_schema_file() -> None:
    body = build_body(
        job_id=JOB_ID,
        module="attachments",
        attempt=2,
        ids={"attachment_id": ATTACHMENT_ID, "pipeline_version": 3, "variant": "thumb"},
        enqueued_at=WHEN,
        traceparent=TRACEPARENT,
    )
    assert not list(VALIDATOR.iter_errors(body))
    assert body == {
        "schema_version": SCHEMA_VERSION,
        "job_id": str(JOB_ID),
        "module": "attachments",
        "attempt": 2,
        "enqueued_at": WHEN.isoformat(),
        "traceparent": TRACEPARENT,
        "attachment_id": str(ATTACHMENT_ID),
        "pipeline_version": 3,
        "variant": "thumb",
    }
    assert json.loads(json.dumps(body)) == body


def test_build_body_starts_a_trace_when_none_is_given() -> None:
    one = build_body(job_id=JOB_ID, module="jobs", attempt=1, ids={}, enqueued_at=WHEN)
    two = build_body(job_id=JOB_ID, module="jobs", attempt=1, ids={}, enqueued_at=WHEN)
    assert not list(VALIDATOR.iter_errors(one))
    assert one["traceparent"] != two["traceparent"]


def test_new_traceparent_matches_the_w3c_shape() -> None:
    assert not list(VALIDATOR.iter_errors({**minimal(), "traceparent": new_traceparent()}))


def test_build_body_accepts_any_utc_offset() -> None:
    east = WHEN.astimezone(timezone(timedelta(hours=5, minutes=30)))
    body = build_body(job_id=JOB_ID, module="jobs", attempt=1, ids={}, enqueued_at=east)
    assert body["enqueued_at"].endswith("+05:30")


def test_build_body_refuses_a_naive_timestamp() -> None:
    with pytest.raises(InvalidMessage, match="enqueued_at"):
        build_body(
            job_id=JOB_ID, module="jobs", attempt=1, ids={}, enqueued_at=WHEN.replace(tzinfo=None)
        )


def test_build_body_refuses_an_unknown_id_field() -> None:
    with pytest.raises(InvalidMessage):
        build_body(job_id=JOB_ID, module="jobs", attempt=1, ids={"path": "x"}, enqueued_at=WHEN)


def test_build_body_round_trips_through_parse() -> None:
    body = build_body(
        job_id=JOB_ID,
        module="attachments",
        attempt=4,
        ids={"attachment_id": ATTACHMENT_ID, "variant": "thumb"},
        enqueued_at=WHEN,
        traceparent=TRACEPARENT,
    )
    env = parse((), body)
    assert env.job_id == JOB_ID
    assert env.attempt == 4
    assert env.ids == {"attachment_id": str(ATTACHMENT_ID), "variant": "thumb"}
    assert env.traceparent == TRACEPARENT


# --- parse: accepted ------------------------------------------------------------------------


def test_parse_accepts_a_foreign_producers_minimal_body() -> None:
    env = parse((), minimal())
    assert env == Envelope(
        job_id=JOB_ID,
        module="attachments",
        attempt=1,
        outbox_id=None,
        concurrency_key=None,
        ids={},
        traceparent=None,
    )


def test_parse_reads_every_optional_field() -> None:
    env = parse((), full())
    assert env.outbox_id == 7
    assert env.concurrency_key == "attachment:1c8f4a5b"
    assert env.ids == {
        "attachment_id": str(ATTACHMENT_ID),
        "pipeline_version": 3,
        "variant": "thumb_small",
    }
    assert env.traceparent == TRACEPARENT


def test_parse_does_not_keep_the_callers_mapping() -> None:
    body = full()
    env = parse((), body)
    body["variant"] = "changed"
    assert env.ids["variant"] == "thumb_small"


# --- parse: rejected ------------------------------------------------------------------------


def test_positional_arguments_are_rejected() -> None:
    assert "positional" in rejected(minimal(), args=(str(JOB_ID),))


@pytest.mark.parametrize("field", REQUIRED)
def test_a_missing_required_field_is_rejected(field: str) -> None:
    body = minimal()
    del body[field]
    assert field in rejected(body)


@pytest.mark.parametrize(
    ("field", "value"),
    [("url", "https://example.com/a.png"), ("filename", "a.png"), ("path", "/tmp/a"), ("x", 1)],
)
def test_an_extra_field_is_rejected(field: str, value: object) -> None:
    assert "additional" in rejected({**minimal(), field: value}).lower()


@pytest.mark.parametrize(
    "job_id",
    [
        "not-a-uuid",
        "",
        "0b7e3f4a9c1d4e2f8a6b5c4d3e2f1a0b",  # the right digits without dashes
        "{0b7e3f4a-9c1d-4e2f-8a6b-5c4d3e2f1a0b}",
        "urn:uuid:0b7e3f4a-9c1d-4e2f-8a6b-5c4d3e2f1a0b",
        "0b7e3f4a-9c1d-4e2f-8a6b-5c4d3e2f1a0",  # one digit short
        "0b7e3f4a-9c1d-4e2f-8a6b-5c4d3e2f1a0bf",  # one digit long
        " 0b7e3f4a-9c1d-4e2f-8a6b-5c4d3e2f1a0b",
        1234,
        None,
    ],
)
def test_a_non_uuid_job_id_is_rejected(job_id: object) -> None:
    assert "job_id" in rejected({**minimal(), "job_id": job_id})


@pytest.mark.parametrize("attempt", [0, -1, -1000, "1", "one", 1.5, True, None, [1], 1_000_001])
def test_a_bad_attempt_is_rejected(attempt: object) -> None:
    assert "attempt" in rejected({**minimal(), "attempt": attempt})


@pytest.mark.parametrize("version", [0, 2, "1", None, 1.5])
def test_a_wrong_schema_version_is_rejected(version: object) -> None:
    assert "schema_version" in rejected({**minimal(), "schema_version": version})


URLS_AND_PATHS = [
    "https://evil.example/x",
    "http://169.254.169.254/latest/meta-data",
    "file:///etc/passwd",
    "s3://bucket/key.png",
    "//evil.example/x",
    "/etc/passwd",
    "../../etc/passwd",
    "./a",
    "a/b",
    "C:\\Windows\\win.ini",
    "~/.ssh/id_rsa",
]
STRING_FIELDS = ("job_id", "module", "concurrency_key", "variant", "tracestate", "traceparent")


@pytest.mark.parametrize("field", STRING_FIELDS)
@pytest.mark.parametrize("value", URLS_AND_PATHS)
def test_a_url_or_a_path_in_a_string_field_is_rejected(field: str, value: str) -> None:
    assert field in rejected({**minimal(), field: value})


@pytest.mark.parametrize("value", URLS_AND_PATHS)
def test_a_url_or_a_path_hidden_in_a_tracestate_member_is_rejected(value: str) -> None:
    assert "tracestate" in rejected({**minimal(), "tracestate": f"rojo=00f0,congo={value}"})


@pytest.mark.parametrize(
    "field", ["job_id", "attachment_id", "module", "concurrency_key", "variant", "traceparent"]
)
@pytest.mark.parametrize("junk", ["\x00", " ", "\r", "\t", "%2e%2e"])
def test_junk_appended_to_a_string_field_is_rejected(field: str, junk: str) -> None:
    assert field in rejected({**full(), field: full()[field] + junk})


@pytest.mark.parametrize("field", ["module", "concurrency_key", "variant", "traceparent"])
def test_a_trailing_newline_in_a_string_field_is_rejected(field: str) -> None:
    rejected({**full(), field: full()[field] + "\n"})


def test_a_trailing_newline_in_job_id_raises_invalid_message() -> None:
    rejected({**minimal(), "job_id": str(JOB_ID) + "\n"})


def test_an_integral_float_attempt_is_rejected_or_made_an_int() -> None:
    try:
        env = parse((), {**minimal(), "attempt": 1.0})
    except InvalidMessage:
        return
    assert type(env.attempt) is int


def test_a_body_over_the_size_limit_is_rejected() -> None:
    body = {**minimal(), "tracestate": "a=" + "b" * MAX_BODY_BYTES}
    assert str(MAX_BODY_BYTES) in rejected(body)


def largest() -> dict[str, Any]:
    """Every field of the schema at its longest in JSON: no valid body is longer."""
    return {
        **full(),
        "module": "m" * 64,
        "attempt": 1_000_000,
        "outbox_id": 2**63 - 1,
        "concurrency_key": "k" * 200,
        "pipeline_version": 1000,
        "variant": "v" * 32,
        "time_limit": 2.2250738585072014e-308,
        "soft_time_limit": 2.2250738585072014e-308,
        "enqueued_at": "2025-03-01T12:30:45.123456+05:30",
        "tracestate": "a" * 256 + "=" + "b" * 255,
    }


def test_the_largest_legitimate_body_fits_the_size_limit() -> None:
    # validate_body measures only an invalid body: this bound is what lets it.
    assert set(largest()) == set(SCHEMA["properties"]), "a new field needs its longest here"
    assert len(json.dumps(largest())) < MAX_BODY_BYTES
    assert parse((), largest()).concurrency_key == "k" * 200


def test_an_outbox_id_past_a_bigint_is_rejected() -> None:
    # The schema's bound on the one number no range held: no outbox row has such an id.
    assert "outbox_id" in rejected({**largest(), "outbox_id": 2**63})


def test_validate_body_rejects_a_non_object() -> None:
    for body in ([], "x", None, 1):
        with pytest.raises(InvalidMessage):
            validate_body(body)


# --- parse under fuzz -----------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
known_keys = st.sampled_from(sorted(SCHEMA["properties"]))
keys = known_keys | st.text(max_size=12)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.dictionaries(keys, json_values, max_size=12))
def test_parse_of_arbitrary_json_raises_only_invalid_message(body: dict[str, Any]) -> None:
    try:
        env = parse((), body)
    except InvalidMessage:
        return
    assert isinstance(env, Envelope)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    overrides=st.dictionaries(keys, json_values, max_size=4),
    drop=st.sets(st.sampled_from(REQUIRED), max_size=2),
    args=st.lists(json_scalars, max_size=2).map(tuple),
)
def test_parse_of_a_mutated_valid_body_raises_only_invalid_message(
    overrides: dict[str, Any], drop: set[str], args: tuple[Any, ...]
) -> None:
    body = {**full(), **overrides}
    for name in drop:
        body.pop(name, None)
    try:
        env = parse(args, body)
    except InvalidMessage:
        return
    assert not args
    assert isinstance(env, Envelope)
    assert isinstance(env.job_id, uuid.UUID)
    assert str(env.job_id) == body["job_id"]
    assert env.attempt >= 1
    assert set(body) <= set(SCHEMA["properties"])


# --- task ids and trace headers -------------------------------------------------------------


@given(job=st.uuids(), attempt=st.integers(min_value=1, max_value=1_000_000))
def test_task_id_is_stable_for_one_attempt(job: uuid.UUID, attempt: int) -> None:
    task_id = task_id_for(job, attempt)
    assert task_id == task_id_for(job, attempt)
    assert task_id == task_id_for(uuid.UUID(str(job)), attempt)
    assert str(uuid.UUID(task_id)) == task_id


@given(job=st.uuids())
def test_a_first_attempts_task_id_is_its_jobs_id(job: uuid.UUID) -> None:
    # The id the caller holds (r.id) is the one Celery's signals, inspect and Flower name.
    assert task_id_for(job, 1) == str(job)
    assert job_id_of_task(task_id_for(job, 1)) == job


@given(job=st.uuids(), attempt=st.integers(min_value=2, max_value=1_000_000))
def test_a_later_attempts_task_id_is_the_name_based_uuid_of_its_job_and_attempt(
    job: uuid.UUID, attempt: int
) -> None:
    assert task_id_for(job, attempt) == str(uuid.uuid5(_TASK_ID_NAMESPACE, f"{job}:{attempt}"))


def test_later_attempts_task_ids_stored_before_stay_the_same() -> None:
    """Ids already in journals and Flower's history: a retry's mapping never changes."""
    first = uuid.UUID("00000000-0000-4000-8000-000000000001")
    last = uuid.UUID("ffffffff-ffff-4fff-bfff-ffffffffffff")
    assert task_id_for(first, 2) == "ba6ff542-5cfa-5a4b-9a95-26ce017d7152"
    assert task_id_for(last, 7) == "67c08042-d4ab-54e6-9c79-3374ec792ddf"


@given(job=st.uuids(), attempt=st.integers(min_value=1, max_value=1_000_000))
def test_task_ids_differ_across_attempts(job: uuid.UUID, attempt: int) -> None:
    assert task_id_for(job, attempt) != task_id_for(job, attempt + 1)


def test_task_ids_differ_across_jobs_and_only_the_first_is_the_job_id() -> None:
    assert task_id_for(JOB_ID, 1) != task_id_for(ATTACHMENT_ID, 1)
    assert task_id_for(JOB_ID, 2) != task_id_for(ATTACHMENT_ID, 2)
    assert task_id_for(JOB_ID, 2) != str(JOB_ID)


def test_task_id_is_pinned() -> None:
    """An outbox row of a retry published before an upgrade is republished under the same
    task id (a first attempt's changed once, to its job's id: docs/messages.md)."""
    assert task_id_for(JOB_ID, 1) == str(JOB_ID)
    assert task_id_for(JOB_ID, 2) == "76c6f44d-43ef-51b1-8e27-ba1a138498f8"
    assert uuid.UUID(task_id_for(JOB_ID, 2)).version == 5


def test_trace_headers_copy_traceparent_and_tracestate() -> None:
    assert trace_headers(full()) == {"traceparent": TRACEPARENT, "tracestate": TRACESTATE}


def test_trace_headers_skip_what_is_absent() -> None:
    assert trace_headers(minimal()) == {}
    assert trace_headers({**minimal(), "traceparent": TRACEPARENT}) == {"traceparent": TRACEPARENT}
