"""What Celery's task events, and so Flower, show of an attempt: the user's call.

A lifecycle task's Celery message carries jobsapp's envelope, and its task raises only after
the journal recorded the outcome; left alone, Flower would show the envelope as the
arguments and jobsapp's wrapper as the exception. Instead:

- a delivery of an attempt's own task id that started no work (a broker's redelivery, an
  expired job) does not report a success: Celery's ``task-succeeded`` outranks every state
  Flower keeps, so a failed attempt's task would read SUCCESS. ``report`` raises ``NotRun``
  instead and the worker sends the event of the journal's state, or none;
- an attempt's end is reported by ``report``: a failed or requeued attempt raises
  ``AttemptFailed`` dressed as the body's exception:
  the body's class name, its scrubbed message and the traceback of the body's own frames,
  with a note naming the job and attempt (the last lines of Flower's traceback);
- where the worker sends task events (Flower watching, or ``-E``), the claimed attempt sends
  a ``task-started`` event with the body's arguments as Celery's producer shows them
  (``saferepr``, then scrubbed) and the job id, so Flower's args and kwargs are the user's.
  It goes out through one event dispatcher kept per process (``send_started``), not one
  built per event as ``Task.send_event`` does, held with the process's other task-started
  events for at most ``EVENTS_WINDOW`` and published with them in one message, as Celery's
  worker publishes its own task events.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from functools import cache
from types import CodeType, TracebackType
from typing import Any, Final

from billiard.einfo import ExceptionWithTraceback  # type: ignore[attr-defined]  # not in its stubs
from celery import Celery
from celery.events.dispatcher import EventDispatcher
from celery.exceptions import Ignore, Retry
from celery.signals import worker_process_shutdown
from celery.utils.saferepr import saferepr
from celery.worker import state as worker_state
from celery.worker.request import Request
from kombu.utils.imports import symbol_by_name

from jobsapp.lifecycle.rules.message import Envelope, task_id_for
from jobsapp.lifecycle.rules.scrub import scrub
from jobsapp.lifecycle.transport import publisher
from jobsapp.lifecycle.worker import timeouts
from jobsapp.lifecycle.worker.attempt import End, Ended
from jobsapp.lifecycle.worker.claim import NOT_RUN, Refusal, not_run

log = logging.getLogger(__name__)

# The request field that tells the pool child whether this worker sends task events now.
EVENTS_ON: Final = "jobsapp_task_events"
# Celery's own bound on the argument texts of a message (``AMQP.argsrepr_maxsize``).
REPR_MAX: Final = 1024


class AttemptFailed(Exception):
    """Raised after the journal recorded a failed attempt, so Celery and Flower show it.

    Its repr is the body's exception's (``ValueError('...')``), its message the scrubbed
    one; it pickles as itself, so it crosses the prefork pool to the worker that sends
    the task event.
    """

    # The body's exception's own repr, scrubbed (its several arguments as Celery shows
    # them); None where there is no exception (a snooze) or its repr failed.
    said: str | None = None

    def __init__(self, message: str, shown: str = "AttemptFailed") -> None:
        super().__init__(message)
        self.shown = shown

    def __reduce__(self) -> tuple[Any, ...]:
        return (AttemptFailed, (str(self), self.shown), self.__dict__)

    def __repr__(self) -> str:
        return self.said or f"{self.shown}({str(self)!r})"


class NotRun(Ignore):
    """A delivery of an attempt's own task id that started no work; ``event`` is the task
    event (and its fields) that keeps Flower's task on the journal's state, or None when
    the attempt's own events already tell it. Celery's pool child records nothing for an
    ``Ignore``; the worker acks the message and sends ``event`` (``LifecycleRequest``)."""

    def __init__(self, refusal: str, event: str | None, fields: Mapping[str, Any]) -> None:
        super().__init__(refusal)
        self.event = event
        self.fields = dict(fields)

    def __reduce__(self) -> tuple[Any, ...]:
        return (NotRun, (str(self), self.event, self.fields))


def not_run_of(outcome: Any) -> NotRun | None:
    """The ``NotRun`` a delivery raised, from what Celery's tracer or pool hands back (an
    ``ExceptionInfo``, its exception wrapped for the pool's pickle); None for anything else."""
    exc = getattr(outcome, "exception", None)
    if isinstance(exc, ExceptionWithTraceback):
        exc = exc.exc
    return exc if isinstance(exc, NotRun) else None


def started_no_work(outcome: Any) -> bool:
    """Whether a delivery's outcome (what Celery's tracer hands back) is a refusal: a copy
    under its own id returns the reason, an attempt's own id raises ``NotRun``."""
    if isinstance(outcome, str):
        return outcome.startswith(NOT_RUN)
    return not_run_of(outcome) is not None


