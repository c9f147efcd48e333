"""A missing dependency is one line naming its setting and a documented exit code.

Each test runs the real command (``jobsapp ...``, ``celery -A jobsapp worker|beat``,
``jobsapp web``, gunicorn) against one broken dependency: a closed port for the database,
the broker or S3, a database that exists but was never migrated, a bucket that does not
exist. Everything else points at the real test services, so only that one thing is wrong.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from jobsapp.preflight import ExitCode
from tests.support.databases import drop_postgres, fresh_postgres
from tests.support.env import SESSION, service
from tests.support.procs import Launcher, beat_argv
from tests.support.waiting import eventually
from tests.support.webserver import Http, free_port

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
# Nothing listens on port 9 (discard) here: every connection is refused at once.
CLOSED = "127.0.0.1:9"
DEAD_DATABASE = f"postgresql+psycopg2://postgres@{CLOSED}/none"
# A queue nobody else uses: a worker that wrongly started would consume nothing of others'.
QUEUE = f"jobsapp-errors-{SESSION}"


@pytest.fixture(scope="module")
def unmigrated_url() -> Iterator[str]:
    admin = service("JOBSAPP_TEST_DATABASE_URL")
    name = f"jobsapp_unmigrated_{SESSION}"
    yield fresh_postgres(admin, name)
    drop_postgres(admin, name)


@pytest.fixture
def good_env(postgres_url: str, tmp_path: Path) -> dict[str, str]:
    """A working configuration: migrated Postgres, Redis broker, the test bucket."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("JOBSAPP_")}
    return base | {
        "PYTHONPATH": str(ROOT),
        "JOBSAPP_VAR_DIR": str(tmp_path / "var"),
        "JOBSAPP_DATABASE_URL": postgres_url,
        "JOBSAPP_BROKER_URL": service("JOBSAPP_TEST_REDIS_URL"),
        "JOBSAPP_STORAGE_URL": f"file://{tmp_path / 'objects'}",
        "JOBSAPP_API_TOKEN": "errors-producers-token-8e1c5a9f3b7d20",
    }


def s3(bucket: str | None = None, endpoint: str | None = None) -> dict[str, str]:
    """The test bucket on the test S3, or the bucket or endpoint given instead."""
    bucket = bucket or service("JOBSAPP_TEST_S3_BUCKET")
    return {
        "JOBSAPP_STORAGE_URL": f"s3://{bucket}/errors-{SESSION}",
        "JOBSAPP_S3_ENDPOINT_URL": endpoint or service("JOBSAPP_TEST_S3_ENDPOINT_URL"),
    }


def broken(what: str, unmigrated: str) -> dict[str, str]:
    """The one setting that breaks ``what``."""
    return {
        "database down": {"JOBSAPP_DATABASE_URL": DEAD_DATABASE},
        "not migrated": {"JOBSAPP_DATABASE_URL": unmigrated},
        "broker down": {"JOBSAPP_BROKER_URL": f"redis://{CLOSED}/0"},
        "S3 down": s3(endpoint=f"http://{CLOSED}"),
        "bucket missing": s3(bucket=f"no-such-bucket-{SESSION}"),
        "wrong S3 secret": s3() | {"AWS_SECRET_ACCESS_KEY": "not-the-secret"},
    }[what]


# what is broken -> the exit code and what the one line must say
EXPECTED: dict[str, tuple[int, tuple[str, ...]]] = {
    "database down": (
        ExitCode.DATABASE_UNREACHABLE,
        ("database unreachable", f"JOBSAPP_DATABASE_URL={DEAD_DATABASE}", "Connection refused"),
    ),
    "not migrated": (
        ExitCode.DATABASE_NOT_MIGRATED,
        (
            "database not migrated",
            "JOBSAPP_DATABASE_URL=",
            "jobsapp_unmigrated_",
            "run `jobsapp db upgrade`",
        ),
    ),
    "broker down": (
        ExitCode.BROKER_UNREACHABLE,
        ("broker unreachable", f"JOBSAPP_BROKER_URL=redis://{CLOSED}/0"),
    ),
    "S3 down": (
        ExitCode.S3_UNREACHABLE,
        ("S3 unreachable", f"JOBSAPP_S3_ENDPOINT_URL=http://{CLOSED}"),
    ),
    "bucket missing": (
        ExitCode.BUCKET_MISSING,
        ("bucket missing", "JOBSAPP_STORAGE_URL=s3://no-such-bucket-", "does not exist"),
    ),
    "wrong S3 secret": (ExitCode.S3_ACCESS_DENIED, ("S3 access denied", "AWS_SECRET_ACCESS_KEY")),
}


