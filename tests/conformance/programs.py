"""The idioms: small programs from Celery's user guide (Tasks, Calling, Canvas) and the API of
``celery.result`` and ``celery.app.task``, each written once as a Celery user writes it and
run against both apps. An answer is what that user checks: a value, a state, an exception's
type and message.

``PROGRAMS`` maps an idiom to its program and Celery's answer (the bare app must give it,
so an expectation here cannot drift from Celery). ``DIFFERENT`` holds the idioms where
jobsapp answers otherwise by design, with its answer; docs/celery-compat.md gives the
guarantee behind each.
"""

from __future__ import annotations

import copy
import pickle
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from datetime import time as clock_time
from decimal import Decimal
from typing import Any
from uuid import UUID

from celery import Celery, chain, chord, group, signature, states
from celery.result import AsyncResult, GroupResult, ResultSet, result_from_tuple
from celery.signals import before_task_publish
from kombu import Queue
from kombu.exceptions import EncodeError

from tests.conformance import bodies

WAIT = 30


@dataclass(frozen=True)
class Side:
    """One app's tasks by short name (``s.add``), and the app itself."""

    app: Celery
    tasks: dict[str, Any]
    prefix: str

    def __getattr__(self, short: str) -> Any:
        try:
            return self.tasks[short]
        except KeyError:
            raise AttributeError(short) from None

    def name(self, short: str) -> str:
        return f"{self.prefix}.{short}"


def token() -> str:
    return uuid.uuid4().hex[:10]


