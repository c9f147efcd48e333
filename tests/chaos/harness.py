"""The chaos harness: one isolated deployment per test, real processes, real services.

A ``Cluster`` is what a test crashes: its own Postgres database (cloned from a migrated
template), its own broker (a private ``redis-server``, or a RabbitMQ vhost), its own S3
prefix, and the ``jobsapp web`` / ``celery -A jobsapp worker`` / ``celery -A jobsapp beat``
processes started for it. A crash point is armed by starting the process that should die
with ``JOBSAPP_CRASH_AT`` in its environment; the harness restarts what a supervisor
would restart, unarmed. Assertions read what a user would check: the rows and the bucket.

Cadences are short (heartbeat 0.5 s, stale after 2 s, reaper and relay every second) so
that a crash is recovered in seconds; every process is killed by the fixture finalizer.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import itertools
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, urlsplit

from PIL import Image
from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.pool import NullPool

from jobsapp.attachments.models import ATTACHMENTS, RUNS, VARIANTS
from jobsapp.attachments.pipeline import get_pipeline, original_key, variant_key
from jobsapp.attachments.store import PUBLISHED_PREFIX, STAGING_PREFIX
from jobsapp.lifecycle.journal import OUTBOX
from jobsapp.storage import ObjectStore
from tests.support import journal_view
from tests.support.attachments import sha256
from tests.support.faketime_celery import faketime
from tests.support.procs import BIN, WORKER_FLAGS, Launcher, Proc, beat_argv, ready
from tests.support.servers import QUEUE, free_port
from tests.support.webserver import API_TOKEN, Http, Reply

ROOT = Path(__file__).resolve().parents[2]

HEARTBEAT = 0.5
STALE_AFTER = 2.0
UNCLAIMED_AFTER = 2.0
REAPER_EVERY = 1.0
RELAY_EVERY = 1.0
BEAT_LEASE = 3.0
# Staging retention's orphan limit for the tests: about a second (0.0003 h = 1.08 s).
STAGING_ORPHAN_HOURS = 0.0003
SETTINGS = {
    "JOBSAPP_HEARTBEAT_INTERVAL": str(HEARTBEAT),
    "JOBSAPP_STALE_AFTER": str(STALE_AFTER),
    "JOBSAPP_UNCLAIMED_AFTER": str(UNCLAIMED_AFTER),
    "JOBSAPP_REAPER_EVERY": str(REAPER_EVERY),
    "JOBSAPP_RELAY_EVERY": str(RELAY_EVERY),
    "JOBSAPP_BEAT_LEASE_SECONDS": str(BEAT_LEASE),
    "JOBSAPP_STAGING_ORPHAN_HOURS": str(STAGING_ORPHAN_HOURS),
    "JOBSAPP_API_TOKEN": API_TOKEN,
}
VERSION = 1
PROMISED = tuple(sorted(spec.name for spec in get_pipeline(VERSION).variants))


# ----------------------------------------------------------------------------- images


def photo(size: tuple[int, int] = (320, 240), quality: int = 85) -> bytes:
    """A JPEG no other call returns (random noise), ``size`` pixels."""
    rng = random.Random()
    tint = tuple(rng.randrange(256) for _ in range(3))
    img = Image.merge(
        "RGB",
        (
            Image.linear_gradient("L").resize(size),
            Image.effect_noise(size, 40),
            Image.new("L", size, tint[0]),
        ),
    )
    out = io.BytesIO()
    img.save(out, "JPEG", quality=quality)
    return out.getvalue()


# A photo whose variants take the worker a few seconds to render on a CI core: a window
# wide enough to freeze or kill the worker mid-run, observed from outside.
BIG = (5000, 3500)


# ---------------------------------------------------------------------------- brokers


class Broker(Protocol):
    @property
    def url(self) -> str: ...

    @property
    def dedup_url(self) -> str:
        """The Redis of the dedup fast path (a deployment with RabbitMQ still has one)."""
        ...

    def pending(self) -> int:
        """Messages waiting in the queue (not counting delivered, unacknowledged ones)."""
        ...

    def close(self) -> None: ...


@dataclass
class RabbitBroker:
    """A vhost of its own on the shared RabbitMQ (publisher confirms on)."""

    base_url: str
    dedup_url: str
    vhost: str

    @property
    def url(self) -> str:
        parts = urlsplit(self.base_url)
        return f"{parts.scheme}://{parts.netloc}/{quote(self.vhost, safe='')}"

    @classmethod
    def create(cls, base_url: str, dedup_url: str, name: str) -> RabbitBroker:
        """A fresh vhost ``name``; refused loudly when rabbitmqctl cannot make one (a broker
        not started by scripts/services.sh): the shared vhost's queue may hold another
        session's messages, which a purge would destroy (tests/README.md)."""
        refused = _rabbitmqctl("add_vhost", name) or _rabbitmqctl(
            "set_permissions", "-p", name, "guest", ".*", ".*", ".*"
        )
        if refused:
            raise RuntimeError(
                f"rabbitmqctl could not create the vhost {name!r} ({refused}): start "
                "RabbitMQ with scripts/services.sh (a test never shares the default vhost)"
            )
        return cls(base_url, dedup_url, name)

    def _channel(self) -> Any:
        from kombu import Connection

        return Connection(self.url, connect_timeout=5)

    def pending(self) -> int:
        from amqp.exceptions import NotFound

        with self._channel() as conn:
            try:
                _, count, _ = conn.default_channel.queue_declare(QUEUE, passive=True)
            except NotFound:
                return 0
            return int(count)

    def close(self) -> None:
        _rabbitmqctl("delete_vhost", self.vhost)


