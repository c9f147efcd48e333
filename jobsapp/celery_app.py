"""The Celery app: ``celery -A jobsapp worker`` and ``celery -A jobsapp beat``."""

from __future__ import annotations

import importlib.util
import logging
import os
from collections import ChainMap
from collections.abc import Mapping, Sequence
from typing import Any

from celery import Celery
from celery.concurrency import get_implementation
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    celeryd_after_setup,
    task_revoked,
    worker_init,
    worker_process_init,
)
from celery.utils.imports import import_from_cwd
from celery.utils.log import get_multiprocessing_logger

from jobsapp import preflight
from jobsapp.db import dispose_engines
from jobsapp.lifecycle.celery_api.configured import AfterConfigure
from jobsapp.lifecycle.flow.gating import held_while_paused, while_paused
from jobsapp.lifecycle.transport.hooks import add_publish_filter
from jobsapp.lifecycle.worker.claim import add_claim_hold
from jobsapp.lifecycle.worker.pools import green_pool_refusal
from jobsapp.logs import (
    format_handlers,
    json_startup,
    log_worker_banner,
    one_line_per_reject,
    scrub_handlers,
)
from jobsapp.maintenance.entries import with_maintenance
from jobsapp.settings import (
    CELERY_BROKER_SETTINGS,
    Settings,
    SettingsError,
    foreign_broker,
    get_settings,
    sentinel_unnamed,
)
from jobsapp.shipped import CELERYCONFIG

RESULTS = "jobsapp.lifecycle.celery_api.layered:over_deployment"
BASE_IMPORTS = (
    "jobsapp.maintenance.beat_tasks",
    "jobsapp.attachments.tasks",
    "jobsapp.attachments.reprocess",
)
# Celery's convention: the settings module a deployment edits, found from the working
# directory; Celery's CELERY_CONFIG_MODULE names another.
DEFAULT_DEPLOYMENT_CONFIG = "celeryconfig"
CONFIG_MODULE_ENV = "CELERY_CONFIG_MODULE"
TRANSPORT_OPTIONS = "broker_transport_options"
# celery.contrib.testing's ping task, which Celery's embedded test worker sends at start.
PING = "celery.ping"


def _module_settings(module: object) -> dict[str, Any]:
    return {name: value for name, value in vars(module).items() if not name.startswith("_")}


