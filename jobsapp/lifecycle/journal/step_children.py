"""What a workflow step's success sent: Celery's ``children`` of its result.

Celery's tracer records the results of what a task's success sends before it stores that
success (``celery/app/trace.py``: the ``link`` callbacks, then the chain's next task), and
its result meta keeps them as ``children``: ``AsyncResult(id).children`` of a chain's step
is the next step's result, and ``collect()``, ``iterdeps()`` and ``graph`` walk a chain
from its first step through them. The journal wrote those steps with the canvas (a step's
``next``) and the step's success started them in its own transaction, so they are read,
never recorded: the step's row and its successors' by primary key (the workflow's rows, by
its index, only when a group after the step has a member that is a canvas of its own). A
job of its own reads nothing, and nothing is written for any.

In Celery's order and shapes:
- the callbacks (``link``): one as its result (a chain's, its first task's); several as one
  group's, as Celery sends them (a lifecycle group answers to its workflow's id);
- the chain's next task as its result; a group (or a chord's header) after the step as
  that group's result, its members' results those of each member's last task;
- never a chord's body, which Celery's backend sends after a member's result is stored,
  nor a step that never started (its chain ended: ``self.request.chain = None``).

Each is Celery's result tuple (``AsyncResult.as_tuple``), which ``result_from_tuple``
rebuilds for the reader.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from jobsapp.lifecycle.journal import workflow
from jobsapp.lifecycle.journal.reads import step_runs
from jobsapp.lifecycle.journal.workflow import CANCELLED, FAILURE, canvas_order

Row = Mapping[str, Any]
# A canvas node a success sent: its path, and the steps of it the success started.
Node = tuple[str, Sequence[Row]]
# Celery's result tuple: ((id, its parent's tuple), None); a group's: ((id, None), members).
ResultTuple = tuple[tuple[str, Any], list[Any] | None]


def children(conn: Connection, job_id: uuid.UUID, workflow_id: uuid.UUID) -> list[ResultTuple]:
    """Celery's ``children`` of the succeeded step ``job_id`` of ``workflow_id``."""
    step = next(iter(workflow.step_rows(conn, [str(job_id)])), None)
    if step is None or not step["next"]:
        return []
    sent = _started(conn, [s for s in workflow.step_rows(conn, step["next"]) if _sent_by(s)])
    shape = Sent.of(step["path"], sent)
    rows = sent if shape.known else workflow.steps_of(conn, workflow_id)
    return shape.results(rows, str(workflow_id))


def _sent_by(step: Row) -> bool:
    """Whether a successor is sent by the step's success in Celery: a chord's body (it
    waits for several) is sent by the backend once the member's result is stored."""
    return not isinstance(step["after"], list)


def _started(conn: Connection, sent: Sequence[Row]) -> list[Row]:
    """``sent`` but the steps that never started (cancelled before the success could)."""
    cancelled = [s for s in sent if s["blocked_outcome"] == CANCELLED]
    ran = step_runs(conn, cancelled) if cancelled else {}
    return [s for s in sent if s["blocked_outcome"] != CANCELLED or s["job_id"] in ran]


# --- pure: the canvas's shape, from the steps' paths ("0.1", "0.1.h.0", "0.link0") --------


@dataclass(frozen=True)
class Sent:
    """What a step's success started, by the canvas node each step starts: its callbacks,
    then the chain's next node (None: the chain ends there)."""

    links: Sequence[Node]
    following: Node | None

    @classmethod
    def of(cls, step_path: str, sent: Sequence[Row]) -> Sent:
        """``sent``: the steps the success of the step at ``step_path`` started."""
        links: dict[str, list[Row]] = {}
        following: list[Row] = []
        for row in sent:
            link = _link_path(step_path, row["path"])
            (following if link is None else links.setdefault(link, [])).append(row)
        after = (_following_path(step_path, following), following) if following else None
        return cls(list(links.items()), after)

    @property
    def known(self) -> bool:
        """Whether the steps it started are all the results need (else the workflow's)."""
        grouped = len(self.links) > 1  # several callbacks: each a member of one group
        known = all(_known_from_first(node, grouped) for node in self.links)
        return known and (self.following is None or _known_from_first(self.following, False))

    def results(self, rows: Sequence[Row], group_id: str) -> list[ResultTuple]:
        """The result tuples (``rows``: the steps), as Celery's tracer records them: the
        callbacks, then the chain's next node; several callbacks are sent as one group (a
        callback that is a group by itself, each before it)."""
        found = [_result(node, rows, group_id) for node in self.links]
        if len(self.links) > 1:
            groups = [r for r in found if r[1] is not None]
            tasks = [_outputs(p, rows)[0] for p, f in self.links if _group_path(p, f) is None]
            found = [*groups, *([_group(group_id, tasks)] if tasks else [])]
        if self.following is not None:
            found.append(_result(self.following, rows, group_id))
        return found


