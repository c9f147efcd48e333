"""``jobsapp demo``: the whole attachment flow on the embedded default, with no server.

Migrates the SQLite journal, starts a Celery worker subprocess and the web app on a free
loopback port, uploads three generated images over real HTTP, shows their states as they
move, checks every variant's bytes against its recorded SHA-256 and says where the files
are. Everything lives under ``./var/`` unless JOBSAPP_* variables say otherwise.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alembic import command
from kombu.utils.url import maybe_sanitize_url
from PIL import ExifTags, Image, ImageDraw
from sqlalchemy.engine import make_url
from werkzeug.serving import make_server

from jobsapp.attachments import service
from jobsapp.attachments.store import get_store
from jobsapp.settings import get_settings
from jobsapp.shipped import alembic_config
from jobsapp.storage.local import LocalObjectStore
from jobsapp.web.app import create_app

WORKER_CMD = (
    *(sys.executable, "-m", "celery", "-A", "jobsapp", "worker", "--pool=solo", "-l", "warning"),
    *("--without-gossip", "--without-mingle", "--without-heartbeat"),
)
TERMINAL_STATES = frozenset({"ready", "failed"})
_POLL_S = 0.25
_WORKER_STOP_S = 15.0
_HTTP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Sample:
    filename: str
    content_type: str
    data: bytes
    about: str


@dataclass
class Watched:
    sample: Sample
    attachment_id: str
    state: str


def run_demo(timeout: float = 90.0) -> int:
    """Run the demo; 0 when every upload became ready within ``timeout`` seconds."""
    # Migration and transport chatter would bury what the demo shows.
    for name in ("alembic", "kombu"):
        logging.getLogger(name).setLevel(logging.ERROR)
    settings = get_settings()
    _say(f"jobsapp demo: database {_redacted_db(settings.database_url)}")
    _say(f"              broker   {maybe_sanitize_url(settings.broker_url)}")
    _say(f"              objects  {settings.storage_url}")
    command.upgrade(alembic_config(), "head")
    log_path = settings.var_dir / "demo-worker.log"
    with _worker(log_path) as worker, _web_server() as base_url:
        _say(f"web app on {base_url}, worker pid {worker.pid} (log: {log_path})\n")
        ok = _flow(base_url, worker, timeout)
        if not ok:
            _say(f"the worker log ends with:\n{_tail(log_path)}")
    _say(f"worker stopped (exit code {worker.returncode}); {'done' if ok else 'FAILED'}.")
    return 0 if ok else 1


def _flow(base_url: str, worker: subprocess.Popen[bytes], timeout: float) -> bool:
    """Upload, watch, verify; False (with the reason said) when something went wrong."""
    # A fresh key per run: a second demo in the same folder uploads anew.
    run = uuid.uuid4().hex[:8]
    try:
        watched = [_upload(base_url, s, f"demo-{run}-{s.filename}") for s in sample_images()]
        _show_replay(base_url, watched[0], f"demo-{run}-{watched[0].sample.filename}")
        if not _watch(base_url, watched, timeout, worker):
            return False
        _report_variants(base_url, watched)
    except (RuntimeError, OSError) as failure:
        _say(f"demo failed: {failure}")
        return False
    return True


def _redacted_db(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def _say(line: str = "") -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# ------------------------------------------------------------------------- processes


@contextmanager
def _worker(log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        # Same environment and working directory: the worker finds the same ./var/.
        proc = subprocess.Popen(WORKER_CMD, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    # SIGTERM is Celery's warm shutdown: the current task finishes and is acked.
    proc.terminate()
    try:
        proc.wait(timeout=_WORKER_STOP_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def _web_server() -> Iterator[str]:
    # Request lines would scroll the state table away.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = make_server("127.0.0.1", 0, create_app(), threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="demo-web", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join()


# --------------------------------------------------------------------------- samples


def sample_images() -> list[Sample]:
    """A photo-like JPEG, a PNG with transparency and a JPEG that EXIF says to rotate."""
    return [
        Sample("photo.jpg", "image/jpeg", _photo(), "JPEG 1600x1000, gradients and grain"),
        Sample("logo.png", "image/png", _logo(), "PNG 800x600 with an alpha channel"),
        Sample("rotated.jpg", "image/jpeg", _rotated(), "JPEG stored 1200x800, EXIF: turn upright"),
    ]


def _photo() -> bytes:
    size = (1600, 1000)
    red = Image.linear_gradient("L").resize(size)
    green = Image.radial_gradient("L").resize(size)
    grain = Image.effect_noise(size, 48)
    return _encode(Image.merge("RGB", (red, green, grain)), "JPEG", quality=90)


def _logo() -> bytes:
    img = Image.new("RGBA", (800, 600), (0, 0, 0, 0))
    draw = ImageDraw.Draw(img)
    draw.ellipse((100, 50, 700, 550), fill=(30, 144, 255, 200))
    draw.rectangle((300, 200, 500, 400), fill=(255, 215, 0, 255))
    return _encode(img, "PNG")


def _rotated() -> bytes:
    # Stored sideways, as cameras do: Orientation 6 means "turn 90 degrees clockwise".
    img = Image.new("RGB", (1200, 800), (240, 240, 230))
    ImageDraw.Draw(img).polygon([(100, 400), (600, 100), (600, 700)], fill=(200, 30, 30))
    exif = Image.Exif()
    exif[ExifTags.Base.Orientation] = 6
    return _encode(img, "JPEG", quality=90, exif=exif)


def _encode(img: Image.Image, fmt: str, **params: Any) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **params)
    return out.getvalue()


# ------------------------------------------------------------------------------ HTTP


def _upload(base_url: str, sample: Sample, key: str | None = None) -> Watched:
    status, body = post_file(base_url, sample.filename, sample.data, sample.content_type, key)
    _say(f"POST {sample.filename:<12} {sample.about:<40} -> {status} {body['state']} {body['id']}")
    return Watched(sample, body["id"], body["state"])


def _show_replay(base_url: str, first: Watched, key: str) -> None:
    # A client retrying with its Idempotency-Key gets the first attachment, not a duplicate.
    again = _upload(base_url, first.sample, key)
    same = again.attachment_id == first.attachment_id
    _say(f"retried with the same Idempotency-Key -> {'the same' if same else 'ANOTHER'} id\n")


def post_file(
    base_url: str, filename: str, data: bytes, content_type: str, key: str | None = None
) -> tuple[int, dict[str, Any]]:
    """POST one file as multipart/form-data; returns the status and the JSON body."""
    body, multipart = multipart_body("file", filename, data, content_type)
    headers = {"Content-Type": multipart}
    if key is not None:
        headers["Idempotency-Key"] = key
    url = f"{base_url}/v1/attachments"
    return _json_call(urllib.request.Request(url, body, headers, method="POST"))  # noqa: S310


def multipart_body(field: str, filename: str, data: bytes, content_type: str) -> tuple[bytes, str]:
    """A one-file multipart/form-data body and its Content-Type (urllib has no helper)."""
    boundary = uuid.uuid4().hex
    head = (
        f"--{boundary}\r\n"
        f'Content-Disposition: form-data; name="{field}"; filename="{filename}"\r\n'
        f"Content-Type: {content_type}\r\n\r\n"
    ).encode()
    body = head + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def _get_json(url: str) -> dict[str, Any]:
    return _json_call(urllib.request.Request(url))[1]  # noqa: S310


# S310: every URL here is built from the demo's own http://127.0.0.1 base.
def _json_call(request: urllib.request.Request) -> tuple[int, dict[str, Any]]:
    _authorized(request)
    try:
        with urllib.request.urlopen(request, timeout=_HTTP_TIMEOUT_S) as response:  # noqa: S310
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        raise RuntimeError(f"{request.full_url} answered {error.code}: {error.read()!r}") from None


def _get_bytes(url: str) -> bytes:
    request = _authorized(urllib.request.Request(url))  # noqa: S310
    with urllib.request.urlopen(request, timeout=_HTTP_TIMEOUT_S) as response:  # noqa: S310
        data: bytes = response.read()
        return data


def _authorized(request: urllib.request.Request) -> urllib.request.Request:
    # The embedded default asks for no token; a deployment's configured one is sent.
    if token := get_settings().api_token:
        request.add_header("Authorization", f"Bearer {token}")
    return request


# ------------------------------------------------------------------------ the table


def _watch(
    base_url: str, watched: Sequence[Watched], timeout: float, worker: subprocess.Popen[bytes]
) -> bool:
    """Print a row whenever a state changes; True once all are ready."""
    _say("  time  " + "".join(f"{w.sample.filename:<14}" for w in watched))
    started = time.monotonic()
    shown: tuple[str, ...] = ()
    while True:
        for w in watched:
            w.state = _get_json(f"{base_url}/v1/attachments/{w.attachment_id}")["state"]
        states = tuple(w.state for w in watched)
        elapsed = time.monotonic() - started
        if states != shown:
            _say(f"{elapsed:5.1f}s  " + "".join(f"{s:<14}" for s in states))
            shown = states
        if set(states) <= TERMINAL_STATES:
            return _all_ready(base_url, watched)
        if not _still_waiting(elapsed, timeout, worker):
            return False
        time.sleep(_POLL_S)


def _still_waiting(elapsed: float, timeout: float, worker: subprocess.Popen[bytes]) -> bool:
    if worker.poll() is not None:
        _say(f"the worker exited early with code {worker.returncode}")
        return False
    if elapsed > timeout:
        _say(f"not all ready after {timeout:.0f}s")
        return False
    return True


def _all_ready(base_url: str, watched: Sequence[Watched]) -> bool:
    failed = [w for w in watched if w.state != "ready"]
    for w in failed:
        view = _get_json(f"{base_url}/v1/attachments/{w.attachment_id}")
        _say(f"{w.sample.filename} failed: {view.get('error_code')}")
    return not failed


# ---------------------------------------------------------------------- the results


def _report_variants(base_url: str, watched: Sequence[Watched]) -> None:
    """Fetch every variant over HTTP, check its SHA-256, and say where it is stored."""
    store = get_store()
    _say("\nvariants (bytes fetched over HTTP match their recorded sha256):")
    for w in watched:
        # In-process read: the public view leaves storage keys out on purpose.
        view = service.get_attachment(uuid.UUID(w.attachment_id))
        if view is None:
            raise RuntimeError(f"attachment {w.attachment_id} vanished")
        _say(f"  {w.sample.filename} ({view['width']}x{view['height']}):")
        for variant in view["variants"]:
            _check_bytes(base_url, w.attachment_id, variant)
            _say(f"    {_describe(variant)}  {_location(store, variant['object_key'])}")


def _check_bytes(base_url: str, attachment_id: str, variant: Mapping[str, Any]) -> None:
    url = f"{base_url}/v1/attachments/{attachment_id}/variants/{variant['name']}"
    digest = hashlib.sha256(_get_bytes(url)).hexdigest()
    if digest != variant["sha256"]:
        raise RuntimeError(f"{url} served bytes whose sha256 is {digest}, not {variant['sha256']}")


def _describe(variant: Mapping[str, Any]) -> str:
    shape = f"{variant['width']}x{variant['height']}"
    return f"{variant['name']:<10} v{variant['pipeline_version']} {shape:>9} {variant['size']:>8} B"


def _location(store: object, key: str) -> str:
    if isinstance(store, LocalObjectStore):
        # LocalObjectStore keeps each object's bytes at <root>/objects/<key>.
        return str(store.root / "objects" / key)
    return f"object key {key}"


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
