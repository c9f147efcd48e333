"""Real processes for end-to-end tests: `jobsapp web` and a Celery worker, plus an HTTP client.

The client never follows redirects, so a test sees the 302 itself, and it checks on every
response that the app sent ``X-Content-Type-Options: nosniff``.
"""

from __future__ import annotations

import functools
import http.client
import json
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any

from jobsapp.demo import multipart_body
from tests.support.servers import free_port

WEB = (sys.executable, "-m", "jobsapp.cli", "web", "--host", "127.0.0.1")
APP = "jobsapp.web.app:create_app()"
WORKER = (
    *(sys.executable, "-m", "celery", "-A", "jobsapp", "worker", "--pool=threads", "-c", "2"),
    *("-l", "warning", "--without-gossip", "--without-mingle", "--without-heartbeat"),
)
REPO = Path(__file__).resolve().parents[2]
# The producers' token of the webs these helpers start, unless a test sets its own.
API_TOKEN = "e2e-producers-token-4b9d2f7a1c6e08"


def procfile_web() -> tuple[str, ...]:
    """The Procfile's web line as its argv, run by this interpreter's gunicorn; it binds
    where ``JOBSAPP_WEB_BIND`` says (web/gunicorn_conf.py)."""
    lines = (REPO / "Procfile").read_text().splitlines()
    argv = shlex.split(next(line for line in lines if line.startswith("web:"))[4:])
    assert argv[0] == "gunicorn", argv
    return (sys.executable, "-m", *argv)


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Message
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Http:
    """A client for the app under test; every response must carry nosniff. With a
    ``token``, a request that names no Authorization of its own sends it as a bearer. With
    a ``source`` (127.0.0.2, ...: Linux routes every 127/8 address like 127.0.0.1), it is
    another client address to the app, so its failed guesses throttle only itself."""

    base_url: str
    token: str | None = None
    source: str | None = None

    def get(self, path: str) -> Reply:
        return self.request(path)

    def post_file(
        self,
        data: bytes,
        filename: str = "upload.bin",
        content_type: str = "application/octet-stream",
        headers: Mapping[str, str] | None = None,
        field_name: str = "file",
    ) -> Reply:
        body, multipart = multipart_body(field_name, filename, data, content_type)
        all_headers = {"Content-Type": multipart, **(headers or {})}
        return self.request("/v1/attachments", body, all_headers, method="POST")

    def request(
        self,
        path: str,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        method: str = "GET",
    ) -> Reply:
        all_headers = dict(headers or {})
        if self.token and not any(name.lower() == "authorization" for name in all_headers):
            all_headers["Authorization"] = f"Bearer {self.token}"
        # S310: the URL is always the app's own http://127.0.0.1 address.
        request = urllib.request.Request(  # noqa: S310
            self.base_url + path, data, all_headers, method=method
        )
        opener = _NO_REDIRECTS
        if self.source:
            opener = urllib.request.build_opener(_NoRedirect, _FromAddress(self.source))
        reply = fetch(request, opener)
        assert reply.headers.get("X-Content-Type-Options") == "nosniff", (request.full_url, reply)
        return reply


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *_args: Any, **_kwargs: Any) -> None:
        return None


_NO_REDIRECTS = urllib.request.build_opener(_NoRedirect)


class _FromAddress(urllib.request.HTTPHandler):
    def __init__(self, source: str) -> None:
        super().__init__()
        self.source = source

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        bound = functools.partial(http.client.HTTPConnection, source_address=(self.source, 0))
        return self.do_open(bound, req)


def fetch(request: urllib.request.Request | str, opener: Any = None) -> Reply:
    """One HTTP exchange; 4xx/5xx are answers to look at, not exceptions."""
    opener = opener or urllib.request.build_opener()
    try:
        with opener.open(request, timeout=30) as response:
            return Reply(response.status, response.headers, response.read())
    except urllib.error.HTTPError as error:
        with error:
            return Reply(error.code, error.headers, error.read())


def start(argv: tuple[str, ...], env: Mapping[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        return subprocess.Popen(argv, cwd=REPO, env=dict(env), stdout=log, stderr=subprocess.STDOUT)


def start_web(
    env: Mapping[str, str], log_path: Path, *, gunicorn: bool = False
) -> tuple[subprocess.Popen[bytes], Http]:
    """`jobsapp web` (or gunicorn, as the Procfile runs it) on a free port, once /healthz
    answers; its client sends the web's API token (``API_TOKEN`` unless ``env`` names one)."""
    port = free_port()
    env = {"JOBSAPP_API_TOKEN": API_TOKEN, **env}
    if gunicorn:
        env = {**env, "JOBSAPP_WEB_BIND": f"127.0.0.1:{port}"}
    proc = start(procfile_web() if gunicorn else (*WEB, "--port", str(port)), env, log_path)
    http = Http(f"http://127.0.0.1:{port}", env["JOBSAPP_API_TOKEN"] or None)
    try:
        _wait_healthy(proc, http, log_path)
    except BaseException:
        stop(proc)
        raise
    return proc, http


def _wait_healthy(proc: subprocess.Popen[bytes], http: Http, log_path: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the web process exited: {log_path.read_text()[-3000:]}")
        try:
            # 503 is an answer too: /healthz reports the database, and some tests run
            # the web process against a database that is down on purpose.
            if http.get("/healthz").status in (200, 503):
                return
        except (ConnectionError, urllib.error.URLError):
            time.sleep(0.1)
    raise AssertionError(f"jobsapp web never became healthy: {log_path.read_text()[-3000:]}")


@contextmanager
def running_web(
    env: Mapping[str, str], log_path: Path, *, gunicorn: bool = False
) -> Iterator[Http]:
    """`jobsapp web` (or gunicorn) for the duration of the block."""
    proc, client = start_web(env, log_path, gunicorn=gunicorn)
    try:
        yield client
    finally:
        stop(proc)


@contextmanager
def running_worker(env: Mapping[str, str], log_path: Path) -> Iterator[Path]:
    """A `celery -A jobsapp worker` for the duration of the block; yields its log."""
    proc = start(WORKER, env, log_path)
    try:
        yield log_path
    finally:
        # The tests are over: a warm shutdown would wait (15 s, until the SIGKILL of stop())
        # for the jobs they left running on purpose, and a cold one cannot end a thread.
        # A threads pool is one process: its SIGKILL leaves nothing behind.
        proc.kill()
        proc.wait()


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if the process lingers."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
