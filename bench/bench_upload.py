"""Upload to ready: gunicorn (2 workers, as the Procfile) + a Celery worker (-c 2 prefork).

On the bench's Postgres with fsync on, its Redis (broker and dedup) and its S3. Three
measurements of the same 1024x768 JPEG, each upload a new attachment:
1. service time on an idle system: one upload at a time, POST until the row is ``ready``;
2. capacity: a burst uploaded by 4 client threads, ready uploads per second until the
   last is ready;
3. latency under an open-loop (Poisson) arrival rate of 50% and 80% of that capacity:
   each upload's latency runs from its scheduled arrival (so a slow POST counts, no
   coordinated omission) to the moment a poller sees its row ``ready``.
Readiness is read from the database by one poller every 10 ms, so the web app serves
only uploads.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import psycopg2
import redis
from PIL import Image

from bench import plots
from bench.services import ROOT, S3_BUCKET, Instance, Services
from jobsapp.demo import multipart_body

BIN = Path(sys.executable).parent
POLL = 0.01
SIZES = {  # idle uploads, burst, seconds per load level
    "full": (10, 300, 120.0),
    "quick": (3, 30, 12.0),
    "smoke": (1, 4, 1.0),
}
LOADS = (0.5, 0.8)


def sample_jpeg() -> bytes:
    image = Image.linear_gradient("L").resize((1024, 768)).convert("RGB")
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=90)
    return buf.getvalue()


class Ready:
    """Watches attachment rows; records when each is first seen in a terminal state."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.pending: set[str] = set()
        self.seen: dict[str, float] = {}
        self.failed: set[str] = set()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def watch(self, attachment_id: str) -> None:
        with self.lock:
            self.pending.add(attachment_id)

    def _poll(self) -> None:
        conn = psycopg2.connect(self.dsn)
        conn.autocommit = True
        with conn.cursor() as cur:
            while not self.stopping.wait(POLL):
                with self.lock:
                    ids = list(self.pending)
                if not ids:
                    continue
                cur.execute(
                    "SELECT id::text, state FROM attachments WHERE id = ANY(%s::uuid[]) "
                    "AND state IN ('ready', 'failed')",
                    (ids,),
                )
                now = time.time()
                with self.lock:
                    for attachment_id, state in cur.fetchall():
                        self.pending.discard(attachment_id)
                        self.seen[attachment_id] = now
                        if state == "failed":
                            self.failed.add(attachment_id)
        conn.close()

    def wait_all(self, limit: float) -> None:
        deadline = time.monotonic() + limit
        while True:
            with self.lock:
                if not self.pending:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(self.pending)} uploads not ready in {limit:.0f}s")
            time.sleep(POLL)
        if self.failed:
            raise RuntimeError(f"{len(self.failed)} uploads failed, e.g. {min(self.failed)}")


# The producers' token of the web under measure (JOBSAPP_API_TOKEN).
API_TOKEN = "bench-producers-token-6d2a8c4f9e1b73"  # noqa: S105 - the bench's own web, on loopback


