"""The fast check agrees with jsonschema on valid bodies and on every kind of mutation."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from jobsapp.lifecycle.rules import message
from jobsapp.lifecycle.rules.message import fast_valid
from tests.support.env import examples

SCHEMA = json.loads(resources.files("jobsapp.schemas").joinpath("jobs.schema.json").read_text())
VALIDATOR = Draft202012Validator(SCHEMA)
PROPERTIES: dict[str, Any] = SCHEMA["properties"]
FIELDS = sorted(PROPERTIES)
MEMBER = r"[a-z0-9_*@-]{1,12}=[A-Za-z0-9._:-]{1,12}"


def _resolved(name: str) -> dict[str, Any]:
    prop = PROPERTIES[name]
    if "$ref" in prop:
        return {**SCHEMA["$defs"]["uuid"], **prop}
    return prop


def _valid_value(name: str) -> st.SearchStrategy[Any]:
    prop = _resolved(name)
    if "const" in prop:
        return st.sampled_from([prop["const"], float(prop["const"])])
    if prop["type"] == "integer":
        low, high = prop.get("minimum", -(2**40)), prop.get("maximum", 2**40)
        return st.integers(low, high) | st.integers(low, high).map(float)
    if prop["type"] == "number":
        low, high = prop["minimum"], prop["maximum"]
        return st.floats(low, high) | st.integers(low, high)
    if prop["pattern"] == SCHEMA["$defs"]["uuid"]["pattern"]:
        return st.uuids().map(str)
    if name == "tracestate":  # the pattern's 32 members of 256 characters generate slowly
        return st.lists(st.from_regex(MEMBER, fullmatch=True), min_size=1, max_size=4).map(",".join)
    return st.from_regex(prop["pattern"])


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def valid_bodies(draw: st.DrawFn) -> dict[str, Any]:
    optional = [f for f in FIELDS if f not in SCHEMA["required"]]
    chosen = [*SCHEMA["required"], *draw(st.lists(st.sampled_from(optional), unique=True))]
    return {name: draw(_valid_value(name)) for name in chosen}


@st.composite
def mutated_bodies(draw: st.DrawFn) -> dict[str, Any]:
    body = draw(valid_bodies())
    name = draw(st.sampled_from(sorted(body)))
    how = draw(st.sampled_from(["replace", "drop", "extra", "append", "prepend", "boundary"]))
    if how == "replace":
        body[name] = draw(JSON | _valid_value(draw(st.sampled_from(FIELDS))))
    elif how == "drop":
        del body[name]
    elif how == "extra":
        body[draw(st.text(max_size=12))] = draw(JSON)
    elif how in ("append", "prepend") and isinstance(body[name], str):
        junk = draw(st.text(min_size=1, max_size=4))
        body[name] = body[name] + junk if how == "append" else junk + body[name]
    elif isinstance(body[name], int | float):
        body[name] = body[name] + draw(st.sampled_from([-1, 1, 0.5, 10**7]))
    return body


def _jsonschema_verdict(body: dict[str, Any]) -> bool:
    """jsonschema's verdict, a pattern's ``$`` read as JSON Schema defines it (ECMA-262: the
    end of the string), as fastjsonschema reads it. Python's ``re``, which jsonschema uses,
    also matches ``$`` before a final newline; no pattern of the schema admits a newline,
    and validate_body refuses one as a control character after either check."""
    final_newline = any(isinstance(v, str) and v.endswith("\n") for v in body.values())
    return VALIDATOR.is_valid(body) and not final_newline


def _agrees(body: dict[str, Any]) -> None:
    assert fast_valid(body) == _jsonschema_verdict(body), body


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(valid_bodies())
def test_valid_bodies_pass_the_fast_check(body: dict[str, Any]) -> None:
    assert VALIDATOR.is_valid(body)
    _agrees(body)


@settings(max_examples=examples(ci=150, explore=400), suppress_health_check=[HealthCheck.too_slow])
@given(mutated_bodies())
def test_the_fast_check_agrees_with_jsonschema_on_mutated_bodies(body: dict[str, Any]) -> None:
    _agrees(body)


@settings(max_examples=200)
@given(st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), JSON, max_size=8))
def test_the_fast_check_agrees_with_jsonschema_on_arbitrary_objects(body: dict[str, Any]) -> None:
    _agrees(body)


def test_a_keyword_the_fast_check_does_not_know_fails_loudly() -> None:
    with pytest.raises(ValueError, match="format"):
        message.compile_fast_check({**SCHEMA, "$defs": {"uuid": {"format": "uuid"}}})