def raised(call: Callable[[], Any], *hide: str) -> list[str]:
    """``[type name, message]`` of what ``call`` raised (``hide`` replaced by ``<token>``)."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the answer is which exception
        said = str(exc)
        for text in hide:
            said = said.replace(text, "<token>")
        return [type(exc).__name__, said]
    return ["nothing raised", ""]


def started(t: str) -> Any:
    """Wait until a held body says it started."""
    deadline = time.monotonic() + WAIT
    while bodies.runs(f"started:{t}") == 0:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# --- results and states ----------------------------------------------------------------


def by_id_from_anywhere(s: Side) -> Any:
    sent = s.add.delay(2, 3)
    held = sent.id  # a Django view keeps only the id
    return [AsyncResult(held, app=s.app).get(timeout=WAIT), isinstance(sent, AsyncResult)]


def send_task_get(s: Side) -> Any:
    return s.app.send_task(s.name("add"), args=(4, 5)).get(timeout=WAIT)


def send_task_kwargs_countdown(s: Side) -> Any:
    r = s.app.send_task(s.name("add"), kwargs={"x": 1, "y": 2}, countdown=1)
    return r.get(timeout=WAIT)


def states_of_success(s: Side) -> Any:
    r = s.add.delay(1, 1)
    value = r.get(timeout=WAIT)
    return [
        value,
        r.state,
        r.status,
        r.ready(),
        r.successful(),
        r.failed(),
        r.result,
        isinstance(r.date_done, datetime),
        r.traceback,
        r.wait(timeout=WAIT),
    ]


def body_exception_from_get(s: Side) -> Any:
    t = token()
    r = s.boom.delay(t)
    first = raised(lambda: r.get(timeout=WAIT), t)
    kept = r.get(timeout=WAIT, propagate=False)
    return [
        first,
        type(kept).__name__,
        r.state,
        r.failed(),
        type(r.result).__name__,
        "ValueError" in (r.traceback or ""),
        r.ready(),
    ]


def except_clause_around_get(s: Side) -> Any:
    t = token()
    try:
        s.boom.delay(t).get(timeout=WAIT)
    except ValueError as exc:  # how a team's code catches a task's error
        return ["caught", str(exc).replace(t, "<token>")]
    return ["not caught"]


def unknown_id_is_pending(s: Side) -> Any:
    r = AsyncResult(str(uuid.uuid4()), app=s.app)
    return [r.state, r.ready(), r.result, raised(lambda: r.get(timeout=0.5))[0]]


def callers_own_task_id(s: Side) -> Any:
    mine = f"order-{token()}"
    r = s.add.apply_async((2, 2), task_id=mine)
    return [r.id == mine, AsyncResult(mine, app=s.app).get(timeout=WAIT)]


def countdown_then_value(s: Side) -> Any:
    return s.add.apply_async((5, 5), countdown=1).get(timeout=WAIT)


def eta_then_value(s: Side) -> Any:
    eta = datetime.now(UTC) + timedelta(seconds=1)
    return s.add.apply_async((6, 6), eta=eta).get(timeout=WAIT)


def get_timeout_of_a_late_task(s: Side) -> Any:
    r = s.add.apply_async((1, 1), countdown=30)
    try:
        return [raised(lambda: r.get(timeout=0.5))[0], r.state, r.ready()]
    finally:
        r.revoke()


def scheduled_by_inspect(s: Side) -> Any:
    """Whether ``inspect().scheduled()`` lists a call due in a minute while it waits."""
    r = s.add.apply_async((2, 2), countdown=60)
    try:
        deadline, seen = time.monotonic() + 3, False
        while not seen and time.monotonic() < deadline:
            found = s.app.control.inspect(timeout=0.5).scheduled() or {}
            seen = any(r.id == e["request"]["id"] for held in found.values() for e in held)
        return [seen, r.state]
    finally:
        r.revoke()


def kwargs_only_call(s: Side) -> Any:
    return [
        s.add.apply_async(kwargs={"x": 3, "y": 4}).get(timeout=WAIT),
        s.add.delay(y=1, x=2).get(timeout=WAIT),
    ]


def headers_of_a_call(s: Side) -> Any:
    return s.tenant.apply_async((token(),), headers={"tenant": "acme"}).get(timeout=WAIT)


def headers_of_a_send_task(s: Side) -> Any:
    r = s.app.send_task(s.name("tenant"), args=(token(),), headers={"tenant": "acme"})
    return r.get(timeout=WAIT)


def options_without_effect_here(s: Side) -> Any:
    kinds = ({"add_to_parent": False}, {"serializer": "json"}, {"compression": "zlib"})
    return [s.add.apply_async((1, 2), **options).get(timeout=WAIT) for options in kinds]


def _second_queue(s: Side) -> str:
    """The worker's second queue, which few idioms use. RabbitMQ drops a message whose
    expiry (its TTL) passes while it waits in a queue, and it then reads PENDING for good on
    either side: one that should expire in the worker goes here, so a consumer takes it at
    once."""
    return s.app.conf.task_default_queue + "-second"


def queue_as_a_kombu_queue(s: Side) -> Any:
    second = Queue(_second_queue(s))
    return s.queue_seen.apply_async((1,), queue=second).get(timeout=WAIT)


def priority_and_queue(s: Side) -> Any:
    return [
        s.add.apply_async((1, 2), priority=7).get(timeout=WAIT),
        s.add.apply_async((2, 2), queue=_second_queue(s)).get(timeout=WAIT),
    ]


def result_set(s: Side) -> Any:
    rs = ResultSet([s.add.delay(1, 1), s.add.delay(2, 2)])
    return [rs.get(timeout=WAIT), rs.join(timeout=WAIT), rs.completed_count(), rs.successful()]


def progress_shown(s: Side) -> Any:
    t = token()
    r = s.progress.delay(t)
    try:
        started(t)
        seen = AsyncResult(r.id, app=s.app)
        shown = [seen.state, {**seen.info, "token": "<set>"}, seen.ready()]
    finally:
        bodies.release(t)
    return [*shown, r.get(timeout=WAIT), r.state]


def progress_streamed(s: Side) -> Any:
    t = token()
    r = s.progress.delay(t)
    seen: list[Any] = []

    def heard(meta: dict[str, Any]) -> None:
        # Celery's Redis result consumer hands on_message every message it receives, other
        # tasks' too: this thread's earlier idioms' results arrive here as well.
        if meta.get("task_id") != r.id:
            return
        seen.append(meta.get("status"))
        if meta.get("status") == "PROGRESS":
            bodies.release(t)

    started(t)
    return [r.get(timeout=WAIT, on_message=heard), seen]


def result_attributes(s: Side) -> Any:
    ok = s.add.delay(2, 3)
    ok.get(timeout=WAIT)
    bad = s.boom.delay(token())
    bad.get(timeout=WAIT, propagate=False)
    return [
        [ok.successful(), ok.failed(), ok.status, ok.result, isinstance(ok.date_done, datetime)],
        [bad.successful(), bad.failed(), bad.status, type(bad.result).__name__],
        ["Traceback" in (bad.traceback or ""), type(bad.get(propagate=False)).__name__],
        ok.wait(timeout=WAIT),
    ]


def frozen_signature(s: Side) -> Any:
    sig = s.add.s(1, 2)
    frozen = sig.freeze()
    r = sig.delay()
    members = group(s.add.s(1, 1), s.add.s(2, 2))
    frozen_group = members.freeze()
    sent = members.apply_async()
    named = str(uuid.uuid4())
    return [
        group(s.add.s(3, 3)).apply_async(task_id=named).id == named,
        [r.id == frozen.id, r.get(timeout=WAIT), s.add.AsyncResult(r.id).get(timeout=WAIT)],
        [
            sent.id == frozen_group.id,
            [m.id for m in sent.results] == [m.id for m in frozen_group.results],
        ],
        sent.get(timeout=WAIT),
    ]


def frozen_chain_chord(s: Side) -> Any:
    steps = chain(s.add.s(1, 1), s.add.s(10))
    frozen = steps.freeze()
    sent = steps.apply_async()
    joined = chord([s.add.s(1, 1), s.add.s(2, 2)], s.tsum.s())
    frozen_chord = joined.freeze()
    ran = joined.apply_async()
    return [
        [sent.id == frozen.id, sent.get(timeout=WAIT)],
        [ran.id == frozen_chord.id, ran.get(timeout=WAIT)],
    ]


def canvas_named_by_task_id(s: Side) -> Any:
    steps, joined = str(uuid.uuid4()), str(uuid.uuid4())
    sent = chain(s.add.s(1, 1), s.add.s(10)).apply_async(task_id=steps)
    ran = chord([s.add.s(1, 1)], s.tsum.s()).apply_async(task_id=joined)
    return [[sent.id == steps, sent.get(timeout=WAIT)], [ran.id == joined, ran.get(timeout=WAIT)]]


def group_piped_into_a_task(s: Side) -> Any:
    return (group(s.add.s(1, 1), s.add.s(2, 2)) | s.tsum.s()).apply_async().get(timeout=WAIT)


def lineage_of_a_call(s: Side) -> Any:
    def seen(result: Any, ids: dict[str, str]) -> list[Any]:
        found = result.get(timeout=WAIT)
        return [ids.get(found[0], found[0]), *(ids.get(x, x and "other") for x in found[1:3])]

    alone = s.lineage.delay()
    retried = s.lineage.delay(token())
    sender = s.sends_lineage.delay()
    sent = AsyncResult(sender.get(timeout=WAIT), app=s.app)
    return [
        seen(alone, {alone.id: "own"}),
        [*seen(retried, {retried.id: "own"}), retried.get(timeout=WAIT)[3]],
        seen(sent, {sent.id: "own", sender.id: "sender"}),
    ]


def lineage_of_canvas_steps(s: Side) -> Any:
    step = s.step_lineage
    c = chain(step.s(), s.lineage.si(token()), step.s()).apply_async()
    g = group(step.s(), step.s()).apply_async()
    h = chord([step.s(), step.s()], step.s()).apply_async()
    sender = s.sends_chain.delay()
    first, second = (AsyncResult(i, app=s.app) for i in sender.get(timeout=WAIT))
    names = {c.parent.parent.id: "c1", c.parent.id: "c2", c.id: "c3", g.id: "g"}
    names.update({r.id: f"g{i}" for i, r in enumerate(g.results)})
    names.update({h.id: "body", h.parent.id: "header", sender.id: "sender"})
    names.update({r.id: f"h{i}" for i, r in enumerate(h.parent.results)})
    names.update({first.id: "s1", second.id: "s2"})
    seen = [c.parent.parent, c.parent, c, *g.results, *h.parent.results, h, first, second]
    found = [[names.get(x, x) for x in r.get(timeout=WAIT)] for r in seen]
    # A chord's body is sent by the member that finishes last, in Celery as here: either.
    body = found[-3]
    found[-3] = [body[0], *("a member" if x in ("h0", "h1") else x for x in body[1:3]), body[3]]
    return found


def fields_of_a_call(s: Side) -> Any:
    plain = s.call_fields.delay().get(timeout=WAIT)
    later = s.call_fields.apply_async(countdown=1, expires=60).get(timeout=WAIT)
    return [plain, later]


def extended_result_fields(s: Side) -> Any:
    sent = s.add.apply_async((2, 3))
    sent.get(timeout=WAIT)
    r = AsyncResult(sent.id, app=s.app)  # another handle: read from the backend
    routed = s.app.conf.task_default_queue
    return [r.name == s.add.name, r.args, r.kwargs, r.retries, r.queue == routed]


def chain_ended_by_a_step(s: Side) -> Any:
    t = token()
    c = chain(s.add.s(1, 1), s.ends_chain.s(), s.count_run.si(t)).apply_async()
    ended = c.parent.get(timeout=WAIT)
    time.sleep(2)  # Celery would have sent the next step at once: long enough to run it
    return [ended, bodies.runs(t), c.state, c.ready()]


# Seconds: revoked before their countdown ends on a loaded machine too (at 1 s a group's
# member once started first, and a revoke lets a running task finish).
REVOKED_IN = 3


def revoke_many(s: Side) -> Any:
    a = s.add.apply_async((1, 1), countdown=REVOKED_IN)
    b = s.add.apply_async((2, 2), countdown=REVOKED_IN)
    s.app.control.revoke([a.id, b.id])
    g = group(s.add.s(3, 3), s.add.s(4, 4)).apply_async(countdown=REVOKED_IN)
    g.revoke()
    # Celery's revoke reaches the workers later: each answer is read once get() raised.
    return [[raised(lambda r=r: r.get(timeout=WAIT))[0], r.state] for r in (a, b, *g.results)] + [
        raised(lambda: g.get(timeout=WAIT))[0]
    ]


def countdown_of_a_step(s: Side) -> Any:
    # A step's own countdown counts from when what it waits for ended; a group's member's
    # from the group's start. Timed from the call: a loaded machine's get() of the first
    # step may return well after it ended (its end read late made a gap read short).
    sent = time.monotonic()
    c = chain(s.add.s(1, 1), s.add.s(2).set(countdown=1.5)).apply_async()
    first = c.parent.get(timeout=WAIT)
    value = c.get(timeout=WAIT)
    later = time.monotonic() - sent >= 1.5
    start = time.monotonic()
    g = group(s.add.s(1, 1).set(countdown=1.5), s.add.s(2, 2)).apply_async()
    quick = g.results[1].get(timeout=WAIT)
    slow = g.results[0].get(timeout=WAIT)
    return [first, value, later, quick, slow, time.monotonic() - start >= 1.5]


def canvas_shapes(s: Side) -> Any:
    shapes: list[tuple[Any, tuple[Any, ...]]] = [
        (chord([s.add.s(1, 1), s.add.s(2, 2)], group(s.tsum.s(), s.tsum.s())), ()),
        (group(s.add.s(1), s.add.s(2)), (10,)),
        (group(s.add.s(1, 1), s.add.s(2, 2)) | group(s.tsum.s(), s.tsum.s()), ()),
        (chain(s.add.s(1, 1), group(s.add.s(1), s.add.s(2)), group(s.tsum.s(), s.tsum.s())), ()),
        (group(chord([s.add.s(1, 1)], s.tsum.s()), chord([s.add.s(2, 2)], s.tsum.s())), ()),
        (chain(chord([s.add.s(1, 1), s.add.s(2, 2)], s.tsum.s()), s.add.s(100)), ()),
    ]
    out = []
    for canvas, args in shapes:
        try:
            out.append(canvas.apply_async(args).get(timeout=WAIT))
        except Exception as exc:  # noqa: BLE001 - a refused shape is an answer too
            out.append([type(exc).__name__, str(exc)[:80]])
    return out


def on_one_broker_connection(s: Side) -> Any:
    """Celery's "Calling Tasks" guide: many calls on one connection, or one producer."""
    with s.app.pool.acquire(block=True) as conn:
        on_connection = [s.add.apply_async((i, i), connection=conn) for i in range(3)]
    with s.app.producer_or_acquire() as producer:
        on_producer = [s.add.apply_async((i, 1), producer=producer) for i in range(3)]
        by_name = s.app.send_task(s.add.name, (5, 5), producer=producer)
    return [
        [r.get(timeout=WAIT) for r in on_connection],
        [r.get(timeout=WAIT) for r in on_producer],
        by_name.get(timeout=WAIT),
    ]


def skew_and_a_chains_link(s: Side) -> Any:
    start = time.monotonic()
    spread = group(s.add.s(i, i) for i in range(3)).skew(start=0, stop=1.0).apply_async()
    spread_values = spread.get(timeout=WAIT)
    t = token()
    c = chain(s.add.s(1, 1), s.add.s(2)).apply_async(link=s.count_run.si(t))
    value = c.get(timeout=WAIT)
    deadline = time.monotonic() + WAIT
    while bodies.runs(t) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    return [spread_values, time.monotonic() - start >= 1.0, value, bodies.runs(t)]


def a_handle_as_a_value(s: Side) -> Any:
    """A result kept the ways teams keep one: compared, in a set, as a tuple, pickled (a
    session, a cache), copied."""
    r = s.add.delay(2, 2)
    same = AsyncResult(r.id, app=s.app)
    return [
        [r == r.id, r == same, r != "x", str(r) == r.id, r.task_id == r.id],
        [hash(r) == hash(r.id), len({r, same})],
        result_from_tuple(r.as_tuple(), app=s.app).get(timeout=WAIT),
        pickle.loads(pickle.dumps(r)).get(timeout=WAIT),  # noqa: S301 - our own bytes
        copy.copy(r).get(timeout=WAIT),
        isinstance(r, AsyncResult),
    ]


def whereabouts(s: Side) -> Any:
    return s.whereabouts.delay().get(timeout=WAIT)


