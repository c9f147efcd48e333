"""One typed settings object, read from the environment.

With no variable set everything is embedded under ``./var/`` (SQLite, the kombu
filesystem transport, a local object folder), so a newcomer's first command needs no
server. A bad value fails at start with a message naming the variable.
"""

from __future__ import annotations

import difflib
import importlib.util
import ipaddress
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from urllib.parse import urlsplit


class SettingsError(ValueError):
    """A configuration variable holds a value jobsapp cannot use."""


_DB_SCHEMES = ("sqlite", "postgresql", "postgres")
_POSTGRES = "postgresql+psycopg2"
# Tokens that ship in examples and templates: a deployment that kept one is not protected.
_WELL_KNOWN_TOKENS = frozenset(
    {
        "change-me",
        "changeme",
        "change_me",
        "secret",
        "admin",
        "password",
        "token",
        "jobsapp",
        "test",
        "default",
        "example",
        "xxx",
    }
)
# A shared token shorter than this, or with fewer distinct characters, is refused: 32
# characters of token_urlsafe carry 192 bits; a word or a repeated pattern carries few.
MIN_TOKEN_LENGTH = 32
MIN_TOKEN_VARIETY = 10
# Every variable jobsapp reads (its processes, Procfile and compose lines included). An
# unknown JOBSAPP_* name is refused: a typo would otherwise fall back to a default silently.
KNOWN_NAMES = frozenset(
    {
        "JOBSAPP_ADMIN_TOKEN",
        "JOBSAPP_API_TOKEN",
        "JOBSAPP_ARGS_MAX_BYTES",
        "JOBSAPP_AUTH_PROXY_HEADER",
        "JOBSAPP_AUTH_PROXY_TRUSTED",
        "JOBSAPP_BEAT_CATCH_UP_SECONDS",
        "JOBSAPP_BEAT_LEASE_SECONDS",
        "JOBSAPP_BROKER_URL",
        "JOBSAPP_CONSOLE_TIMEOUT",
        "JOBSAPP_CRASH_AT",
        "JOBSAPP_DATABASE_URL",
        "JOBSAPP_FINISH_FLUSH",
        "JOBSAPP_FLOWER_ADDRESS",
        "JOBSAPP_FLOWER_PORT",
        "JOBSAPP_HEARTBEAT_INTERVAL",
        "JOBSAPP_IMAGE_MEMORY_BUDGET_MB",
        "JOBSAPP_IMPORTS",
        "JOBSAPP_INLINE_WAIT_MAX",
        "JOBSAPP_LOG_FORMAT",
        "JOBSAPP_MAX_UPLOAD_BYTES",
        "JOBSAPP_METRICS_TOKEN",
        "JOBSAPP_OPERATORS",
        "JOBSAPP_PUBLISH_TIMEOUT",
        "JOBSAPP_REAPER_BATCH",
        "JOBSAPP_REAPER_EVERY",
        "JOBSAPP_RECONCILE_EVERY",
        "JOBSAPP_REDIS_URL",
        "JOBSAPP_RELAY_BATCH",
        "JOBSAPP_RELAY_EVERY",
        "JOBSAPP_RESULT_MAX_BYTES",
        "JOBSAPP_RETENTION_EVERY",
        "JOBSAPP_S3_ENDPOINT_URL",
        "JOBSAPP_S3_PUBLIC_URL",
        "JOBSAPP_SECRET_KEY",
        "JOBSAPP_STAGING_EVERY",
        "JOBSAPP_STAGING_FAILED_DAYS",
        "JOBSAPP_STAGING_ORPHAN_HOURS",
        "JOBSAPP_STAGING_SCAN_LIMIT",
        "JOBSAPP_STALE_AFTER",
        "JOBSAPP_STORAGE_URL",
        "JOBSAPP_UNCLAIMED_AFTER",
        "JOBSAPP_UPLOAD_CONCURRENCY",
        "JOBSAPP_VAR_DIR",
        "JOBSAPP_WEB_BIND",
        "JOBSAPP_WEB_READ_TIMEOUT",
    }
)
# Names that are not jobsapp's settings: the test suite's and the repository's scripts'
# (scripts/services.sh's servers, the soak and screenshot switches of the tests).
TOOL_PREFIXES = (
    "JOBSAPP_TEST_",
    "JOBSAPP_SVC_",
    "JOBSAPP_PG_",
    "JOBSAPP_PGBOUNCER_",
    "JOBSAPP_REDIS_PORT",
    "JOBSAPP_S3_PORT",
    "JOBSAPP_S3_BUCKET",
    "JOBSAPP_S3_ACCESS_KEY",
    "JOBSAPP_S3_SECRET_KEY",
    "JOBSAPP_S3_REGION",
    "JOBSAPP_AMQP_PORT",
    "JOBSAPP_EPMD_PORT",
    "JOBSAPP_RABBITMQ_",
    "JOBSAPP_WEED_",
    "JOBSAPP_SOAK_",
    "JOBSAPP_SCREENSHOTS",
)
# Set one and every one must be set: the embedded default is for a machine with none set,
# never a fallback beside a server (a worker on filesystem:// sharing a Postgres journal
# would never see what the producers publish; uploads kept in one host's ./var/storage
# would never reach the others). A local value may still be named: sqlite:///...,
# filesystem://, file:///....
SERVER_NAMES = ("JOBSAPP_DATABASE_URL", "JOBSAPP_BROKER_URL", "JOBSAPP_STORAGE_URL")
_REDIS_SCHEMES = ("redis", "rediss", "unix")
_BROKER_SCHEMES = ("filesystem", "redis", "rediss", "sentinel", "amqp", "amqps", "pyamqp", "memory")
EMBEDDED_BROKER = "filesystem://"
_MIB = 1024 * 1024
_HEADER_NAME = re.compile(r"[A-Za-z0-9-]{1,100}")
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
DEFAULT_IMAGE_MEMORY_BUDGET_MB = 512
DEFAULT_RESULT_MAX_BYTES = 64 * 1024
DEFAULT_ARGS_MAX_BYTES = 256 * 1024
DEFAULT_UPLOAD_CONCURRENCY = 4
DEFAULT_WEB_READ_TIMEOUT = 60.0