# A task event and its fields; no event: (None, {}).
Event = tuple[str | None, Mapping[str, Any]]


def revoked(*, expired: bool) -> tuple[str, Mapping[str, Any]]:
    """Celery's task-revoked of a task that never ran (or a revoke without terminate)."""
    return ("task-revoked", {"terminated": False, "signum": None, "expired": expired})


# The task event of each refusal of an attempt's own delivery. Left out (no journal run
# for the message, or a key held by another): the delivery's own result, as before.
_REFUSED: Final[Mapping[Refusal, Event]] = {
    # Ended unrun by the journal, as Celery's worker reports a message it let expire.
    Refusal.EXPIRED: revoked(expired=True),
    # Requeued to a later attempt: RETRY, as the attempt's own end said (Celery lets a
    # copy's task-received replace a RETRY, but not a SUCCESS, FAILURE or REVOKED).
    Refusal.STALE_ATTEMPT: ("task-retried", {}),
    Refusal.REQUEUED: ("task-retried", {}),
    # The job ended while this attempt waited: it never runs, as a revoked message.
    Refusal.UNSTARTED: revoked(expired=False),
    # Ended, running elsewhere, or published again later: that delivery's events tell it.
    **dict.fromkeys(
        (
            Refusal.TERMINAL,
            Refusal.IN_FLIGHT,
            Refusal.EARLY,
            Refusal.WAITING,
            Refusal.PAUSED,
            Refusal.THROTTLED,
        ),
        (None, {}),
    ),
}


# The task event of an attempt of its own task id that its delivery did not end.
_NOT_ENDED_HERE: Final[Mapping[End, Event]] = {
    End.CANCELLED: revoked(expired=False),
    End.LEASE_LOST: (None, {}),
}


@cache
def _dressed(module: str, qualname: str) -> type[AttemptFailed]:
    """An ``AttemptFailed`` that a formatted traceback names as the body's exception class."""
    name = qualname.rpartition(".")[2]
    return type(name, (AttemptFailed,), {"__module__": module, "__qualname__": qualname})


def shown_failure(
    exc: BaseException, *, entry: CodeType, note: str, secrets: Sequence[str]
) -> AttemptFailed:
    """``exc`` as Celery should report it: its class, its scrubbed message, the frames from
    the body's call down (those below ``entry``, the frame that called the body) and
    ``note``. Raise it outside any ``except`` block, so no jobsapp exception is chained."""
    kind = type(exc)
    shown = _dressed(kind.__module__, kind.__qualname__)(
        scrub(str(exc), secrets=secrets), kind.__name__
    )
    shown.said = _said(exc, secrets)
    shown.add_note(note)
    return shown.with_traceback(_below(exc.__traceback__, entry))


def _said(exc: BaseException, secrets: Sequence[str]) -> str | None:
    """``exc``'s repr as Celery's task-failed event carries it, scrubbed."""
    try:
        return scrub(saferepr(exc, REPR_MAX), secrets=secrets)
    except Exception:  # noqa: BLE001 - a team's __repr__ may raise anything: the default
        return None


def _below(tb: TracebackType | None, entry: CodeType) -> TracebackType | None:
    """The frames under the one running ``entry``; all of them when none does (the body's
    exception came through ``self.retry(exc=...)``, caught in the body itself)."""
    walk = tb
    while walk is not None:
        if walk.tb_frame.f_code is entry:
            return walk.tb_next
        walk = walk.tb_next
    return tb


def report(
    env: Envelope,
    ended: Ended | Refusal,
    task_id: str,
    *,
    entry: CodeType,
    secrets: Sequence[str],
) -> Any:
    """Delivery ``task_id``'s Celery result, or the exception that gives its task Flower's
    state.

    A succeeded attempt's result is what the body returned: Flower's result column and
    Celery's ``task-succeeded`` event carry it, as for any Celery task.

    A requeued attempt raises ``Retry`` (RETRY, acked, nothing re-sent: the journal already
    scheduled the next attempt, whose task id its note names); a failed one raises
    ``AttemptFailed`` dressed as the body's exception (FAILURE, acked); a delivery that
    started no work returns what happened instead, or raises ``NotRun`` when its task is
    the attempt's own. ``entry`` is the frame that called the body: the traceback Flower
    shows starts below it.
    """
    if isinstance(ended, Refusal):
        return _not_run(env, ended, task_id)
    if ended.end is End.SUCCEEDED:
        return ended.value
    label = f"job {env.job_id} attempt {env.attempt}"
    if ended.end is End.REQUEUED:
        following = task_id_for(env.job_id, env.attempt + 1)
        shown = _shown(
            ended,
            f"jobsapp: {env.module} {label} requeued; next: attempt "
            f"{env.attempt + 1}, task {following}",
            entry,
            secrets,
        )
        # Celery's worker sends task-retried once this raises: the attempt's task-started,
        # if held, goes first (Flower takes a started event after a retry as a new run).
        flush_held()
        raise Retry(f"{label} requeued", exc=shown) from shown
    if ended.end is End.FAILED:
        raise _shown(ended, f"jobsapp: {env.module} {label} {ended.summary}", entry, secrets)
    said = f"{label}: {ended.end.value}{': ' if ended.summary else ''}{ended.summary}"
    # Not a success: a revoke stopped it (REVOKED), or another actor decided the run (the
    # reaper, which sent the attempt's event of what it decided).
    return _no_success(env, task_id, said, _NOT_ENDED_HERE[ended.end])