def run(argv: list[str], env: Mapping[str, str], timeout: float = 60) -> tuple[int, str, str]:
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(
            f"{argv} still ran after {timeout}s:\n{out[-2000:]}{err[-2000:]}"
        ) from None
    return proc.returncode, out, err


def assert_one_line(what: str, code: int, out: str, err: str) -> str:
    """The exit code of ``what``, exactly one ``jobsapp:`` line on stderr, no traceback."""
    expected_code, words = EXPECTED[what]
    ours = [line for line in err.splitlines() if line.startswith("jobsapp: ")]
    assert code == expected_code, f"exit {code}:\n{out[-2000:]}\n{err[-3000:]}"
    assert len(ours) == 1, err[-3000:]
    for word in words:
        assert word in ours[0], ours[0]
    assert "Traceback" not in out + err
    return ours[0]


CLI_CASES = [
    ("database down", ["summary"]),
    ("not migrated", ["summary"]),
    ("database down", ["db", "upgrade"]),
    ("not migrated", ["replay", str(uuid.UUID(int=1)), "--module", "jobs", "--reason", "r"]),
    ("broker down", ["maintenance", "run-once", "--pass", "relay"]),
    ("database down", ["maintenance", "run-once", "--pass", "reconcile"]),
    ("not migrated", ["reconcile"]),
    ("S3 down", ["verify"]),
    ("bucket missing", ["verify"]),
    ("wrong S3 secret", ["verify"]),
]


@pytest.mark.parametrize(("what", "args"), CLI_CASES, ids=[f"{w}-{a[0]}" for w, a in CLI_CASES])
def test_a_command_says_what_is_missing_in_one_line(
    what: str, args: list[str], good_env: dict[str, str], unmigrated_url: str
) -> None:
    code, out, err = run([str(BIN / "jobsapp"), *args], good_env | broken(what, unmigrated_url))

    assert_one_line(what, code, out, err)
    assert "botocore" not in err  # its INFO chatter ("Found credentials ...") is off


def test_db_upgrade_cures_not_migrated(good_env: dict[str, str]) -> None:
    # `db upgrade` is the cure for "not migrated": it must not refuse for that reason.
    admin = service("JOBSAPP_TEST_DATABASE_URL")
    name = f"jobsapp_upgraded_{SESSION}"
    env = good_env | {"JOBSAPP_DATABASE_URL": fresh_postgres(admin, name)}

    code, out, err = run([str(BIN / "jobsapp"), "db", "upgrade"], env)

    assert code == 0, err
    code, out, err = run([str(BIN / "jobsapp"), "summary"], env)
    drop_postgres(admin, name)
    assert code == 0, err
    assert out.startswith("MODULE")


WORKER_CASES = ["database down", "not migrated", "broker down", "bucket missing"]


@pytest.mark.parametrize("what", WORKER_CASES)
def test_a_worker_without_its_dependency_exits_before_ready(
    what: str, good_env: dict[str, str], unmigrated_url: str
) -> None:
    argv = [
        str(BIN / "celery"),
        "-A",
        "jobsapp",
        "worker",
        "--pool=solo",
        "-Q",
        QUEUE,
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "--loglevel",
        "INFO",
    ]

    code, out, err = run(argv, good_env | broken(what, unmigrated_url))

    assert_one_line(what, code, out, err)
    assert " ready." not in out + err


@pytest.mark.parametrize("what", ["database down", "not migrated"])
def test_beat_without_its_database_exits_instead_of_standing_by(
    what: str, good_env: dict[str, str], unmigrated_url: str, tmp_path: Path
) -> None:
    code, out, err = run(beat_argv(tmp_path / "schedule"), good_env | broken(what, unmigrated_url))

    assert_one_line(what, code, out, err)
    assert "standing by" not in out + err
    assert "is the leader" not in out + err