def _rabbitmqctl(*args: str) -> str | None:
    """rabbitmqctl against the node of scripts/services.sh (same defaults, same env); None
    when it did it, else why not. Each call starts an Erlang VM: on a loaded machine one
    can outlast its timeout, and is tried again (an ``add_vhost`` that did its work before
    timing out then finds the vhost there)."""
    svc = Path(os.environ.get("JOBSAPP_SVC_DIR") or ROOT / "var" / "services") / "rabbitmq"
    ctl = Path(os.environ.get("JOBSAPP_RABBITMQ_LIB", "/usr/lib/rabbitmq/bin")) / "rabbitmqctl"
    node = os.environ.get("JOBSAPP_RABBITMQ_NODENAME", "jobsapp@localhost")
    if not ctl.exists() or not svc.is_dir():
        return f"no {ctl} or no {svc}"
    env = {
        **os.environ,
        "HOME": str(svc),
        "RABBITMQ_NODENAME": node,
        "ERL_EPMD_PORT": os.environ.get("JOBSAPP_EPMD_PORT", "4370"),
        "RABBITMQ_CONF_ENV_FILE": str(svc / "rabbitmq-env.conf"),
    }
    why = "not run"
    for _ in range(3):
        try:
            done = subprocess.run(
                [str(ctl), "-q", "-n", node, *args],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        except subprocess.TimeoutExpired:
            why = "timed out after 60 s"
            continue
        except OSError as exc:
            return str(exc)
        if done.returncode == 0 or "already exists" in done.stderr:
            return None
        return f"exit {done.returncode}: {done.stderr.strip()[-300:]}"
    return why


# --------------------------------------------------------------------------- postgres


class PrivatePostgres:
    """A PostgreSQL cluster of one test, so that it can be stopped without harming others.

    Same binaries and settings as scripts/services.sh (fsync off: a test server), or
    ``durable`` as production runs it (fsync, synchronous_commit and full_page_writes on),
    for tests that kill it and count what survived; ``settings`` adds ``-c`` options. As
    root (CI here) the server runs as the ``postgres`` user, as initdb refuses root.
    """

    def __init__(self, *, durable: bool = False, settings: Mapping[str, str] | None = None) -> None:
        self.durable = durable
        self.settings = dict(settings or {})
        self.bin = Path(os.environ.get("JOBSAPP_PG_BIN", "/usr/lib/postgresql/15/bin"))
        self.dir = Path(tempfile.mkdtemp(prefix="jobsapp-chaos-pg-"))
        self.dir.chmod(0o755)
        self.data = self.dir / "data"
        self.port = free_port()

    def _run(self, *argv: str, timeout: float = 60) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        output = self.dir / "pg_ctl.out"
        with output.open("ab") as out:
            done = subprocess.run(
                [*prefix, *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        assert done.returncode == 0, (argv, output.read_text()[-2000:])

    def init(self) -> None:
        assert (self.bin / "initdb").exists(), f"no PostgreSQL binaries in {self.bin}"
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
            "--no-sync",
            "--no-instructions",
        )
        self.start()

    def start(self) -> None:
        switch = "on" if self.durable else "off"
        options = (
            f"-p {self.port} -k '{self.dir}' -c listen_addresses=127.0.0.1"
            + "".join(
                f" -c {name}={switch}"
                for name in ("fsync", "synchronous_commit", "full_page_writes")
            )
            + "".join(f" -c {name}={value}" for name, value in self.settings.items())
        )
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.dir / "pg.log"),
            "-w",
            "-t",
            "30",
            "-o",
            options,
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def crash(self) -> None:
        """SIGKILL the postmaster and every backend: no shutdown checkpoint, no flush."""
        pids = [int(self._postmaster_pid()), *map(int, self._children())]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # Until reaped, a killed postmaster's zombie answers kill(pid, 0): the next start
        # would take it for a live server holding the lock files.
        deadline = time.monotonic() + 20
        while Path(f"/proc/{pids[0]}").exists():
            assert time.monotonic() < deadline, f"postmaster {pids[0]} not reaped after 20s"
            time.sleep(0.02)
        for pid in pids[1:]:
            wait_gone(pid)

    def hold_wal_flushes(self) -> None:
        """SIGSTOP the background processes that flush the WAL on their own (the walwriter,
        and the bgwriter, which flushes before writing a dirty page): until the crash, only a
        synchronous commit flushes a relaxed one. Without it the walwriter, woken by the
        relaxed commit itself, can flush it between a poll that saw it and the SIGKILL."""
        children = self._children()
        title = re.compile(rb"postgres: (walwriter|background writer)\b")
        held = [pid for pid in children if title.match(_cmdline(pid))]
        assert len(held) == 2, f"walwriter and bgwriter not both found among {children}"
        for pid in held:
            os.kill(int(pid), signal.SIGSTOP)

    def _children(self) -> list[str]:
        """The postmaster's child processes (backends and background workers)."""
        postmaster = self._postmaster_pid()
        return Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()

    def _postmaster_pid(self) -> str:
        return (self.data / "postmaster.pid").read_text().split()[0]

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{database}"

    def destroy(self) -> None:
        pidfile = self.data / "postmaster.pid"
        if pidfile.exists():
            pid = int(pidfile.read_text().split()[0])
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGQUIT)  # immediate shutdown; children follow
            deadline = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)