@dataclass(frozen=True)
class AuthProxy:
    """An authenticating proxy names its user in ``header`` (X-Forwarded-Email), believed
    only from a peer within ``trusted``; ``operators`` (lower case) may act, the rest look."""

    header: str
    trusted: tuple[Network, ...]
    operators: frozenset[str]


@dataclass(frozen=True)
class Settings:
    var_dir: Path
    database_url: str
    broker_url: str
    redis_url: str | None
    storage_url: str
    s3_endpoint_url: str | None
    s3_public_url: str | None
    s3_region: str | None
    admin_token: str | None
    # Signs the console's session cookie with the admin token; None: a random secret the
    # first web process keeps in the database (web/auth.py).
    secret_key: str | None
    heartbeat_interval: float
    stale_after: float
    inline_wait_max: float
    unclaimed_after: float
    publish_timeout: float
    # Bytes one image job may allocate for decoding and encoding (docs/performance.md).
    image_memory_budget: int
    # When set, /metrics answers only ``Authorization: Bearer <it>`` (not the admin token:
    # a scraper must not hold the operator's power).
    metrics_token: str | None = None
    # The deployment's identity provider, an authenticating proxy (web/access.py); None: none.
    auth_proxy: AuthProxy | None = None
    # "text" or "json" (one object per line, see jobsapp.logs).
    log_format: str = "text"
    # The deployment's own modules (tasks, run tables) every process imports: JOBSAPP_IMPORTS.
    imports: tuple[str, ...] = ()
    # The largest return value a lifecycle task's run keeps, as compact UTF-8 JSON.
    result_max_bytes: int = DEFAULT_RESULT_MAX_BYTES
    # The most a job's arguments may take in its run row, as compact UTF-8 JSON.
    args_max_bytes: int = DEFAULT_ARGS_MAX_BYTES
    # Seconds a console or API transaction may run (PostgreSQL's statement_timeout).
    console_timeout: float = 5.0
    # JOBSAPP_FINISH_FLUSH: False lets an attempt's success commit without waiting for the
    # WAL flush (PostgreSQL; docs/lifecycle.md, "A success may not wait for the flush").
    success_waits_for_flush: bool = True
    # Uploads one web process handles at once; one more is answered 503 (web/app.py).
    upload_concurrency: int = DEFAULT_UPLOAD_CONCURRENCY
    # Seconds a request's body may take to arrive after its headers (web/server.py).
    web_read_timeout: float = DEFAULT_WEB_READ_TIMEOUT
    # The producers' bearer token for uploads and attachment reads (web/api_auth.py).
    api_token: str | None = None
    # No server URL is set: SQLite, folders, one machine (a developer's first command).
    embedded: bool = True

    @property
    def broker_is_filesystem(self) -> bool:
        return self.broker_url.startswith("filesystem")

    @property
    def broker_folder(self) -> Path:
        return self.var_dir / "broker"