@pytest.mark.parametrize("what", ["not migrated", "S3 down", "bucket missing"])
def test_the_web_without_its_dependency_exits(
    what: str, good_env: dict[str, str], unmigrated_url: str
) -> None:
    argv = [str(BIN / "jobsapp"), "web", "--port", str(free_port())]

    code, out, err = run(argv, good_env | broken(what, unmigrated_url))

    assert_one_line(what, code, out, err)


def gunicorn(workers: int, tmp_path: Path) -> list[str]:
    # Its own control socket: the default one in ~/.gunicorn is shared machine-wide.
    return [
        str(BIN / "gunicorn"),
        "--bind",
        f"127.0.0.1:{free_port()}",
        "--workers",
        str(workers),
        "--control-socket",
        str(tmp_path / "gunicorn.ctl"),
        "jobsapp.web.app:create_app()",
    ]


def test_gunicorn_stops_with_the_line_instead_of_respawning_workers(
    good_env: dict[str, str], unmigrated_url: str, tmp_path: Path
) -> None:
    env = good_env | broken("bucket missing", unmigrated_url)

    code, out, err = run(gunicorn(1, tmp_path), env)

    # gunicorn halts only on its own boot-error code; the line says what to fix.
    assert code == ExitCode.GUNICORN_BOOT_ERROR, err[-3000:]
    ours = {line for line in err.splitlines() if line.startswith("jobsapp: ")}
    assert len(ours) == 1, err[-3000:]
    assert "bucket missing: JOBSAPP_STORAGE_URL=s3://no-such-bucket-" in ours.pop()
    assert "Traceback" not in out + err


def test_gunicorn_with_the_procfiles_two_workers_stops_too(
    good_env: dict[str, str], unmigrated_url: str, tmp_path: Path
) -> None:
    env = good_env | broken("bucket missing", unmigrated_url)

    code, _out, err = run(gunicorn(2, tmp_path), env)

    # When both workers fail at once, gunicorn 27 may raise its HaltServer a second time
    # while halting (its traceback, exit 1) instead of exiting 3: it stops either way.
    assert code in (ExitCode.GUNICORN_BOOT_ERROR, 1), err[-3000:]
    assert "jobsapp: bucket missing: JOBSAPP_STORAGE_URL=s3://no-such-bucket-" in err