class Client:
    def __init__(self, base_url: str, image: bytes) -> None:
        self.base_url = base_url
        self.body, self.content_type = multipart_body("file", "bench.jpg", image, "image/jpeg")

    def upload(self) -> str:
        request = urllib.request.Request(  # noqa: S310 (our own http://127.0.0.1 server)
            self.base_url + "/v1/attachments",
            self.body,
            {"Content-Type": self.content_type, "Authorization": f"Bearer {API_TOKEN}"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=60) as reply:  # noqa: S310
            attachment_id: str = json.loads(reply.read())["id"]
        return attachment_id

    def wait_up(self, limit: float = 60) -> None:
        deadline = time.monotonic() + limit
        while True:
            try:
                urllib.request.urlopen(  # noqa: S310
                    f"{self.base_url}/v1/attachments/{uuid.uuid4()}",
                    timeout=2,
                )
            except urllib.error.HTTPError:
                return  # 404: the app answers
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def _environment(instance: Instance, run: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "JOBSAPP_DATABASE_URL": instance.pg_url("upload"),
        "JOBSAPP_BROKER_URL": instance.redis_url(8),
        "JOBSAPP_REDIS_URL": instance.redis_url(8),
        "JOBSAPP_STORAGE_URL": f"s3://{S3_BUCKET}/upload-{run}",
        "JOBSAPP_S3_ENDPOINT_URL": instance.s3_endpoint,
        "JOBSAPP_VAR_DIR": str(ROOT / "var" / "bench" / "upload"),
        "JOBSAPP_API_TOKEN": API_TOKEN,
    }


@contextmanager
def running_app(instance: Instance, port: int, out: Path) -> Iterator[str]:
    """A fresh database, then gunicorn and a worker; both killed on the way out."""
    conn = psycopg2.connect(instance.pg_dsn("postgres"))
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("DROP DATABASE IF EXISTS upload WITH (FORCE)")
        cur.execute("CREATE DATABASE upload")
    conn.close()
    env = _environment(instance, uuid.uuid4().hex[:8])
    redis.Redis.from_url(env["JOBSAPP_BROKER_URL"]).flushdb()
    subprocess.run(
        [sys.executable, "-m", "jobsapp.cli", "db", "upgrade"],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    commands = {
        "web": [
            str(BIN / "gunicorn"),
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "2",
            "jobsapp.web.app:create_app()",
        ],
        "worker": [
            str(BIN / "celery"),
            "-A",
            "jobsapp",
            "worker",
            "--pool=prefork",
            "-c",
            "2",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-l",
            "warning",
        ],
    }
    procs = []
    try:
        for name, argv in commands.items():
            log = (out / f"upload-{name}.log").open("ab")
            procs.append(
                subprocess.Popen(
                    argv,
                    env=env,
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        yield f"http://127.0.0.1:{port}"
    finally:
        # The whole group: gunicorn's and Celery's own children hold the port and the queue.
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def service_times(client: Client, ready: Ready, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.time()
        attachment_id = client.upload()
        ready.watch(attachment_id)
        ready.wait_all(120)
        times.append(ready.seen[attachment_id] - started)
    return times


def capacity(client: Client, ready: Ready, burst: int) -> float:
    started = time.time()
    with ThreadPoolExecutor(4) as pool:
        ids = list(pool.map(lambda _: client.upload(), range(burst)))
    for attachment_id in ids:
        ready.watch(attachment_id)
    ready.wait_all(120 + burst)
    return burst / (max(ready.seen[i] for i in ids) - started)


def open_loop(client: Client, ready: Ready, rate: float, seconds: float) -> list[float]:
    """Poisson arrivals at ``rate``/s for ``seconds``; latency from each scheduled arrival."""
    rng = random.Random(12)
    arrivals: dict[str, float] = {}
    lock = threading.Lock()

    def arrive(at: float) -> None:
        attachment_id = client.upload()
        ready.watch(attachment_id)
        with lock:
            arrivals[attachment_id] = at

    start = time.time()
    with ThreadPoolExecutor(32) as pool:
        at = start + rng.expovariate(rate)
        while at < start + seconds:
            time.sleep(max(0.0, at - time.time()))
            pool.submit(arrive, at)
            at += rng.expovariate(rate)
    ready.wait_all(120 + seconds)
    return [ready.seen[i] - scheduled for i, scheduled in arrivals.items()]


def percentiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return (values[0],) * 3 if values else (0.0, 0.0, 0.0)
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[49], cuts[94], cuts[98]


def plot(latencies: dict[float, list[float]], path: Path) -> None:
    with plots.saved(path) as ax:
        for load, values in latencies.items():
            ordered = sorted(values)
            ax.plot(
                [v * 1000 for v in ordered],
                [(i + 1) / len(ordered) for i in range(len(ordered))],
                label=f"{load:.0%} of capacity",
            )
        ax.set_xlabel("upload to ready, ms")
        ax.set_ylabel("fraction of uploads")
        ax.legend()


def main(services: Services, size: str, out: Path) -> list[str]:
    idle, burst, seconds = SIZES[size]
    client_image = sample_jpeg()
    ready = Ready(services.durable.pg_dsn("upload"))
    with running_app(services.durable, services.web_port, out) as base_url:
        client = Client(base_url, client_image)
        client.wait_up()
        ready.thread.start()
        try:
            service_times(client, ready, 1)  # warm-up: first connections, imports, bucket
            service = statistics.median(service_times(client, ready, idle))
            ups = capacity(client, ready, burst)
            latencies = {load: open_loop(client, ready, load * ups, seconds) for load in LOADS}
        finally:
            ready.stopping.set()
    print(f"service time on an idle system: {service * 1000:.0f} ms (median of {idle})")
    print(f"capacity: {ups:.1f} uploads/s ready (burst of {burst})")
    lines = [
        f"upload capacity (uploads/s ready): {ups:.1f}",
        f"upload idle service time (ms): {service * 1000:.0f}",
    ]
    for load, values in latencies.items():
        p50, p95, p99 = percentiles(values)
        print(
            f"{load:.0%} load ({load * ups:.1f}/s for {seconds:.0f}s, {len(values)} uploads): "
            f"p50 {p50 * 1000:.0f} ms  p95 {p95 * 1000:.0f} ms  p99 {p99 * 1000:.0f} ms"
        )
        lines.append(f"upload p99/idle service time ratio ({load:.0%} load): {p99 / service:.2f}")
    plot(latencies, out / "upload.png")
    return lines