def optional_number(env: Mapping[str, str], name: str) -> float | None:
    """A finite number greater than zero from ``env``, or None when the variable is unset."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise SettingsError(f"{name}={raw!r} must be a finite number greater than zero")
    return value


def positive_number(env: Mapping[str, str], name: str, default: float) -> float:
    value = optional_number(env, name)
    return default if value is None else value


def whole_number(env: Mapping[str, str], name: str, default: int) -> int:
    """A count of at least 1 (a batch size, a scan limit)."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise SettingsError(f"{name}={raw!r} must be a whole number, at least 1")
    return int(raw)


def _url(env: Mapping[str, str], name: str, default: str, schemes: tuple[str, ...]) -> str:
    """``name``'s URL (``default`` when unset: an empty default is no URL, unchecked)."""
    value = env.get(name) or default
    if not value:
        return value
    scheme = urlsplit(value).scheme.split("+", 1)[0]
    if scheme not in schemes:
        allowed = ", ".join(schemes)
        raise SettingsError(f"{name} has scheme {scheme!r}; expected one of: {allowed}")
    return value


def _database_url(env: Mapping[str, str], var_dir: Path) -> str:
    """jobsapp runs PostgreSQL through psycopg2: its prepared hot path and a relaxed
    commit's ``SET LOCAL`` sent in the statement's own message are psycopg2's. A URL that
    names no driver gets it (SQLAlchemy 2.1 would pick psycopg 3, on which every claim
    failed); so does ``postgres://``, libpq's other spelling, the one Heroku's and Render's
    ``DATABASE_URL`` use. Another driver is refused, naming the one to use."""
    url = _url(env, "JOBSAPP_DATABASE_URL", f"sqlite:///{var_dir / 'jobsapp.db'}", _DB_SCHEMES)
    return with_psycopg2(url, "JOBSAPP_DATABASE_URL")


def with_psycopg2(url: str, name: str) -> str:
    """``url`` (the value of the variable ``name``) with psycopg2 as its PostgreSQL driver
    (``_database_url`` says why); another driver is refused, naming the one to use."""
    scheme, _, rest = url.partition("://")
    if scheme in ("postgres", "postgresql"):
        return f"{_POSTGRES}://{rest}"
    if scheme.startswith("postgresql+") and scheme != _POSTGRES:
        raise SettingsError(
            f"{name} names the driver {scheme.partition('+')[2]!r}; jobsapp runs "
            f"PostgreSQL through psycopg2: write {_POSTGRES}:// (or postgresql://)"
        )
    return url


def _storage_url(env: Mapping[str, str], var_dir: Path) -> str:
    value = env.get("JOBSAPP_STORAGE_URL") or f"file://{(var_dir / 'storage').resolve()}"
    parts = urlsplit(value)
    if parts.scheme == "s3" and parts.netloc:
        return value
    if parts.scheme == "file" and parts.path:
        return value
    raise SettingsError(
        "JOBSAPP_STORAGE_URL must be s3://bucket/prefix or file:///path, "
        f"not {parts.scheme or 'a scheme-less value'!r}"
    )


