"""An installed package is complete: the wheel alone migrates a real Postgres.

The checkout keeps ``migrations/`` and ``celeryconfig.py`` at its top level (the card's
layout); the wheel must carry them inside the package, and an installation must find them.

The wheel is built from the checkout's files (as git lists them, so no stale ``build/``
leaks in), installed with its dependencies into a fresh venv by pip's own resolver (no
system or dev site-packages), and its ``jobsapp db upgrade`` runs in a folder outside
the checkout, with an environment that holds nothing but the database URL.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect

from tests.support.databases import drop_postgres, fresh_postgres
from tests.support.env import SESSION, service
from tests.support.webserver import REPO

DATABASE = f"jobsapp_wheel_{SESSION}"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
EXPECTED_TABLES = {"job_events", "outbox", "leases", "job_runs", "attachments", "alembic_version"}


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None, code: int = 0) -> str:
    """What ``argv`` printed once it exited with ``code``: its output, or for a refusal
    (a code other than 0) its error output."""
    result = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=240
    )
    found = f"{argv}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert result.returncode == code, found
    return result.stdout if code == 0 else result.stderr


def _checkout_copy(dest: Path) -> Path:
    listed = _run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO)
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    source = _checkout_copy(root / "src")
    _run([*PIP, "wheel", "-q", "--no-deps", "-w", str(root / "dist"), str(source)], cwd=root)
    (built,) = (root / "dist").glob("jobsapp-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin/ folder of a fresh venv holding the wheel and only what it requires."""
    root = tmp_path_factory.mktemp("venv")
    venv.create(root / "venv", with_pip=False, system_site_packages=False)
    bin_dir = root / "venv" / "bin"
    _run([*_pip_into(bin_dir), str(wheel)], cwd=root)
    return bin_dir


def _pip_into(bin_dir: Path) -> list[str]:
    """``pip install`` into the venv of ``bin_dir``: this pip, run with ``--python``, resolves
    against that venv's interpreter and site-packages alone (no copy of pip in the venv:
    ensurepip was 5 s of CPU, 20 s under load). --no-compile: byte-compiling every
    dependency (botocore's thousands of files) is most of an install's time; what the
    tests import compiles on import."""
    return [*PIP, "--python", str(bin_dir / "python"), "install", "-q", "--no-compile"]


def test_wheel_carries_the_top_level_migrations_and_celery_settings_inside_the_package(
    wheel: Path,
) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    top_level = {
        str(path.relative_to(REPO))
        for pattern in ("celeryconfig.py", "migrations/*.*", "migrations/versions/*.py")
        for path in REPO.glob(pattern)
    }
    assert {"celeryconfig.py", "migrations/env.py", "migrations/script.py.mako"} <= top_level
    assert {f"jobsapp/{name}" for name in top_level} <= names
    # Inside the package only: site-packages/migrations would belong to somebody else.
    assert not {name for name in names if name.split("/")[0] in ("migrations", "celeryconfig.py")}


@pytest.fixture
def database_url() -> Iterator[str]:
    admin = service("JOBSAPP_TEST_DATABASE_URL")
    yield fresh_postgres(admin, DATABASE)
    drop_postgres(admin, DATABASE)


def _bare_env(bin_dir: Path, **extra: str) -> dict[str, str]:
    # Nothing of the checkout or the dev venv: no PYTHONPATH, no JOBSAPP_* test settings.
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), **extra}


