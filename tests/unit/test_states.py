"""The state machine: documented exits, the ALLOWED table, can() and the state partition."""

from __future__ import annotations

import ast
import inspect
import itertools

import pytest

from jobsapp.lifecycle.rules import states
from jobsapp.lifecycle.rules.states import (
    ACTIVE_STATES,
    ALL_STATES,
    ALLOWED,
    TERMINAL_STATES,
    State,
    Transition,
    can,
    is_active,
    is_terminal,
)

SOURCES: list[State | None] = [None, *State]

# Who performs each transition, as a word the docstring of a state it leaves must name.
ACTOR_WORD = {
    Transition.ENQUEUE: "enqueue",
    Transition.CLAIM: "claim",
    Transition.SUCCEED: "worker",
    Transition.RETRY: "worker",
    Transition.SNOOZE: "worker",
    Transition.FAIL: "worker",
    Transition.REAP_REQUEUE: "reaper",
    Transition.REAP_FAIL: "reaper",
    Transition.REPLAY: "replay",
    Transition.RERUN: "enqueue",
    Transition.CANCEL: "cancel",
    Transition.EXPIRE: "expire",
}


def member_docstrings() -> dict[str, str]:
    """The string literal under each ``State`` member (Enum members keep no ``__doc__``)."""
    tree = ast.parse(inspect.getsource(states))
    cls = next(
        node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "State"
    )
    docs: dict[str, str] = {}
    body = cls.body
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.Assign)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            target = node.targets[0]
            assert isinstance(target, ast.Name)
            docs[target.id] = after.value.value
    return docs


def leaving(state: State) -> set[Transition]:
    return {t for t, (sources, _) in ALLOWED.items() if state in sources}


# --- docstrings -----------------------------------------------------------------------------


def test_every_state_has_a_docstring() -> None:
    docs = member_docstrings()
    assert set(docs) == {s.name for s in State}
    for name, text in docs.items():
        assert len(text.split()) >= 5, f"State.{name} docstring is too thin: {text!r}"
        assert "Left" in text, f"State.{name} docstring does not say who moves a job out"


def test_terminal_docstrings_say_terminal() -> None:
    docs = member_docstrings()
    for state in State:
        assert ("Terminal" in docs[state.name]) == is_terminal(state), state


@pytest.mark.parametrize(
    "state",
    [
        State.QUEUED,
        State.RUNNING,
        State.SUCCEEDED,
        State.FAILED,
    ],
)
def test_docstring_names_every_actor_that_moves_a_job_out(state: State) -> None:
    text = member_docstrings()[state.name].lower()
    missing = {t.value for t in leaving(state) if ACTOR_WORD[t] not in text}
    assert not missing, f"State.{state.name} docstring does not name: {sorted(missing)}"


# --- the ALLOWED table ----------------------------------------------------------------------


def test_every_state_changing_transition_is_in_the_table() -> None:
    # SKIP is journaled as an event but changes no state (the run never started).
    assert set(ALLOWED) == set(Transition) - {Transition.SKIP, Transition.CANCEL_REQUEST}
    assert set(ACTOR_WORD) == set(ALLOWED)


def test_terminal_states_are_left_only_by_replay_or_rerun() -> None:
    for transition, (sources, _) in ALLOWED.items():
        if any(s is not None and is_terminal(s) for s in sources):
            assert transition in {Transition.REPLAY, Transition.RERUN}, transition


def test_replay_and_rerun_reopen_to_queued() -> None:
    assert ALLOWED[Transition.REPLAY] == ((State.FAILED,), State.QUEUED)
    assert set(ALLOWED[Transition.RERUN][0]) == {State.SUCCEEDED, State.FAILED}
    assert ALLOWED[Transition.RERUN][1] is State.QUEUED


def test_only_enqueue_and_foreign_claim_start_from_no_row() -> None:
    from_nothing = {t for t, (sources, _) in ALLOWED.items() if None in sources}
    assert from_nothing == {Transition.ENQUEUE, Transition.CLAIM}


