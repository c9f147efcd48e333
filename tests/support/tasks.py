"""Tasks the lifecycle tests drive; effects are counted in Redis so any process can see them."""

from __future__ import annotations

import os
import time
from typing import Any

import redis

from jobsapp.celery_app import app
from jobsapp.lifecycle import RetryAfter, RetryPolicy, current_run, lifecycle_task

FAST_RETRY = RetryPolicy(base_delay=0.3, max_delay=1.0, jitter=0.0)


def counter() -> redis.Redis:
    return redis.Redis.from_url(os.environ["JOBSAPP_TEST_REDIS_URL"])


def _key(name: str) -> str:
    """Counters of one test session; subprocess workers of e2e tests have no namespace."""
    namespace = os.environ.get("JOBSAPP_TEST_NAMESPACE")
    return f"jobsapp-test:{namespace}:calls:{name}" if namespace else f"jobsapp-test:calls:{name}"


def record(name: str) -> int:
    """Count one execution of a body under ``name``; returns the count so far."""
    return int(counter().incr(_key(name)))


def calls(name: str) -> int:
    return int(counter().get(_key(name)) or 0)


@lifecycle_task(app, name="tests.echo", dedup_window=0)
def echo(token: str) -> None:
    record(token)


@lifecycle_task(app, name="tests.windowed", dedup_window=1.0)
def windowed(token: str) -> None:
    record(token)


# Runs longer than its dedup window: the Redis key is gone before the job finishes.
SLOW_WINDOW = 3.0


@lifecycle_task(app, name="tests.windowed_slow", dedup_window=SLOW_WINDOW)
def windowed_slow(token: str, seconds: float) -> None:
    record(token)
    time.sleep(seconds)


@lifecycle_task(app, name="tests.flaky", max_attempts=5, retry_policy=FAST_RETRY)
def flaky(token: str, fail_times: int, secret: str) -> None:
    if record(token) <= fail_times:
        raise ConnectionError(f"upstream down at postgresql://app:{secret}@db.internal/jobs")


@lifecycle_task(app, name="tests.doomed", max_attempts=2, retry_policy=FAST_RETRY)
def doomed(token: str) -> None:
    record(token)
    raise ValueError("this never works")


@lifecycle_task(app, name="tests.doomed_carrying", max_attempts=1)
def doomed_carrying(token: str, nan_only: bool) -> None:
    """Raises with arguments Celery's JSON result keeps as they are, and one (a NaN) that
    JSON has no number for; or with that NaN alone."""
    record(token)
    if nan_only:
        raise ValueError(float("nan"))
    raise ValueError({"field": "email", "code": 7}, float("nan"))


@lifecycle_task(app, name="tests.sleepy", key="sleepy:{token}")
def sleepy(token: str, seconds: float) -> None:
    record(token)
    ctx = current_run()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.1)
    ctx.check_lease()
    record(f"{token}:published")


@lifecycle_task(app, name="tests.keyed", key="account:{account}")
def keyed(account: str, token: str, seconds: float = 0.0) -> None:
    record(token)
    time.sleep(seconds)


@lifecycle_task(app, name="tests.paused", max_attempts=3)
def paused(token: str, seconds: float) -> None:
    if record(token) == 1:
        raise RetryAfter(seconds, "rate limited upstream")
    record(f"{token}:done")


@lifecycle_task(
    app,
    name="tests.celery_retry",
    autoretry_for=(KeyError,),
    max_retries=2,
    retry_policy=FAST_RETRY,
)
def celery_retry(token: str) -> None:
    if record(token) < 3:
        raise KeyError("not yet")


@lifecycle_task(app, name="tests.retries_in_a_minute", bind=True)
def retries_in_a_minute(self: Any, token: str) -> int:
    """Asks for a retry a minute on at its first run; its second returns its retries."""
    if record(token) == 1:
        raise self.retry(countdown=60)
    return int(self.request.retries)


@lifecycle_task(app, name="tests.snoozer", max_snoozes=2)
def snoozer(token: str) -> None:
    record(token)
    raise RetryAfter(2.5, "come back later")


@lifecycle_task(app, name="tests.tick")
def tick() -> None:
    """A task a foreign producer can call knowing only its name."""
    record(f"tick:{current_run().job_id}")


