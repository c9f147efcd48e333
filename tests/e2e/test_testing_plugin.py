"""The testing kit's plugin on PostgreSQL: with ``JOBSAPP_TEST_DATABASE_URL`` (and no server
of its own named), a team's test session gets a database of its own beside the one the URL
names, emptied per test and dropped at the session's end; xdist workers get one each.
The team's tests (examples/team_app/tests) run in a pytest of their own, as a team runs them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from tests.support.databases import drop_postgres, fresh_postgres
from tests.support.env import SESSION, service, shell_env
from tests.support.webserver import REPO

NAMED = f"jobsapp_kitsrv_{SESSION}"


@pytest.fixture
def named_url() -> Iterator[str]:
    """The database the team's URL names: empty, so anything written there shows."""
    admin = service("JOBSAPP_TEST_DATABASE_URL")
    url = fresh_postgres(admin, NAMED)
    yield url
    create_engine(url).dispose()
    drop_postgres(admin, NAMED)


def _databases(url: str) -> list[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            found = conn.execute(
                text("SELECT datname FROM pg_database WHERE datname LIKE :p"),
                {"p": f"{NAMED}_kit_%"},
            )
            return sorted(found.scalars())
    finally:
        engine.dispose()


# A test of the team's that names the database its process is on.
OWN_PROCESS = """
import os

from jobsapp.settings import get_settings


def test_this_process_has_a_journal_of_its_own(jobsapp):
    assert get_settings().database_url.endswith(f"_kit_{os.getpid()}")
"""


# A team's conftest.py that imports its tasks (and so jobsapp's app) as it is loaded.
IMPORTS_THE_TASKS = "import billing.tasks  # noqa: F401\n"


# A Celery team's suite on its lifecycle tasks, written with Celery's own testing tools
# (celery.contrib.pytest, loaded with -p as Celery's docs say): its session worker runs on
# the team's app, which is jobsapp's.
CELERY_TOOLS_CONFTEST = """
import celery.contrib.testing.tasks  # noqa: F401 - celery.ping, the worker's start check
import pytest

from jobsapp.celery_app import app


@pytest.fixture(scope="session")
def celery_session_app():
    return app
"""

CELERY_TOOLS = """
import pytest
from billing.tasks import charge, invoice
from celery import Celery
from celery.result import EagerResult

from jobsapp.celery_app import app
from jobsapp.lifecycle import lifecycle_task

bare = Celery("bare")


def refuse(account):
    raise ValueError(f"no account {account}")


bare_refuse = bare.task(name="team.refuse")(refuse)
our_refuse = lifecycle_task(app, name="team.refuse", max_attempts=1)(refuse)


@lifecycle_task(app, name="team.later", bind=True)
def later(self, account):
    if not self.request.retries:
        raise self.retry(countdown=2)
    return f"later {account}"


@pytest.fixture
def eager():
    for each in (app, bare):
        each.conf.update(task_always_eager=True, task_eager_propagates=True)
    yield
    for each in (app, bare):
        each.conf.update(task_always_eager=False, task_eager_propagates=False)


def test_a_call_under_task_always_eager_runs_here_without_the_kit(eager):
    # First in the session: no test has asked for the kit yet.
    result = charge.delay("acct-e")  # its first attempt fails, the retry runs here too
    assert isinstance(result, EagerResult)
    assert result.get() == "charged acct-e"
    for task in (bare_refuse, our_refuse):
        with pytest.raises(ValueError, match="no account acct-x"):
            task.delay("acct-x")


def test_the_session_worker_runs_a_call(jobsapp, celery_session_worker):
    assert invoice.delay("acct-s").get(timeout=30) == "invoiced acct-s"
    assert jobsapp.assert_succeeded(invoice)


def test_the_session_worker_retries_a_call_as_the_same_job(jobsapp, celery_session_worker):
    assert charge.delay("acct-r").get(timeout=30) == "charged acct-r"
    (run,) = jobsapp.runs(charge)
    assert (run.state, run.attempts) == ("succeeded", 2)


def test_a_countdown_and_a_retrys_countdown_run_when_due(jobsapp, celery_session_worker):
    # Both wait in the journal (JOBSAPP_INLINE_WAIT_MAX=1 for this run): no beat here.
    assert invoice.apply_async(("acct-c",), countdown=2).get(timeout=15) == "invoiced acct-c"
    assert later.delay("acct-l").get(timeout=15) == "later acct-l"
"""


def _team_tests(
    tmp_path: Path,
    url: str | None,
    *args: str,
    code: int = 0,
    only: str = "tests",
    **env: str,
) -> tuple[int, str]:
    team = tmp_path / "team_app"
    shutil.copytree(
        REPO / "examples" / "team_app", team, ignore=shutil.ignore_patterns("__pycache__")
    )
    (team / "tests" / "conftest.py").write_text(IMPORTS_THE_TASKS)
    (team / "celery_tools").mkdir()  # collected only when named
    (team / "celery_tools" / "conftest.py").write_text(CELERY_TOOLS_CONFTEST)
    (team / "celery_tools" / "test_celery_tools.py").write_text(CELERY_TOOLS)
    if url is not None:
        (team / "tests" / "test_own_process.py").write_text(OWN_PROCESS)
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, only]
    own = {} if url is None else {"JOBSAPP_TEST_DATABASE_URL": url}
    # The caller's PYTHONPATH kept: a worktree's run tests its own jobsapp.
    path = os.pathsep.join(filter(None, [str(team), os.environ.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        argv,
        cwd=team,
        env=shell_env(PYTHONPATH=path, **own, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == code, out[-3000:]
    return proc.pid, out


def _as_documented(url: str) -> str:
    """``postgresql://`` with no driver named, as docs/testing.md writes the URL (SQLAlchemy
    alone would take it for psycopg 3, which jobsapp does not install)."""
    return "postgresql://" + url.partition("://")[2]


def test_a_session_gets_a_database_of_its_own_and_drops_it(named_url: str, tmp_path: Path) -> None:
    pid, out = _team_tests(tmp_path, _as_documented(named_url))
    assert "11 passed" in out, out[-3000:]
    assert "jobsapp: journal on postgresql+psycopg2://" in out
    assert f"/{NAMED}_kit_{pid}\n" in out
    engine = create_engine(named_url)
    try:
        assert inspect(engine).get_table_names() == []  # nothing in the named database
    finally:
        engine.dispose()
    assert _databases(named_url) == []  # the session's own is gone


def test_xdist_workers_each_get_a_database_of_their_own(named_url: str, tmp_path: Path) -> None:
    """Each worker drops what the controller set for itself and makes its own: two
    workers emptying one journal before each test would fail each other's tests. With
    ``loadfile`` a worker may run only the test that names its process's database."""
    _pid, out = _team_tests(tmp_path, named_url, "-n", "2", "--dist", "loadfile")
    assert "11 passed" in out, out[-3000:]
    assert _databases(named_url) == []


def test_with_nothing_set_the_journal_is_the_sessions_own_not_the_teams_var(
    tmp_path: Path,
) -> None:
    """The team's conftest imports its tasks before any test: the journal is still one in a
    temporary folder of the session's, never the working directory's var/ (the team's own
    embedded journal, which the kit empties before each test)."""
    _pid, out = _team_tests(tmp_path, None)
    assert "10 passed" in out, out[-3000:]
    assert "jobsapp: journal on sqlite:///" in out
    assert "/jobsapp-tests-" in out, out[-3000:]
    assert not (tmp_path / "team_app" / "var").exists()


def test_a_plugin_that_reads_jobsapps_settings_first_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    """A plugin loaded before the kit chose the journal (here the team's tasks, ``-p``)
    built jobsapp's app on the working directory's var/: the kit would have emptied the
    team's own journal before each test."""
    _pid, out = _team_tests(tmp_path, None, "-p", "billing.tasks", code=4)
    assert (
        "ERROR: jobsapp's settings were read before its pytest plugin chose the session's "
        "journal (a plugin imported jobsapp's app): import it from conftest.py or the tests"
    ) in out, out[-3000:]


def test_a_celery_teams_own_testing_tools_run_beside_the_kit(tmp_path: Path) -> None:
    """Celery's plugin (``-p celery.contrib.pytest``) and jobsapp's in one session:
    ``task_always_eager`` in a test that asks for no kit, and ``celery_session_worker`` on
    jobsapp's app beside the ``jobsapp`` fixture. Before, the journal was migrated by the
    ``jobsapp`` fixture alone: the eager call found no tables, and the session worker
    (set up before any test's own fixtures) stopped at its start-up check. A countdown (or
    a retry's) beyond the inline wait, which Celery's worker runs when due, waited in the
    journal for a beat the session does not run: the relay's tick now runs beside an
    embedded worker (jobsapp/testing/beside.py)."""
    _pid, out = _team_tests(
        tmp_path,
        None,
        "-p",
        "celery.contrib.pytest",
        only="celery_tools",
        JOBSAPP_INLINE_WAIT_MAX="1",
    )
    assert "4 passed" in out, out[-3000:]