def create_database(admin_url: str, name: str, template: str | None = None) -> str:
    admin = create_engine(
        admin_url.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT", poolclass=NullPool
    )
    clause = f' TEMPLATE "{template}"' if template else ""
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"{clause}'))
    admin.dispose()
    return admin_url.rsplit("/", 1)[0] + f"/{name}"


def drop_database(admin_url: str, name: str) -> None:
    admin = create_engine(
        admin_url.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT", poolclass=NullPool
    )
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def migrate(url: str) -> None:
    """``jobsapp db upgrade`` in a process of its own (it leaves no pooled connection)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBSAPP_")}
    done = subprocess.run(
        [str(BIN / "jobsapp"), "db", "upgrade"],
        cwd=ROOT,
        env={
            **env,
            "JOBSAPP_DATABASE_URL": url,
            "JOBSAPP_BROKER_URL": "memory://",
            "JOBSAPP_STORAGE_URL": f"file://{ROOT}/var/storage-unused",
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


# ------------------------------------------------------------------------- processes


def _cmdline(pid: str) -> bytes:
    """A process's command line; empty for one gone since it was listed (a backend whose
    client left, an autovacuum worker)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting for its parent."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pid: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while _alive(pid):
        assert time.monotonic() < deadline, f"process {pid} still alive after {timeout}s"
        time.sleep(0.02)


def pid_of(worker_column: str) -> int:
    """The pool process that ran an attempt, from the run's ``worker`` (``name@host:pid``)."""
    return int(worker_column.rsplit(":", 1)[1])


@dataclass
class Web:
    proc: Proc
    http: Http


@dataclass(frozen=True)
class NoAnswer:
    """The connection broke before any HTTP answer: the server died mid-request."""

    error: str


UPLOAD_ERRORS = (OSError, http.client.HTTPException, urllib.error.URLError)


# --------------------------------------------------------------------------- cluster


