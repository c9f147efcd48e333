"""load_settings(env): embedded defaults, validation that names the variable, derived values."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobsapp.settings import Settings, SettingsError, load_settings, served_api_problem

VAR = Path("/srv/jobsapp-var")
SERVERS = {
    "JOBSAPP_DATABASE_URL": "postgresql://db/jobs",
    "JOBSAPP_BROKER_URL": "redis://broker:6379/0",
    "JOBSAPP_STORAGE_URL": "s3://bucket/prefix",
}


def test_an_empty_env_embeds_everything_under_var() -> None:
    # The test process has JOBSAPP_* variables set: an explicit env must ignore them.
    settings = load_settings({})
    var_dir = Path("var").resolve()
    assert settings.var_dir == var_dir
    assert settings.database_url == f"sqlite:///{var_dir / 'jobsapp.db'}"
    assert settings.broker_url == "filesystem://"
    assert settings.broker_is_filesystem
    assert settings.broker_folder == var_dir / "broker"
    assert settings.storage_url == f"file://{var_dir / 'storage'}"
    assert settings.redis_url is None
    assert settings.s3_endpoint_url is None
    assert settings.s3_region is None
    assert settings.admin_token is None
    assert settings.heartbeat_interval == 30.0
    assert settings.stale_after == 90.0
    assert settings.inline_wait_max == 5.0
    assert settings.unclaimed_after == 300.0


def test_var_dir_moves_every_embedded_default() -> None:
    settings = load_settings({"JOBSAPP_VAR_DIR": str(VAR)})
    assert settings.var_dir == VAR
    assert settings.database_url == f"sqlite:///{VAR}/jobsapp.db"
    assert settings.storage_url == f"file://{VAR}/storage"
    assert settings.broker_folder == VAR / "broker"


def test_empty_strings_fall_back_to_defaults() -> None:
    names = [
        "JOBSAPP_VAR_DIR",
        "JOBSAPP_DATABASE_URL",
        "JOBSAPP_BROKER_URL",
        "JOBSAPP_REDIS_URL",
        "JOBSAPP_STORAGE_URL",
        "JOBSAPP_ADMIN_TOKEN",
        "JOBSAPP_HEARTBEAT_INTERVAL",
        "JOBSAPP_STALE_AFTER",
        "JOBSAPP_INLINE_WAIT_MAX",
        "JOBSAPP_UNCLAIMED_AFTER",
    ]
    assert load_settings(dict.fromkeys(names, "")) == load_settings({})


def test_services_are_read_from_the_env() -> None:
    settings = load_settings(
        {
            "JOBSAPP_DATABASE_URL": "postgresql+psycopg2://jobs@db:5432/jobs",
            "JOBSAPP_BROKER_URL": "redis://cache:6379/0",
            "JOBSAPP_REDIS_URL": "redis://cache:6379/1",
            "JOBSAPP_STORAGE_URL": "s3://bucket/prefix",
            "JOBSAPP_S3_ENDPOINT_URL": "http://seaweed:8333",
            "AWS_DEFAULT_REGION": "eu-west-1",
            "JOBSAPP_ADMIN_TOKEN": "t0ken-7f3a9c2e5b1d8064-settings-a",
        }
    )
    assert settings.database_url == "postgresql+psycopg2://jobs@db:5432/jobs"
    assert settings.broker_url == "redis://cache:6379/0"
    assert not settings.broker_is_filesystem
    assert settings.redis_url == "redis://cache:6379/1"
    assert settings.storage_url == "s3://bucket/prefix"
    assert settings.s3_endpoint_url == "http://seaweed:8333"
    assert settings.s3_region == "eu-west-1"
    assert settings.admin_token == "t0ken-7f3a9c2e5b1d8064-settings-a"


def test_aws_region_wins_over_the_default_region() -> None:
    env = {"AWS_REGION": "us-east-2", "AWS_DEFAULT_REGION": "eu-west-1"}
    assert load_settings(env).s3_region == "us-east-2"


@pytest.mark.parametrize(
    ("url", "taken"),
    [
        ("sqlite:///x.db", "sqlite:///x.db"),
        ("sqlite://", "sqlite://"),
        ("postgresql+psycopg2://h/db", "postgresql+psycopg2://h/db"),
        # No driver named: psycopg2, jobsapp's (SQLAlchemy 2.1 would pick psycopg 3).
        ("postgresql://h/db", "postgresql+psycopg2://h/db"),
        # libpq's other spelling, a platform's DATABASE_URL (Heroku, Render).
        (
            "postgres://u:p@h:5432/d?sslmode=require",
            "postgresql+psycopg2://u:p@h:5432/d?sslmode=require",
        ),
    ],
)
def test_supported_databases(url: str, taken: str) -> None:
    assert load_settings({**SERVERS, "JOBSAPP_DATABASE_URL": url}).database_url == taken


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg", "pg8000"])
def test_another_postgres_driver_is_refused_naming_jobsapps(driver: str) -> None:
    env = {**SERVERS, "JOBSAPP_DATABASE_URL": f"postgresql+{driver}://h/db"}
    with pytest.raises(SettingsError) as refused:
        load_settings(env)
    assert str(refused.value) == (
        f"JOBSAPP_DATABASE_URL names the driver {driver!r}; jobsapp runs PostgreSQL through "
        "psycopg2: write postgresql+psycopg2:// (or postgresql://)"
    )


@pytest.mark.parametrize(
    "url",
    [
        "filesystem://",
        "redis://h:6379/0",
        "rediss://h:6380/0",
        "sentinel://h:26379;sentinel://h2:26379",
        "amqp://g@h//",
        "amqps://g@h:5671/v",
        "pyamqp://h//",
        "redis+socket:///run/redis.sock",
        "memory://",
    ],
)
def test_supported_brokers(url: str) -> None:
    assert load_settings({**SERVERS, "JOBSAPP_BROKER_URL": url}).broker_url == url


@pytest.mark.parametrize("url", ["s3://bucket", "s3://bucket/a/b", "file:///data/objects"])
def test_supported_storage(url: str) -> None:
    assert load_settings({**SERVERS, "JOBSAPP_STORAGE_URL": url}).storage_url == url


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("JOBSAPP_DATABASE_URL", "mysql://user@db/jobs"),
        ("JOBSAPP_DATABASE_URL", "mysql+pymysql://user@db/jobs"),
        ("JOBSAPP_DATABASE_URL", "jobs.db"),
        ("JOBSAPP_BROKER_URL", "ftp://files.example/queue"),
        ("JOBSAPP_BROKER_URL", "sqs://"),
        # The dedup fast path's client: redis-py's URLs only (before: a ValueError from
        # the first enqueue of a task with a dedup window).
        ("JOBSAPP_REDIS_URL", "sentinel://h:26379"),
        ("JOBSAPP_REDIS_URL", "cache:6379"),
        ("JOBSAPP_STORAGE_URL", "http://bucket.example/objects"),
        ("JOBSAPP_STORAGE_URL", "https://bucket.example/objects"),
        ("JOBSAPP_STORAGE_URL", "s3://"),
        ("JOBSAPP_STORAGE_URL", "file://"),
        ("JOBSAPP_STORAGE_URL", "/data/objects"),
        ("JOBSAPP_HEARTBEAT_INTERVAL", "abc"),
        ("JOBSAPP_HEARTBEAT_INTERVAL", "-1"),
        ("JOBSAPP_HEARTBEAT_INTERVAL", "0"),
        ("JOBSAPP_STALE_AFTER", "soon"),
        ("JOBSAPP_STALE_AFTER", "-30"),
        ("JOBSAPP_INLINE_WAIT_MAX", "5s"),
        ("JOBSAPP_UNCLAIMED_AFTER", "0"),
        ("JOBSAPP_FINISH_FLUSH", "later"),
        ("JOBSAPP_FINISH_FLUSH", "off"),
    ],
)
def test_an_invalid_value_fails_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=name):
        load_settings({name: value})


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_non_finite_interval_is_refused(value: str) -> None:
    with pytest.raises(SettingsError, match="JOBSAPP_HEARTBEAT_INTERVAL"):
        load_settings({"JOBSAPP_HEARTBEAT_INTERVAL": value})


def test_settings_error_is_a_value_error() -> None:
    assert issubclass(SettingsError, ValueError)


def test_the_error_does_not_leak_a_database_password() -> None:
    with pytest.raises(SettingsError) as info:
        load_settings({"JOBSAPP_DATABASE_URL": "mysql://jobs:Zq7xW2pL9vK4@db/jobs"})
    assert "Zq7xW2pL9vK4" not in str(info.value)


@pytest.mark.parametrize(("heartbeat", "stale"), [("30", 90.0), ("2", 6.0), ("0.5", 1.5)])
def test_stale_after_defaults_to_three_heartbeats(heartbeat: str, stale: float) -> None:
    settings = load_settings({"JOBSAPP_HEARTBEAT_INTERVAL": heartbeat})
    assert settings.heartbeat_interval == float(heartbeat)
    assert settings.stale_after == pytest.approx(stale)


def test_an_explicit_stale_after_wins() -> None:
    env = {"JOBSAPP_HEARTBEAT_INTERVAL": "10", "JOBSAPP_STALE_AFTER": "45"}
    assert load_settings(env).stale_after == 45.0


def test_numbers_parse_as_floats() -> None:
    settings = load_settings({"JOBSAPP_INLINE_WAIT_MAX": "2.5", "JOBSAPP_UNCLAIMED_AFTER": "1e3"})
    assert settings.inline_wait_max == 2.5
    assert settings.unclaimed_after == 1000.0


@pytest.mark.parametrize(
    ("value", "waits"), [("", True), ("wait", True), ("no-wait", False), (" No-Wait ", False)]
)
def test_a_success_waits_for_its_flush_unless_told_not_to(value: str, waits: bool) -> None:
    assert load_settings({"JOBSAPP_FINISH_FLUSH": value}).success_waits_for_flush is waits
    assert load_settings({}).success_waits_for_flush


def test_settings_are_frozen() -> None:
    settings = load_settings({})
    assert isinstance(settings, Settings)
    with pytest.raises(AttributeError):
        settings.heartbeat_interval = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("JOBSAPP_BROKR_URL", "JOBSAPP_BROKER_URL"),
        ("JOBSAPP_DATABSE_URL", "JOBSAPP_DATABASE_URL"),
        ("JOBSAPP_IMPORT", "JOBSAPP_IMPORTS"),
    ],
)
def test_a_misspelled_name_is_refused_with_the_name_it_meant(typo: str, meant: str) -> None:
    said = f"^{typo} is not a jobsapp setting; did you mean {meant}"
    with pytest.raises(SettingsError, match=said):
        load_settings({**SERVERS, typo: "x"})


def test_the_test_suites_and_scripts_names_are_not_settings_and_pass() -> None:
    tools = {"JOBSAPP_TEST_DATABASE_URL": "x", "JOBSAPP_SVC_DIR": "/tmp", "JOBSAPP_PG_PORT": "1"}
    assert load_settings({**SERVERS, **tools}).broker_url == SERVERS["JOBSAPP_BROKER_URL"]


@pytest.mark.parametrize("missing", sorted(SERVERS))
def test_one_server_url_missing_beside_the_others_is_refused(missing: str) -> None:
    env = {name: url for name, url in SERVERS.items() if name != missing}
    with pytest.raises(SettingsError, match=f"^{missing} is not set while .* are: set all"):
        load_settings(env)


def test_a_database_url_alone_does_not_fall_back_to_the_embedded_broker_and_storage() -> None:
    with pytest.raises(SettingsError, match=r"^JOBSAPP_BROKER_URL and JOBSAPP_STORAGE_URL are not"):
        load_settings({"JOBSAPP_DATABASE_URL": SERVERS["JOBSAPP_DATABASE_URL"]})


def test_local_values_may_be_named_beside_each_other() -> None:
    local = {
        "JOBSAPP_DATABASE_URL": "sqlite:///x.db",
        "JOBSAPP_BROKER_URL": "filesystem://",
        "JOBSAPP_STORAGE_URL": "file:///srv/objects",
    }
    assert load_settings(local).storage_url == "file:///srv/objects"


def test_every_name_the_package_reads_is_a_known_setting() -> None:
    import re

    import jobsapp
    from jobsapp.settings import KNOWN_NAMES, TOOL_PREFIXES

    root = Path(jobsapp.__file__).parent
    read = {
        name
        for path in root.rglob("*.py")
        for name in re.findall(r"JOBSAPP_[A-Z0-9_]+", path.read_text())
    }
    settings = {name for name in read if not name.startswith(TOOL_PREFIXES)}
    assert settings - KNOWN_NAMES - {"JOBSAPP_"} == set()


def test_the_api_needs_a_token_beside_servers_and_none_on_the_embedded_default() -> None:
    assert served_api_problem(load_settings({})) is None
    problem = served_api_problem(load_settings(SERVERS)) or ""
    assert problem.startswith("JOBSAPP_API_TOKEN is not set")
    given = load_settings({**SERVERS, "JOBSAPP_API_TOKEN": "producers-7c1d-9a4e2b8f06d3c5e1-x"})
    assert (given.api_token, given.embedded) == ("producers-7c1d-9a4e2b8f06d3c5e1-x", False)
    assert served_api_problem(given) is None


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"JOBSAPP_API_TOKEN": "change-me"}, "JOBSAPP_API_TOKEN is a well-known placeholder"),
        ({"JOBSAPP_API_TOKEN": "producers-7c1d"}, "JOBSAPP_API_TOKEN has 14 characters, fewer"),
        (
            {
                "JOBSAPP_API_TOKEN": "same-7c1d-9a4e2b8f06d3c5e1f7ab-0q",
                "JOBSAPP_ADMIN_TOKEN": "same-7c1d-9a4e2b8f06d3c5e1f7ab-0q",
            },
            "JOBSAPP_API_TOKEN is the admin token",
        ),
        (
            {
                "JOBSAPP_METRICS_TOKEN": "same-7c1d-9a4e2b8f06d3c5e1f7ab-0q",
                "JOBSAPP_ADMIN_TOKEN": "same-7c1d-9a4e2b8f06d3c5e1f7ab-0q",
            },
            "JOBSAPP_METRICS_TOKEN is the admin token: the scraper",
        ),
    ],
)
def test_an_api_token_that_protects_nothing_is_refused(env: dict[str, str], said: str) -> None:
    with pytest.raises(SettingsError, match=said):
        load_settings(env)


@pytest.mark.parametrize(
    ("name", "value"), [("JOBSAPP_UPLOAD_CONCURRENCY", "0"), ("JOBSAPP_WEB_READ_TIMEOUT", "-1")]
)
def test_the_webs_bounds_are_refused_when_they_admit_nothing(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=name):
        load_settings({name: value})


@pytest.mark.parametrize(
    "name", ["CELERY_BROKER_URL", "CELERY_BROKER_WRITE_URL", "CELERY_BROKER_READ_URL"]
)
def test_a_celery_broker_variable_naming_another_broker_is_refused(name: str) -> None:
    """Left from a Celery setup (or set by ``celery -b``): Celery reads it before any
    setting, so the app published there while the journal stayed embedded, each host its
    own; before, nothing said so."""
    with pytest.raises(SettingsError, match=rf"^{name} in the environment names another") as info:
        load_settings({name: "redis://:Zq7xW2pL9vK4@broker:6379/0"})
    assert "not set: the embedded default" in str(info.value)
    assert "Zq7xW2pL9vK4" not in str(info.value)
    with pytest.raises(SettingsError, match=rf"^{name} .* \(set\)"):
        load_settings({**SERVERS, name: "redis://other:6379/0"})


def test_a_celery_broker_variable_naming_jobsapps_broker_is_taken() -> None:
    env = {**SERVERS, "CELERY_BROKER_URL": SERVERS["JOBSAPP_BROKER_URL"]}
    assert load_settings(env).broker_url == SERVERS["JOBSAPP_BROKER_URL"]