def _public_url(env: Mapping[str, str]) -> str | None:
    value = env.get("JOBSAPP_S3_PUBLIC_URL", "").strip()
    if not value:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SettingsError(f"JOBSAPP_S3_PUBLIC_URL must be http(s)://host[:port], not {value!r}")
    return value


def _shared_token(env: Mapping[str, str], name: str, off: str) -> str | None:
    """A shared bearer token (the operator's, the scraper's); empty means ``off``. A
    well-known, short or repetitive one stops us: it would be guessed, not brute-forced."""
    token = env.get(name, "").strip()
    if not token:
        return None
    make = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
    if token.lower() in _WELL_KNOWN_TOKENS:
        why = "is a well-known placeholder"
    elif len(token) < MIN_TOKEN_LENGTH:
        why = f"has {len(token)} characters, fewer than {MIN_TOKEN_LENGTH}"
    elif len(set(token)) < MIN_TOKEN_VARIETY:
        why = f"has only {len(set(token))} distinct characters, fewer than {MIN_TOKEN_VARIETY}"
    else:
        return token
    raise SettingsError(f"{name} {why}; set a random secret (e.g. {make}) or leave it empty {off}")


def _auth_proxy(env: Mapping[str, str]) -> AuthProxy | None:
    """The provider's header, the proxies trusted to send it, and who of its users may act."""
    header = env.get("JOBSAPP_AUTH_PROXY_HEADER", "").strip()
    raw = [c.strip() for c in env.get("JOBSAPP_AUTH_PROXY_TRUSTED", "").split(",") if c.strip()]
    operators = frozenset(
        o.strip().lower() for o in env.get("JOBSAPP_OPERATORS", "").split(",") if o.strip()
    )
    if header and not _HEADER_NAME.fullmatch(header):
        raise SettingsError(f"JOBSAPP_AUTH_PROXY_HEADER={header!r} is not a header name")
    if bool(header) != bool(raw):
        raise SettingsError(
            "JOBSAPP_AUTH_PROXY_HEADER and JOBSAPP_AUTH_PROXY_TRUSTED go together: the header "
            "is believed only from the proxies' addresses (CIDRs, comma-separated)"
        )
    if operators and not header:
        raise SettingsError(
            "JOBSAPP_OPERATORS names identities of JOBSAPP_AUTH_PROXY_HEADER, which is not set"
        )
    trusted = []
    for cidr in raw:
        try:
            trusted.append(ipaddress.ip_network(cidr, strict=False))
        except ValueError:
            raise SettingsError(f"JOBSAPP_AUTH_PROXY_TRUSTED: {cidr!r} is not a CIDR") from None
    return AuthProxy(header, tuple(trusted), operators) if header else None


def _own_token(env: Mapping[str, str], name: str, unset: str, holders: str) -> str | None:
    """A token its ``holders`` keep (the producers, the scraper): as strong as the other
    shared tokens, and not the admin's, which would give them the operator's power."""
    token = _shared_token(env, name, unset)
    if token is not None and token == env.get("JOBSAPP_ADMIN_TOKEN", "").strip():
        raise SettingsError(
            f"{name} is the admin token: {holders} would hold the operator's power; "
            f"give {holders} a token of their own"
        )
    return token


def served_api_problem(settings: Settings) -> str | None:
    """Why the web cannot serve the attachments API as configured: beside servers (not the
    embedded default) it asks for credentials, and none is configured."""
    if settings.embedded or settings.api_token is not None:
        return None
    return (
        "JOBSAPP_API_TOKEN is not set: uploads and attachment reads need a bearer token "
        "whenever a server URL is set; set a random secret (the producers' own, not the "
        "admin token)"
    )


def _log_format(env: Mapping[str, str]) -> str:
    value = env.get("JOBSAPP_LOG_FORMAT", "").strip().lower() or "text"
    if value not in ("text", "json"):
        raise SettingsError(f"JOBSAPP_LOG_FORMAT={value!r} must be 'text' or 'json'")
    return value