def _known_from_first(node: Node, as_member: bool) -> bool:
    """Whether a node's result is known from the steps it starts with: a task's, a chain's
    (its first task's) or a group's of tasks; not a group with a member that is a canvas
    of its own, nor a chain ``as_member`` of a group (whose result is its last task's)."""
    path, first = node
    group = _group_path(path, first)
    if group is not None:
        return all(len(_parts(row["path"])) == len(_parts(group)) + 1 for row in first)
    return not as_member or first[0]["path"] == path


def _result(node: Node, rows: Sequence[Row], group_id: str) -> ResultTuple:
    """A node's result as its first send gives it: a task's (a chain's first task's), or
    a group's of its members' outputs."""
    path, first = node
    group = _group_path(path, first)
    if group is None:
        return ((str(first[0]["job_id"]), None), None)
    return _group(group_id, _outputs(group, rows))


def _group(group_id: str, members: list[ResultTuple]) -> ResultTuple:
    return ((group_id, None), members)


def _outputs(node_path: str, rows: Sequence[Row]) -> list[ResultTuple]:
    """The results a node answers with: its steps nothing inside it runs after (a member
    chain's last task, whose parents are the chain's steps before it), in canvas order."""
    inside = {str(r["job_id"]): r for r in rows if _inside(node_path, r)}
    last = [r for r in inside.values() if not any(str(n) in inside for n in r["next"])]
    return [_with_parents(r, inside) for r in sorted(last, key=canvas_order)]


def _with_parents(row: Row, inside: Mapping[str, Row]) -> ResultTuple:
    after = row["after"]
    within = isinstance(after, str) and after in inside
    return ((str(row["job_id"]), _with_parents(inside[after], inside) if within else None), None)


def _inside(node_path: str, row: Row) -> bool:
    """Whether ``row`` is a step of the node (not one of its callbacks or errbacks)."""
    parts, node = _parts(row["path"]), _parts(node_path)
    if parts[: len(node)] != node or row["trigger"] == FAILURE:
        return False
    return not any(p.startswith(("link", "err")) for p in parts[len(node) :])


def _link_path(step_path: str, path: str) -> str | None:
    """The callback node ``path`` starts, if it is one: a ``linkN`` part past where its
    path parts from the step's own."""
    mine, theirs = _parts(step_path), _parts(path)
    for i in range(_shared(mine, theirs), len(theirs)):
        if theirs[i].startswith("link"):
            return ".".join(theirs[: i + 1])
    return None


def _following_path(step_path: str, following: Sequence[Row]) -> str:
    """The node the chain's next steps start: the group several are members of, else the
    one past where its path parts from the step's (a chain's next task, or a canvas
    starting with it)."""
    first, *others = [_parts(row["path"]) for row in following]
    if not others:
        return ".".join(first[: _shared(_parts(step_path), first) + 1])
    common = first
    for path in others:
        common = common[: _shared(common, path)]
    return ".".join(common)


def _group_path(node_path: str, first: Sequence[Row]) -> str | None:
    """The group a node's first steps are members of: the node when it starts several, a
    chord's header within it; None for one task (Celery sends a group of one as it)."""
    if len(first) > 1:
        return node_path
    node, parts = _parts(node_path), _parts(first[0]["path"])
    rest = parts[len(node) :]
    return ".".join(parts[: len(node) + rest.index("h") + 1]) if "h" in rest else None


def _parts(path: str) -> list[str]:
    return str(path).split(".")


def _shared(a: Sequence[str], b: Sequence[str]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
