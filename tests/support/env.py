"""Test configuration: real services from scripts/services.sh, set before jobsapp loads."""

from __future__ import annotations

import atexit
import os
import tempfile
from pathlib import Path

import pytest

from tests.support.servers import RedisServer

IN_CI = os.environ.get("CI", "").lower() == "true"
VAR_DIR = tempfile.mkdtemp(prefix="jobsapp-tests-")
# Names of this session's database, queue and counters, so two test sessions on one set
# of services (a developer's and a helper's) never see each other's jobs.
SESSION = f"s{os.getpid()}"
# The hypothesis profile tests/conftest.py loads: "ci" (derandomized) or "explore".
HYPOTHESIS_PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
# The variables configure_process_env set, not found: what a child session must not inherit.
_SET_BY_SESSION = "JOBSAPP_TEST_SET_BY_SESSION"


def _session_redis() -> str | None:
    """A ``redis-server`` of this session's own in place of the shared one, whose URL
    tells that the services run: nothing another session (an xdist worker, a colleague)
    does to its broker, queues or dedup keys reaches ours. It dies with this process."""
    if not os.environ.get("JOBSAPP_TEST_REDIS_URL"):
        return None
    server = RedisServer(Path(VAR_DIR) / "redis", dies_with_pytest=True)
    server.start()
    atexit.register(server.close)
    os.environ["JOBSAPP_TEST_REDIS_URL"] = server.url
    return server.url


def examples(ci: int, explore: int) -> int:
    """A heavy property's max_examples: ``ci`` replays the same fixed set on every run (more
    would only repeat its cost), ``explore`` looks further for new failures."""
    return explore if HYPOTHESIS_PROFILE == "explore" else ci


def service(name: str) -> str:
    """The URL of a test service; in CI a missing one fails, locally it skips."""
    value = os.environ.get(name)
    if value:
        return value
    message = f"{name} is not set: start the services (scripts/services.sh start)"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def configure_process_env() -> None:
    """Point jobsapp (and any worker subprocess) at the test services.

    A session started by another (an xdist worker by its controller) inherits the values
    the other set for itself, its namespace and Redis among them: those are dropped first,
    so every session sets its own, and only what the caller's environment held wins."""
    for key in filter(None, os.environ.pop(_SET_BY_SESSION, "").split(",")):
        os.environ.pop(key, None)
    redis_url = _session_redis()
    defaults = {
        "JOBSAPP_VAR_DIR": VAR_DIR,
        "JOBSAPP_DATABASE_URL": os.environ.get("JOBSAPP_TEST_DATABASE_URL")
        or f"sqlite:///{VAR_DIR}/jobsapp.db",
        "JOBSAPP_BROKER_URL": redis_url or "memory://",
        "JOBSAPP_STORAGE_URL": f"file://{VAR_DIR}/storage",
        "JOBSAPP_REDIS_URL": redis_url or "",
        "JOBSAPP_IMPORTS": "tests.support.tasks",
        "JOBSAPP_HEARTBEAT_INTERVAL": "0.5",
        "JOBSAPP_STALE_AFTER": "3",
        "JOBSAPP_INLINE_WAIT_MAX": "2",
        "JOBSAPP_TEST_NAMESPACE": SESSION,
    }
    mine = [key for key, value in defaults.items() if value and key not in os.environ]
    for key in mine:
        os.environ[key] = defaults[key]
    os.environ[_SET_BY_SESSION] = ",".join(mine)


def shell_env(**settings: str) -> dict[str, str]:
    """A fresh shell's environment (no ``JOBSAPP_*`` variable set) plus ``settings``."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("JOBSAPP_")}, **settings}


def bare_env() -> dict[str, str]:
    """The environment of a fresh shell: no JOBSAPP_* variable set."""
    return {k: v for k, v in os.environ.items() if not k.startswith("JOBSAPP_")}