def test_installed_wheel_migrates_postgres_from_an_unrelated_folder(
    installed: Path, database_url: str, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _bare_env(
        installed,
        JOBSAPP_DATABASE_URL=database_url,
        JOBSAPP_BROKER_URL="memory://",
        JOBSAPP_STORAGE_URL=f"file://{tmp_path / 'objects'}",
    )
    out = _run([str(installed / "jobsapp"), "db", "upgrade"], cwd=elsewhere, env=env)
    assert "database at head" in out
    engine = create_engine(database_url)
    try:
        assert set(inspect(engine).get_table_names()) >= EXPECTED_TABLES
    finally:
        engine.dispose()


def test_installed_celery_app_finds_its_settings_from_any_folder(
    installed: Path, tmp_path: Path
) -> None:
    probe = (
        "import jobsapp.celery_app as m, jobsapp; "
        "print(m.app.conf.task_acks_late, m.app.conf.beat_scheduler, jobsapp.__file__)"
    )
    env = _bare_env(installed, JOBSAPP_VAR_DIR=str(tmp_path / "var"))
    out = _run([str(installed / "python"), "-c", probe], cwd=tmp_path, env=env)
    acks_late, scheduler, package = out.split()
    assert (acks_late, scheduler) == ("True", "jobsapp.maintenance.scheduler:LeasedScheduler")
    assert Path(package).is_relative_to(installed.parent)


def test_a_deployments_celeryconfig_overrides_only_what_it_sets(
    installed: Path, tmp_path: Path
) -> None:
    """Celery's convention: a ``celeryconfig`` module in the working directory is the one a
    deployment edits; the settings it does not name stay jobsapp's."""
    (tmp_path / "celeryconfig.py").write_text("worker_prefetch_multiplier = 4\n")
    probe = (
        "import jobsapp.celery_app as m; "
        "print(m.app.conf.worker_prefetch_multiplier, m.app.conf.task_acks_late, "
        "m.app.conf.worker_consumer)"
    )
    env = _bare_env(installed, JOBSAPP_VAR_DIR=str(tmp_path / "var"))
    out = _run([str(installed / "python"), "-c", probe], cwd=tmp_path, env=env)
    assert out.split() == ["4", "True", "jobsapp.lifecycle.transport.guard:GuardedConsumer"]


def test_a_checkout_finds_its_top_level_files_from_any_folder(tmp_path: Path) -> None:
    """The development install (editable) has no packaged copies: it uses the card's files."""
    probe = (
        "import jobsapp.celery_app as m, jobsapp.shipped as s; "
        "print(s.MIGRATIONS, s.CELERYCONFIG, m.app.conf.task_acks_late)"
    )
    # Not the test session's JOBSAPP_IMPORTS: its modules live in the checkout, not here, and
    # a module that cannot be found is refused at start (docs/errors.md).
    env = {**os.environ, "JOBSAPP_VAR_DIR": str(tmp_path / "var"), "JOBSAPP_IMPORTS": ""}
    out = _run([sys.executable, "-c", probe], cwd=tmp_path, env=env)
    assert out.split() == [str(REPO / "migrations"), str(REPO / "celeryconfig.py"), "True"]


def test_a_deployments_transport_options_keep_jobsapps_own_beside_its_own(
    tmp_path: Path,
) -> None:
    """A deployment names a transport option of its own (a shared Redis's key prefix) and
    one of jobsapp's (a longer redelivery timeout): before, its dict replaced jobsapp's, and
    RabbitMQ's publish confirms and Redis's list per priority were silently gone."""
    (tmp_path / "celeryconfig.py").write_text(
        'broker_transport_options = {"global_keyprefix": "acme:", "visibility_timeout": 9000}\n'
    )
    keys = ("global_keyprefix", "visibility_timeout", "confirm_publish", "priority_steps")
    probe = (
        "import jobsapp.celery_app as m; o = m.app.conf.broker_transport_options; "
        f"print(*(o.get(k) for k in {keys!r}), sep='|')"
    )
    env = {**os.environ, "JOBSAPP_VAR_DIR": str(tmp_path / "var"), "JOBSAPP_IMPORTS": ""}
    out = _run([sys.executable, "-c", probe], cwd=tmp_path, env=env)
    assert out.strip().split("|") == ["acme:", "9000", "True", str(list(range(10)))]


def test_a_deployments_celeryconfig_imports_are_imported_beside_jobsapps(tmp_path: Path) -> None:
    """Celery's ``imports`` in a deployment's ``celeryconfig`` (a team's tasks module, the
    way Celery's guide names it): before, jobsapp's own list replaced it, so its worker
    never imported the team's tasks and every message of theirs was unregistered."""
    (tmp_path / "celeryconfig.py").write_text('imports = ("billing.tasks",)\n')
    probe = (
        "import jobsapp.celery_app as m; m.app.loader.import_default_modules(); "
        "print('billing.tasks' in m.app.conf.imports, 'billing.invoice' in m.app.tasks, "
        "'jobsapp.maintenance.relay' in m.app.tasks)"
    )
    env = {
        **os.environ,
        "JOBSAPP_VAR_DIR": str(tmp_path / "var"),
        "JOBSAPP_IMPORTS": "",
        "PYTHONPATH": str(REPO / "examples" / "team_app"),
    }
    out = _run([sys.executable, "-c", probe], cwd=tmp_path, env=env)
    assert out.split() == ["True", "True", "True"]


def test_a_deployments_celeryconfig_broker_url_is_refused_in_one_line(tmp_path: Path) -> None:
    """Celery's ``broker_url`` in a deployment's ``celeryconfig``: jobsapp's own setting
    replaced it, so every process ran on the embedded broker and journal of its own host
    and no job ever reached a worker elsewhere, silently."""
    (tmp_path / "celeryconfig.py").write_text('broker_url = "redis://broker.internal:6379/0"\n')
    env = {**os.environ, "JOBSAPP_VAR_DIR": str(tmp_path / "var"), "JOBSAPP_IMPORTS": ""}
    for name in ("JOBSAPP_DATABASE_URL", "JOBSAPP_BROKER_URL", "JOBSAPP_STORAGE_URL"):
        env.pop(name, None)
    refused = _run([sys.executable, "-c", "import jobsapp.celery_app"], tmp_path, env, code=2)
    (line,) = refused.splitlines()
    assert line.startswith("jobsapp: configuration error: broker_url in the deployment's celery")
    assert "set the broker there" in line


def test_celery_config_module_names_the_deployments_settings(tmp_path: Path) -> None:
    """Celery's ``CELERY_CONFIG_MODULE`` (also what ``celery --config`` sets) names a
    deployment's settings module: it was ignored, so none of its settings applied. A name
    that cannot be imported is one line, not a silent fall back to jobsapp's settings."""
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "__init__.py").write_text("")
    (tmp_path / "proj" / "celery_settings.py").write_text("worker_prefetch_multiplier = 7\n")
    env = {**os.environ, "JOBSAPP_VAR_DIR": str(tmp_path / "var"), "JOBSAPP_IMPORTS": ""}
    probe = "import jobsapp.celery_app as m; print(m.app.conf.worker_prefetch_multiplier)"
    named = {**env, "CELERY_CONFIG_MODULE": "proj.celery_settings"}
    assert _run([sys.executable, "-c", probe], tmp_path, named).split() == ["7"]

    misspelled = {**env, "CELERY_CONFIG_MODULE": "proj.celery_setings"}
    refused = _run([sys.executable, "-c", probe], tmp_path, misspelled, code=2)
    (line,) = refused.splitlines()
    assert "CELERY_CONFIG_MODULE names proj.celery_setings, which cannot be imported" in line


