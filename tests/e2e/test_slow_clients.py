"""Slow clients against the web as the Procfile runs it (gunicorn, two workers).

An outside review (issue 35) held every worker of the web with four uploads sending a byte
every two seconds: `/healthz` timed out for as long as they dripped. Here the same four
clients drip while `/healthz` answers within a second; an upload beyond the per-process
bound is answered 503 with `Retry-After` at once; a body slower than its deadline is cut
and answered 408; a request whose headers never end loses its connection.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from tests.support.databases import migrate
from tests.support.waiting import eventually
from tests.support.webserver import Http, fetch, running_web
from tests.unit import images

BOUNDARY = "slowclientboundary"
# The file part's headers go at once; then the image "drips" a byte at a time.
PREAMBLE = (
    f"--{BOUNDARY}\r\n"
    'Content-Disposition: form-data; name="file"; filename="slow.png"\r\n'
    "Content-Type: image/png\r\n\r\n"
).encode()
DRIP_EVERY = 2.0


@contextmanager
def procfile_web(tmp_path: Path, **settings: str) -> Iterator[Http]:
    """gunicorn as the Procfile starts it, on the embedded default (SQLite, folders)."""
    var = tmp_path / "var"
    var.mkdir()
    migrate(f"sqlite:///{var / 'jobsapp.db'}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBSAPP_")}
    env |= {"JOBSAPP_VAR_DIR": str(var), **settings}
    with running_web(env, tmp_path / "web.log", gunicorn=True) as http:
        yield http


class SlowUpload:
    """An upload whose headers arrive at once and whose body never ends on its own."""

    def __init__(self, http: Http) -> None:
        host, port = http.base_url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        head = (
            "POST /v1/attachments HTTP/1.1\r\n"
            f"Host: {host}\r\n"
            f"Authorization: Bearer {http.token}\r\n"
            f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
            "Content-Length: 100000\r\n\r\n"
        )
        self.sock.sendall(head.encode() + PREAMBLE)
        self.received = b""

    def drip(self) -> bool:
        """One more byte; False once the server has closed its side."""
        try:
            self.sock.sendall(b"x")
        except OSError:
            return False
        return True

    def answer(self) -> bytes:
        """What the server sent so far (without waiting for more)."""
        self.sock.setblocking(False)
        try:
            while chunk := self.sock.recv(65536):
                self.received += chunk
        except (BlockingIOError, OSError):
            pass
        return self.received


@contextmanager
def dripping(uploads: list[SlowUpload], every: float) -> Iterator[None]:
    """Each upload sends a byte every ``every`` seconds for the block's duration."""
    stop = threading.Event()

    def drip() -> None:
        while not stop.wait(every):
            for upload in uploads:
                upload.drip()

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        for upload in uploads:
            upload.sock.close()


def healthz_seconds(http: Http) -> float:
    started = time.monotonic()
    try:
        reply = fetch(http.base_url + "/healthz")
    except OSError:
        return float("inf")  # no answer at all: the web is held
    assert reply.status == 200, reply
    return time.monotonic() - started


@pytest.mark.serial
def test_four_slow_uploads_do_not_hold_healthz(tmp_path: Path) -> None:
    with procfile_web(tmp_path) as http:
        uploads = [SlowUpload(http) for _ in range(4)]
        with dripping(uploads, DRIP_EVERY):
            waits = []
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                waits.append(healthz_seconds(http))
                time.sleep(0.5)  # the probe's pace, as a health check's interval
            # The four were being read all along: none was answered or cut.
            assert [u.answer() for u in uploads] == [b""] * 4
    assert len(waits) >= 10
    assert max(waits) < 1.0, waits


def test_an_upload_beyond_the_bound_is_answered_503_at_once(tmp_path: Path) -> None:
    # Two workers admitting one upload each: of three uploads in flight, one or two (the
    # kernel picks the worker of each connection) are refused, at once.
    with procfile_web(tmp_path, JOBSAPP_UPLOAD_CONCURRENCY="1") as http:
        with ExitStack() as stack:
            uploads = [SlowUpload(http) for _ in range(3)]
            stack.enter_context(dripping(uploads, DRIP_EVERY))
            refused = eventually(lambda: [u.answer() for u in uploads if u.answer()], timeout=10)
            assert 1 <= len(refused) <= 2, refused
            for answer in refused:
                head = answer.decode()
                assert head.startswith("HTTP/1.1 503 "), head
                assert "\r\nRetry-After: 5\r\n" in head, head
                assert '"error":"busy"' in head.replace(" ", ""), head
        # The slow ones gone, their slots are free again.
        upload = eventually(
            lambda: (
                (reply := http.post_file(images.solid("PNG"), "p.png", "image/png")).status == 202
                and reply
            ),
            timeout=20,
        )
        assert upload.json()["state"] == "queued"


def test_a_body_slower_than_its_deadline_is_answered_408(tmp_path: Path) -> None:
    with procfile_web(tmp_path, JOBSAPP_WEB_READ_TIMEOUT="2") as http:
        upload = SlowUpload(http)
        with dripping([upload], 0.5):
            answer = eventually(upload.answer, timeout=15).decode()
    assert answer.startswith("HTTP/1.1 408 "), answer
    assert '"error":"body_timeout"' in answer.replace(" ", ""), answer


def test_headers_that_never_end_lose_their_connection(tmp_path: Path) -> None:
    with procfile_web(tmp_path) as http:
        host, port = http.base_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            started = time.monotonic()

            def closed() -> bool:
                try:
                    sock.sendall(b"X-Slow: 1\r\n")
                    sock.settimeout(0.5)
                    return sock.recv(1) == b""
                except TimeoutError:
                    return False
                except OSError:
                    return True

            eventually(closed, timeout=30, interval=1.0)
        # gunicorn's headers deadline (10 s), not the body's (60 s).
        assert time.monotonic() - started < 20