@lifecycle_task(app, name="tests.long_first", key="long-first:{token}")
def long_first(token: str, seconds: float) -> None:
    """Sleeps ``seconds`` on attempt 1 only (long enough to be killed), then finishes.

    Counts ``<token>:started:<attempt>`` at the start and ``<token>:done:<attempt>`` once
    the attempt's effect is published, so a test sees which attempt completed.
    """
    ctx = current_run()
    record(f"{token}:started:{ctx.attempt}")
    if ctx.attempt == 1:
        ctx.heartbeat.wait(seconds)
    ctx.check_lease()
    record(f"{token}:done:{ctx.attempt}")


@lifecycle_task(app, name="tests.suicidal", max_attempts=10)
def suicidal(token: str) -> None:
    """A poison job: kills the process running it on every attempt (as an OOM kill would)."""
    import signal  # appended task: the module's imports are left as they are

    record(token)
    os.kill(os.getpid(), signal.SIGKILL)


@lifecycle_task(app, name="tests.fails_once", max_attempts=1)
def fails_once(token: str) -> None:
    """Fails permanently on its first attempt, succeeds on any later one: a job whose
    cause an operator fixed before replaying it. No shared state decides, so a suite
    that empties the test keys meanwhile cannot change the outcome."""
    from jobsapp.lifecycle import PermanentError  # appended task: imports left as they are

    record(token)
    if current_run().attempt == 1:
        raise PermanentError("upstream refuses this job until someone fixes it")


def planted_secrets(token: str) -> dict[str, str]:
    """The credentials ``tests.leaky`` puts in its errors, derived from ``token``: the
    arguments the journal keeps hold none of them, yet a test can name every one."""
    import hashlib  # appended helper: the module's imports are left as they are

    kinds = ("db", "aws", "sig", "bearer", "url", "token")
    return {k: hashlib.sha256(f"{token}:{k}".encode()).hexdigest()[:28] for k in kinds}


@lifecycle_task(app, name="tests.leaky", max_attempts=2, retry_policy=FAST_RETRY)
def leaky(token: str) -> None:
    """Fails with credentials in its error text: a transient error on attempt 1 (a retry
    event), a permanent one on attempt 2, each caused by an error holding a database URL."""
    from jobsapp.lifecycle import PermanentError  # appended task: imports left as they are

    s = planted_secrets(token)
    cause = OSError(f"connect to postgresql://app:{s['db']}@db.internal:5432/jobs failed")
    if current_run().attempt == 1:
        raise ConnectionError(
            f"upstream refused us; env was AWS_SECRET_ACCESS_KEY={s['aws']} AWS_REGION=eu-west-1"
        ) from cause
    raise PermanentError(
        "GET https://bucket.s3.amazonaws.com/k.jpg?X-Amz-Algorithm=AWS4-HMAC-SHA256"
        "&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20261130%2Fus-east-1%2Fs3%2Faws4_request"
        f"&X-Amz-Signature={s['sig']} answered 403 to Bearer {s['bearer']}; "
        f"fallback https://svc:{s['url']}@api.example.com/v1/items?access_token={s['token']}"
    ) from cause


def open_gate(token: str, run: int) -> None:
    """Let the ``run``-th body of ``tests.gated`` under ``token`` (1 = the first) end."""
    counter().set(_key(f"{token}:gate:{run}"), 1)


@lifecycle_task(app, name="tests.lineage_seen", bind=True)
def lineage_seen(self: Any, *_: Any) -> list[str | None]:
    """What Celery gives the body as its ``root_id`` and ``parent_id`` (a canvas step's
    arguments ignored)."""
    return [self.request.root_id, self.request.parent_id]


@lifecycle_task(app, name="tests.sends_lineage", bind=True)
def sends_lineage(self: Any) -> str:
    """Calls ``lineage_seen`` from its body; the id of that call."""
    return str(lineage_seen.delay().id)


@lifecycle_task(app, name="tests.gated", key="gated:{token}")
def gated(token: str, seconds: float) -> None:
    """Runs until the test opens its gate (at most ``seconds``) and never looks at its
    lease, as a body deep in a library call would not; counts ``<token>:told`` if its
    heartbeat had told it the lease was lost by the time it ends."""
    run = record(token)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not counter().exists(_key(f"{token}:gate:{run}")):
        time.sleep(0.05)
    if current_run().heartbeat.lost:
        record(f"{token}:told")


@lifecycle_task(app, name="tests.looping", heartbeat_interval=0.2)
def looping(token: str, seconds: float = 60.0) -> None:
    """A body that loops and sleeps, never asking its context: only the heartbeat's raise
    stops it early. Counts its start under ``token`` and its end under ``token-done``."""
    record(token)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.05)
    record(f"{token}-done")