def shipped_settings() -> dict[str, Any]:
    """jobsapp's ``celeryconfig.py``, by path: a checkout's top-level file is no module of the
    package (``jobsapp.shipped``)."""
    spec = importlib.util.spec_from_file_location("jobsapp.celeryconfig", CELERYCONFIG)
    if spec is None or spec.loader is None:
        raise ImportError(f"jobsapp's Celery settings are missing: {CELERYCONFIG}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return _module_settings(module)


def _deployment_settings() -> dict[str, Any]:
    """The deployment's ``celeryconfig`` module (or the one ``CELERY_CONFIG_MODULE`` names),
    found as Celery finds one (the working directory first, then sys.path), or nothing. An
    error inside that module is raised; a module the variable names must exist."""
    named = os.environ.get(CONFIG_MODULE_ENV, "").strip()
    try:
        module = import_from_cwd(named or DEFAULT_DEPLOYMENT_CONFIG)
    except ModuleNotFoundError as exc:
        if named:
            raise SettingsError(
                f"{CONFIG_MODULE_ENV} names {named}, which cannot be imported ({exc}): check "
                "the spelling, the working directory and PYTHONPATH"
            ) from None
        if exc.name != DEFAULT_DEPLOYMENT_CONFIG:
            raise
        return {}
    return _module_settings(module)


def celery_settings() -> ChainMap[str, Any]:
    """The deployment's settings over jobsapp's, setting by setting: a deployment's file
    holds only what it changes, and a contract setting it does not name (late ack, the
    guarded consumer) is never lost. ``beat_schedule`` is merged entry by entry, so a
    deployment's own periodic tasks run beside the maintenance passes
    (``maintenance.entries``), and ``broker_transport_options`` key by key: jobsapp's keys
    there are contract too (Redis's redelivery timeout above the longest run, RabbitMQ's
    publish confirms, a list per priority), and a deployment names one of its own (a shared
    Redis's ``global_keyprefix``) without knowing them. From a checkout's top level both
    are the same file."""
    deployment, shipped = _deployment_settings(), shipped_settings()
    merged = {}
    if "beat_schedule" in deployment:
        schedule = with_maintenance(shipped["beat_schedule"], deployment["beat_schedule"] or {})
        merged["beat_schedule"] = schedule
    options = deployment.get(TRANSPORT_OPTIONS, {})
    if isinstance(options, Mapping | None):  # any other value is Celery's to refuse
        merged[TRANSPORT_OPTIONS] = {**shipped[TRANSPORT_OPTIONS], **(options or {})}
    return ChainMap(merged, deployment, shipped)


def _transport_options(settings: Settings, base: dict[str, Any]) -> dict[str, Any]:
    if not settings.broker_is_filesystem:
        return base
    queue = settings.broker_folder / "queue"
    processed = settings.broker_folder / "processed"
    # kombu keeps its exchange tables in ``control/`` of the working directory by default.
    control = settings.broker_folder / "control"
    for folder in (queue, processed, control):
        folder.mkdir(parents=True, exist_ok=True)
    return {
        **base,
        "data_folder_in": str(queue),
        "data_folder_out": str(queue),
        "processed_folder": str(processed),
        "control_folder": str(control),
        "store_processed": False,
    }


def _broker(broker_url: str) -> tuple[str, str | None]:
    """Celery's ``broker_url`` and ``broker_transport`` for ``JOBSAPP_BROKER_URL``: the
    same URL, but for a Redis socket (``redis_transport.SocketTransport`` says why)."""
    prefix = "redis+socket://"
    if broker_url.startswith(prefix):
        socket = f"socket://{broker_url.removeprefix(prefix)}"
        return socket, "jobsapp.lifecycle.transport.redis_transport:SocketTransport"
    return broker_url, _transport(broker_url)


def _transport(broker_url: str) -> str | None:
    """Redis brokers get kombu's Redis transport that refuses items it cannot parse;
    RabbitMQ gets py-amqp's whose publish batches wait for their confirms once; the
    embedded default kombu's filesystem transport whose messages appear whole."""
    scheme = broker_url.split("://", 1)[0]
    if scheme == "filesystem":
        return "jobsapp.lifecycle.transport.filesystem_transport:Transport"
    if scheme in ("redis", "rediss"):
        return "jobsapp.lifecycle.transport.redis_transport:Transport"
    if scheme == "sentinel":
        return "jobsapp.lifecycle.transport.redis_transport:SentinelTransport"
    if scheme in ("amqp", "pyamqp"):
        return "jobsapp.lifecycle.transport.amqp_transport:Transport"
    if scheme == "amqps":
        return "jobsapp.lifecycle.transport.amqp_transport:SSLTransport"
    return None


def _all_imports(deployment: Sequence[str] | None, named: tuple[str, ...]) -> tuple[str, ...]:
    """jobsapp's modules, the deployment's ``imports`` (Celery's setting in its
    ``celeryconfig``, which the worker and beat import at start as for any Celery app) and
    ``JOBSAPP_IMPORTS`` (which every process imports, the web's included), each once."""
    return tuple(dict.fromkeys((*BASE_IMPORTS, *(deployment or ()), *named)))


def create_app() -> Celery:
    settings = get_settings()
    # Revokes of lifecycle jobs are kept in the journal (lifecycle/celery_api/revoke.py).
    celery_app = Celery("jobsapp", control="jobsapp.lifecycle.celery_api.revoke:JournalControl")
    # The journal answers for lifecycle jobs over any result backend the deployment names
    # (Celery takes this before its setting, which CELERY_RESULT_BACKEND overrides).
    celery_app.backend_cls = RESULTS
    # Before anything reads its configuration: a team's module connects to it later.
    celery_app.on_after_configure = AfterConfigure(celery_app)
    celery_app.config_from_object(celery_settings())
    named = {name: celery_app.conf.get(name) for name in CELERY_BROKER_SETTINGS}
    if refusal := foreign_broker(named, "the deployment's celeryconfig", settings.broker_url):
        raise SettingsError(refusal)
    celery_app.steps["consumer"].add("jobsapp.lifecycle.transport.guard:DeadLetterQueue")
    celery_app.steps["consumer"].add("jobsapp.lifecycle.worker.held_events:HeldTaskEvents")
    broker_url, transport = _broker(settings.broker_url)
    celery_app.conf.update(
        broker_url=broker_url,
        broker_transport=transport,
        broker_transport_options=_transport_options(
            settings, dict(celery_app.conf.broker_transport_options or {})
        ),
        imports=_all_imports(celery_app.conf.imports, settings.imports),
    )
    if refusal := sentinel_unnamed(settings.broker_url, celery_app.conf.broker_transport_options):
        raise SettingsError(refusal)
    json_startup(celery_app)
    one_line_per_reject()
    # Eagerly, as a process that only replays or relays may publish before any lifecycle
    # task joins this app (on_bound registers them then, for a team's own app too).
    add_publish_filter(celery_app, held_while_paused)
    add_claim_hold(celery_app, while_paused)
    return celery_app


try:
    app = create_app()
except SettingsError as bad:
    # Celery's command line would bury the line under "Unable to load celery application"
    # and a traceback; gunicorn imports this module too, through the web app.
    preflight.exit_on_bad_setting(bad)
preflight.connect_celery_signals()


@worker_process_init.connect
def _fresh_connections(**_kwargs: Any) -> None:
    """A forked child must not share its parent's database sockets."""
    dispose_engines()


@worker_init.connect
def _register_worker(**_kwargs: Any) -> None:
    """The worker registry beats from ``worker_ready`` on. Imported by a worker only: its
    reads load every run table, which a producer or ``celery inspect`` does not need."""
    from jobsapp.monitor import workers

    workers.connect_celery_signals()


@worker_init.connect
def _ping_through_journal(sender: Any, **_kwargs: Any) -> None:
    """``celery.ping``, as a lifecycle task, before the consumer reads the registry.

    Celery's embedded test worker (``start_worker(app)``, the ``celery_worker`` and
    ``celery_session_worker`` fixtures) checks it is up by
    ``celery.ping.delay().get() == "pong"``. On an app whose plain tasks keep no result
    (jobsapp's, the journal its only backend) that ``get()`` is ``None`` at once, and the
    check failed with a bare ``AssertionError``. As a lifecycle task of the same body the
    ping goes the way every job goes and is read back from its run. A production worker
    has no ``celery.ping``; an app that keeps plain results keeps its own.
    """
    from jobsapp.lifecycle import lifecycle_task

    plain = sender.app.tasks.get(PING)
    # A lifecycle task never ignores its result (the journal keeps every run's value).
    if plain is None or not plain.ignore_result:
        return
    sender.app.tasks.unregister(PING)
    lifecycle_task(sender.app, name=PING, max_attempts=1)(plain.run)


@task_revoked.connect
def _expired_before_adoption(sender: Any, request: Any = None, **kwargs: Any) -> None:
    """A plain call's message that expired before a worker adopted it gets its expired
    run (lifecycle/worker/unadopted.py): imported only where it happens, in a worker."""
    if kwargs.get("expired"):
        from jobsapp.lifecycle.worker import unadopted

        unadopted.record_expired(sender, request)


@worker_init.connect
def _refuse_green_pools(sender: Any, **_kwargs: Any) -> None:
    """Runs before the pool is built; SystemExit, because Celery logs and swallows the
    Exceptions of signal handlers."""
    reason = green_pool_refusal(get_implementation(sender.pool_cls))
    if reason is not None:
        logging.getLogger(__name__).critical(reason)
        raise SystemExit(reason)


@after_setup_logger.connect
@after_setup_task_logger.connect
def _scrub_logs(logger: logging.Logger, **_kwargs: Any) -> None:
    """Celery's handlers (root, task and multiprocessing loggers) mask secrets too."""
    forked = get_multiprocessing_logger()  # None until billiard has made one
    scrub_handlers(logger, *([forked] if forked is not None else []))
    format_handlers(logger, *([forked] if forked is not None else []))


@celeryd_after_setup.connect
def _banner(instance: Any, **_kwargs: Any) -> None:
    log_worker_banner(instance)