def _finish_flush(env: Mapping[str, str]) -> bool:
    """Whether a success waits for its WAL flush (``wait``, the default) or not."""
    value = env.get("JOBSAPP_FINISH_FLUSH", "").strip().lower() or "wait"
    if value not in ("wait", "no-wait"):
        raise SettingsError(f"JOBSAPP_FINISH_FLUSH={value!r} must be 'wait' or 'no-wait'")
    return value == "wait"


def unknown_name(env: Mapping[str, str]) -> str | None:
    """The first ``JOBSAPP_*`` name in ``env`` that is no setting, with a did-you-mean."""
    for name in sorted(env):
        if not name.startswith("JOBSAPP_") or name in KNOWN_NAMES:
            continue
        if name.startswith(TOOL_PREFIXES):
            continue
        close = difflib.get_close_matches(name, KNOWN_NAMES, n=1)
        hint = f"did you mean {close[0]}?" if close else "see docs/operators.md for the list"
        return f"{name} is not a jobsapp setting; {hint}"
    return None


def servers_half_set(env: Mapping[str, str]) -> str | None:
    """Why the server URLs are unusable when some of them are set and others are not."""
    given = [name for name in SERVER_NAMES if env.get(name, "").strip()]
    missing = [name for name in SERVER_NAMES if name not in given]
    if not given or not missing:
        return None
    verb = ("is", "are")
    return (
        f"{' and '.join(missing)} {verb[len(missing) > 1]} not set while "
        f"{' and '.join(given)} {verb[len(given) > 1]}: set all of "
        f"{', '.join(SERVER_NAMES)}, or none for the embedded default"
    )


# Where Celery takes a broker from besides jobsapp's own setting: its environment variables,
# read before any configuration (``app.conf.broker_url``), and a deployment's celeryconfig.
CELERY_BROKER_ENV = ("CELERY_BROKER_URL", "CELERY_BROKER_WRITE_URL", "CELERY_BROKER_READ_URL")
CELERY_BROKER_SETTINGS = ("broker_url", "broker_write_url", "broker_read_url")


def foreign_broker(named: Mapping[str, object], where: str, broker_url: str) -> str | None:
    """Why a broker named outside ``JOBSAPP_BROKER_URL`` (``named``: name -> value, found in
    ``where``) cannot be used, or None when each is unset or the same URL. Celery would
    publish and consume there, while the journal, the relay and the worker's guard follow
    ``JOBSAPP_BROKER_URL`` (with an embedded journal, each host's own). No value is shown:
    a URL may carry a password."""
    for name, value in named.items():
        if value and str(value).strip() != broker_url:
            ours = "not set: the embedded default" if broker_url == EMBEDDED_BROKER else "set"
            return (
                f"{name} in {where} names another broker than JOBSAPP_BROKER_URL ({ours}); "
                "jobsapp's journal, relay and worker guard follow JOBSAPP_BROKER_URL: set the "
                "broker there (with JOBSAPP_DATABASE_URL and JOBSAPP_STORAGE_URL) and remove "
                f"{name}"
            )
    return None


def sentinel_unnamed(broker_url: str, transport_options: Mapping[str, object]) -> str | None:
    """Why a Redis Sentinel broker cannot be reached: kombu asks the sentinels for the
    master by the ``master_name`` transport option, which no URL carries."""
    if broker_url.startswith("sentinel://") and not transport_options.get("master_name"):
        return (
            "JOBSAPP_BROKER_URL names Redis Sentinel but no master: set "
            'broker_transport_options = {"master_name": "..."} in the deployment\'s '
            "celeryconfig (kept beside jobsapp's own options)"
        )
    return None


