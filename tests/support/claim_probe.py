"""A team's plain job run as a worker runs it, profiled, in a process of its own:
``python -m tests.support.claim_probe plain|paused DATABASE_URL`` prints, as JSON, what
the attempt returned, the job's state and attempts after it, and the functions (file,
name) the attempt entered.

A process of its own because the profile must see only this attempt: in a test process
that earlier modules shared (threads, signal handlers, engines), a profiled attempt once
ran past pytest-timeout and left its xdist worker spinning; here a stuck probe is killed
by the caller's timeout and fails one test.
"""

from __future__ import annotations

import cProfile
import json
import sys
import uuid
from typing import Any

from billiard.einfo import ExceptionInfo
from celery import Celery
from celery.app.trace import build_tracer

from bench.cost import captured
from jobsapp.lifecycle import lifecycle_task
from jobsapp.lifecycle.flow import gating
from jobsapp.lifecycle.journal import flow_rows as statements
from jobsapp.testing.kit import delivered
from tests.support.databases import use_database
from tests.support.journal_view import run_row

Sent = tuple[str, str, tuple[Any, ...], dict[str, Any]]


def team_app() -> Celery:
    """A team's own app with one lifecycle task of no feature: no rate, no limit, no key."""
    team = Celery("team", broker="memory://", set_as_current=False)
    lifecycle_task(team, name="team.job", lazy=False, shared=False)(body)
    return team


def body() -> None:
    """A task body with no feature."""


def enqueued(app: Celery, name: str) -> tuple[uuid.UUID, Sent]:
    """A job of task ``name`` enqueued: its id and its message."""
    with captured() as sent:
        job_id = app.tasks[name].delay().job_id
    [message] = sent
    return job_id, message


def worked(app: Celery, message: Sent) -> tuple[str, list[tuple[str, str]]]:
    """``message`` run as a worker runs it: what the attempt returned, and the functions
    its calls entered."""
    name, task_id, args, kwargs = message
    tracer = build_tracer(name, app.tasks[name], app=app, eager=False)
    request = delivered(app, task_id, "unit")
    profile = cProfile.Profile()
    traced = profile.runcall(tracer, task_id, args, kwargs, request)
    profile.create_stats()
    entered = sorted({(file, func) for file, _line, func in profile.stats})  # type: ignore[attr-defined]
    # A refused delivery of the attempt's own task id is Celery's ignored task (NotRun).
    retval = traced.retval
    if isinstance(retval, ExceptionInfo):
        return str(retval.exception.exc), entered  # billiard's ExceptionWithTraceback
    return str(retval), entered


def probe(scenario: str, url: str) -> dict[str, Any]:
    team = team_app()
    engine = use_database(url)
    team.finalize()  # its tasks bound: their on_bound ran
    if scenario == "plain":
        team.__dict__["_jobsapp_claim_holds"] = ()  # an app that set up none
    job_id, message = enqueued(team, "team.job")
    queue = str(team.conf.task_default_queue)
    if scenario == "paused":
        with engine.begin() as conn:
            statements.pause(conn, "queue", queue, actor="operator:t", reason="hold")
        gating._seen.clear()  # this process sees the pause now
    ran, entered = worked(team, message)
    row = run_row(engine, job_id)
    return {"ran": ran, "state": row["state"], "attempts": row["attempts"], "entered": entered}


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1], sys.argv[2])))
