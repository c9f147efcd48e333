"""What a step's success sent, as Celery's tracer records it in ``children`` (no database):
a canvas compiled into steps, then the shape ``step_children`` reads from them."""

from __future__ import annotations

import uuid
from typing import Any

from celery import chain, chord, group

from jobsapp.lifecycle.journal.step_children import ResultTuple, Sent
from jobsapp.lifecycle.workflows.canvas import Compiler
from tests.support import canvas_tasks as t

WORKFLOW = uuid.UUID(int=21)
GROUP = f"group {WORKFLOW}"


def steps(sig: Any) -> dict[str, dict[str, Any]]:
    """``sig``'s step rows by path, as ``workflow_steps`` keeps them."""
    compiler = Compiler(WORKFLOW)
    compiler.node(sig, "0", None, (), ())
    return {step.path: step.row() for step in compiler.steps()}


def children(rows: dict[str, dict[str, Any]], path: str) -> tuple[list[Any], bool]:
    """The children of the step at ``path`` (as the paths of their steps), and whether
    the steps it started were all it took to answer them."""
    by_id = {str(row["job_id"]): row for row in rows.values()}
    sent = [by_id[n] for n in rows[path]["next"] if not isinstance(by_id[n]["after"], list)]
    shape = Sent.of(path, sent)
    found = shape.results(list(rows.values()), str(WORKFLOW))
    if shape.known:
        assert shape.results(sent, str(WORKFLOW)) == found
    paths = {str(row["job_id"]): p for p, row in rows.items()}
    return [_named(r, paths) for r in found], shape.known


def _named(result: ResultTuple, paths: dict[str, str]) -> Any:
    (job_id, parent), members = result
    if members is not None:
        return [f"group {job_id}", [_named(m, paths) for m in members]]
    return paths[job_id] if parent is None else [paths[job_id], _named(parent, paths)]


def test_a_chains_step_sent_the_next_one_and_its_last_sent_nothing() -> None:
    rows = steps(chain(t.add.s(1, 1), t.add.s(2), t.add.s(3)))
    assert children(rows, "0.0") == (["0.1"], True)
    assert children(rows, "0.1") == (["0.2"], True)
    assert children(rows, "0.2") == ([], True)


def test_a_step_a_group_follows_sent_the_group_its_members_the_results_of_their_last_tasks() -> (
    None
):
    rows = steps(chain(t.add.s(1, 1), group(t.add.s(1), t.add.s(2))))
    assert children(rows, "0.0") == ([[GROUP, ["0.1.0", "0.1.1"]]], True)
    rows = steps(chain(t.add.s(1, 1), group(chain(t.add.s(1), t.add.s(2)), t.add.s(3))))
    assert children(rows, "0.0") == ([[GROUP, [["0.1.0.1", "0.1.0.0"], "0.1.1"]]], False)


def test_a_step_a_chord_follows_sent_its_header_and_a_member_sent_nothing() -> None:
    # Celery's backend sends a chord's body once a member's result is stored: no member's
    # children name it.
    rows = steps(chain(t.add.s(1, 1), chord([t.add.s(1), t.add.s(2)], t.tsum.s())))
    assert children(rows, "0.0") == ([[GROUP, ["0.1.h.0", "0.1.h.1"]]], True)
    assert children(rows, "0.1.h.0") == ([], True)
    rows = steps(chain(t.add.s(1, 1), chord([t.add.s(1)], t.tsum.s())))
    assert children(rows, "0.0") == ([[GROUP, ["0.1.h.0"]]], True)


def test_a_steps_callbacks_come_before_the_chains_next_step() -> None:
    first = t.add.s(1, 1)
    first.link(t.identity.s())
    rows = steps(chain(first, t.add.s(2)))
    assert children(rows, "0.0") == (["0.0.link0", "0.1"], True)
    # A chain's link is its last task's.
    linked = chain(t.add.s(1, 1), t.add.s(2))
    linked.link(t.identity.s())
    rows = steps(linked)
    assert children(rows, "0.0") == (["0.1"], True)
    assert children(rows, "0.1") == (["0.link0"], True)


def test_a_callback_that_is_a_chain_is_sent_as_its_first_task_and_its_steps_follow() -> None:
    first = t.add.s(1, 1)
    first.link(chain(t.identity.s(), t.add.s(1)))
    rows = steps(first)
    assert children(rows, "0") == (["0.link0.0"], True)
    assert children(rows, "0.link0.0") == (["0.link0.1"], True)


def test_several_callbacks_are_sent_as_one_group_a_group_among_them_by_itself_first() -> None:
    first = t.add.s(1, 1)
    first.link(t.identity.s())
    first.link(chain(t.identity.s(), t.add.s(1)))
    rows = steps(first)
    expected = [[GROUP, ["0.link0", ["0.link1.1", "0.link1.0"]]]]
    assert children(rows, "0") == (expected, False)
    first = t.add.s(1, 1)
    first.link(t.identity.s())
    first.link(group(t.add.s(1), t.add.s(2)))
    rows = steps(first)
    expected = [[GROUP, ["0.link1.0", "0.link1.1"]], [GROUP, ["0.link0"]]]
    assert children(rows, "0") == (expected, True)
