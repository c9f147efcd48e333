"""The links between a canvas's results as Celery's result API walks them, on Postgres and
SQLite: a result's ``parent`` (what ran before it) and ``AsyncResult(id).children`` (what its
success sent, read from the workflow's steps; a job of its own reads no step), and
``collect()``, ``iterdeps()`` and ``graph`` over them."""

from __future__ import annotations

import pytest
from celery import chain, chord, group
from sqlalchemy import Engine

from tests.support import canvas_tasks as t

pytestmark = pytest.mark.timeout(120)


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