@dataclass
class Cluster:
    name: str
    env: dict[str, str]
    launcher: Launcher
    engine: Engine
    store: ObjectStore
    broker: Broker
    webs: list[Web] = field(default_factory=list)

    # --- processes -------------------------------------------------------------------

    def worker(
        self, name: str, *, crash_at: str | None = None, env: Mapping[str, str] | None = None
    ) -> Proc:
        argv = [str(BIN / "celery"), "-A", "jobsapp", "worker", *WORKER_FLAGS, "-n", f"{name}@%h"]
        return self.launcher.start(name, argv, {**(env or {}), **(_armed(crash_at) or {})})

    def beat(
        self, name: str = "beat", env: Mapping[str, str] | None = None, *, level: str = "info"
    ) -> Proc:
        """``level="debug"`` logs every reaper pass, idle ones too (see ``reaper_ticks``)."""
        argv = beat_argv(self.launcher.workdir / f"{name}-schedule", level)
        return self.launcher.start(name, argv, env)

    def skewed_worker(self, name: str, offset: str, env: Mapping[str, str] | None = None) -> Proc:
        """A worker under libfaketime, its wall clock moved by ``offset``;
        tests/support/faketime_celery.py says why monotonic clocks stay real."""
        celery = [sys.executable, "-m", "tests.support.faketime_celery", "-A", "jobsapp"]
        argv = [*faketime(offset), *celery, "worker", *WORKER_FLAGS, "-n", f"{name}@%h"]
        return self.launcher.start(name, argv, {"FAKETIME_DONT_FAKE_MONOTONIC": "1", **(env or {})})

    def web(self, *, crash_at: str | None = None, timeout: float = 30.0) -> Web:
        """``jobsapp web`` on a free port, once /healthz answers."""
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "jobsapp.cli",
            "web",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        proc = self.launcher.start("web", argv, _armed(crash_at))
        client = Http(f"http://127.0.0.1:{port}", API_TOKEN)
        deadline = time.monotonic() + timeout
        while True:
            assert proc.alive(), f"jobsapp web exited:\n{proc.log()[-3000:]}"
            with contextlib.suppress(*UPLOAD_ERRORS):
                if client.get("/healthz").status == 200:
                    break
            assert time.monotonic() < deadline, f"web not healthy:\n{proc.log()[-3000:]}"
            time.sleep(0.05)
        web = Web(proc, client)
        self.webs.append(web)
        return web

    def maintenance(self, pass_name: str) -> str:
        """``jobsapp maintenance run-once --pass NAME``; returns what it printed."""
        proc = self.launcher.jobsapp(
            f"run-once-{pass_name}", "maintenance", "run-once", "--pass", pass_name
        )
        assert proc.wait(60) == 0, proc.log()
        return proc.log()

    # --- the client ------------------------------------------------------------------

    @staticmethod
    def upload(web: Web, data: bytes, key: str | None = None) -> Reply | NoAnswer:
        headers = {"Idempotency-Key": key} if key else None
        try:
            return web.http.post_file(data, "photo.jpg", "image/jpeg", headers=headers)
        except UPLOAD_ERRORS as exc:
            return NoAnswer(f"{type(exc).__name__}: {exc}")

    def accepted(self, web: Web, data: bytes) -> uuid.UUID:
        reply = self.upload(web, data)
        assert isinstance(reply, Reply), reply
        assert reply.status == 202, reply.body
        return uuid.UUID(reply.json()["id"])

    # --- the journal -----------------------------------------------------------------

    def _rows(self, stmt: Any) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(stmt).mappings()]

    def attachments(self) -> list[dict[str, Any]]:
        return self._rows(select(ATTACHMENTS).order_by(ATTACHMENTS.c.created_at))

    def attachment(self, attachment_id: uuid.UUID) -> dict[str, Any]:
        (row,) = self._rows(select(ATTACHMENTS).where(ATTACHMENTS.c.id == attachment_id))
        return row

    def run(self, attachment_id: uuid.UUID) -> dict[str, Any]:
        (row,) = self._rows(select(RUNS).where(RUNS.c.attachment_id == attachment_id))
        return row

    def variants(self, attachment_id: uuid.UUID) -> list[dict[str, Any]]:
        return self._rows(
            select(VARIANTS)
            .where(VARIANTS.c.attachment_id == attachment_id)
            .order_by(VARIANTS.c.variant)
        )

    def events(self, job_id: uuid.UUID) -> list[dict[str, Any]]:
        """The job's history: its event rows and what its run row carries, in order."""
        return [dict(e) for e in journal_view.events(self.engine, job_id)]

    def transitions(self, job_id: uuid.UUID) -> list[tuple[str, int]]:
        return [(e["transition"], e["attempt"]) for e in self.events(job_id)]

    def outbox(self, job_id: uuid.UUID) -> list[dict[str, Any]]:
        return self._rows(
            select(OUTBOX).where(OUTBOX.c.job_id == job_id).order_by(OUTBOX.c.attempt)
        )

    def all_outbox(self) -> list[dict[str, Any]]:
        return self._rows(select(OUTBOX).order_by(OUTBOX.c.id))

    def count(self, table: Any) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(table)).scalar_one())

    def wait_for(self, probe: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
        """The first truthy ``probe()``; on timeout fails with the processes' logs."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(Exception):
                value = probe()
                if value:
                    return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout}s")
            time.sleep(0.05)

    def settled(self, attachment_id: uuid.UUID, timeout: float = 40.0) -> dict[str, Any]:
        """The attachment row once it is ``ready`` (fails on ``failed``)."""
        row = self.wait_for(
            lambda: (r := self.attachment(attachment_id))["state"] in ("ready", "failed") and r,
            f"attachment {attachment_id} ready",
            timeout,
        )
        assert row["state"] == "ready", row
        return dict(row)

    def claimed_by(
        self, attachment_id: uuid.UUID, worker: str, *, attempt: int = 1, timeout: float = 30.0
    ) -> dict[str, Any]:
        """The run once ``worker`` claimed the attempt."""
        run = self.wait_for(
            lambda: (
                (r := self.run(attachment_id))["attempts"] == attempt
                and (r["worker"] or "").startswith(f"{worker}@")
                and r
            ),
            f"attempt {attempt} of {attachment_id} claimed by {worker}",
            timeout,
        )
        return dict(run)

    # --- the bucket ------------------------------------------------------------------

    def objects(self, prefix: str) -> dict[str, tuple[str, datetime]]:
        """``key -> (sha256 of the bytes, last modified)`` of every object under ``prefix``."""
        return {
            info.key: (sha256(self.store.get(info.key)), info.modified_at)
            for info in self.store.list(prefix)
        }

    def published_prefix(self, attachment_id: uuid.UUID) -> str:
        return f"{PUBLISHED_PREFIX}/{attachment_id}/"

    @staticmethod
    def expected_keys(attachment_id: uuid.UUID, ext: str = "jpg") -> set[str]:
        keys = {variant_key(PUBLISHED_PREFIX, attachment_id, VERSION, n) for n in PROMISED}
        return keys | {original_key(PUBLISHED_PREFIX, attachment_id, ext)}

    def staging_objects(self) -> set[str]:
        return {info.key for info in self.store.list(STAGING_PREFIX)}

    # --- what "published exactly once" means ----------------------------------------

    def assert_published_once(
        self, attachment_id: uuid.UUID, original: bytes | None = None, *, staging_gone: bool = True
    ) -> dict[str, Any]:
        """Ready; one variant row per effect key, each object's bytes matching its row;
        nothing else under the attachment's prefix; the run succeeded exactly once."""
        row = self.attachment(attachment_id)
        assert (row["state"], row["published_version"], row["error_code"]) == ("ready", 1, None)
        if original is not None:
            assert row["sha256"] == sha256(original)
        variants = self.variants(attachment_id)
        effect_keys = [(v["attachment_id"], v["pipeline_version"], v["variant"]) for v in variants]
        assert len(effect_keys) == len(set(effect_keys))
        assert [v["variant"] for v in variants] == list(PROMISED)
        stored = self.objects(self.published_prefix(attachment_id))
        for v in variants:
            assert stored[v["object_key"]][0] == v["sha256"], v
        assert stored[row["original_key"]][0] == row["sha256"]
        assert set(stored) == {v["object_key"] for v in variants} | {row["original_key"]}
        run = self.run(attachment_id)
        assert run["state"] == "succeeded", run
        moves = Counter(self.transitions(run["job_id"]))
        assert sum(n for (t, _), n in moves.items() if t == "succeed") == 1, moves
        assert all(n == 1 for (t, _), n in moves.items() if t == "claim"), moves
        if staging_gone:
            assert self.store.head(row["staging_key"]) is None, "staging outlived the result"
        return row

    def snapshot(self, attachment_id: uuid.UUID) -> dict[str, Any]:
        """Everything a late writer could disturb: rows, history and objects."""
        run = self.run(attachment_id)
        return {
            "attachment": self.attachment(attachment_id),
            "variants": self.variants(attachment_id),
            "run": run,
            "events": self.events(run["job_id"]),
            "outbox_attempts": [m["attempt"] for m in self.outbox(run["job_id"])],
            "objects": self.objects(self.published_prefix(attachment_id)),
        }


def _armed(crash_at: str | None) -> dict[str, str] | None:
    return {"JOBSAPP_CRASH_AT": crash_at} if crash_at else None


# Celery's log prefix, then the reaper's line for one pass (beat_tasks.reap, in beat).
REAPER_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): [^\]]*\] reaper: ", re.M)


