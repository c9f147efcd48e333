"""A canvas compiled into steps (no database): what each step waits for, what it starts,
its derived job id, and the canvases refused before anything is written."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from celery import Celery, chain, chord, group

from jobsapp.attachments.tasks import TASK_NAME as ATTACHMENT_TASK
from jobsapp.celery_app import app
from jobsapp.lifecycle import lifecycle_task
from jobsapp.lifecycle.journal.workflow import FAILURE, START, SUCCESS, Step, body_lineage
from jobsapp.lifecycle.workflows.canvas import Compiler, MixedCanvas, is_lifecycle_canvas
from tests.support import canvas_tasks as t

WORKFLOW = uuid.UUID(int=20)


def compiled(sig: Any, **routing: Any) -> dict[str, Step]:
    """``sig``'s steps; ``routing``: the queue and priority of a whole canvas's apply_async."""
    compiler = Compiler(WORKFLOW)
    compiler.node(sig, "0", None, (), (), routing)
    return {step.path: step for step in compiler.steps()}


def routes(steps: dict[str, Step]) -> dict[str, tuple[str | None, int | None]]:
    return {path: (step.queue, step.priority) for path, step in steps.items()}


def job(path: str) -> str:
    return str(uuid.uuid5(WORKFLOW, path))


def test_a_group_inside_a_chain_is_a_fork_then_a_join_in_order() -> None:
    # Celery's chain makes the group and the step after it a chord.
    steps = compiled(chain(t.add.s(1, 1), group(t.add.s(1), t.add.s(2)), t.tsum.s()))
    assert steps["0.0"].trigger == START
    assert list(steps["0.0"].next) == [job("0.1.h.0"), job("0.1.h.1")]
    assert (steps["0.1.h.1"].trigger, steps["0.1.h.1"].after) == (SUCCESS, job("0.0"))
    assert steps["0.1.body"].after == [job("0.1.h.0"), job("0.1.h.1")]
    assert steps["0.1.body"].job_id == uuid.UUID(job("0.1.body"))


def test_a_group_in_a_group_or_in_a_chords_header_is_unrolled_as_celery_unrolls_it() -> None:
    # Celery's group unrolls a member group: one flat list of results, members in order.
    steps = compiled(group(group(t.add.s(1, 1), t.add.s(2, 2)), t.add.s(3, 3)))
    assert [(p, list(steps[p].args)) for p in steps] == [
        ("0.0", [1, 1]),
        ("0.1", [2, 2]),
        ("0.2", [3, 3]),
    ]
    steps = compiled(chord([group(t.add.s(1, 1), t.add.s(2, 2)), t.add.s(3, 3)], t.tsum.s()))
    assert steps["0.body"].after == [job("0.h.0"), job("0.h.1"), job("0.h.2")]
    # A chain in a group stays one member: its last step's value.
    steps = compiled(group(chain(t.add.s(1, 1), t.add.s(2)), t.add.s(3, 3)))
    assert {"0.0.0", "0.0.1", "0.1"} == set(steps)


def test_a_chains_errback_is_every_steps_and_a_chords_is_its_bodys() -> None:
    steps = compiled(chain(t.add.s(1, 1), t.add.s(2)).on_error(t.identity.s()))
    assert [len(steps[p].errbacks) for p in ("0.0", "0.1")] == [1, 1]
    assert (steps["0.0.err0"].trigger, steps["0.0.err0"].after) == (FAILURE, job("0.0"))
    steps = compiled(chord([t.add.s(1, 1), t.add.s(2, 2)], t.tsum.s().on_error(t.identity.s())))
    assert [len(steps[p].errbacks) for p in ("0.h.0", "0.h.1", "0.body")] == [0, 0, 1]


def test_immutable_and_partial_arguments_and_step_options_are_kept() -> None:
    steps = compiled(chain(t.add.s(1), t.add.si(5, 5).set(queue="b", priority=3)))
    assert (list(steps["0.0"].args), steps["0.0"].immutable) == ([1], False)
    step = steps["0.1"]
    assert (list(step.args), step.immutable, step.queue, step.priority) == ([5, 5], True, "b", 3)


def test_a_canvas_queue_and_priority_go_where_celery_sends_them() -> None:
    # Celery: every member of a group, a chain's first task only, a chord's header and
    # body; over a step's own (the call's options win, as in Signature.apply_async).
    assert routes(compiled(group(t.add.s(1, 1), t.add.s(2, 2).set(queue="own")), queue="q")) == {
        "0.0": ("q", None),
        "0.1": ("q", None),
    }
    assert routes(compiled(chain(t.add.s(1, 1), t.add.s(2)), queue="q", priority=3)) == {
        "0.0": ("q", 3),
        "0.1": (None, None),
    }
    assert routes(
        compiled(chord([t.add.s(1, 1)], t.tsum.s().on_error(t.identity.s())), queue="q")
    ) == {
        "0.h.0": ("q", None),
        "0.body": ("q", None),
        "0.body.err0": (None, None),
    }


def test_the_body_of_an_empty_header_starts_at_once() -> None:
    steps = compiled(chord([], t.tsum.s()))
    assert (steps["0.body"].trigger, steps["0.body"].after) == (START, [])


def test_the_same_canvas_compiles_to_the_same_steps() -> None:
    canvas = chord([t.add.s(i, i) for i in range(3)], t.tsum.s())
    assert compiled(canvas) == compiled(canvas)


def test_refused_before_anything_is_written() -> None:
    with pytest.raises(TypeError, match=r"does not support \['expires'\] on a step"):
        compiled(chain(t.add.s(1, 1), t.add.s(2).set(expires=5)))
    with pytest.raises(TypeError, match="only tasks of the jobs table run in a canvas"):
        compiled(chain(t.add.s(1, 1), app.tasks[ATTACHMENT_TASK].si(attachment_id="a")))
    with pytest.raises(TypeError, match="cannot link a callback to group"):
        compiled(group(t.add.s(1, 1)).set(link=[t.identity.s()]))


def test_a_canvas_is_ours_theirs_or_refused_as_mixed() -> None:
    plain = Celery("plain-compile")
    plain_add = plain.task(name="plain.compile.add")(t.BODIES["add"])
    assert is_lifecycle_canvas(chain(t.add.s(1, 1), t.add.s(2)))
    assert not is_lifecycle_canvas(chain(plain_add.s(1, 1), plain_add.s(2)))
    with pytest.raises(MixedCanvas, match=r"^plain\.compile\.add is a plain Celery task"):
        is_lifecycle_canvas(group(t.add.s(1, 1), plain_add.s(2, 2)))


def lineages(steps: dict[str, Step]) -> dict[str, Any]:
    return {path: step.lineage for path, step in steps.items()}


def test_a_steps_lineage_is_what_celerys_canvas_would_send_it_with() -> None:
    # Celery: a chain's steps root at its first task; a group's members (and of a chain
    # in a group, its last task) carry the group's id and are their own roots; a chord's
    # body carries the header's id, its root and parent the member that finishes last.
    wf = str(WORKFLOW)
    assert lineages(compiled(chain(t.add.s(1, 1), t.add.s(2)))) == {
        "0.0": {"root_id": job("0.0"), "parent_id": None, "group": None},
        "0.1": {"root_id": job("0.0"), "group": None},
    }
    assert lineages(compiled(group(t.add.s(1, 1), chain(t.add.s(1, 1), t.add.s(2))))) == {
        "0.0": {"root_id": job("0.0"), "parent_id": None, "group": wf},
        "0.1.0": {"root_id": job("0.1.0"), "parent_id": None, "group": None},
        "0.1.1": {"root_id": job("0.1.0"), "group": wf},
    }
    steps = compiled(chord([t.add.s(1, 1), t.add.s(2, 2)], t.tsum.s()))
    assert steps["0.body"].lineage == {"root_id": None, "group": wf}


def test_a_canvas_sent_from_a_body_descends_from_that_body() -> None:
    compiler = Compiler(WORKFLOW, sender=("root", "sender"))
    compiler.node(chord([t.add.s(1, 1), t.add.s(2, 2)], t.tsum.s()), "0", None, (), ())
    steps = {step.path: step.lineage for step in compiler.steps()}
    assert steps["0.h.0"] == {"root_id": "root", "parent_id": "sender", "group": str(WORKFLOW)}
    assert steps["0.body"] == {"root_id": "root", "group": str(WORKFLOW)}


def test_a_started_steps_parent_is_the_step_whose_end_started_it() -> None:
    started_by = {"job_id": "m1", "lineage": {"root_id": "m1", "parent_id": None}}
    chord_body = {"lineage": {"root_id": None, "group": "g"}}
    assert body_lineage(chord_body, started_by) == {
        "root_id": "m1",
        "parent_id": "m1",
        "group": "g",
    }
    chained = {"lineage": {"root_id": "c1", "group": None}}
    assert body_lineage(chained, started_by) == {"root_id": "c1", "parent_id": "m1", "group": None}
    first = {"lineage": {"root_id": "s", "parent_id": "p", "group": None}}
    assert body_lineage(first, None) == first["lineage"]
    assert body_lineage({"lineage": None}, started_by) is None  # written before migration 0031


def test_a_steps_own_countdown_is_kept_with_it() -> None:
    steps = compiled(chain(t.add.s(1, 1), t.add.s(2).set(countdown=5)))
    assert [steps[p].countdown for p in ("0.0", "0.1")] == [None, 5.0]
    assert compiled(t.add.s(1, 1).set(countdown=0))["0"].countdown is None


def test_a_steps_countdown_beyond_a_year_or_not_a_number_is_refused_at_compile() -> None:
    for bad in (float("inf"), 400 * 24 * 3600, "soon"):
        with pytest.raises(ValueError, match=r"^countdown must be between 0 and"):
            compiled(chain(t.add.s(1, 1), t.add.s(2).set(countdown=bad)))


def name_by_args(task: Any, args: Any, kwargs: Any, options: Any) -> str:
    del task, kwargs, options
    return f"named:{args}"


@lifecycle_task(app, name="tests.unit.named_step", shadow_name=name_by_args)
def named_step(x: int, y: int = 0) -> int:
    return x + y


def test_a_steps_shadow_is_its_own_or_its_canvas_s_and_refused_when_no_name() -> None:
    steps = compiled(chain(t.add.s(1, 1), t.add.s(2).set(shadow="mine")))
    assert [steps[p].shadow for p in ("0.0", "0.1")] == [None, "mine"]
    # A whole canvas's shadow goes where its queue goes, over a step's own.
    steps = compiled(group(t.add.s(1, 1), t.add.s(2, 2).set(shadow="mine")), shadow="all")
    assert [steps[p].shadow for p in ("0.0", "0.1")] == ["all", "all"]
    with pytest.raises(TypeError, match=r"shadow is a name to show, a string, not int"):
        compiled(chain(t.add.s(1, 1), t.add.s(2).set(shadow=7)))


def test_a_tasks_shadow_name_names_the_steps_whose_arguments_are_whole_at_compile() -> None:
    # A first step, or an immutable one: asked with its arguments. A later step given what
    # it waits for is started by the journal, which asks no team code: its task's name.
    steps = compiled(chain(named_step.s(1), named_step.s(), named_step.si(5, 5)))
    assert [steps[p].shadow for p in ("0.0", "0.1", "0.2")] == ["named:(1,)", None, "named:(5, 5)"]
    assert compiled(named_step.s(1).set(shadow="mine"))["0"].shadow == "mine"
