"""Servers a test session or module owns: a free port, a private ``redis-server``.

Nothing here imports jobsapp: tests/conftest.py starts the session's Redis before jobsapp
reads its settings.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

QUEUE = "celery"  # Celery's default queue: the one web, beat and workers all use here
# util-linux (essential on Debian): the kernel SIGKILLs the server when the pytest thread
# that started it dies, even by SIGKILL or an unhandled SIGTERM (``timeout``), so no
# session leaves a server behind.
DIE_WITH_PARENT = ("setpriv", "--pdeathsig", "KILL", "--")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class RedisServer:
    """A private ``redis-server`` (no persistence, like the shared one), killable at will.

    Private rather than a database number on the shared server: a test can kill and
    restart it without touching anyone else's queues, and no two sessions share a queue.
    ``dies_with_pytest`` ties it to this process's life (the kernel kills it with pytest);
    leave it off for a server that a thread other than the main one may restart: the tie
    is to the thread that started it.
    """

    workdir: Path
    port: int = field(default_factory=free_port)
    popen: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    dies_with_pytest: bool = False
    replica_of: int | None = None  # a master's port: this server replicates it
    # A folder holding ca.crt, server.crt and server.key: the server speaks TLS only.
    tls: Path | None = None
    # Named by its Unix socket (kombu's ``redis+socket://``), as a Redis on the same host is.
    by_socket: bool = False

    @property
    def socket(self) -> Path:
        # Short: a socket's path has at most 107 bytes, a test's tmp_path may be longer.
        return Path(f"/tmp/jobsapp-redis-{self.port}.sock")

    @property
    def url(self) -> str:
        if self.by_socket:
            return f"redis+socket://{self.socket}"
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}/0"

    @property
    def dedup_url(self) -> str:
        """The URL redis-py takes (``JOBSAPP_REDIS_URL``)."""
        return f"unix://{self.socket}" if self.by_socket else self.url

    def argv(self) -> list[str]:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed (apt-get install redis-server)"
        return [
            binary,
            *self._listener(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
            "--daemonize",
            "no",
            "--logfile",
            str(self.workdir / "redis.log"),
            *(
                ()
                if self.replica_of is None
                else ("--replicaof", "127.0.0.1", str(self.replica_of))
            ),
        ]

    def _listener(self) -> tuple[str, ...]:
        if self.by_socket:
            return ("--port", str(self.port), "--unixsocket", str(self.socket))
        if self.tls is None:
            return ("--port", str(self.port))
        return (
            *("--port", "0", "--tls-port", str(self.port), "--tls-auth-clients", "no"),
            *("--tls-cert-file", str(self.tls / "server.crt")),
            *("--tls-key-file", str(self.tls / "server.key")),
            *("--tls-ca-cert-file", str(self.tls / "ca.crt")),
        )

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        tie = DIE_WITH_PARENT if self.dies_with_pytest else ()
        self.popen = subprocess.Popen(
            [*tie, *self.argv()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        client = self.client()
        deadline = time.monotonic() + 10
        while True:
            try:
                # Ours, not a server another session started on the port meanwhile.
                if client.info("server")["process_id"] == self.popen.pid:
                    return
                raise AssertionError(f"port {self.port} answers for another redis-server")
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.popen.poll() is not None:
                    raise
                time.sleep(0.02)
            finally:
                client.close()

    def kill(self) -> None:
        """SIGKILL: the queue, unacked messages and dedup keys are gone with it."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=10)

    def restart(self, down_for: float) -> None:
        self.kill()
        time.sleep(down_for)
        self.restarts += 1
        self.start()

    def client(self) -> redis.Redis:
        trust = {} if self.tls is None else {"ssl_ca_certs": str(self.tls / "ca.crt")}
        return redis.Redis.from_url(self.dedup_url, socket_timeout=5, **trust)

    def pending(self) -> int:
        with contextlib.closing(self.client()) as client:
            return int(client.llen(QUEUE))

    def unacked(self) -> int:
        with contextlib.closing(self.client()) as client:
            return int(client.hlen("unacked"))

    def age_unacked(self) -> int:
        """Make every unacked message look delivered long ago (kombu's ``unacked_index``).

        kombu restores an unacked message (puts it back on the queue) once it is older
        than the visibility timeout, at the next worker's start or periodic sweep. The
        timeout is two hours here (celeryconfig), so a test moves the delivery time back
        instead of waiting: the redelivery itself is kombu's own ``restore_visible``.
        """
        with contextlib.closing(self.client()) as client:
            tags = client.zrange("unacked_index", 0, -1)
            for tag in tags:
                client.zadd("unacked_index", {tag: 0}, xx=True)
            return len(tags)

    def close(self) -> None:
        self.kill()
        if self.by_socket:  # a killed server leaves its socket behind
            self.socket.unlink(missing_ok=True)


@dataclass
class SentinelServer(RedisServer):
    """A Redis Sentinel (``redis-server --sentinel``) watching the master on ``master``'s
    port under the name ``MASTER``; quick to call a master down and to fail over."""

    master: int = 0
    MASTER = "jobsapp-master"

    @property
    def url(self) -> str:
        return f"sentinel://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        config = self.workdir / "sentinel.conf"  # Sentinel rewrites its own config
        config.write_text(
            f"sentinel monitor {self.MASTER} 127.0.0.1 {self.master} 1\n"
            f"sentinel down-after-milliseconds {self.MASTER} 1000\n"
            f"sentinel failover-timeout {self.MASTER} 5000\n"
        )
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed (apt-get install redis-server)"
        return [
            binary,
            str(config),
            "--sentinel",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.workdir),
            "--logfile",
            str(self.workdir / "sentinel.log"),
        ]

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def master_port(self) -> int:
        with contextlib.closing(self.client()) as client:
            _, port = client.sentinel_get_master_addr_by_name(self.MASTER)
            return int(port)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