def _not_run(env: Envelope, refusal: Refusal, task_id: str) -> str:
    return _no_success(env, task_id, not_run(refusal), _REFUSED.get(refusal))


def _no_success(env: Envelope, task_id: str, said: str, event: Event | None) -> str:
    """``said`` as the result of a delivery under a task id of its own (a copy sent under
    another id: what it did is true, a task of its own in Flower); under the attempt's own,
    ``NotRun`` carrying ``event``, so that no task-succeeded outranks the journal's state."""
    if event is None or task_id != task_id_for(env.job_id, env.attempt):
        return said
    raise NotRun(said, *event)


def _shown(ended: Ended, note: str, entry: CodeType, secrets: Sequence[str]) -> AttemptFailed:
    """The attempt's failure as Celery reports it: the body's exception where there is one
    (a snooze has none), with ``note`` naming the job."""
    if ended.error is None:
        failed = AttemptFailed(ended.summary)
        failed.add_note(note)
        return failed
    return shown_failure(ended.error, entry=entry, note=note, secrets=secrets)


def call_fields(
    args: Sequence[Any], kwargs: Mapping[str, Any], secrets: Sequence[str]
) -> dict[str, str]:
    """The body's arguments as Flower's args and kwargs columns, scrubbed."""
    return {"args": _call_part(tuple(args), secrets), "kwargs": _call_part(dict(kwargs), secrets)}


def _call_part(part: tuple[Any, ...] | dict[str, Any], secrets: Sequence[str]) -> str:
    # An empty part is what saferepr and scrub make of it, without their ~30 us: a
    # domain's body never has positional arguments.
    if not part:
        return "()" if isinstance(part, tuple) else "{}"
    return scrub(saferepr(part, REPR_MAX), secrets=secrets)


# The dispatcher of each (process, worker name), with the connection it owns: a forked
# child builds its own (its parent's connection is not its to use).
_dispatchers: dict[tuple[int, str], EventDispatcher] = {}
_dispatchers_lock = threading.Lock()
# A pool child's task-started events wait at most this long (seconds) and go out together,
# up to Celery's 24 to a message: a publish per event cost a job 185 calls.
EVENTS_WINDOW: Final = 0.25


def send_started(app: Celery, task_id: str, hostname: str, fields: Mapping[str, Any]) -> None:
    """A ``task-started`` event of ``task_id`` carrying ``fields``, published within
    ``EVENTS_WINDOW``.

    ``Task.send_event`` takes a producer from the pool and builds a dispatcher (an exchange,
    a producer, a lock) for every event, about as much CPU as the publish itself; this
    process keeps one, which holds its events as Celery's worker holds its own (the
    ``task`` group, published as one ``task.multi`` message of up to 24 events, which
    Celery's receivers and Flower take apart) and a thread of its own publishes them within
    the window. A failed publish drops the dispatcher, and the next event starts afresh on
    a new connection (an AMQP connection does not come back by itself); its events, a live
    view, are lost.
    """
    dispatcher = _dispatcher(app, hostname)
    try:
        dispatcher.send("task-started", uuid=task_id, retry=False, **fields)
    except BaseException:
        _drop(dispatcher)
        raise


def _dispatcher(app: Celery, hostname: str) -> EventDispatcher:
    key = (os.getpid(), hostname)
    with _dispatchers_lock:
        found = _dispatchers.get(key)
        if found is None:
            flusher = _Flusher()
            found = _dispatchers[key] = app.events.Dispatcher(
                # Bounded as a publish: a silent broker must not hold a child that is
                # leaving (its last flush runs in its main thread) past the timeout.
                publisher.bounded_connection(app),
                hostname=hostname,
                buffer_while_offline=False,
                buffer_group=["task"],
                on_send_buffered=flusher.soon,
            )
            flusher.start(found)
            # A pool child leaving (``--max-tasks-per-child``) exits with os._exit, its
            # flusher thread with it: what it still holds goes out first.
            worker_process_shutdown.connect(
                _flush_on_child_exit, weak=False, dispatch_uid="jobsapp.task-events"
            )
        return found