def reaper_ticks(beat: Proc) -> list[datetime]:
    """When beat ran a reaper pass, from a beat started with ``level="debug"``."""
    return [datetime.strptime(at, "%Y-%m-%d %H:%M:%S,%f") for at in REAPER_LINE.findall(beat.log())]


def largest_gap(ticks: list[datetime]) -> float:
    return max((b - a).total_seconds() for a, b in itertools.pairwise(ticks))


@contextlib.contextmanager
def row_locked(engine: Engine, table: Any, *where: Any) -> Iterator[None]:
    """A session idle in transaction holding the row's lock (``FOR UPDATE``), as a frozen
    process would, until the block ends."""
    with engine.connect() as holder:
        holder.begin()
        assert holder.execute(select(table).where(*where).with_for_update()).first() is not None
        try:
            yield
        finally:
            holder.rollback()


def log_has(proc: Proc, pattern: str) -> re.Match[str] | None:
    return re.search(pattern, proc.log())


def wait_log(procs: Iterable[Proc], pattern: str, timeout: float = 30.0) -> Proc:
    """The first of ``procs`` whose log matches ``pattern``."""
    deadline = time.monotonic() + timeout
    procs = list(procs)
    while True:
        for proc in procs:
            if log_has(proc, pattern):
                return proc
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.log()[-2000:]}" for p in procs)
            raise AssertionError(f"no log matched {pattern!r} in {timeout}s\n{tails}")
        time.sleep(0.05)


