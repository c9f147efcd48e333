"""Celery's canvas programs, run on bare Celery (Redis result backend) and on lifecycle
tasks: the same answers.

The programs are a selection of Celery's own t/integration/test_canvas.py, over the same
small tasks (add, tsum, identity, fail; tests/support/canvas_tasks.py): a chain of 3, a
group of 5, a chord of 5 with a body, ``link``, ``link_error``, a nested chain in a group,
a group inside a chain, partial arguments, ``.si()`` and ``|``. Each program is written
once, as a Celery user writes it, and run against both task sets; the bare app runs first
on a worker of its own (two in-process workers cannot share a process). What jobsapp adds
(every step a run of one workflow) is checked in the journal afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest
from celery import Celery, chain, chord, group
from sqlalchemy import Engine, select

from jobsapp.lifecycle.tables import JobRun
from tests.support import canvas_tasks
from tests.support.result_tasks import bare_worker
from tests.support.workers import in_process_worker

pytestmark = pytest.mark.timeout(120)

WAIT = 20


@dataclass(frozen=True)
class Tasks:
    """One task set: the canvas tasks, and Celery's ``AsyncResult`` lookup by id."""

    add: Any
    tsum: Any
    identity: Any
    fail: Any
    kinds: Any
    result: Callable[[str], Any]


def _bare(app: Celery) -> Tasks:
    named = {name: app.tasks[f"bare.results.{name}"] for name in canvas_tasks.BODIES}
    return Tasks(**named, result=app.AsyncResult)


LIFECYCLE = Tasks(
    canvas_tasks.add,
    canvas_tasks.tsum,
    canvas_tasks.identity,
    canvas_tasks.fail,
    canvas_tasks.kinds,
    canvas_tasks.identity.AsyncResult,
)


def chain_of_3(t: Tasks) -> Any:
    return chain(t.add.s(1, 2), t.add.s(3), t.add.s(4)).apply_async().get(timeout=WAIT)


def pipe_with_partial_and_immutable(t: Tasks) -> Any:
    first = (t.add.s(2, 2) | t.add.s(4)).apply_async().get(timeout=WAIT)
    second = (t.add.s(2, 2) | t.add.si(5, 5)).apply_async().get(timeout=WAIT)
    partial = chain(t.add.s(3), t.add.s(4)).apply_async((1,)).get(timeout=WAIT)
    return [first, second, partial]


def group_of_5(t: Tasks) -> Any:
    return group(t.add.s(i, i) for i in range(5)).apply_async().get(timeout=WAIT)


def chord_of_5(t: Tasks) -> Any:
    header = [t.add.s(i, i) for i in range(5)]
    applied = chord(header, t.tsum.s()).apply_async().get(timeout=WAIT)
    called = chord([t.add.s(i, 1) for i in range(5)])(t.tsum.s()).get(timeout=WAIT)
    empty = chord([], t.tsum.s()).apply_async().get(timeout=WAIT)
    return [applied, called, empty]


def nested_chain_in_group(t: Tasks) -> Any:
    members = [chain(t.add.s(1, 1), t.add.s(1)), t.add.s(5, 5), t.add.s(2, 2) | t.add.s(3)]
    return group(members).apply_async().get(timeout=WAIT)


def group_inside_a_chain(t: Tasks) -> Any:
    return (
        chain(t.add.s(1, 1), group(t.add.s(1), t.add.s(2)), t.tsum.s())
        .apply_async()
        .get(timeout=WAIT)
    )


def link(t: Tasks) -> Any:
    callback = str(uuid.uuid4())
    parent = t.add.apply_async((2, 2), link=t.add.s(10).set(task_id=callback))
    return [parent.get(timeout=WAIT), t.result(callback).get(timeout=WAIT)]


def link_error(t: Tasks) -> Any:
    errback = str(uuid.uuid4())
    token = f"canvas-fail-{uuid.uuid4().hex[:8]}"
    failing = t.fail.apply_async((token,), link_error=t.identity.s().set(task_id=errback))
    # Celery's old-style errback is called with the failed task's id.
    return t.result(errback).get(timeout=WAIT) == failing.id