def _flush_on_child_exit(**_: object) -> None:
    flush_held()


def flush_held() -> None:
    """Publish this process's held task events now."""
    pid = os.getpid()
    with _dispatchers_lock:
        held = [found for (owner, _host), found in _dispatchers.items() if owner == pid]
    for dispatcher in held:
        _flush(dispatcher)


def _flush(dispatcher: EventDispatcher) -> None:
    try:
        dispatcher.flush(errors=False)
    except Exception as down:  # noqa: BLE001 - a live view; the next event reconnects
        log.info("task events not sent: %s", type(down).__name__)
        _drop(dispatcher)


class _Flusher:
    """Publishes a dispatcher's held events ``EVENTS_WINDOW`` after the first of them."""

    def __init__(self) -> None:
        self._due = threading.Event()

    def start(self, dispatcher: EventDispatcher) -> None:
        name = "jobsapp-task-events"
        threading.Thread(target=self._run, args=(dispatcher,), name=name, daemon=True).start()

    def soon(self) -> None:
        # Set once per window: an event held while the thread waits rides along.
        if not self._due.is_set():
            self._due.set()

    def _run(self, dispatcher: EventDispatcher) -> None:
        while not dispatcher._closed:  # type: ignore[attr-defined]
            # A while at a time: a dispatcher dropped by the sender ends its thread too.
            if not self._due.wait(timeout=30.0):
                continue
            time.sleep(EVENTS_WINDOW)
            # Cleared before the publish: an event held during it arms the next window.
            self._due.clear()
            _flush(dispatcher)


def _drop(dispatcher: EventDispatcher) -> None:
    with _dispatchers_lock:
        for key in [k for k, v in _dispatchers.items() if v is dispatcher]:
            del _dispatchers[key]
    dispatcher.close()
    if dispatcher.connection is not None:
        dispatcher.connection.collect()


def started_shows_call(app: Celery, name: str) -> bool:
    """Whether the attempts of task ``name`` send their own ``task-started`` with the user's
    call (``LifecycleRequest``), which a ``task-received`` heard later must not undo."""
    task = app.tasks.get(name)
    return task is not None and issubclass(symbol_by_name(task.Request), LifecycleRequest)


class LifecycleRequest(Request):
    """Celery's request, telling the pool child whether this worker sends task events.

    Flower switches a worker's task events on and off while it runs; only the worker's
    own dispatcher knows, and the child, which has a dispatcher of its own, must not send
    events that nobody asked for (they cost throughput)."""

    _eventer: Any  # set by Request.__init__; celery's stubs leave it out

    def send_event(self, type: str, **fields: Any) -> None:
        """Every event but Celery's own ``task-started``: the attempt sends its one
        ``task-started`` once its claim holds, with the user's call (``send_started``);
        a second, with the envelope as arguments, counted each attempt twice."""
        if type != "task-started":
            super().send_event(type, **fields)

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> None:
        """Celery acks an ``Ignore`` and sends nothing; a ``NotRun`` sends its event."""
        super().on_failure(exc_info, send_failed_event, return_ok)
        refused = not_run_of(exc_info)
        if refused is not None and refused.event is not None:
            self.send_event(refused.event, **refused.fields)

    def on_timeout(self, soft: bool, timeout: float) -> None:
        """A hard limit: the pool kills the child, which cannot write its end; the
        journal records it here first (lifecycle/worker/timeouts.py), then Celery reports it.
        Nothing may escape: billiard kills the child only after this returns."""
        if not soft and not worker_state.should_terminate:
            try:
                timeouts.ended_by_pool(self, timeout)
            except Exception:
                log.exception("job of task %s: hard time limit not recorded", self.id)
        super().on_timeout(soft, timeout)

    def terminate(self, pool: Any, signal: Any = None) -> None:
        """``revoke(terminate=True)``: the pool kills the child, which cannot write its end;
        the journal's cancel (written by the revoke before its broadcast) is honoured here,
        at once, instead of by the reaper once the heartbeat has gone stale."""
        running = bool(self.time_start)
        super().terminate(pool, signal)
        if running and not worker_state.should_terminate:
            try:
                timeouts.cancelled_by_pool(self)
            except Exception:
                log.exception("job of task %s: its terminate not recorded", self.id)

    @property
    def request_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = super().request_dict
        eventer = self._eventer
        found[EVENTS_ON] = bool(
            eventer is not None
            and eventer.enabled
            and self.task.send_events
            and (not eventer.groups or "task" in eventer.groups)
        )
        return found