def test_a_teams_package_beside_the_wheel_runs_its_task_under_the_procfiles_worker(
    installed: Path, tmp_path: Path
) -> None:
    """The deploy path of docs/deploy.md without a Docker engine: the team's package
    (examples/team_app, what its Dockerfile stage adds) importable beside the installed
    wheel, ``JOBSAPP_IMPORTS`` naming its module, the Procfile's ``release`` and ``worker``
    lines run from a folder of their own, and a producer's call answered by the worker."""
    from tests.support.compose import procfile, procfile_argv

    env = _bare_env(
        installed, JOBSAPP_IMPORTS="billing.tasks", PYTHONPATH=str(REPO / "examples" / "team_app")
    )
    _run(procfile_argv(procfile()["release"], env), cwd=tmp_path, env=env)
    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(
        procfile_argv(procfile()["worker"], env),
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    call = "from billing.tasks import invoice; print(invoice.delay('acct-1').get(timeout=90))"
    try:
        out = _run([str(installed / "python"), "-c", call], cwd=tmp_path, env=env)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        log.close()
    assert out.strip() == "invoiced acct-1", (tmp_path / "worker.log").read_text()[-3000:]


def _team_tests_from_the_wheel(installed: Path, wheel: Path, tmp_path: Path, **env: str) -> str:
    """examples/team_app's tests, run by the venv of ``installed`` with the wheel's
    ``testing`` extra added (to the shared venv: these tests come last in the module)."""
    _run([*_pip_into(installed), f"{wheel}[testing]"], cwd=tmp_path)
    team = tmp_path / "team_app"
    shutil.copytree(
        REPO / "examples" / "team_app", team, ignore=shutil.ignore_patterns("__pycache__")
    )
    # --trace-config: the run also lists the plugins it loaded.
    pytest_argv = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--trace-config", "tests"]
    return _run(
        [str(installed / "python"), *pytest_argv],
        cwd=team,
        env=_bare_env(installed, PYTHONPATH=str(team), **env),
    )


def test_a_teams_own_tests_run_on_the_testing_kit_from_the_wheel(
    installed: Path, wheel: Path, tmp_path: Path
) -> None:
    """``pip install 'jobsapp[testing]'`` and the team's tests (examples/team_app/tests)
    pass with nothing else set up: no server, no conftest, no JOBSAPP_* setting."""
    out = _team_tests_from_the_wheel(installed, wheel, tmp_path)
    assert "10 passed" in out, out[-3000:]
    # pytest-celery came with the extra and loads beside the kit without a conflict.
    assert "pytest_celery.plugin" in out, out[-3000:]


def test_a_teams_own_tests_run_on_postgres_from_the_wheel_with_the_documented_url(
    installed: Path, wheel: Path, tmp_path: Path
) -> None:
    """``JOBSAPP_TEST_DATABASE_URL=postgresql://...`` as docs/testing.md writes it: the
    wheel installs psycopg2 only, on which the plugin makes the session's database (the
    URL alone made SQLAlchemy load psycopg 3, and the session ended at its start)."""
    server = "postgresql://" + service("JOBSAPP_TEST_DATABASE_URL").partition("://")[2]
    out = _team_tests_from_the_wheel(installed, wheel, tmp_path, JOBSAPP_TEST_DATABASE_URL=server)
    assert "10 passed" in out, out[-3000:]