def _imports(env: Mapping[str, str]) -> tuple[str, ...]:
    """JOBSAPP_IMPORTS, each module found where Celery looks for it (the working directory
    first), without running it: a misspelled name is one line here, not a traceback from
    every process's first import. An error inside a module that exists stays its own."""
    from celery.utils.imports import cwd_in_path

    names = tuple(m.strip() for m in env.get("JOBSAPP_IMPORTS", "").split(",") if m.strip())
    for name in names:
        try:
            with cwd_in_path():
                found = importlib.util.find_spec(name)
        except (ImportError, ValueError) as exc:
            found, why = None, str(exc)
        else:
            why = f"No module named {name!r}"
        if found is None:
            raise SettingsError(
                f"JOBSAPP_IMPORTS names {name}, which cannot be imported "
                f"({why}): check the spelling, the working directory and "
                "PYTHONPATH, and that its package is installed"
            )
    return names


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Read and validate the configuration; raises SettingsError naming the variable."""
    env = os.environ if env is None else env
    if refusal := unknown_name(env) or servers_half_set(env):
        raise SettingsError(refusal)
    var_dir = Path(env.get("JOBSAPP_VAR_DIR") or "var").resolve()
    heartbeat = positive_number(env, "JOBSAPP_HEARTBEAT_INTERVAL", 30.0)
    broker_url = _url(env, "JOBSAPP_BROKER_URL", EMBEDDED_BROKER, _BROKER_SCHEMES)
    celerys = {name: env.get(name) for name in CELERY_BROKER_ENV}
    if refusal := foreign_broker(celerys, "the environment", broker_url):
        raise SettingsError(refusal)
    return Settings(
        var_dir=var_dir,
        database_url=_database_url(env, var_dir),
        broker_url=broker_url,
        # redis-py's own schemes: the dedup fast path is one plain client (no Sentinel).
        redis_url=_url(env, "JOBSAPP_REDIS_URL", "", _REDIS_SCHEMES) or None,
        storage_url=_storage_url(env, var_dir),
        s3_endpoint_url=env.get("JOBSAPP_S3_ENDPOINT_URL") or None,
        s3_public_url=_public_url(env),
        s3_region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
        admin_token=_shared_token(env, "JOBSAPP_ADMIN_TOKEN", "to keep the operator API off"),
        secret_key=env.get("JOBSAPP_SECRET_KEY", "").strip() or None,
        heartbeat_interval=heartbeat,
        stale_after=positive_number(env, "JOBSAPP_STALE_AFTER", 3 * heartbeat),
        inline_wait_max=positive_number(env, "JOBSAPP_INLINE_WAIT_MAX", 5.0),
        unclaimed_after=positive_number(env, "JOBSAPP_UNCLAIMED_AFTER", 300.0),
        publish_timeout=positive_number(env, "JOBSAPP_PUBLISH_TIMEOUT", 2.0),
        image_memory_budget=_MIB
        * whole_number(env, "JOBSAPP_IMAGE_MEMORY_BUDGET_MB", DEFAULT_IMAGE_MEMORY_BUDGET_MB),
        metrics_token=_own_token(
            env, "JOBSAPP_METRICS_TOKEN", "to leave /metrics open", "the scraper"
        ),
        auth_proxy=_auth_proxy(env),
        log_format=_log_format(env),
        imports=_imports(env),
        result_max_bytes=whole_number(env, "JOBSAPP_RESULT_MAX_BYTES", DEFAULT_RESULT_MAX_BYTES),
        args_max_bytes=whole_number(env, "JOBSAPP_ARGS_MAX_BYTES", DEFAULT_ARGS_MAX_BYTES),
        console_timeout=positive_number(env, "JOBSAPP_CONSOLE_TIMEOUT", 5.0),
        success_waits_for_flush=_finish_flush(env),
        upload_concurrency=whole_number(
            env, "JOBSAPP_UPLOAD_CONCURRENCY", DEFAULT_UPLOAD_CONCURRENCY
        ),
        web_read_timeout=positive_number(env, "JOBSAPP_WEB_READ_TIMEOUT", DEFAULT_WEB_READ_TIMEOUT),
        api_token=_own_token(
            env,
            "JOBSAPP_API_TOKEN",
            "(the attachments API is then open only on the embedded default)",
            "the producers",
        ),
        embedded=not any(env.get(name, "").strip() for name in SERVER_NAMES),
    )


@cache
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return load_settings()