def map_and_starmap(t: Tasks) -> Any:
    # Celery's user guide, Canvas: "map and starmap" (it returned None on lifecycle tasks).
    mapped = t.tsum.map([[1, 2], [3, 4]]).apply_async().get(timeout=WAIT)
    starred = t.add.starmap([(1, 2), (3, 4), (5, 6)]).delay().get(timeout=WAIT)
    return [mapped, starred]


KOMBU_VALUES = [
    datetime(2026, 12, 4, 1, 2, 3, 456789, tzinfo=UTC),
    datetime(2026, 12, 4, 1, 2, 3),
    date(2026, 12, 4),
    time(1, 2, 3),
    Decimal("1.50"),
    UUID("6f1d7c4e-3b57-4a8e-9a54-3c1f0e1d2b77"),
    b"bytes",
]
KOMBU_KINDS = ["datetime", "datetime", "date", "time", "Decimal", "UUID", "bytes"]


def kombu_json_types(t: Tasks) -> Any:
    # Celery's JSON serializer (kombu.utils.json) gives these back as themselves: to the
    # body, to get(), and from one step of a chain to the next.
    received = t.kinds.delay(KOMBU_VALUES).get(timeout=WAIT)
    echoed = t.identity.delay(KOMBU_VALUES).get(timeout=WAIT)
    passed_on = chain(t.identity.s(KOMBU_VALUES), t.kinds.s()).apply_async().get(timeout=WAIT)
    summed = t.add.delay(Decimal("1.1"), Decimal("2.2")).get(timeout=WAIT)
    return [received, echoed == KOMBU_VALUES, passed_on, summed]


PROGRAMS: dict[str, tuple[Callable[[Tasks], Any], Any]] = {
    "chain of 3": (chain_of_3, 10),
    "| with partial and immutable": (pipe_with_partial_and_immutable, [8, 10, 8]),
    "group of 5": (group_of_5, [0, 2, 4, 6, 8]),
    "chord of 5 with a body": (chord_of_5, [20, 15, 0]),
    "nested chain in a group": (nested_chain_in_group, [3, 10, 7]),
    "group inside a chain": (group_inside_a_chain, 7),
    "link": (link, [4, 14]),
    "link_error": (link_error, True),
    "map and starmap": (map_and_starmap, [[3, 7], [3, 7, 11]]),
}


def _run_all(tasks: Tasks) -> dict[str, Any]:
    return {name: program(tasks) for name, (program, _) in PROGRAMS.items()}


def test_canvas_programs_answer_as_on_bare_celery(db: Engine, redis_clean: None) -> None:
    with bare_worker(canvas_tasks.BODIES) as bare:
        celerys = _run_all(_bare(bare))
    assert celerys == {name: expected for name, (_, expected) in PROGRAMS.items()}
    with in_process_worker():
        ours = _run_all(LIFECYCLE)
    assert ours == celerys
    runs = JobRun.__table__
    with db.connect() as conn:
        rows = conn.execute(select(runs.c.state, runs.c.workflow_id)).all()
    # Every step was a journaled run of a workflow; only the failing one failed.
    assert all(row.workflow_id is not None for row in rows)
    assert sorted(row.state for row in rows if row.state != "succeeded") == ["failed"]


def test_kombus_json_types_reach_the_body_and_come_back_as_on_bare_celery(
    db: Engine, redis_clean: None
) -> None:
    with bare_worker(canvas_tasks.BODIES) as bare:
        celerys = kombu_json_types(_bare(bare))
    assert celerys == [KOMBU_KINDS, True, KOMBU_KINDS, Decimal("3.3")]
    with in_process_worker():
        ours = kombu_json_types(LIFECYCLE)
    assert ours == celerys


def test_chunks_of_a_lifecycle_task_is_refused_at_the_call_in_one_line() -> None:
    with pytest.raises(TypeError, match=r"^tests\.canvas\.add\.chunks: .* use starmap"):
        canvas_tasks.add.chunks(zip(range(4), range(4), strict=True), 2)