def acks_late_declared(s: Side) -> Any:
    task = s.acks_late
    return [task.delay(1, 2).get(timeout=WAIT), task.acks_late, task.reject_on_worker_lost]


def registered_by_inspect(s: Side) -> Any:
    found = s.app.control.inspect(timeout=5).registered() or {}
    return any(s.name("add") in names for names in found.values())


def result_of_ignore_result(s: Side) -> Any:
    return s.quiet.delay(1, 2).get(timeout=WAIT)


def running_without_track_started(s: Side) -> Any:
    t = token()
    r = s.held.delay(t)
    try:
        started(t)
        state = AsyncResult(r.id, app=s.app).state
    finally:
        bodies.release(t)
    return [state, r.get(timeout=WAIT)]


def ids_a_tracer_sees(s: Side) -> Any:
    """The task id Celery's signals, ``inspect()`` and a publish receiver name for a call:
    what an error tracker or a tracer ties to the caller's ``r.id``."""
    published: list[str] = []
    caller = threading.get_ident()  # the driver runs programs side by side, in threads

    def heard(headers: dict[str, Any] | None = None, **_: Any) -> None:
        if threading.get_ident() == caller:
            published.append(str((headers or {}).get("id")))

    t = token()
    before_task_publish.connect(heard)
    try:
        r = s.held.delay(t)
    finally:
        before_task_publish.disconnect(heard)
    try:
        started(t)
        inspect = s.app.control.inspect(timeout=2)
        found = any((inspect.query_task(r.id) or {}).values())
        active = [x["id"] for xs in (inspect.active() or {}).values() for x in xs]
    finally:
        bodies.release(t)
    r.get(timeout=WAIT)
    deadline = time.monotonic() + WAIT
    while bodies.signalled("postrun", r.id) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return [
        published == [r.id],
        found,
        r.id in active,
        bodies.signalled("prerun", r.id),
        bodies.signalled("postrun", r.id),
    ]


def request_in_a_bound_body(s: Side) -> Any:
    r = s.request_seen.delay(1, k=3)
    seen_id, args, kwargs, retries = r.get(timeout=WAIT)
    return [seen_id == r.id, args, kwargs, retries]


def called_directly(s: Side) -> Any:
    return [s.add(1, 2), s.request_seen(5)[1:]]


def eager_apply(s: Side) -> Any:
    t = token()
    ok = s.add.apply((3, 4))
    return [ok.get(), ok.state, ok.successful(), raised(lambda: s.boom.apply((t,)).get(), t)]


def get_inside_a_task(s: Side) -> Any:
    return s.get_inside.delay().get(timeout=WAIT)


def missing_argument_at_the_call(s: Side) -> Any:
    return raised(lambda: s.add.delay(1))


def unchecked_call(s: Side) -> Any:
    """``typing=False``: the call is not checked where it is made; the worker's is."""
    r = s.untyped.delay(1)
    return [raised(lambda: r.get(timeout=WAIT)), r.state]


def forget_a_result(s: Side) -> Any:
    r = s.add.delay(20, 22)
    value = r.get(timeout=WAIT)
    r.forget()
    return [value, AsyncResult(r.id, app=s.app).state]


# --- exceptions and retries --------------------------------------------------------------


def autoretry_exhausted(s: Side) -> Any:
    t = token()
    r = s.missing.delay(t)
    return [raised(lambda: r.get(timeout=WAIT), t), r.state]


def retry_exhausted(s: Side) -> Any:
    r = s.retried_out.delay(token())
    return [raised(lambda: r.get(timeout=WAIT))[0], r.state]


def retry_with_exc_exhausted(s: Side) -> Any:
    t = token()
    r = s.retry_with_exc.delay(t)
    return [raised(lambda: r.get(timeout=WAIT), t), r.state]


def retry_then_success(s: Side) -> Any:
    t = token()
    r = s.flaky.delay(t)
    return [r.get(timeout=WAIT), r.state, bodies.runs(t)]


def autoretry_then_success(s: Side) -> Any:
    t = token()
    return [s.flaky_auto.delay(t).get(timeout=WAIT), bodies.runs(t)]


def ignore_or_reject_ends_it(s: Side) -> Any:
    ignored, rejected = token(), token()
    i, r = s.ignored.delay(ignored), s.rejected.delay(rejected)
    time.sleep(3)  # time for a retry, which Celery never makes of either
    return [[i.state, bodies.runs(ignored)], [r.state, bodies.runs(rejected)]]


def throws_expected_error(s: Side) -> Any:
    t = token()
    r = s.thrown.delay(t)
    return [raised(lambda: r.get(timeout=WAIT), t), r.state]


def result_not_serializable(s: Side) -> Any:
    r = s.opaque.delay()
    try:
        r.get(timeout=WAIT)
    except EncodeError:  # kombu's, as Celery's worker fails a result it cannot encode
        return ["EncodeError caught", r.state]
    return ["not caught", r.state]


def argument_not_serializable(s: Side) -> Any:
    try:
        s.identity.delay(object())
    except EncodeError:
        return "EncodeError caught"
    return "not caught"


# --- time limits -------------------------------------------------------------------------


def hard_time_limit(s: Side) -> Any:
    t = token()
    r = s.hang.delay(t)
    return [raised(lambda: r.get(timeout=WAIT))[0], r.state]


def soft_time_limit_caught(s: Side) -> Any:
    t = token()
    return s.soft.delay(t).get(timeout=WAIT).replace(t, "<token>")


def soft_time_limit_uncaught(s: Side) -> Any:
    r = s.soft_uncaught.delay(token())
    return [raised(lambda: r.get(timeout=WAIT))[0], r.state]


def time_limit_per_call(s: Side) -> Any:
    t = token()
    r = s.held_once.apply_async((t,), time_limit=1)
    try:
        return [raised(lambda: r.get(timeout=WAIT))[0], r.state]
    finally:
        bodies.release(t)


# --- revoke and expiry -------------------------------------------------------------------


def revoke_a_queued_task(s: Side) -> Any:
    r = s.add.apply_async((1, 1), countdown=1)
    r.revoke()
    return [raised(lambda: r.get(timeout=WAIT))[0], r.state, r.ready()]


def control_revoke_by_id(s: Side) -> Any:
    r = s.add.apply_async((1, 1), countdown=1)
    s.app.control.revoke(r.id)
    return [raised(lambda: r.get(timeout=WAIT))[0], r.state]


def revoke_terminate_a_running_task(s: Side) -> Any:
    t = token()
    r = s.held.delay(t)
    try:
        started(t)
        r.revoke(terminate=True)
        return [raised(lambda: r.get(timeout=WAIT))[0], r.state]
    finally:
        bodies.release(t)


def _ready_state(r: AsyncResult, within: float = WAIT) -> str:
    """``r``'s state once it is ready, or as it is after ``within`` seconds."""
    deadline = time.monotonic() + within
    while r.state not in states.READY_STATES and time.monotonic() < deadline:
        time.sleep(0.05)
    return str(r.state)


def _runs_within(t: str, within: float) -> int:
    """The runs of the body counting under ``t``, waiting at most ``within`` for one (an
    errback is sent as its task ends: one that runs at all runs within a second on a quiet
    machine; an answer of one may wait longer, it returns as soon as it is seen)."""
    deadline = time.monotonic() + within
    while bodies.runs(t) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    return bodies.runs(t)


def revoke_terminate_a_chain_step(s: Side) -> Any:
    """A running chain's middle step revoked: the chain's get(), the middle step's state,
    the next step's, and whether the middle step's link_error ran."""
    t, e = token(), token()
    middle = s.held.si(t).on_error(s.count_run.si(e))
    r = chain(s.add.s(1, 1), middle, s.add.si(1, 2)).apply_async()
    try:
        started(t)
        r.parent.revoke(terminate=True)
        kind = raised(lambda: r.get(timeout=WAIT))[0]
        return [kind, _ready_state(r.parent), r.state, _runs_within(e, 2)]
    finally:
        bodies.release(t)


def revoke_terminate_a_chord_member(s: Side) -> Any:
    """A chord's member revoked while it runs: the chord's get(), its body's state once
    ready, whether the body's link_error ran."""
    t, e = token(), token()
    body = s.tsum.s().on_error(s.count_run.si(e))
    r = chord([s.add.s(1, 1), s.held.si(t)], body).apply_async()
    try:
        started(t)
        r.parent.results[1].revoke(terminate=True)
        # The member's TaskRevokedError if get() meets it first (follow_parents), else the
        # body's ChordError naming it: a race in Celery, as for a failing member.
        kind = raised(lambda: r.get(timeout=WAIT))[0]
        return [kind in ("TaskRevokedError", "ChordError"), _ready_state(r), _runs_within(e, 10)]
    finally:
        bodies.release(t)


def revoke_a_chord_member_before_it_starts(s: Side) -> Any:
    """A chord's member revoked while it waits for its countdown: the chord's get(), the
    member's state, its body's once ready, whether the body's link_error ran."""
    e = token()
    body = s.tsum.s().on_error(s.count_run.si(e))
    r = chord([s.add.s(1, 1), s.add.s(2, 2).set(countdown=2)], body).apply_async()
    member = r.parent.results[1]
    member.revoke()
    kind = raised(lambda: r.get(timeout=WAIT))[0]  # either, a race as for a failing member
    return [
        kind in ("TaskRevokedError", "ChordError"),
        _ready_state(member),
        _ready_state(r),
        _runs_within(e, 10),
    ]


