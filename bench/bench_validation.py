"""The message check on the worker's hot path: ``python -m bench.bench_validation [--n N]``.

Every body a worker receives (and every body the relay republishes) passes
``message.validate_body``, whose schema check is ``message.fast_valid``; jsonschema only
words a rejection. This times, per body, ``fast_valid``, a bare ``fastjsonschema``
validator compiled from the same ``jobs.schema.json``, and jsonschema's ``is_valid`` (the
reference), on a typical valid body and on invalid ones, and the whole ``validate_body``
of a valid body. No servers; a few seconds. Each figure is the best of 5 repeats of N
calls (the least disturbed by other processes), in microseconds per body.
"""

from __future__ import annotations

import argparse
import timeit
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import fastjsonschema
from jsonschema import Draft202012Validator

from jobsapp.lifecycle.rules import message

Check = Callable[[dict[str, Any]], object]
REPEATS = 5


def typical_body() -> dict[str, Any]:
    """What the relay publishes for an attachment variant: every id field set."""
    body = dict(
        message.build_body(
            job_id=uuid.uuid4(),
            module="attachments",
            attempt=1,
            ids={"attachment_id": uuid.uuid4(), "pipeline_version": 3, "variant": "thumb"},
            enqueued_at=datetime.now(UTC),
        )
    )
    return {**body, "outbox_id": 123456}


def invalid_bodies(valid: dict[str, Any]) -> dict[str, dict[str, Any]]:
    missing = dict(valid)
    del missing["attempt"]
    return {
        "job_id not a uuid": {**valid, "job_id": valid["job_id"].upper()},
        "unknown field": {**valid, "url": "http://example.com/x.jpg"},
        "attempt missing": missing,
        "attempt a string": {**valid, "attempt": "1"},
        "attempt 0": {**valid, "attempt": 0},
    }


def checks() -> dict[str, Check]:
    schema = message._schema()
    library = fastjsonschema.compile(schema)

    def bare_library(body: dict[str, Any]) -> bool:
        try:
            library(body)
        except fastjsonschema.JsonSchemaValueException:
            return False
        return True

    return {
        "fast_valid": message.fast_valid,
        "fastjsonschema": bare_library,
        "jsonschema": Draft202012Validator(schema).is_valid,
    }


def per_call_us(check: Check, body: dict[str, Any], n: int) -> float:
    return min(timeit.repeat(lambda: check(body), repeat=REPEATS, number=n)) / n * 1e6


def agreement(bodies: dict[str, dict[str, Any]], by: dict[str, Check]) -> None:
    """A timing of checks that disagree would compare nothing."""
    for name, body in bodies.items():
        verdicts = {label: bool(check(body)) for label, check in by.items()}
        if len(set(verdicts.values())) != 1:
            raise AssertionError(f"the checks disagree on {name}: {verdicts}")


def table(n: int) -> list[str]:
    valid = typical_body()
    bodies = {"valid (typical)": valid, **invalid_bodies(valid)}
    by = checks()
    agreement(bodies, by)
    lines = [f"| body | {' | '.join(by)} |", "|---" * (len(by) + 1) + "|"]
    for name, body in bodies.items():
        figures = " | ".join(f"{per_call_us(check, body, n):.2f}" for check in by.values())
        lines.append(f"| {name} | {figures} |")
    whole = per_call_us(message.validate_body, valid, n)
    lines.append(f"validate_body of the typical valid body: {whole:.2f} us")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_validation")
    parser.add_argument("--n", type=int, default=20000, help="calls per repeat")
    print("\n".join(table(parser.parse_args(argv).n)))


if __name__ == "__main__":
    main()