@pytest.mark.parametrize(
    ("transition", "sources", "target"),
    [
        (Transition.ENQUEUE, {None}, State.QUEUED),
        (Transition.CLAIM, {State.QUEUED, None}, State.RUNNING),
        (Transition.SUCCEED, {State.RUNNING}, State.SUCCEEDED),
        (Transition.RETRY, {State.RUNNING}, State.QUEUED),
        (Transition.SNOOZE, {State.RUNNING}, State.QUEUED),
        (Transition.FAIL, {State.RUNNING}, State.FAILED),
        (Transition.REAP_REQUEUE, {State.RUNNING}, State.QUEUED),
        (Transition.REAP_FAIL, {State.RUNNING}, State.FAILED),
        (Transition.REPLAY, {State.FAILED}, State.QUEUED),
        (Transition.RERUN, {State.SUCCEEDED, State.FAILED}, State.QUEUED),
        (Transition.CANCEL, {State.QUEUED, State.RUNNING}, State.FAILED),
        (Transition.EXPIRE, {State.QUEUED}, State.FAILED),
    ],
)
def test_table_matches_the_design(
    transition: Transition, sources: set[State | None], target: State
) -> None:
    """docs/lifecycle.md: each transition leaves exactly these states."""
    assert set(ALLOWED[transition][0]) == sources
    assert ALLOWED[transition][1] is target


def test_no_transition_enters_the_state_it_leaves_except_none() -> None:
    # running -> running (heartbeat) is an UPDATE of heartbeat_at, not a state transition.
    for transition, (sources, target) in ALLOWED.items():
        assert target not in sources, transition


def test_every_state_is_reachable_and_every_active_state_can_end() -> None:
    reachable: set[State | None] = {None}
    frontier: list[State | None] = [None]
    while frontier:
        here = frontier.pop()
        for sources, target in ALLOWED.values():
            if here in sources and target not in reachable:
                reachable.add(target)
                frontier.append(target)
    assert reachable == {None, *State}
    for state in ACTIVE_STATES:
        ends = {target for sources, target in ALLOWED.values() if state in sources}
        assert ends - {State.QUEUED, State.RUNNING}, f"{state} has no way to a terminal state"


# --- can() ----------------------------------------------------------------------------------


@pytest.mark.parametrize("transition", list(ALLOWED))
@pytest.mark.parametrize("current", SOURCES)
def test_can_is_exactly_the_table(transition: Transition, current: State | None) -> None:
    assert can(transition, current) is (current in ALLOWED[transition][0])


def test_can_examples() -> None:
    assert can(Transition.CLAIM, State.QUEUED)
    assert can(Transition.CLAIM, None)
    assert not can(Transition.CLAIM, State.RUNNING)
    assert not can(Transition.SUCCEED, State.QUEUED)
    assert not can(Transition.FAIL, State.SUCCEEDED)
    assert not can(Transition.REPLAY, State.SUCCEEDED)
    assert can(Transition.RERUN, State.SUCCEEDED)
    assert can(Transition.CANCEL, State.RUNNING)
    assert not can(Transition.CANCEL, State.SUCCEEDED)
    assert not can(Transition.ENQUEUE, State.FAILED)


def test_can_accepts_the_plain_string_read_from_a_row() -> None:
    # Rows carry state as text; StrEnum equality keeps the table usable with it.
    assert can(Transition.CLAIM, "queued")  # type: ignore[arg-type]
    assert not can(Transition.CLAIM, "running")  # type: ignore[arg-type]


# --- the partition --------------------------------------------------------------------------


def test_active_and_terminal_partition_all_states() -> None:
    assert not set(ACTIVE_STATES) & set(TERMINAL_STATES)
    assert set(ACTIVE_STATES) | set(TERMINAL_STATES) == set(ALL_STATES)
    assert len(ALL_STATES) == len(set(ALL_STATES))
    assert set(ALL_STATES) == {s.value for s in State}
    assert set(ACTIVE_STATES) == {"queued", "running"}
    assert set(TERMINAL_STATES) == {"succeeded", "failed"}


@pytest.mark.parametrize("state", list(State))
def test_each_state_is_exactly_one_of_active_or_terminal(state: State) -> None:
    assert is_active(state) != is_terminal(state)
    assert is_active(state.value) == is_active(state)
    assert is_terminal(state.value) == is_terminal(state)


def test_unknown_state_is_neither() -> None:
    assert not is_active("cancelled")
    assert not is_terminal("cancelled")