def test_the_web_with_its_database_down_says_so_and_answers_503(
    good_env: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "web.log"
    env = good_env | {"JOBSAPP_DATABASE_URL": DEAD_DATABASE}
    with log.open("wb") as out:
        web = subprocess.Popen(
            [str(BIN / "jobsapp"), "web", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        http = Http(f"http://127.0.0.1:{port}")
        eventually(lambda: _status(http), timeout=30)
        assert _status(http) == 503
    finally:
        os.killpg(web.pid, signal.SIGKILL)
        web.wait()
    ours = [ln for ln in log.read_text().splitlines() if ln.startswith("jobsapp: ")]
    assert ours == [
        f"jobsapp: database unreachable at JOBSAPP_DATABASE_URL={DEAD_DATABASE}: "
        f'connection to server at "127.0.0.1", port 9 failed: Connection refused; '
        "serving 503 until it answers"
    ]


def _status(http: Http) -> int | None:
    try:
        return http.get("/healthz").status
    except OSError:
        return None


def test_a_beat_standing_by_names_the_beat_that_leads(
    good_env: dict[str, str], tmp_path: Path
) -> None:
    launcher = Launcher(env=good_env, workdir=tmp_path)
    try:
        leader = launcher.beat("beat-1").wait_for_log(r"beat (\S+) is the leader", timeout=60)
        standby = launcher.beat("beat-2").wait_for_log(
            r"beat (\S+) standing by: the lease is held by beat (\S+) until", timeout=60
        )
    finally:
        launcher.kill_all()

    assert standby[2] == leader[1]
    assert standby[1] != leader[1]


# ------------------------------------------------------------------ a bad setting

# A value that is not a number, and a token that ships in examples (docs/errors.md: exit 2).
BAD_SETTINGS = {
    "heartbeat": (
        {"JOBSAPP_HEARTBEAT_INTERVAL": "abc"},
        "jobsapp: configuration error: JOBSAPP_HEARTBEAT_INTERVAL='abc' is not a number",
    ),
    "admin token": (
        {"JOBSAPP_ADMIN_TOKEN": "secret"},
        "jobsapp: configuration error: JOBSAPP_ADMIN_TOKEN is a well-known placeholder",
    ),
    # Issue 34: a short token was accepted, to be guessed rather than brute-forced.
    "short admin token": (
        {"JOBSAPP_ADMIN_TOKEN": "abc1"},
        "jobsapp: configuration error: JOBSAPP_ADMIN_TOKEN has 4 characters, fewer than 32",
    ),
    # Issue 36: a typo fell back to the embedded default, a missing broker to filesystem://,
    # and a misspelled module printed a 63-line traceback with exit 1.
    "typo": (
        {"JOBSAPP_BROKR_URL": "redis://elsewhere/0"},
        "jobsapp: configuration error: JOBSAPP_BROKR_URL is not a jobsapp setting; "
        "did you mean JOBSAPP_BROKER_URL?",
    ),
    "broker missing": (
        {"JOBSAPP_BROKER_URL": ""},
        "jobsapp: configuration error: JOBSAPP_BROKER_URL is not set while "
        "JOBSAPP_DATABASE_URL and JOBSAPP_STORAGE_URL are",
    ),
    "imports": (
        {"JOBSAPP_IMPORTS": "myapp.taskz"},
        "jobsapp: configuration error: JOBSAPP_IMPORTS names myapp.taskz, which cannot "
        "be imported (No module named 'myapp')",
    ),
}
ENTRY_POINTS = {
    "summary": [str(BIN / "jobsapp"), "summary"],
    "verify": [str(BIN / "jobsapp"), "verify"],
    "db upgrade": [str(BIN / "jobsapp"), "db", "upgrade"],
    "jobsapp web": [str(BIN / "jobsapp"), "web", "--port", "0"],
    "python -m": [sys.executable, "-m", "jobsapp.attachments.commands", "verify"],
    "worker": [str(BIN / "celery"), "-A", "jobsapp", "worker", "--pool=solo", "-Q", QUEUE],
    "beat": [str(BIN / "celery"), "-A", "jobsapp", "beat", "-s", "/nonexistent/schedule"],
}


# Every entry point reads its settings through the same checks (jobsapp.settings), and reports
# its refusal in its own way: every entry point meets the setting whose check runs latest
# (an import), and each other setting is met at one entry point, in turn.
BAD_AT = [
    *(("imports", entry) for entry in ENTRY_POINTS),
    *zip((b for b in BAD_SETTINGS if b != "imports"), ENTRY_POINTS, strict=False),
]


@pytest.mark.parametrize(("bad", "entry"), BAD_AT)
def test_a_bad_setting_is_one_line_and_exit_2_at_every_entry_point(
    bad: str, entry: str, good_env: dict[str, str]
) -> None:
    setting, line = BAD_SETTINGS[bad]

    code, out, err = run(ENTRY_POINTS[entry], good_env | setting)

    assert code == ExitCode.CONFIGURATION, f"exit {code}:\n{out[-2000:]}\n{err[-3000:]}"
    assert err.strip().startswith(line), err[-3000:]
    assert len(err.strip().splitlines()) == 1, err[-3000:]
    assert out == ""


@pytest.mark.parametrize("entry", ["worker", "beat", "jobsapp web", "python -m"])
def test_with_json_logs_a_start_up_error_is_one_json_line(
    entry: str, good_env: dict[str, str]
) -> None:
    """Start-up errors stayed plain text under JOBSAPP_LOG_FORMAT=json (issue 35, item 9):
    a log collector parsing JSON lines dropped the one line that said why."""
    bad = {"JOBSAPP_LOG_FORMAT": "json", "JOBSAPP_HEARTBEAT_INTERVAL": "abc"}

    code, out, err = run(ENTRY_POINTS[entry], good_env | bad)

    assert code == ExitCode.CONFIGURATION, f"exit {code}:\n{out[-2000:]}\n{err[-3000:]}"
    (line,) = err.strip().splitlines()
    said = json.loads(line)
    assert (said["level"], said["exit_code"]) == ("CRITICAL", 2)
    assert said["message"].startswith(
        "jobsapp: configuration error: JOBSAPP_HEARTBEAT_INTERVAL='abc' is not a number"
    )


def test_a_worker_with_a_bad_finish_flush_stops_at_start(good_env: dict[str, str]) -> None:
    code, out, err = run(ENTRY_POINTS["worker"], good_env | {"JOBSAPP_FINISH_FLUSH": "maybe"})

    assert code == ExitCode.CONFIGURATION, f"exit {code}:\n{out[-2000:]}\n{err[-3000:]}"
    assert err.strip() == (
        "jobsapp: configuration error: JOBSAPP_FINISH_FLUSH='maybe' must be 'wait' or 'no-wait'"
    ), err[-3000:]
    assert out == ""


BEAT_VARIABLES = [
    "JOBSAPP_REAPER_EVERY",
    "JOBSAPP_BEAT_LEASE_SECONDS",
    "JOBSAPP_RELAY_BATCH",
    "JOBSAPP_STAGING_ORPHAN_HOURS",
]


@pytest.mark.parametrize("setting", BEAT_VARIABLES)
def test_beat_with_a_bad_variable_of_its_own_stops_at_start(
    setting: str, good_env: dict[str, str], tmp_path: Path
) -> None:
    argv = [str(BIN / "celery"), "-A", "jobsapp", "beat", "-s", str(tmp_path / "schedule")]

    code, out, err = run(argv, good_env | {setting: "abc"})

    assert code == ExitCode.CONFIGURATION, f"exit {code}:\n{out[-2000:]}\n{err[-3000:]}"
    assert err.strip().startswith(f"jobsapp: configuration error: {setting}='abc'"), err
    assert len(err.strip().splitlines()) == 1, err[-3000:]
    assert "is the leader" not in out


@pytest.mark.parametrize("bad", list(BAD_SETTINGS))
def test_gunicorn_with_a_bad_setting_stops_with_the_line(
    bad: str, good_env: dict[str, str], tmp_path: Path
) -> None:
    setting, line = BAD_SETTINGS[bad]

    code, out, err = run(gunicorn(1, tmp_path), good_env | setting)

    assert code == ExitCode.GUNICORN_BOOT_ERROR, err[-3000:]
    assert (
        [ln for ln in err.splitlines() if ln.startswith("jobsapp: ")]
        == [ln for ln in err.splitlines() if ln.startswith(line)]
        != []
    ), err[-3000:]
    assert "Traceback" not in out + err


@pytest.mark.parametrize("server", ["jobsapp web", "gunicorn"])
def test_a_web_beside_servers_without_an_api_token_stops_at_start(
    server: str, good_env: dict[str, str], tmp_path: Path
) -> None:
    """Issue 35: uploads and attachment reads needed no credentials in any deployment."""
    argv = gunicorn(1, tmp_path) if server == "gunicorn" else ENTRY_POINTS["jobsapp web"]
    env = {k: v for k, v in good_env.items() if k != "JOBSAPP_API_TOKEN"}

    code, out, err = run(argv, env)

    assert code == (3 if server == "gunicorn" else 2), err[-3000:]
    said = [ln for ln in err.splitlines() if ln.startswith("jobsapp: ")]
    assert said == [
        "jobsapp: configuration error: JOBSAPP_API_TOKEN is not set: uploads and attachment "
        "reads need a bearer token whenever a server URL is set; set a random secret (the "
        "producers' own, not the admin token)"
    ], err[-3000:]
    assert "Traceback" not in out + err


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["summary", "--help"]])
def test_version_and_help_need_no_settings(args: list[str], good_env: dict[str, str]) -> None:
    # Every bad setting at once: reading any one of them would fail the command.
    bad = {
        name: value for setting, _line in BAD_SETTINGS.values() for name, value in setting.items()
    }

    code, out, err = run([str(BIN / "jobsapp"), *args], good_env | bad)

    assert (code, err) == (0, ""), err[-3000:]
    assert out.startswith("jobsapp ") or out.startswith("usage: jobsapp"), out


# ------------------------------------------------------------------ a closed pipe


SIGPIPE_STATUS = 128 + signal.SIGPIPE


# argparse itself drops an OSError while it prints help: `--help | head` ends with 0.
@pytest.mark.parametrize(
    ("args", "status"),
    [(["summary"], SIGPIPE_STATUS), (["summary", "--json"], SIGPIPE_STATUS), (["--help"], 0)],
)
def test_output_into_a_pipe_its_reader_closed_ends_quietly(
    args: list[str], status: int, good_env: dict[str, str]
) -> None:
    # `jobsapp summary | head -0`: the reader is gone before the command writes a byte.
    reader, writer = os.pipe()
    os.close(reader)
    try:
        proc = subprocess.run(
            [str(BIN / "jobsapp"), *args],
            cwd=ROOT,
            env=good_env,
            stdin=subprocess.DEVNULL,
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(writer)

    assert proc.stderr == ""
    assert proc.returncode == status


# ------------------------------------------------------------------ a producer

PRODUCERS = {
    "delay": "from tests.support.tasks import echo\necho.delay('t')",
    "transaction": "from jobsapp.celery_app import app\n"
    "from jobsapp.lifecycle.producer.enqueue import transaction\n"
    "from tests.support.tasks import echo\n"
    "with transaction(app) as batch:\n"
    "    echo.enqueue_in(batch, ('t',))",
    "connection": "from jobsapp.db import get_engine\n"
    "from tests.support.tasks import echo\n"
    "with get_engine().begin() as conn:\n"
    "    echo.apply_async(('t',), connection=conn)",
    # Celery's eager call, a team's test without the kit: it read REJECTED and get() None.
    "apply": "from tests.support.tasks import echo\necho.apply(('t',)).get()",
}
# What a web app's result page or an operator's shell reads: Celery's result API.
READERS = {
    "state": "from celery.result import AsyncResult\n"
    "from jobsapp.celery_app import app\n"
    f"print(AsyncResult('{uuid.uuid4()}', app=app).state)",
    "group": "from celery.result import GroupResult\n"
    "from jobsapp.celery_app import app\n"
    f"print(GroupResult.restore('{uuid.uuid4()}', app=app))",
    "forget": "from celery.result import AsyncResult\n"
    "from jobsapp.celery_app import app\n"
    f"AsyncResult('{uuid.uuid4()}', app=app).forget()",
}
# Inside a caller's own SQLite transaction the raw error stays (docs/errors.md).
CALLS = PRODUCERS | READERS
CALL_CASES = [
    (d, c) for d in ("postgres", "sqlite") for c in CALLS if (d, c) != ("sqlite", "connection")
]


@pytest.mark.parametrize(("dialect", "call"), CALL_CASES)
def test_a_producer_or_a_reader_on_a_database_never_migrated_is_told_to_migrate_in_one_line(
    dialect: str, call: str, good_env: dict[str, str], unmigrated_url: str, tmp_path: Path
) -> None:
    database = unmigrated_url if dialect == "postgres" else f"sqlite:///{tmp_path}/fresh.db"
    env = good_env | {"JOBSAPP_DATABASE_URL": database}

    told_to_migrate(*run([sys.executable, "-c", CALLS[call]], env))


def told_to_migrate(code: int, _out: str, err: str) -> None:
    """An uncaught exception of ours, whose text is the line every jobsapp process prints."""
    last = err.strip().splitlines()[-1]
    assert code == 1, err[-3000:]
    assert last.startswith(
        "jobsapp.lifecycle.rules.errors.DatabaseNotMigrated: database not migrated: "
        "JOBSAPP_DATABASE_URL="
    ), last
    assert "it has no jobsapp tables (this jobsapp needs revision " in last
    assert last.endswith("; run `jobsapp db upgrade`"), last
    for raw in ("OperationalError", "ProgrammingError", "no such table", "INSERT", "[SQL"):
        assert raw not in err, err[-3000:]