def no_work_line(job_id: uuid.UUID, attempt: int, reason: str = "") -> str:
    """The worker's log line for a delivered message the claim guard turned into a no-op."""
    return rf"job {job_id} attempt {attempt}: no work, {re.escape(reason)}"


def start_all(
    cluster: Cluster, *names: str, beat: bool = True, crash_at: Mapping[str, str] | None = None
) -> list[Proc]:
    """Start beat (optionally) and workers together, and wait until each is ready."""
    procs = [cluster.beat()] if beat else []
    procs += [cluster.worker(n, crash_at=(crash_at or {}).get(n)) for n in names]
    ready(*procs, timeout=45)
    return procs


# ------------------------------------------------------------------ staging retention


def staging_pass() -> str | None:
    """The name of the staging retention pass, once ``jobsapp.maintenance`` has one."""
    from jobsapp.maintenance import beat_tasks

    for name in ("staging", "staging_retention"):
        if name in beat_tasks.PASSES:
            return name
    return None


STAGING_TODO = (
    "staging retention pass not in jobsapp.maintenance.beat_tasks.PASSES yet: "
    "removal of the object is not proven"
)


# ------------------------------------------------------------------------- fixtures


@contextlib.contextmanager
def cluster_for(
    name: str,
    *,
    database_url: str,
    broker: Broker,
    storage_url: str,
    s3_endpoint: str,
    workdir: Path,
) -> Iterator[Cluster]:
    """A Cluster whose processes all die (SIGKILL, process group) when it closes."""
    from jobsapp.storage import store_from_url

    base = {k: v for k, v in os.environ.items() if not k.startswith("JOBSAPP_")}
    env = {
        **base,
        "PYTHONPATH": str(ROOT),
        "JOBSAPP_DATABASE_URL": database_url,
        "JOBSAPP_BROKER_URL": broker.url,
        "JOBSAPP_REDIS_URL": broker.dedup_url,
        "JOBSAPP_STORAGE_URL": storage_url,
        "JOBSAPP_S3_ENDPOINT_URL": s3_endpoint,
        "JOBSAPP_VAR_DIR": str(workdir / "var"),
        **SETTINGS,
    }
    launcher = Launcher(env, workdir)
    engine = create_engine(database_url, poolclass=NullPool)
    store = store_from_url(storage_url, endpoint_url=s3_endpoint)
    cluster = Cluster(name, env, launcher, engine, store, broker)
    try:
        yield cluster
    finally:
        launcher.kill_all()
        launcher.dump_logs()
        engine.dispose()
        for info in list(store.list("")):
            with contextlib.suppress(Exception):
                store.delete(info.key)