def revoke_a_chain_step_before_it_starts(s: Side) -> Any:
    """A chain's second step revoked while its first runs: the chain's get(), the second
    step's state, the third's, and whether the second's link_error ran."""
    t, e = token(), token()
    second = s.add.si(1, 1).on_error(s.count_run.si(e))
    r = chain(s.held.si(t), second, s.add.si(1, 2)).apply_async()
    try:
        started(t)
        r.parent.revoke()
    finally:
        bodies.release(t)
    kind = raised(lambda: r.get(timeout=WAIT))[0]
    return [kind, _ready_state(r.parent), r.state, _runs_within(e, 2)]


def expires_of_the_task(s: Side) -> Any:
    r = s.short_lived.apply_async((1, 2), countdown=3, queue=_second_queue(s))
    return [raised(lambda: r.get(timeout=WAIT))[0], r.state]


def get_inside_a_task_allowed(s: Side) -> Any:
    return s.get_allowed.delay().get(timeout=WAIT)


def expired_before_it_ran(s: Side) -> Any:
    r = s.add.apply_async((1, 1), countdown=2, expires=1, queue=_second_queue(s))
    return [raised(lambda: r.get(timeout=WAIT))[0], r.state, type(r.result).__name__]


# --- canvas ------------------------------------------------------------------------------


def canvas_options(s: Side) -> Any:
    second = _second_queue(s)
    g = group(s.queue_seen.s(i) for i in range(2)).apply_async(queue=second)
    c = chain(s.queue_seen.si(1), s.queue_seen.si(2)).apply_async(queue=second)
    sent = time.monotonic()
    later = chain(s.add.s(1, 1), s.add.s(2)).apply_async(countdown=1)
    value = later.get(timeout=WAIT)
    return [
        g.get(timeout=WAIT),
        [c.parent.get(timeout=WAIT), c.get(timeout=WAIT)],
        [value, time.monotonic() - sent >= 1],
    ]


def chain_of_3(s: Side) -> Any:
    return chain(s.add.s(1, 2), s.add.s(3), s.add.s(4)).apply_async().get(timeout=WAIT)


def pipe_partial_immutable(s: Side) -> Any:
    first = (s.add.s(2, 2) | s.add.s(4)).apply_async().get(timeout=WAIT)
    second = (s.add.s(2, 2) | s.add.si(5, 5)).apply_async().get(timeout=WAIT)
    partial = chain(s.add.s(3), s.add.s(4)).apply_async((1,)).get(timeout=WAIT)
    return [first, second, partial]


def chain_parents(s: Side) -> Any:
    r = chain(s.add.s(1, 1), s.add.s(10)).apply_async()
    return [r.get(timeout=WAIT), r.parent.get(timeout=WAIT), r.parent.id != r.id]


def chain_failing_in_the_middle(s: Side) -> Any:
    t = token()
    r = chain(s.add.s(1, 1), s.boom.si(t), s.add.s(1)).apply_async()
    return [raised(lambda: r.get(timeout=WAIT), t), r.parent is not None]


def signature_calls(s: Side) -> Any:
    return [
        s.add.s(1, 2).delay().get(timeout=WAIT),
        s.add.s(1).apply_async((2,)).get(timeout=WAIT),
        s.add.s(2, 2).set(countdown=1).apply_async().get(timeout=WAIT),
        s.add.s(5).clone(args=(6,)).delay().get(timeout=WAIT),
        signature(s.name("add"), args=(3, 3), app=s.app).delay().get(timeout=WAIT),
    ]


def group_of_5(s: Side) -> Any:
    g = group(s.add.s(i, i) for i in range(5)).apply_async()
    return [g.get(timeout=WAIT), len(g.results), isinstance(g, GroupResult), isinstance(g.id, str)]


def group_without_propagation(s: Side) -> Any:
    t = token()
    g = group(s.add.s(2, 2), s.boom.si(t)).apply_async()
    values = g.get(timeout=WAIT, propagate=False)
    return [
        values[0],
        type(values[1]).__name__,
        g.ready(),
        g.successful(),
        g.failed(),
        g.completed_count(),
    ]


def group_get_raises(s: Side) -> Any:
    t = token()
    g = group(s.add.s(2, 2), s.boom.si(t)).apply_async()
    return raised(lambda: g.get(timeout=WAIT), t)


def group_join(s: Side) -> Any:
    return group(s.add.s(1, 0), s.add.s(2, 0)).apply_async().join(timeout=WAIT)


def group_saved_and_restored(s: Side) -> Any:
    g = group(s.add.s(i, i) for i in range(3)).apply_async()
    g.save()
    restored = GroupResult.restore(g.id, app=s.app)
    return [restored is not None, restored.get(timeout=WAIT) if restored else None]


def chord_of_5(s: Side) -> Any:
    header = [s.add.s(i, i) for i in range(5)]
    applied = chord(header, s.tsum.s()).apply_async().get(timeout=WAIT)
    called = chord([s.add.s(i, 1) for i in range(5)])(s.tsum.s()).get(timeout=WAIT)
    return [applied, called]


def empty_group(s: Side) -> Any:
    return group([]).apply_async().get(timeout=WAIT)


def empty_chord(s: Side) -> Any:
    return chord([], s.tsum.s()).apply_async().get(timeout=WAIT)


def chord_immutable_body(s: Side) -> Any:
    return chord([s.add.s(1, 1), s.add.s(2, 2)], s.add.si(10, 10)).apply_async().get(timeout=WAIT)


def chord_parent_is_its_header(s: Side) -> Any:
    r = chord([s.add.s(1, 1), s.add.s(2, 2)], s.tsum.s()).apply_async()
    return [r.get(timeout=WAIT), r.parent.get(timeout=WAIT)]


def chord_with_a_failing_member(s: Side) -> Any:
    t = token()
    r = chord([s.add.s(1, 1), s.boom.si(t)], s.add.s(0)).apply_async()
    kind, said = raised(lambda: r.get(timeout=WAIT), t)
    # Celery raises the member's error if get() sees it first (``follow_parents``), else
    # the body's ChordError naming it: which one is a race in Celery as here.
    return kind in ("ValueError", "ChordError") and "boom <token>" in said


def nested_chain_in_group(s: Side) -> Any:
    members = [chain(s.add.s(1, 1), s.add.s(1)), s.add.s(5, 5), s.add.s(2, 2) | s.add.s(3)]
    return group(members).apply_async().get(timeout=WAIT)


def group_inside_a_chain(s: Side) -> Any:
    return (
        chain(s.add.s(1, 1), group(s.add.s(1), s.add.s(2)), s.tsum.s())
        .apply_async()
        .get(timeout=WAIT)
    )


def map_and_starmap(s: Side) -> Any:
    mapped = s.tsum.map([[1, 2], [3, 4]]).apply_async().get(timeout=WAIT)
    starred = s.add.starmap([(1, 2), (3, 4), (5, 6)]).delay().get(timeout=WAIT)
    return [mapped, starred]


def chunks(s: Side) -> Any:
    return s.add.chunks(zip(range(4), range(4), strict=True), 2).apply_async().get(timeout=WAIT)


def join_native_of_a_group(s: Side) -> Any:
    return group(s.add.s(i, i) for i in range(3)).apply_async().join_native(timeout=WAIT)


def link_callback(s: Side) -> Any:
    callback = str(uuid.uuid4())
    parent = s.add.apply_async((2, 2), link=s.add.s(10).set(task_id=callback))
    return [parent.get(timeout=WAIT), AsyncResult(callback, app=s.app).get(timeout=WAIT)]


def link_with_a_countdown(s: Side) -> Any:
    callback = str(uuid.uuid4())
    sent = time.monotonic()
    parent = s.add.apply_async((2, 2), link=s.add.s(10).set(task_id=callback), countdown=1)
    value = parent.get(timeout=WAIT)
    waited = time.monotonic() - sent >= 1
    return [value, AsyncResult(callback, app=s.app).get(timeout=WAIT), waited]


def publish_retry_options(s: Side) -> Any:
    policy = {"max_retries": 3, "interval_start": 0, "interval_step": 0.2}
    r = s.add.apply_async((1, 2), retry=True, retry_policy=policy)
    return [r.get(timeout=WAIT), s.add.apply_async((3, 4), retry=False).get(timeout=WAIT)]


def link_error_old_style(s: Side) -> Any:
    errback = str(uuid.uuid4())
    t = token()
    failing = s.boom.apply_async((t,), link_error=s.identity.s().set(task_id=errback))
    # Celery's old-style errback is called with the failed task's id.
    return AsyncResult(errback, app=s.app).get(timeout=WAIT) == failing.id


