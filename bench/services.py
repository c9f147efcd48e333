"""The benchmark's own servers, started with scripts/services.sh and always stopped.

Two Postgres clusters: ``durable`` (fsync, synchronous_commit and full_page_writes on,
as production runs it) with Redis and S3 beside it, and ``fast`` (the test suite's
fsync=off) for comparison; a smoke run, whose figures mean nothing, starts ``durable``
alone. PgBouncer and RabbitMQ beside ``durable`` start only when a
benchmark asks (``extras``); stopping the instance stops them too. Each instance has
its own state dir under ``var/bench/`` and ports counted from ``--port-base``, so it
never meets the test services (5439, 6390, 8339, 5679) or another engineer's instance on
a different base.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "services.sh"
DEFAULT_PORT_BASE = 15400
PGBOUNCER_POOL = 6  # server connections per database behind the bench's PgBouncer
S3_BUCKET = "jobsapp-bench"
S3_KEYS = {
    "AWS_ACCESS_KEY_ID": "jobsapp",
    "AWS_SECRET_ACCESS_KEY": "jobsapp-secret-key",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass(frozen=True)
class Instance:
    """One services.sh state dir: its Postgres, and Redis/S3 when started there."""

    name: str
    state_dir: Path
    pg_port: int
    redis_port: int | None
    s3_port: int | None
    # PgBouncer, then RabbitMQ's AMQP, distribution, epmd and TLS ports (five in a row).
    extras_port: int | None = None

    def pg_url(self, database: str) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.pg_port}/{database}"

    def pg_dsn(self, database: str) -> str:
        """libpq form, for psycopg2/psycopg 3 directly."""
        return f"host=127.0.0.1 port={self.pg_port} user=postgres dbname={database}"

    def redis_url(self, db: int) -> str:
        assert self.redis_port is not None, f"{self.name} has no Redis"
        return f"redis://127.0.0.1:{self.redis_port}/{db}"

    @property
    def s3_endpoint(self) -> str:
        assert self.s3_port is not None, f"{self.name} has no S3"
        return f"http://127.0.0.1:{self.s3_port}"

    def pgbouncer_url(self, database: str) -> str:
        assert self.extras_port is not None, f"{self.name} has no PgBouncer"
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.extras_port}/{database}"

    @property
    def amqp_url(self) -> str:
        assert self.extras_port is not None, f"{self.name} has no RabbitMQ"
        return f"pyamqp://guest:guest@127.0.0.1:{self.extras_port + 1}//"

    def pid(self, relative: str) -> int:
        """A server's pid from its pid file (first line), e.g. ``postgres/data/postmaster.pid``."""
        return int((self.state_dir / relative).read_text().split()[0])


def _environment(instance: Instance, durable: bool, port_base: int) -> dict[str, str]:
    env = {
        **os.environ,
        "JOBSAPP_SVC_DIR": str(instance.state_dir),
        "JOBSAPP_PG_PORT": str(instance.pg_port),
        "JOBSAPP_PG_DB": "bench",
        "JOBSAPP_PG_DURABLE": "1" if durable else "0",
    }
    if instance.redis_port is not None:
        env["JOBSAPP_REDIS_PORT"] = str(instance.redis_port)
    if instance.s3_port is not None:
        # weed's gRPC ports are these + 10000: all stay inside the bench's own range.
        env.update(
            {
                "JOBSAPP_S3_PORT": str(instance.s3_port),
                "JOBSAPP_S3_BUCKET": S3_BUCKET,
                "JOBSAPP_WEED_MASTER_PORT": str(port_base + 4),
                "JOBSAPP_WEED_VOLUME_PORT": str(port_base + 5),
                "JOBSAPP_WEED_FILER_PORT": str(port_base + 6),
                "JOBSAPP_WEED_ADMIN_PORT": str(port_base + 7),
            }
        )
    if instance.extras_port is not None:
        env.update(
            {
                "JOBSAPP_PGBOUNCER_PORT": str(instance.extras_port),
                "JOBSAPP_AMQP_PORT": str(instance.extras_port + 1),
                "JOBSAPP_RABBITMQ_DIST_PORT": str(instance.extras_port + 2),
                "JOBSAPP_EPMD_PORT": str(instance.extras_port + 3),
                "JOBSAPP_AMQPS_PORT": str(instance.extras_port + 4),
                "JOBSAPP_RABBITMQ_NODENAME": f"bench{port_base}@localhost",
            }
        )
    return env


@contextmanager
def _running(instance: Instance, durable: bool, port_base: int) -> Iterator[Instance]:
    env = _environment(instance, durable, port_base)
    wanted = ["postgres"] + ["redis"] * (instance.redis_port is not None)
    wanted += ["s3"] * (instance.s3_port is not None)
    try:
        subprocess.run([str(SCRIPT), "start", *wanted], env=env, check=True)
        yield instance
    finally:
        # Also after a failed start: stop whatever part of it came up.
        subprocess.run([str(SCRIPT), "stop"], env=env, check=False)


@dataclass(frozen=True)
class Services:
    durable: Instance
    fast: Instance | None  # None: not started (a smoke run)
    web_port: int  # for the benchmarks' own gunicorn
    port_base: int

    @contextmanager
    def extras(self) -> Iterator[Instance]:
        """PgBouncer (transaction pooling) and RabbitMQ beside ``durable``, stopped after."""
        # Fewer server connections than the 8 x 2 worker children and the beats: PgBouncer
        # multiplexes them, as it would in front of a server with a connection budget.
        env = {
            **_environment(self.durable, True, self.port_base),
            "JOBSAPP_PGBOUNCER_POOL_SIZE": str(PGBOUNCER_POOL),
        }
        try:
            subprocess.run([str(SCRIPT), "start", "pgbouncer", "rabbitmq"], env=env, check=True)
            yield self.durable
        finally:
            for name in ("pgbouncer", "rabbitmq"):
                subprocess.run([str(SCRIPT), "stop", name], env=env, check=False)


def _instances(port_base: int, state_root: Path) -> tuple[Instance, Instance]:
    durable = Instance(
        "durable", state_root / "durable", port_base, port_base + 2, port_base + 3, port_base + 9
    )
    return durable, Instance("fast", state_root / "fast", port_base + 1, None, None)


@contextmanager
def started(port_base: int, state_root: Path, *, compare: bool = True) -> Iterator[Services]:
    """The servers, stopped on the way out; ``compare``: also the fsync-off cluster."""
    durable, fast = _instances(port_base, state_root)
    with ExitStack() as stack:
        stack.enter_context(_running(durable, True, port_base))
        if compare:
            stack.enter_context(_running(fast, False, port_base))
        yield Services(durable, fast if compare else None, port_base + 8, port_base)


def stop(port_base: int, state_root: Path) -> None:
    """Stops whatever an earlier run under ``state_root`` left running (by its pid files)."""
    for instance, durable in zip(_instances(port_base, state_root), (True, False), strict=True):
        subprocess.run(
            [str(SCRIPT), "stop"],
            env=_environment(instance, durable, port_base),
            check=False,
            capture_output=True,
        )
