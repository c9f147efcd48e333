"""The links between a canvas's results as Celery's result API walks them, on Postgres and
SQLite: a result's ``parent`` (what ran before it) and ``AsyncResult(id).children`` (what its
success sent, read from the workflow's steps; a job of its own reads no step; what its body
called, kept with its run), and ``collect()``, ``iterdeps()`` and ``graph`` over them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import chain, chord, group
from celery.result import AsyncResult, GroupResult
from sqlalchemy import Engine, event

from jobsapp.celery_app import app
from tests.support import canvas_tasks as t

pytestmark = pytest.mark.timeout(120)

WAIT = 20


def test_a_chains_first_step_names_the_next_and_collect_walks_the_chain(worker: object) -> None:
    c = chain(t.add.s(1, 1), t.add.s(2), t.add.s(3)).apply_async()
    assert c.get(timeout=WAIT) == 7
    second = c.parent
    first = AsyncResult(second.parent.id, app=app)
    assert [kid.id for kid in first.children] == [second.id]
    assert [(r.id, value) for r, value in first.collect(timeout=WAIT)] == [
        (first.id, 2),
        (second.id, 4),
        (c.id, 7),
    ]
    assert [(p and p.id, r.id) for p, r in first.iterdeps()] == [
        (None, first.id),
        (first.id, second.id),
        (second.id, c.id),
    ]
    assert [r.id for r in first.graph.topsort()] == [c.id, second.id, first.id]
    assert AsyncResult(c.id, app=app).children == []


def test_the_parent_of_a_group_or_a_chords_header_after_a_step_is_that_step(
    db: Engine, redis_clean: None
) -> None:
    g = chain(t.add.s(1, 1), group(t.add.s(1), t.add.s(2))).apply_async()
    assert g.parent is not None
    assert g.parent.id == g.results[0].parent.id
    c = chain(t.add.s(1, 1), chord([t.add.s(1), t.add.s(2)], t.tsum.s())).apply_async()
    header = c.parent
    assert header.parent is not None
    assert header.parent.id == header.results[0].parent.id
    assert group(t.add.s(1, 1), t.add.s(2, 2)).apply_async().parent is None
    chords = group(chord([t.add.s(1, 1)], t.tsum.s()), chord([t.add.s(2, 2)], t.tsum.s()))
    assert chords.apply_async().parent is None


def test_a_step_before_a_group_names_the_group(worker: object) -> None:
    g = chain(t.add.s(1, 1), group(t.add.s(1), t.add.s(2))).apply_async()
    assert g.get(timeout=WAIT) == [3, 4]
    (kid,) = AsyncResult(g.results[0].parent.id, app=app).children
    assert isinstance(kid, GroupResult)
    assert (kid.id, [r.id for r in kid.results]) == (g.id, [r.id for r in g.results])
    assert kid.get(timeout=WAIT) == [3, 4]


def test_a_chords_member_names_nothing_its_body_is_the_chords(worker: object) -> None:
    c = chain(t.add.s(1, 1), chord([t.add.s(1), t.add.s(2)], t.tsum.s())).apply_async()
    assert c.get(timeout=WAIT) == 7
    header = c.parent
    (kid,) = AsyncResult(header.results[0].parent.id, app=app).children
    assert [r.id for r in kid.results] == [r.id for r in header.results]
    assert AsyncResult(header.results[0].id, app=app).children == []


def test_a_tasks_link_is_its_child(worker: object) -> None:
    r = t.add.apply_async((1, 1), link=t.add.s(10))
    assert r.get(timeout=WAIT) == 2
    assert [kid.get(timeout=WAIT) for kid in r.children] == [12]
    two = t.add.apply_async((1, 1), link=[t.add.s(10), t.add.s(20)])
    two.get(timeout=WAIT)
    (both,) = AsyncResult(two.id, app=app).children
    assert both.get(timeout=WAIT) == [12, 22]


@pytest.fixture
def statements(db: Engine) -> Iterator[list[str]]:
    seen: list[str] = []

    def record(*args: Any) -> None:
        seen.append(str(args[2]))

    event.listen(db, "before_cursor_execute", record)
    yield seen
    event.remove(db, "before_cursor_execute", record)


def test_a_plain_jobs_result_reads_no_step_and_a_steps_reads_its_own_and_the_next(
    worker: object, statements: list[str]
) -> None:
    r = t.add.delay(2, 2)
    r.get(timeout=WAIT)
    c = chain(t.add.s(1, 1), t.add.s(2)).apply_async()
    c.get(timeout=WAIT)
    statements.clear()
    assert AsyncResult(r.id, app=app).get(timeout=WAIT) == 4
    assert not [s for s in statements if "workflow_steps" in s]
    assert AsyncResult(c.parent.id, app=app).get(timeout=WAIT) == 2
    assert len([s for s in statements if "workflow_steps" in s]) == 2


def test_an_id_no_run_knows_has_no_children(db: Engine) -> None:
    assert AsyncResult(str(uuid.uuid4()), app=app).children == []


# Another process, another app: the children it reads are the journal's, not a worker's.
READ_CHILDREN = """
import json, sys
from celery.result import AsyncResult
from jobsapp.celery_app import app
kids = AsyncResult(sys.argv[1], app=app).children
print(json.dumps([[k.id, k.get(timeout=20)] for k in kids]))
"""


def test_the_calls_a_body_made_are_its_children_in_another_process(
    db: Engine, worker: object
) -> None:
    r = t.calls_add.delay(5)
    child, apart = r.get(timeout=WAIT)
    assert [kid.id for kid in AsyncResult(r.id, app=app).children] == [child]
    url = db.url.render_as_string(hide_password=False)
    env = {**os.environ, "JOBSAPP_DATABASE_URL": url}
    read = subprocess.run(
        [sys.executable, "-c", READ_CHILDREN, r.id],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(read.stdout.strip().splitlines()[-1]) == [[child, 6]]
    assert apart != child


def test_a_rerun_that_calls_nothing_answers_no_children_of_the_run_before(
    worker: object,
) -> None:
    token, job_id = uuid.uuid4().hex, uuid.uuid4()
    first = t.calls_at_first_run.apply_async((token,), job_id=job_id)
    (child,) = first.get(timeout=WAIT)
    assert [kid.id for kid in AsyncResult(first.id, app=app).children] == [child]
    again = t.calls_at_first_run.apply_async((token,), job_id=job_id)  # its rerun
    assert again.get(timeout=WAIT) == []
    assert AsyncResult(first.id, app=app).children == []