def link_error_new_style(s: Side) -> Any:
    t = token()
    failing = s.boom.apply_async((t,), link_error=s.on_error.s())
    raised(lambda: failing.get(timeout=WAIT))
    key = f"conformance:errback:{failing.id}"
    deadline = time.monotonic() + WAIT
    while (seen := bodies.store().get(key)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return (seen or "not called").replace(t, "<token>").replace(f"{s.prefix}.", "<app>.")


def replace_with_a_signature(s: Side) -> Any:
    return _value_or_error(s.replaced.delay(41))


def replace_a_step_of_a_chain(s: Side) -> Any:
    return _value_or_error(chain(s.add.s(1, 1), s.replaced.s(), s.add.s(10)).apply_async())


def replace_a_member_of_a_chord(s: Side) -> Any:
    return _value_or_error(chord([s.replaced.s(1), s.add.s(1, 1)], s.tsum.s()).apply_async())


def _value_or_error(r: AsyncResult, timeout: float = WAIT) -> Any:
    try:
        return ["value", r.get(timeout=timeout)]
    except Exception as exc:  # noqa: BLE001 - the answer is which exception
        return ["raised", type(exc).__name__]


# --- idioms a probe from outside found answered otherwise (2026-12-07); what differs
# still is in DIFFERENT below and docs/celery-compat.md ---------------------------------


def children_of_a_chain_step(s: Side) -> Any:
    c = chain(s.add.s(1, 1), s.add.s(2)).apply_async()
    value = c.get(timeout=WAIT)
    first = AsyncResult(c.parent.id, app=s.app)
    kids = first.children or []
    return [value, len(kids), [k.id == c.id for k in kids]]


def _labelled(found: Any, named: dict[str, str]) -> Any:
    """The results of a walk as the names the program gave their ids ("?" for another)."""
    return [named.get(str(r.id), "?") if r is not None else None for r in found]


def walk_a_chain(s: Side) -> Any:
    """Celery's walks over a finished chain from its first step's id: ``collect()``,
    ``iterdeps()`` and ``graph`` follow ``children``; ``parent`` is the caller's handle's."""
    c = chain(s.add.s(1, 1), s.add.s(2), s.add.s(3)).apply_async()
    c.get(timeout=WAIT)
    named = {str(c.parent.parent.id): "a", str(c.parent.id): "b", str(c.id): "c"}
    first = AsyncResult(c.parent.parent.id, app=s.app)
    collected = [[named.get(str(r.id)), v] for r, v in first.collect(timeout=WAIT)]
    deps = [_labelled(pair, named) for pair in first.iterdeps()]
    graph = first.graph
    return [
        collected,
        deps,
        _labelled(graph.topsort(), named),
        [_labelled(graph[node], named) for node in graph.topsort()],
        AsyncResult(c.id, app=s.app).parent,
        c.parent.children[0].id == c.id,
    ]


def children_before_a_group_and_a_chord(s: Side) -> Any:
    """A step a group (a chord's header) follows: its child is that group's result; a
    chord's member has none (its body is the chord's, sent once all of them ended)."""
    g = chain(s.add.s(1, 1), group(s.add.s(1), s.add.s(2))).apply_async()
    values = g.get(timeout=WAIT)
    kids = AsyncResult(g.parent.id, app=s.app).children or []
    c = chain(s.add.s(1, 1), chord([s.add.s(1), s.add.s(2)], s.tsum.s())).apply_async()
    total = c.get(timeout=WAIT)
    before = AsyncResult(c.parent.parent.id, app=s.app).children or []
    member = AsyncResult(c.parent.results[0].id, app=s.app)
    return [
        values,
        [isinstance(k, GroupResult) for k in kids],
        [kids[0].id == g.id, [r.id for r in kids[0].results] == [r.id for r in g.results]],
        total,
        [isinstance(k, GroupResult) for k in before],
        [r.id for r in before[0].results] == [r.id for r in c.parent.results],
        member.children,
    ]


def children_of_a_linked_task(s: Side) -> Any:
    """``apply_async(link=)``: the callback's result is the task's child; two callbacks
    are sent as one group, its result the only child."""
    r = s.add.apply_async((1, 1), link=s.add.s(10))
    r.get(timeout=WAIT)
    kids = r.children or []
    two = s.add.apply_async((1, 1), link=[s.add.s(10), s.add.s(20)])
    two.get(timeout=WAIT)
    both = AsyncResult(two.id, app=s.app).children or []
    return [
        [k.get(timeout=WAIT) for k in kids],
        [isinstance(k, GroupResult) for k in both],
        both[0].get(timeout=WAIT) if both else None,
    ]


def children_of_a_task_that_sent_a_chain(s: Side) -> Any:
    r = s.sends_chain.delay()
    first, _ = r.get(timeout=WAIT)
    kids = AsyncResult(r.id, app=s.app).children or []
    return [len(kids), [k.id == first for k in kids]]


def _group_child(s: Side, sender: Any) -> Any:
    """The children of ``sender``'s run, whose body sent a group and returned its id and
    its members' ids: whether each child is that group's result, and its value."""
    r = sender.delay()
    group_id, members = r.get(timeout=WAIT)
    kids = AsyncResult(r.id, app=s.app).children or []
    return [
        [isinstance(k, GroupResult) for k in kids],
        [k.id == group_id and [m.id for m in k.results] == members for k in kids],
        [k.get(timeout=WAIT) for k in kids],
    ]


def children_of_a_task_that_sent_a_group(s: Side) -> Any:
    """A group sent from a body: its result (the group's id, its members) is the child."""
    return _group_child(s, s.sends_group)


def children_of_a_task_that_sent_a_chord(s: Side) -> Any:
    """A chord sent from a body: its header's result (what Celery's chord publishes) is the
    child, not its body's."""
    return _group_child(s, s.sends_chord)


def children_of_a_task_that_called_two(s: Side) -> Any:
    """``.delay()`` and ``apply_async`` from a body: their results are its children, in
    order, and ``collect()`` walks them after it."""
    r = s.calls_two.delay()
    ids = r.get(timeout=WAIT)
    mine = AsyncResult(r.id, app=s.app)
    kids = mine.children or []
    values = [k.get(timeout=WAIT) for k in kids]
    walked = [[str(x.id) in ids, v] for x, v in mine.collect(timeout=WAIT)][1:]
    return [[k.id for k in kids] == ids, values, walked]


def children_without_add_to_parent(s: Side) -> Any:
    """``apply_async(add_to_parent=False)`` from a body: not a child."""
    r = s.calls_one_not_a_child.delay()
    apart, child = r.get(timeout=WAIT)
    kids = AsyncResult(r.id, app=s.app).children or []
    return [[k.id == child for k in kids], [k.id == apart for k in kids]]


def children_of_a_retried_task(s: Side) -> Any:
    """Each attempt calls a task; the first retries: only the succeeding attempt's call is
    a child (Celery's retry runs under a fresh request)."""
    r = s.calls_then_retries.delay(token())
    first, second = r.get(timeout=WAIT)
    kids = AsyncResult(r.id, app=s.app).children or []
    return [[k.id == second for k in kids], [k.id == first for k in kids]]


def children_of_a_call_in_a_transaction(s: Side) -> Any:
    """A body's call that joins a journal transaction (the relay publishes it) is a child
    as a sent one is."""
    r = s.calls_in_a_transaction.delay()
    (sent,) = r.get(timeout=WAIT)
    kids = AsyncResult(r.id, app=s.app).children or []
    return [[k.id == sent for k in kids], [k.get(timeout=WAIT) for k in kids]]


def _values(result: Any) -> list[Any]:
    """A result's value, or a group's members' values."""
    value = result.get(timeout=WAIT)
    return list(value) if isinstance(result, GroupResult) else [value]


def children_of_a_task_a_body_sent_with_links(s: Side) -> Any:
    """A body's ``app.send_task(name, link=)``: what it sent are its children, and each sent
    task's callbacks (one, or two as one group) are that task's, not the body's: Celery's
    tracer sends them under the sent task's request, the body its root, the sent task its
    parent."""
    r = s.sends_with_links.delay()
    one, two = r.get(timeout=WAIT)
    mine = [k.id for k in AsyncResult(r.id, app=s.app).children or []]
    named = {r.id: "body", one: "one", two: "two"}
    answer: list[Any] = [[named.get(k, "?") for k in mine]]
    for sent in (one, two):
        handle = AsyncResult(sent, app=s.app)
        handle.get(timeout=WAIT)
        kids = handle.children or []
        answer.append([type(k).__name__ for k in kids])
        seen = [v for k in kids for v in _values(k)]
        answer.append([[named.get(x, x) for x in v[1:3]] for v in seen])
    return answer


def group_restored_by_the_app(s: Side) -> Any:
    g = group(s.add.s(i, i) for i in range(2)).apply_async()
    g.save()
    restored = s.app.GroupResult.restore(g.id)
    never_saved = group(s.add.s(5, 5)).apply_async()
    never_saved.get(timeout=WAIT)
    return [
        restored.get(timeout=WAIT) if restored else None,
        GroupResult.restore(str(uuid.uuid4()), app=s.app),
        GroupResult.restore(never_saved.id, app=s.app) is None,
    ]


def group_of_groups(s: Side) -> Any:
    g = group(group(s.add.s(1, 1), s.add.s(2, 2)), group(s.add.s(3, 3))).apply_async()
    values = g.get(timeout=WAIT)
    return [values, len(g.results), [isinstance(r, AsyncResult) for r in g.results]]


def chord_with_a_group_in_its_header(s: Side) -> Any:
    header = [group(s.add.s(1, 1), s.add.s(2, 2)), s.add.s(3, 3)]
    value = chord(header, s.identity.s()).apply_async().get(timeout=WAIT)
    # Celery's order of a nested group's values in the body's list varies: its shape.
    flat = [y for x in value for y in (x if isinstance(x, list) else [x])]
    return [len(value), sorted(flat)]


def exception_with_other_args(s: Side) -> Any:
    t = token()
    r = s.wrapped.delay(t)
    try:
        r.get(timeout=WAIT)
    except Exception as exc:  # noqa: BLE001 - the answer is which exception
        said = str(exc).replace(t, "<token>")
        return [type(exc).__name__, said, isinstance(exc, bodies.WrappedError)]
    return ["nothing raised"]


def exception_carrying_values(s: Side) -> Any:
    out = []
    for kind in ("dict", "object"):
        r = s.boom_carrying.delay(kind)
        try:
            r.get(timeout=WAIT)
        except Exception as exc:  # noqa: BLE001 - the answer is which exception
            out.append([type(exc).__name__, [repr(a) for a in exc.args]])
    return out


def revoke_a_running_task_without_terminate(s: Side) -> Any:
    t = token()
    r = s.held.delay(t)
    started(t)
    r.revoke()
    time.sleep(1)
    bodies.release(t)
    outcome = _value_or_error(r)
    time.sleep(1)
    return [outcome, AsyncResult(r.id, app=s.app).state]


def a_large_result(s: Side) -> Any:
    r = s.big_result.delay(100_000)
    outcome = _value_or_error(r)
    return [outcome if outcome[0] == "raised" else ["value", len(outcome[1])], r.state]


def a_large_argument(s: Side) -> Any:
    try:
        r = s.length.delay("y" * 300_000)
    except Exception as exc:  # noqa: BLE001 - a refused call is an answer too
        return ["refused at the call", type(exc).__name__]
    return _value_or_error(r)


def send_task_with_a_link(s: Side) -> Any:
    callback = str(uuid.uuid4())
    r = s.app.send_task(s.name("add"), (2, 3), link=s.add.s(10).set(task_id=callback))
    t, e = token(), token()
    s.app.send_task(s.name("add"), (1, 1), link=s.count_run.si(t))
    s.app.send_task(s.name("boom"), (e,), link_error=s.count_run.si(e))
    # Celery runs each callback within a second; three is ample and bounds the wait.
    answer = [_value_or_error(r), _value_or_error(AsyncResult(callback, app=s.app), 3)]
    deadline = time.monotonic() + 3
    while (bodies.runs(t) < 1 or bodies.runs(e) < 1) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [*answer, bodies.runs(t), bodies.runs(e)]


def send_task_of_an_unknown_name(s: Side) -> Any:
    try:
        r = s.app.send_task(s.name("no_such_task"), (1,))
    except Exception as exc:  # noqa: BLE001 - a refused call is an answer too
        return ["refused at the call", type(exc).__name__]
    time.sleep(2)
    return [r.state, raised(lambda: r.get(timeout=1))[0]]


def send_task_expired_before_its_countdown(s: Side) -> Any:
    mine = str(uuid.uuid4())
    second = _second_queue(s)
    r = s.app.send_task(s.name("queue_seen"), (3,), task_id=mine, queue=second)
    # Expired in the worker, at its countdown.
    gone = s.app.send_task(s.name("add"), (1, 1), countdown=2, expires=1, queue=second)
    kind = raised(lambda: gone.get(timeout=WAIT))[0]
    return [r.id == mine, r.get(timeout=WAIT), kind, gone.state]


def shadow_name(s: Side) -> Any:
    r = s.add.apply_async((1, 2), shadow="billing.render")
    value = r.get(timeout=WAIT)
    return [value, AsyncResult(r.id, app=s.app).name == s.add.name]


def shadow_of_a_canvas_step(s: Side) -> Any:
    r = chain(s.add.s(1, 2), s.add.s(3).set(shadow="billing.render")).apply_async()
    value = r.get(timeout=WAIT)
    return [value, AsyncResult(r.id, app=s.app).name == s.add.name]


KOMBU_VALUES = [
    datetime(2026, 12, 4, 1, 2, 3, 456789, tzinfo=UTC),
    datetime(2026, 12, 4, 1, 2, 3),
    date(2026, 12, 4),
    clock_time(1, 2, 3),
    Decimal("1.50"),
    UUID("6f1d7c4e-3b57-4a8e-9a54-3c1f0e1d2b77"),
    b"bytes",
]
KOMBU_KINDS = ["datetime", "datetime", "date", "time", "Decimal", "UUID", "bytes"]


def kombu_json_types(s: Side) -> Any:
    # Celery's JSON serializer (kombu.utils.json) gives these back as themselves: to the
    # body, to get(), and from one step of a chain to the next.
    received = s.kinds.delay(KOMBU_VALUES).get(timeout=WAIT)
    echoed = s.identity.delay(KOMBU_VALUES).get(timeout=WAIT)
    passed_on = chain(s.identity.s(KOMBU_VALUES), s.kinds.s()).apply_async().get(timeout=WAIT)
    summed = s.add.delay(Decimal("1.1"), Decimal("2.2")).get(timeout=WAIT)
    return [received, echoed == KOMBU_VALUES, passed_on, str(summed)]


def tuple_comes_back_a_list(s: Side) -> Any:
    return s.identity.delay((1, (2, 3))).get(timeout=WAIT)


def _heard(r: AsyncResult, t: str, *awaited: str) -> list[str]:
    """What the hooks heard of ``r`` once they heard each of ``awaited`` (a worker calls them
    after the result is kept, and a retry's hook may come after the next run's), sorted,
    with its id and token as ``<id>`` and ``<token>``."""
    deadline = time.monotonic() + WAIT

    def missing() -> bool:
        heard = bodies.heard(t)
        return not all(any(h.startswith(a) for h in heard) for a in awaited)

    while missing() and time.monotonic() < deadline:
        time.sleep(0.05)
    return sorted(h.replace(r.id, "<id>").replace(t, "<token>") for h in bodies.heard(t))


def hooks_of_a_base_class(s: Side) -> Any:
    ok, failed = token(), token()
    r = s.hooked.delay(ok, False)
    value = r.get(timeout=WAIT)
    f = s.hooked.delay(failed, True)
    return [
        value,
        _heard(r, ok, "on_retry", "after_return SUCCESS"),
        raised(lambda: f.get(timeout=WAIT), failed),
        _heard(f, failed, "on_retry", "after_return FAILURE"),
    ]


def before_start_of_a_base_class(s: Side) -> Any:
    t = token()
    r = s.start_hooked.apply_async((t,), {"fail": False})
    value = r.get(timeout=WAIT)
    return [value, _heard(r, t, "before_start {'fail': False} retries=1")]


PROGRAMS: dict[str, tuple[Callable[[Side], Any], Any]] = {
    # results and states
    "AsyncResult(id, app=app).get() from the id alone": (by_id_from_anywhere, [5, True]),
    "app.send_task(name, args).get()": (send_task_get, 9),
    "app.send_task(name, kwargs=, countdown=)": (send_task_kwargs_countdown, 3),
    "states of a success": (
        states_of_success,
        [2, "SUCCESS", "SUCCESS", True, True, False, 2, True, None, 2],
    ),
    "the body's exception from get()": (
        body_exception_from_get,
        [["ValueError", "boom <token>"], "ValueError", "FAILURE", True, "ValueError", True, True],
    ),
    "except ValueError around get()": (except_clause_around_get, ["caught", "boom <token>"]),
    "an unknown id": (unknown_id_is_pending, ["PENDING", False, None, "TimeoutError"]),
    "apply_async(task_id=...)": (callers_own_task_id, [True, 4]),
    "apply_async(countdown=1)": (countdown_then_value, 10),
    "apply_async(eta=...)": (eta_then_value, 12),
    "get(timeout=) of a task not due yet": (
        get_timeout_of_a_late_task,
        ["TimeoutError", "PENDING", False],
    ),
    "inspect().scheduled() of a call due in a minute": (scheduled_by_inspect, [True, "PENDING"]),
    "apply_async(kwargs=...), delay(**kwargs)": (kwargs_only_call, [7, 3]),
    "apply_async(headers=) read in the body, kept by a retry": (
        headers_of_a_call,
        ["acme", "acme", 1],
    ),
    "app.send_task(name, headers=) read in the body, kept by a retry": (
        headers_of_a_send_task,
        ["acme", "acme", 1],
    ),
    "apply_async(add_to_parent=, serializer='json', compression=)": (
        options_without_effect_here,
        [3, 3, 3],
    ),
    "apply_async(priority=), apply_async(queue=)": (priority_and_queue, [3, 4]),
    "apply_async(queue=kombu.Queue(name))": (queue_as_a_kombu_queue, [1, "second"]),
    "ResultSet get/join": (result_set, [[2, 4], [2, 4], 2, True]),
    "update_state(PROGRESS, meta) seen from another handle": (
        progress_shown,
        ["PROGRESS", {"step": 1, "token": "<set>"}, False, "done", "SUCCESS"],
    ),
    "get(on_message=) streams PROGRESS, then SUCCESS": (
        progress_streamed,
        ["done", ["PROGRESS", "SUCCESS"]],
    ),
    "get() of a task with ignore_result=True": (result_of_ignore_result, None),
    "successful(), failed(), status, result, traceback, date_done, wait()": (
        result_attributes,
        [
            [True, False, "SUCCESS", 5, True],
            [False, True, "FAILURE", "ValueError"],
            [True, "ValueError"],
            5,
        ],
    ),
    "sig.freeze() id is the result's; Task.AsyncResult(id)": (
        frozen_signature,
        [True, [True, 3, 3], [True, True], [2, 4]],
    ),
    "chain(...).freeze(), chord(...).freeze()": (
        frozen_chain_chord,
        [[True, 12], [True, 6]],
    ),
    "chain/chord apply_async(task_id=)": (canvas_named_by_task_id, [[True, 12], [True, 2]]),
    "group | task (a chord)": (group_piped_into_a_task, 6),
    "self.request.root_id, parent_id of a call, a retry and a call from a body": (
        lineage_of_a_call,
        [["own", "own", None], ["own", "own", "own", 1], ["own", "sender", "sender"]],
    ),
    "self.request.root_id, parent_id, group of canvas steps": (
        lineage_of_canvas_steps,
        [
            ["c1", "c1", None, None],
            ["c2", "c1", "c1", 1],
            ["c3", "c1", "c2", None],
            ["g0", "g0", None, "g"],
            ["g1", "g1", None, "g"],
            ["h0", "h0", None, "header"],
            ["h1", "h1", None, "header"],
            ["body", "a member", "a member", "header"],
            ["s1", "sender", "sender", None],
            ["s2", "sender", "s1", None],
        ],
    ),
    "self.request.correlation_id, timelimit, eta, expires, delivery_info, ignore_result": (
        fields_of_a_call,
        [[True, [30, 20], False, None, True, False], [True, [30, 20], True, 60, True, False]],
    ),
    "AsyncResult(id).name, args, kwargs, retries, queue (result_extended)": (
        extended_result_fields,
        [True, [2, 3], {}, 0, True],
    ),
    "a step sets self.request.chain = None": (chain_ended_by_a_step, [2, 0, "PENDING", False]),
    "app.control.revoke([ids]), GroupResult.revoke()": (
        revoke_many,
        [*[["TaskRevokedError", "REVOKED"]] * 4, "TaskRevokedError"],
    ),
    "sig.set(countdown=) of a canvas step": (countdown_of_a_step, [2, 4, True, 4, 2, True]),
    "canvas shapes: a chord with a group body, group partial args, group | group, ...": (
        canvas_shapes,
        [[6, 6], [11, 12], [6, 6], [7, 7], [2, 4], 106],
    ),
    "apply_async(connection=app.pool.acquire()), apply_async(producer=), send_task(producer=)": (
        on_one_broker_connection,
        [[0, 2, 4], [1, 2, 3], 10],
    ),
    "group(...).skew(start=, stop=), chain(...).apply_async(link=)": (
        skew_and_a_chains_link,
        [[0, 2, 4], True, 4, 1],
    ),
    "a result handle as a value: ==, hash, as_tuple(), pickle, copy": (
        a_handle_as_a_value,
        [[True, True, True, True, True], [True, 1], 4, 4, 4, True],
    ),
    "self.request.hostname, is_eager, called_directly, task": (
        whereabouts,
        [True, False, False, True],
    ),
    "acks_late=, reject_on_worker_lost= declared": (acks_late_declared, [3, True, True]),
    "inspect().registered() lists the task": (registered_by_inspect, True),
    "state of a running task (task_track_started off)": (
        running_without_track_started,
        ["PENDING", "released"],
    ),
    "self.request in a bound body": (request_in_a_bound_body, [True, [1], {"k": 3}, 0]),
    "calling the task directly": (called_directly, [3, [[5], {}, 0]]),
    "eager apply()": (eager_apply, [7, "SUCCESS", True, ["ValueError", "boom <token>"]]),
    "get() inside a task": (get_inside_a_task, "RuntimeError: Never call result.get() wit"),
    "get(disable_sync_subtasks=False) inside a task": (get_inside_a_task_allowed, 4),
    "task_prerun/task_postrun, before_task_publish, inspect() of a call name r.id": (
        ids_a_tracer_sees,
        [True, True, True, "1", "SUCCESS"],
    ),
    "delay() missing an argument": (
        missing_argument_at_the_call,
        ["TypeError", "_add() missing 1 required positional argument: 'y'"],
    ),
    "typing=False and a call that does not fit": (
        unchecked_call,
        [["TypeError", "_add() missing 1 required positional argument: 'y'"], "FAILURE"],
    ),
    "forget()": (forget_a_result, [42, "PENDING"]),
    # exceptions and retries
    "autoretry_for exhausted": (
        autoretry_exhausted,
        [["KeyError", "'missing <token>'"], "FAILURE"],
    ),
    "self.retry(max_retries=1) exhausted": (
        retry_exhausted,
        ["MaxRetriesExceededError", "FAILURE"],
    ),
    "self.retry(exc=...) exhausted": (
        retry_with_exc_exhausted,
        [["KeyError", "'gone <token>'"], "FAILURE"],
    ),
    "self.retry() then success": (retry_then_success, [1, "SUCCESS", 2]),
    "autoretry_for then success": (autoretry_then_success, [2, 2]),
    "raise Ignore(), raise Reject(requeue=False)": (
        ignore_or_reject_ends_it,
        [["PENDING", 1], ["FAILURE", 1]],
    ),
    "throws=(KeyError,)": (throws_expected_error, [["KeyError", "'expected <token>'"], "FAILURE"]),
    "a result JSON cannot carry": (result_not_serializable, ["EncodeError caught", "FAILURE"]),
    "an argument JSON cannot carry": (argument_not_serializable, "EncodeError caught"),
    # time limits
    "time_limit (hard) on prefork": (hard_time_limit, ["TimeLimitExceeded", "FAILURE"]),
    "soft_time_limit caught in the body": (soft_time_limit_caught, "soft <token>"),
    "soft_time_limit uncaught": (
        soft_time_limit_uncaught,
        ["SoftTimeLimitExceeded", "FAILURE"],
    ),
    "apply_async(time_limit=) per call": (time_limit_per_call, ["TimeLimitExceeded", "FAILURE"]),
    # revoke and expiry
    "result.revoke() of a queued task": (
        revoke_a_queued_task,
        ["TaskRevokedError", "REVOKED", True],
    ),
    "app.control.revoke(id)": (control_revoke_by_id, ["TaskRevokedError", "REVOKED"]),
    "revoke(terminate=True) of a running task": (
        revoke_terminate_a_running_task,
        ["TaskRevokedError", "REVOKED"],
    ),
    "revoke(terminate=True) of a running chain's middle step": (
        revoke_terminate_a_chain_step,
        ["TaskRevokedError", "REVOKED", "PENDING", 0],
    ),
    "revoke(terminate=True) of a running chord member": (
        revoke_terminate_a_chord_member,
        [True, "FAILURE", 1],
    ),
    "a chord whose member is revoked before it starts": (
        revoke_a_chord_member_before_it_starts,
        [True, "REVOKED", "FAILURE", 1],
    ),
    "a chain whose second step is revoked before it starts": (
        revoke_a_chain_step_before_it_starts,
        ["TaskRevokedError", "REVOKED", "PENDING", 0],
    ),
    "a task's own expires=, passed before it ran": (
        expires_of_the_task,
        ["TaskRevokedError", "REVOKED"],
    ),
    "apply_async(expires=) passed before it ran": (
        expired_before_it_ran,
        ["TaskRevokedError", "REVOKED", "TaskRevokedError"],
    ),
    # canvas
    "chain of 3": (chain_of_3, 10),
    "group/chain apply_async(queue=, countdown=)": (
        canvas_options,
        [[[0, "second"], [1, "second"]], [[1, "second"], [2, "first"]], [4, True]],
    ),
    "| with partial and immutable": (pipe_partial_immutable, [8, 10, 8]),
    "a chain's .parent": (chain_parents, [12, 2, True]),
    "a chain failing in the middle": (
        chain_failing_in_the_middle,
        [["ValueError", "boom <token>"], True],
    ),
    "signatures: s().delay, partial, set, clone, signature(name)": (
        signature_calls,
        [3, 3, 4, 11, 6],
    ),
    "group of 5": (group_of_5, [[0, 2, 4, 6, 8], 5, True, True]),
    "a group's join_native()": (join_native_of_a_group, [0, 2, 4]),
    "a group's get(propagate=False)": (
        group_without_propagation,
        [4, "ValueError", True, False, True, 1],
    ),
    "a group's get() with a failing member": (group_get_raises, ["ValueError", "boom <token>"]),
    "a group's join()": (group_join, [1, 2]),
    "GroupResult.save() and restore(id)": (group_saved_and_restored, [True, [0, 2, 4]]),
    "chord of 5 with a body, applied and called": (chord_of_5, [20, 15]),
    "an empty chord": (empty_chord, 0),
    "an empty group": (empty_group, []),
    "a chord with an immutable body": (chord_immutable_body, 20),
    "a chord's .parent (its header)": (chord_parent_is_its_header, [6, [2, 4]]),
    "a chord with a failing member": (chord_with_a_failing_member, True),
    "a nested chain in a group": (nested_chain_in_group, [3, 10, 7]),
    "a group inside a chain": (group_inside_a_chain, 7),
    "map and starmap": (map_and_starmap, [[3, 7], [3, 7, 11]]),
    "chunks": (chunks, [[0, 2], [4, 6]]),
    "link": (link_callback, [4, 14]),
    "apply_async(link=, countdown=)": (link_with_a_countdown, [4, 14, True]),
    "apply_async(retry=, retry_policy=)": (publish_retry_options, [3, 7]),
    "link_error, old style (task id)": (link_error_old_style, True),
    "link_error, new style (request, exc, traceback)": (
        link_error_new_style,
        "<app>.boom|ValueError: boom <token>|True",
    ),
    "self.replace(sig)": (replace_with_a_signature, ["value", 42]),
    "self.replace(sig) of a chain's step": (replace_a_step_of_a_chain, ["value", 13]),
    "self.replace(sig) of a chord's member": (replace_a_member_of_a_chord, ["value", 4]),
    # argument types
    "kombu's JSON types": (kombu_json_types, [KOMBU_KINDS, True, KOMBU_KINDS, "3.3"]),
    "a tuple comes back a list": (tuple_comes_back_a_list, [1, [2, 3]]),
    # a team's hooks
    "a base Task class's before_start": (
        before_start_of_a_base_class,
        [
            "ok",
            [
                "before_start {'fail': False} retries=0 <id> ['<token>'] True",
                "before_start {'fail': False} retries=1 <id> ['<token>'] True",
            ],
        ],
    ),
    "a base Task class's on_success, on_retry, on_failure, after_return": (
        hooks_of_a_base_class,
        [
            "ok",
            [
                "after_return SUCCESS 'ok' <id> ['<token>', False] True",
                "on_retry None <id> ['<token>', False] True",
                "on_success ok <id> ['<token>', False] True",
            ],
            ["ValueError", "failed <token>"],
            [
                "after_return FAILURE ValueError('failed <token>') <id> ['<token>', True] True",
                "on_failure ValueError('failed <token>') <id> ['<token>', True] True",
                "on_retry None <id> ['<token>', True] True",
            ],
        ],
    ),
    # Found from outside on 2026-12-07 (docs/celery-compat.md says what still differs).
    "AsyncResult(id).children of a chain's first step": (
        children_of_a_chain_step,
        [4, 1, [True]],
    ),
    "collect(), iterdeps(), graph, parent of a chain from its first step's id": (
        walk_a_chain,
        [
            [["a", 2], ["b", 4], ["c", 7]],
            [[None, "a"], ["a", "b"], ["b", "c"]],
            ["c", "b", "a"],
            [[], ["c"], ["b"]],
            None,
            True,
        ],
    ),
    "children of a step a group follows, of a chord's member": (
        children_before_a_group_and_a_chord,
        [[3, 4], [True], [True, True], 7, [True], True, []],
    ),
    "children of a task with link=, with two links": (
        children_of_a_linked_task,
        [[12], [True], [12, 22]],
    ),
    "children of a task whose body sent a chain": (
        children_of_a_task_that_sent_a_chain,
        [1, [True]],
    ),
    "children of a task whose body sent a group": (
        children_of_a_task_that_sent_a_group,
        [[True], [True], [[2, 4]]],
    ),
    "children of a task whose body sent a chord": (
        children_of_a_task_that_sent_a_chord,
        [[True], [True], [[2, 4]]],
    ),
    "children of a task whose body called .delay() and apply_async, collect()": (
        children_of_a_task_that_called_two,
        [True, [2, 4], [[True, 2], [True, 4]]],
    ),
    "children of a body's apply_async(add_to_parent=False)": (
        children_without_add_to_parent,
        [[True], [False]],
    ),
    "children of a retried task: the succeeding attempt's calls": (
        children_of_a_retried_task,
        [[True], [False]],
    ),
    "children of a body's call joined to a transaction (connection=)": (
        children_of_a_call_in_a_transaction,
        [[True], [5]],
    ),
    "children of what a body sent with send_task(link=), of its callbacks": (
        children_of_a_task_a_body_sent_with_links,
        [
            ["one", "two"],
            ["AsyncResult"],
            [["body", "one"]],
            ["GroupResult"],
            [["body", "two"], ["body", "two"]],
        ],
    ),
    "app.GroupResult.restore(id), restore of an unknown or unsaved id": (
        group_restored_by_the_app,
        [[0, 2], None, True],
    ),
    "a group of groups": (group_of_groups, [[2, 4, 6], 3, [True] * 3]),
    "a chord with a group in its header": (chord_with_a_group_in_its_header, [3, [2, 4, 6]]),
    "an exception whose args are not its __init__'s, from get()": (
        exception_with_other_args,
        ["UnpickleableExceptionWrapper", "WrappedError('size <token> is 3')", False],
    ),
    "an exception carrying a dict, an object, from get()": (
        exception_carrying_values,
        [
            ["ValueError", ["{'field': 'email', 'code': 7}"]],
            ["ValueError", ["'bad response'", "'<Opaque>'"]],
        ],
    ),
    "result.revoke() (no terminate) of a running task": (
        revoke_a_running_task_without_terminate,
        [["value", "released"], "SUCCESS"],
    ),
    "a 100 kB result": (a_large_result, [["value", 100000], "SUCCESS"]),
    "a 300 kB argument": (a_large_argument, ["value", 300000]),
    "app.send_task(name, args, link=), send_task(link_error=)": (
        send_task_with_a_link,
        [["value", 5], ["value", 15], 1, 1],
    ),
    "app.send_task() of a name no worker knows": (
        send_task_of_an_unknown_name,
        ["FAILURE", "NotRegistered"],
    ),
    "app.send_task(task_id=, queue=), send_task(countdown=2, expires=1)": (
        send_task_expired_before_its_countdown,
        [True, [3, "second"], "TaskRevokedError", "REVOKED"],
    ),
    "apply_async(shadow=)": (shadow_name, [3, True]),
    "a canvas step's .set(shadow=)": (shadow_of_a_canvas_step, [6, True]),
}

# Where jobsapp answers otherwise: its answer. docs/celery-compat.md says why, for each: a
# guarantee that requires it, or a gap issue 30 still tracks.
DIFFERENT: dict[str, Any] = {
    # The journal knows the chain's later steps will never run: they end cancelled.
    "a step sets self.request.chain = None": [2, 0, "REVOKED", True],
    # The run is the audit trail: forget() drops its kept value, not its state.
    "forget()": [42, "SUCCESS"],
    # The journal keeps every run's value (within JOBSAPP_RESULT_MAX_BYTES), whatever the
    # task's ignore_result: its handle answers it.
    "get() of a task with ignore_result=True": 3,
    # A run ends in the journal: one that raised Ignore ends failed, never retried (Celery
    # leaves its state as the body set it).
    "raise Ignore(), raise Reject(requeue=False)": [["FAILURE", 1], ["FAILURE", 1]],
    # A start beyond JOBSAPP_INLINE_WAIT_MAX waits in the journal: no worker holds it.
    "inspect().scheduled() of a call due in a minute": [False, "PENDING"],
    # The journal keeps every group's members: restore() answers any group it wrote.
    "app.GroupResult.restore(id), restore of an unknown or unsaved id": [[0, 2], None, False],
    # A revoke stops a running run at its next heartbeat (Celery's lets it finish).
    "result.revoke() (no terminate) of a running task": [["raised", "TaskRevokedError"], "REVOKED"],
    # The journal knows the rest of a revoked step's chain will never run (Celery never
    # sends it: PENDING for good): blocked as a failure blocks it, FAILURE, so a replay of
    # the step resumes it; its get() raises the step's TaskRevokedError, as the chain's.
    "revoke(terminate=True) of a running chain's middle step": [
        "TaskRevokedError",
        "REVOKED",
        "FAILURE",
        0,
    ],
    # As for a running step: the rest of the chain blocked, FAILURE (Celery: PENDING for good).
    "a chain whose second step is revoked before it starts": [
        "TaskRevokedError",
        "REVOKED",
        "FAILURE",
        0,
    ],
    # A value over JOBSAPP_RESULT_MAX_BYTES fails its run; arguments over
    # JOBSAPP_ARGS_MAX_BYTES are refused at the call: the journal keeps both.
    "a 100 kB result": [["raised", "ResultRefused"], "FAILURE"],
    "a 300 kB argument": ["refused at the call", "ArgumentRefused"],
    # Gaps (docs/celery-compat.md, "Where a Celery contract still differs"):
    "an exception whose args are not its __init__'s, from get()": [
        "Exception",
        "<class 'tests.conformance.bodies.WrappedError'>(['size <token> is 3'])",
        False,
    ],
    # Every call of a lifecycle task is a run of its own: no run answers a chunk's list.
    "chunks": [
        "the program raised",
        "TypeError",
        "conf.add.chunks: every call of a lifecycle task is a run of its own, so there is no "
        "chunk to answer a list; use starmap (a group of the same calls)",
    ],
}