@contextlib.contextmanager
def private_postgres(
    *, durable: bool = False, settings: Mapping[str, str] | None = None
) -> Iterator[PrivatePostgres]:
    """A started PrivatePostgres, destroyed (killed if need be) on the way out."""
    server = PrivatePostgres(durable=durable, settings=settings)
    try:
        server.init()
        yield server
    finally:
        server.destroy()


@contextlib.contextmanager
def private_pg_cluster(server: PrivatePostgres, broker: Broker, workdir: Path) -> Iterator[Cluster]:
    """A Cluster on a freshly migrated database of ``server`` (a PostgreSQL of the test's
    own, which it may stop or kill)."""
    from tests.support.env import SESSION, service

    url = create_database(server.url(), f"jobsapp_{uuid.uuid4().hex[:8]}")
    migrate(url)
    bucket = service("JOBSAPP_TEST_S3_BUCKET")
    prefix = f"chaos-{SESSION}-{uuid.uuid4().hex[:10]}"
    with cluster_for(
        prefix,
        database_url=url,
        broker=broker,
        storage_url=f"s3://{bucket}/{prefix}",
        s3_endpoint=service("JOBSAPP_TEST_S3_ENDPOINT_URL"),
        workdir=workdir,
    ) as cluster:
        yield cluster


def counted_tasks_env() -> dict[str, str]:
    """A worker's environment for tests.support.tasks, their counters on the shared Redis
    (a test's private Redis may be killed)."""
    from tests.support.env import service

    env = {
        "JOBSAPP_IMPORTS": "tests.support.tasks",
        "JOBSAPP_TEST_REDIS_URL": service("JOBSAPP_TEST_REDIS_URL"),
    }
    if namespace := os.environ.get("JOBSAPP_TEST_NAMESPACE"):
        env["JOBSAPP_TEST_NAMESPACE"] = namespace
    return env


class Burst:
    """Uploads photos one after another from a thread, recording every answer."""

    def __init__(
        self, cluster: Cluster, web: Web, *, count: int | None = None, pause: float = 0.1
    ) -> None:
        self._cluster = cluster
        self._web = web
        self._count = count
        self._pause = pause
        self.replies: list[tuple[float, Reply | NoAnswer]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="burst", daemon=True)

    def __enter__(self) -> Burst:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _loop(self) -> None:
        while not self._stop.is_set() and (self._count is None or len(self.replies) < self._count):
            reply = self._cluster.upload(self._web, photo())
            self.replies.append((time.monotonic(), reply))
            self._stop.wait(self._pause)

    def join(self, timeout: float = 120) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the burst did not finish"

    def wait_for(
        self,
        probe: Callable[[list[tuple[float, Reply | NoAnswer]]], bool],
        what: str,
        timeout: float = 30,
    ) -> None:
        self._cluster.wait_for(lambda: probe(list(self.replies)), what, timeout)

    def answers_since(self, since: float) -> list[Reply | NoAnswer]:
        return [reply for at, reply in list(self.replies) if at >= since]

    def accepted(self) -> list[uuid.UUID]:
        return [
            uuid.UUID(r.json()["id"])
            for _, r in self.replies
            if isinstance(r, Reply) and r.status == 202
        ]

    def statuses(self) -> Counter[int | str]:
        return Counter(r.status if isinstance(r, Reply) else "no answer" for _, r in self.replies)


def status_of(reply: Reply | NoAnswer) -> int | None:
    return reply.status if isinstance(reply, Reply) else None


class Killer:
    """SIGKILLs a random live worker (its whole process group) every few seconds."""

    def __init__(self, workers: Callable[[], list[Proc]], every: float, seed: int = 7) -> None:
        self._workers = workers
        self._every = every
        self._rng = random.Random(seed)
        self.kills = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="killer", daemon=True)

    def __enter__(self) -> Killer:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        pause = self._every / 2  # the first kill comes early, even in a short run
        while not self._stop.wait(pause):
            pause = self._rng.uniform(0.5, 1.5) * self._every
            alive = [p for p in self._workers() if p.alive()]
            if alive:
                self._rng.choice(alive).kill()
                self.kills += 1
