"""The HTTP API as a client meets it: `jobsapp web` and a Celery worker as real processes,
on Postgres, Redis and S3.

The processes get their own database, Redis database and S3 prefix, so other suites
running against the same services can neither steal their messages nor empty their tables.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import struct
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from PIL import Image
from sqlalchemy import Engine, create_engine, text

from jobsapp.attachments.store import STAGING_PREFIX
from jobsapp.storage import store_from_url
from jobsapp.web.multipart import MAX_PART_HEADER_BYTES
from tests.support.attachments import png
from tests.support.databases import drop_postgres, fresh_postgres, migrate
from tests.support.env import SESSION, service
from tests.support.servers import RedisServer
from tests.support.webserver import Http, fetch, running_web, running_worker

MAX_UPLOAD = 256 * 1024
ADMIN_TOKEN = "e2e-web-token-7f3a9c2e5b1d8064-web"
ERROR = {"error", "reason"}
# No row has it. Fixed, not drawn, because it shows in test ids, which every xdist worker
# must collect alike.
UNKNOWN_ID = uuid.UUID("00000000-0000-4000-8000-00000000dead")


# --------------------------------------------------------------------------- services


@pytest.fixture(scope="module")
def e2e_env(
    tmp_path_factory: pytest.TempPathFactory, module_redis: RedisServer
) -> Iterator[dict[str, str]]:
    """The environment of the web and worker processes; their S3 prefix is emptied after."""
    admin = service("JOBSAPP_TEST_DATABASE_URL")
    db_url = fresh_postgres(admin, f"jobsapp_e2e_web_{SESSION}")
    migrate(db_url)
    web_redis = module_redis.url
    storage_url = f"s3://{service('JOBSAPP_TEST_S3_BUCKET')}/e2e-web-{uuid.uuid4().hex[:12]}"
    endpoint = service("JOBSAPP_TEST_S3_ENDPOINT_URL")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBSAPP_")}
    yield env | {
        "JOBSAPP_VAR_DIR": str(tmp_path_factory.mktemp("e2e-web-var")),
        "JOBSAPP_DATABASE_URL": db_url,
        "JOBSAPP_BROKER_URL": web_redis,
        "JOBSAPP_REDIS_URL": web_redis,
        "JOBSAPP_STORAGE_URL": storage_url,
        "JOBSAPP_S3_ENDPOINT_URL": endpoint,
        "JOBSAPP_MAX_UPLOAD_BYTES": str(MAX_UPLOAD),
        "JOBSAPP_ADMIN_TOKEN": ADMIN_TOKEN,
    }
    store = store_from_url(storage_url, endpoint_url=endpoint)
    for info in list(store.list("")):
        store.delete(info.key)
    drop_postgres(admin, f"jobsapp_e2e_web_{SESSION}")


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e-web-logs")


@pytest.fixture(scope="module")
def http(e2e_env: dict[str, str], logs: Path) -> Iterator[Http]:
    with running_web(e2e_env, logs / "web.log") as client:
        yield client


@pytest.fixture(scope="module")
def worker(e2e_env: dict[str, str], logs: Path) -> Iterator[Path]:
    with running_worker(e2e_env, logs / "worker.log") as log:
        yield log


@pytest.fixture(scope="module")
def journal(e2e_env: dict[str, str]) -> Iterator[Engine]:
    engine = create_engine(e2e_env["JOBSAPP_DATABASE_URL"])
    try:
        yield engine
    finally:
        engine.dispose()


def attachment_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM attachments")).scalar_one())


# ---------------------------------------------------------------------------- images


def jpeg(size: tuple[int, int] = (640, 400)) -> bytes:
    img = Image.merge(
        "RGB",
        (
            Image.linear_gradient("L").resize(size),
            Image.radial_gradient("L").resize(size),
            Image.effect_noise(size, 24),
        ),
    )
    out = io.BytesIO()
    img.save(out, "JPEG", quality=85)
    return out.getvalue()


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header promises these dimensions; no pixel data follows."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(tag + data)
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


SVG = b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'


def assert_documented(http: Http, schema: str, instance: object) -> None:
    """The body has the shape /openapi.json promises for it."""
    components = http.get("/openapi.json").json()["components"]
    root = {"$ref": f"#/components/schemas/{schema}", "components": components}
    Draft202012Validator(root).validate(instance)


# ----------------------------------------------------------------------------- flows


def wait_until_settled(http: Http, attachment_id: str, worker_log: Path) -> dict[str, Any]:
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline:
        view = http.get(f"/v1/attachments/{attachment_id}").json()
        if view["state"] in ("ready", "failed"):
            return dict(view)
        time.sleep(0.2)
    raise AssertionError(f"{attachment_id} never settled; worker: {worker_log.read_text()[-3000:]}")


def test_upload_is_accepted_then_ready_and_each_variant_serves_its_bytes(
    http: Http, worker: Path
) -> None:
    original = jpeg()
    reply = http.post_file(original, "holiday.jpg", "image/jpeg")

    assert reply.status == 202, reply.body
    body = reply.json()
    assert body["state"] == "queued"
    assert reply.headers["Location"] == f"/v1/attachments/{body['id']}"
    assert body["links"]["self"] == reply.headers["Location"]
    assert set(body["links"]["variants"]) == {"thumbnail", "crop", "optimized"}
    assert_documented(http, "Accepted", body)

    view = wait_until_settled(http, body["id"], worker)
    assert view["state"] == "ready", view
    assert view["display_name"] == "holiday.jpg"
    assert view["sha256"] == hashlib.sha256(original).hexdigest()
    assert_documented(http, "Attachment", view)
    # Clients get URLs; storage keys stay the deployment's business.
    assert "object_key" not in view["original"]
    variants = view["variants"]
    assert isinstance(variants, list)
    assert {v["name"] for v in variants} == {"thumbnail", "crop", "optimized"}
    for variant in variants:
        assert "object_key" not in variant
        assert variant["url"] == f"{reply.headers['Location']}/variants/{variant['name']}"
        redirect = http.get(variant["url"])
        assert redirect.status == 302
        served = fetch(redirect.headers["Location"])
        assert served.status == 200
        assert served.headers["Content-Type"] == variant["content_type"] == "image/webp"
        assert hashlib.sha256(served.body).hexdigest() == variant["sha256"]
        assert served.body[:4] == b"RIFF"
        assert served.body[8:12] == b"WEBP"


HOSTILE = [
    pytest.param(jpeg()[:3000], "cut.jpg", 422, "corrupt_image", id="truncated-jpeg"),
    pytest.param(png_claiming(100_000, 100_000), "huge.png", 422, "pixel_limit", id="png-bomb"),
    pytest.param(
        b"just some text\n" * 20, "notes.jpg", 415, "unsupported_format", id="text-as-jpg"
    ),
    pytest.param(SVG, "logo.svg", 415, "unsupported_format", id="svg"),
    pytest.param(b"", "empty.png", 400, "empty_file", id="zero-bytes"),
    # Under the request cap, over the file limit: refused by the validator.
    pytest.param(b"\xff\xd8\xff" + bytes(MAX_UPLOAD), "big.jpg", 413, "too_large", id="just-over"),
    # Far over: refused while the body is read, before it is held in memory.
    pytest.param(bytes(4 * MAX_UPLOAD), "huge.jpg", 413, "too_large", id="far-over"),
]


@pytest.mark.parametrize(("data", "filename", "status", "code"), HOSTILE)
def test_hostile_file_gets_a_json_refusal_and_leaves_nothing_behind(
    http: Http, journal: Engine, data: bytes, filename: str, status: int, code: str
) -> None:
    before = attachment_rows(journal)

    reply = http.post_file(data, filename, "image/jpeg")

    assert reply.status == status, reply.body
    assert reply.headers["Content-Type"] == "application/json"
    assert set(reply.json()) == ERROR
    assert reply.json()["error"] == code
    assert_documented(http, "Error", reply.json())
    assert attachment_rows(journal) == before
    assert http.get("/healthz").status == 200


def test_request_without_a_file_field_is_a_400(http: Http) -> None:
    reply = http.post_file(png(), "a.png", "image/png", field_name="image")

    assert reply.status == 400
    assert reply.json()["error"] == "missing_file"


@pytest.mark.parametrize(
    "key", ["k" * 201, "caf\u00e9", "tab\there"], ids=["long", "latin1", "tab"]
)
def test_a_bad_idempotency_key_is_a_400(http: Http, journal: Engine, key: str) -> None:
    before = attachment_rows(journal)

    reply = http.post_file(png(), "a.png", "image/png", headers={"Idempotency-Key": key})

    assert reply.status == 400
    assert reply.json()["error"] == "bad_idempotency_key"
    assert attachment_rows(journal) == before


def test_a_path_in_the_file_name_only_survives_as_a_display_name(http: Http) -> None:
    reply = http.post_file(png(), "../../etc/passwd", "image/png")

    assert reply.status == 202, reply.body
    view = http.get(reply.headers["Location"]).json()
    assert view["display_name"] == "passwd"
    assert view["content_type"] == "image/png"


def test_the_same_idempotency_key_twice_is_one_attachment(http: Http, journal: Engine) -> None:
    key = f"retry-{uuid.uuid4()}"
    before = attachment_rows(journal)

    first = http.post_file(png(), "a.png", "image/png", headers={"Idempotency-Key": key})
    again = http.post_file(png(), "a.png", "image/png", headers={"Idempotency-Key": key})

    assert (first.status, again.status) == (202, 200)
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["Location"] == first.headers["Location"]
    assert attachment_rows(journal) == before + 1


def test_an_idempotency_key_reused_for_another_file_is_refused(http: Http) -> None:
    key = f"retry-{uuid.uuid4()}"

    first = http.post_file(png(), "a.png", "image/png", headers={"Idempotency-Key": key})
    other = http.post_file(png((64, 64)), "b.png", "image/png", headers={"Idempotency-Key": key})

    assert first.status == 202
    assert other.status == 422
    assert other.json()["error"] == "idempotency_key_reused"


@pytest.mark.parametrize(
    ("path", "status"),
    [
        (f"/v1/attachments/{UNKNOWN_ID}", 404),
        ("/v1/attachments/not-a-uuid", 404),
        ("/v1/attachments/../../etc/passwd", 404),
        (f"/v1/attachments/{UNKNOWN_ID}/variants/thumbnail", 404),
        ("/nowhere", 404),
        ("/healthz/", 404),
    ],
)
def test_unknown_things_are_json_errors(http: Http, path: str, status: int) -> None:
    reply = http.get(path)

    assert reply.status == status
    assert set(reply.json()) == ERROR


def test_a_wrong_method_is_a_json_405(http: Http) -> None:
    reply = http.request("/healthz", method="DELETE")

    assert reply.status == 405
    assert reply.json()["error"] == "method_not_allowed"
    assert "GET" in reply.headers["Allow"]


def test_openapi_describes_every_route_with_its_methods(http: Http) -> None:
    from jobsapp.web.app import create_app

    doc = http.get("/openapi.json").json()

    assert doc["openapi"].startswith("3.1")
    for schema in doc["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)
    routes = {
        (re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule), method.lower())
        for rule in create_app().url_map.iter_rules()
        for method in rule.methods or ()
        if method not in ("HEAD", "OPTIONS")
    }
    documented = {(path, method) for path, item in doc["paths"].items() for method in item}
    assert routes == documented
    for path, method in routes:
        responses = doc["paths"][path][method]["responses"]
        assert "500" in responses, (path, method)
    upload = doc["paths"]["/v1/attachments"]["post"]["responses"]
    assert {"202", "400", "413", "415", "422", "503"} <= set(upload)


def test_openapi_says_how_metrics_are_authenticated(http: Http) -> None:
    """The document showed /metrics as open although it takes JOBSAPP_METRICS_TOKEN."""
    doc = http.get("/openapi.json").json()
    for path in ("/metrics", "/metrics/cluster"):
        assert doc["paths"][path]["get"]["security"] == [{"metricsToken": []}, {}]
    assert doc["components"]["securitySchemes"]["metricsToken"]["scheme"] == "bearer"


def test_uploads_and_attachment_reads_need_the_api_token(http: Http) -> None:
    """Issue 35: uploads and attachment reads needed no credentials."""
    anonymous, wrong = Http(http.base_url), Http(http.base_url, "not-the-token")
    for client in (anonymous, wrong):
        refused = client.post_file(png(), "p.png", "image/png")
        assert refused.status == 401, refused
        assert refused.json()["error"] == "unauthorized"
        assert refused.headers["WWW-Authenticate"] == 'Bearer realm="jobsapp-api"'
    accepted = http.post_file(png(), "p.png", "image/png")
    assert accepted.status == 202, accepted
    location = accepted.headers["Location"]
    for path in (location, f"{location}/variants/thumbnail"):
        assert anonymous.get(path).status == 401
        assert wrong.get(path).status == 401
    assert http.get(location).status == 200
    # The operator's token reads too; what describes the API and the health check stay open.
    assert Http(http.base_url, ADMIN_TOKEN).get(location).status == 200
    assert anonymous.get("/openapi.json").status == 200
    assert anonymous.get("/healthz").status == 200


def test_on_the_embedded_default_uploads_and_reads_need_no_token(tmp_path: Path) -> None:
    """The README's first commands run on the embedded default, without a token."""
    var = tmp_path / "var"
    var.mkdir()
    migrate(f"sqlite:///{var / 'jobsapp.db'}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBSAPP_")}
    env |= {"JOBSAPP_VAR_DIR": str(var), "JOBSAPP_API_TOKEN": ""}
    with running_web(env, tmp_path / "web.log") as anonymous:
        assert anonymous.token is None
        accepted = anonymous.post_file(png(), "p.png", "image/png")
        assert accepted.status == 202, accepted
        assert anonymous.get(accepted.headers["Location"]).status == 200


def test_openapi_names_how_every_route_is_authenticated(http: Http) -> None:
    doc = http.get("/openapi.json").json()
    api = [{"apiToken": []}, {"adminToken": []}]
    assert doc["paths"]["/v1/attachments"]["post"]["security"] == api
    assert doc["paths"]["/v1/attachments/{attachment_id}"]["get"]["security"] == api
    variant = doc["paths"]["/v1/attachments/{attachment_id}/variants/{name}"]["get"]
    assert variant["security"] == api
    assert doc["components"]["securitySchemes"]["apiToken"]["scheme"] == "bearer"
    assert doc["paths"]["/healthz"]["get"]["security"] == [{}]
    unnamed = [
        (path, method)
        for path, item in doc["paths"].items()
        for method, operation in item.items()
        if not operation.get("security")
    ]
    assert unnamed == []


def test_the_generated_document_is_valid_openapi_3_1(http: Http) -> None:
    from openapi_spec_validator import OpenAPIV31SpecValidator

    doc = http.get("/openapi.json").json()

    OpenAPIV31SpecValidator(doc).validate()
    assert doc["openapi"] == "3.1.0"


def test_a_database_outage_is_a_503_the_client_can_retry(
    e2e_env: dict[str, str], logs: Path
) -> None:
    # Nothing listens on port 1: every connection attempt is refused at once.
    dead = e2e_env | {"JOBSAPP_DATABASE_URL": "postgresql+psycopg2://postgres@127.0.0.1:1/none"}
    with running_web(dead, logs / "web-no-db.log") as http:
        upload = http.post_file(png(), "a.png", "image/png")
        status = http.get(f"/v1/attachments/{uuid.uuid4()}")

    for reply in (upload, status):
        assert reply.status == 503
        assert reply.json()["error"] == "unavailable"
        assert "127.0.0.1" not in reply.json()["reason"]
        assert int(reply.headers["Retry-After"]) > 0


def test_an_unexpected_error_is_a_json_500_without_internals() -> None:
    from jobsapp.web.app import create_app

    app = create_app()

    def broken() -> str:
        raise RuntimeError("password=hunter2 at db.internal:5432")

    app.add_url_rule("/broken", view_func=broken)
    reply = app.test_client().get("/broken")

    assert reply.status_code == 500
    assert reply.get_json() == {
        "error": "internal_error",
        "reason": "An unexpected error occurred.",
    }
    assert reply.headers["X-Content-Type-Options"] == "nosniff"


# ------------------------------------------------------------------ the form, part by part


def raw_form(*parts: tuple[bytes, bytes]) -> tuple[bytes, dict[str, str]]:
    """A multipart body of ``(headers, data)`` parts, byte for byte as a client sends it."""
    boundary = uuid.uuid4().hex.encode()
    body = b"".join(b"--%s\r\n%s\r\n\r\n%s\r\n" % (boundary, head, data) for head, data in parts)
    return body + b"--%s--\r\n" % boundary, {
        "Content-Type": f"multipart/form-data; boundary={boundary.decode()}"
    }


def file_part(filename: bytes = b"a.png", data: bytes | None = None) -> tuple[bytes, bytes]:
    head = b'Content-Disposition: form-data; name="file"; filename="%s"\r\n' % filename
    return head + b"Content-Type: image/png", png() if data is None else data


def text_part(name: str, value: bytes) -> tuple[bytes, bytes]:
    return f'Content-Disposition: form-data; name="{name}"'.encode(), value


def post_form(http: Http, *parts: tuple[bytes, bytes]) -> Any:
    body, headers = raw_form(*parts)
    return http.request("/v1/attachments", body, headers, method="POST")


@pytest.mark.parametrize(
    ("parts", "code", "limit"),
    [
        pytest.param(
            [text_part(f"f{i}", b"x") for i in range(2000)] + [file_part()],
            "too_many_parts",
            "16 parts",
            id="too-many-parts",
        ),
        pytest.param(
            [text_part("note", b"n" * 100_000), file_part()],
            "field_too_large",
            "65536 bytes",
            id="huge-text-field",
        ),
        pytest.param(
            [file_part(data=bytes(4 * MAX_UPLOAD))],
            "too_large",
            f"{MAX_UPLOAD + 64 * 1024} bytes",
            id="huge-body",
        ),
    ],
)
def test_each_413_names_the_limit_that_was_passed(
    http: Http, journal: Engine, parts: list[tuple[bytes, bytes]], code: str, limit: str
) -> None:
    before = attachment_rows(journal)

    reply = post_form(http, *parts)

    assert reply.status == 413, reply.body
    assert reply.json()["error"] == code
    assert limit in reply.json()["reason"]
    assert attachment_rows(journal) == before


def staged_objects(env: dict[str, str]) -> int:
    store = store_from_url(env["JOBSAPP_STORAGE_URL"], endpoint_url=env["JOBSAPP_S3_ENDPOINT_URL"])
    return len(list(store.list(STAGING_PREFIX)))


PADDING = b"X-Padding: " + b"p" * 100


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(file_part(filename=b"a" * 200_000 + b".png")[0], id="one-long-header"),
        pytest.param(file_part()[0] + b"\r\n" + b"\r\n".join([PADDING] * 2000), id="many-headers"),
    ],
)
def test_a_part_header_over_its_limit_is_a_413_and_nothing_is_written(
    http: Http, journal: Engine, e2e_env: dict[str, str], head: bytes
) -> None:
    before = (attachment_rows(journal), staged_objects(e2e_env))

    reply = post_form(http, (head, png()))

    assert reply.status == 413, reply.body
    assert reply.json()["error"] == "part_header_too_large"
    assert f"{MAX_PART_HEADER_BYTES} bytes" in reply.json()["reason"]
    assert (attachment_rows(journal), staged_objects(e2e_env)) == before


def test_a_file_name_that_is_not_utf8_is_a_400_that_says_so(http: Http, journal: Engine) -> None:
    before = attachment_rows(journal)

    reply = post_form(http, file_part("café.png".encode("latin-1")))

    assert reply.status == 400, reply.body
    assert reply.json()["error"] == "unreadable_form"
    assert "UTF-8" in reply.json()["reason"]
    assert attachment_rows(journal) == before


def test_two_images_in_one_form_are_a_400_and_nothing_stored(http: Http, journal: Engine) -> None:
    """``curl -F file=@a.png -F file=@b.png``: it was a 202 for the first image alone."""
    before = attachment_rows(journal)

    reply = post_form(http, file_part(b"a.png"), file_part(b"b.png"))

    assert reply.status == 400, reply.body
    assert reply.json()["error"] == "more_than_one_file"
    assert attachment_rows(journal) == before


def test_a_utf8_file_name_is_kept_for_display(http: Http) -> None:
    reply = post_form(http, file_part("café.png".encode()))

    assert reply.status == 202, reply.body
    assert http.get(reply.headers["Location"]).json()["display_name"] == "café.png"


# ---------------------------------------------------------------- hostile path and query

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
# "thumbnail" in fullwidth letters: NFKC makes it the real name.
FULLWIDTH = "".join(chr(ord(c) + 0xFEE0) for c in "thumbnail")


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        (f"/v1/attachments/{UNKNOWN_ID}/variants/thumbnail%00", 400, "bad_url"),
        (f"/v1/attachments/{UNKNOWN_ID}%00", 400, "bad_url"),
        (f"/v1/attachments/{UNKNOWN_ID}/variants/thumb%FFnail", 400, "bad_url"),
        # An overlong encoding of NUL is not UTF-8 at all.
        (f"/v1/attachments/{UNKNOWN_ID}/variants/%C0%80", 400, "bad_url"),
        (f"/v1/attachments/{UNKNOWN_ID}/variants/{quote(FULLWIDTH)}", 404, "not_found"),
        (f"/v1/attachments/{UNKNOWN_ID}/variants/{'x' * 5000}", 404, "not_found"),
        ("/v1/admin/jobs?module=attachments%00", 400, "bad_url"),
        (f"/v1/admin/jobs?limit={quote('²')}", 400, "bad_filter"),
        (f"/v1/admin/jobs?limit={'9' * 5000}", 400, "bad_filter"),
        (f"/v1/admin/outbox/dead?limit={quote('²')}", 400, "bad_filter"),
        (f"/v1/admin/outbox/dead?limit={quote('٣')}", 400, "bad_filter"),
        (f"/v1/admin/outbox/dead?limit={'9' * 5000}", 400, "bad_filter"),
    ],
)
def test_a_hostile_path_or_query_is_a_4xx_before_any_query(
    http: Http, path: str, status: int, code: str
) -> None:
    reply = http.request(path, headers=ADMIN)

    assert (reply.status, reply.json()["error"]) == (status, code), reply.body


def _routes() -> list[tuple[str, str]]:
    from jobsapp.web.app import create_app

    return sorted(
        (rule.rule, method)
        for rule in create_app().url_map.iter_rules()
        for method in rule.methods or ()
        if method not in ("HEAD", "OPTIONS")
    )


# NUL, overlong UTF-8, lone surrogates and bytes that are no UTF-8 at all; look-alikes that
# NFKC or case folding would turn into a real name; digits int() refuses; sheer length.
_NASTY = [
    b"\x00",
    b"thumbnail\x00",
    b"\xc0\x80",
    b"\xe0\x80\x80",
    b"\xed\xa0\x80",
    b"\xff\xfe",
    FULLWIDTH.encode(),
    "thumbnai\u0307l".encode(),
    "ﬁ".encode(),
    "İ".encode(),
    "²".encode(),
    "٣".encode(),
    "\u202e".encode(),
    b"9" * 5000,
    b"x" * 8000,
    b"%",
    b"..",
]
_VALUE = st.one_of(
    st.sampled_from(_NASTY),
    st.text(max_size=40).map(str.encode),
    st.binary(max_size=40),
    st.uuids().map(lambda u: str(u).encode()),
    st.sampled_from([b"attachments", b"thumbnail", b"queued", b"10"]),
)
_PARAM = re.compile(r"<(?:\w+:)?(\w+)>")
_QUERY_NAME = st.sampled_from(["state", "module", "limit", "x"])


_PINNED_UUID = b"00000000-0000-0000-0000-000000000001"


@pytest.mark.parametrize(("rule", "method"), _routes())
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    # More values than any route has parameters; each route takes the ones it needs.
    path_values=st.lists(_VALUE, min_size=3, max_size=3),
    query=st.lists(st.tuples(_QUERY_NAME, _VALUE), max_size=3),
)
@example(path_values=[b"thumbnail\x00"] * 3, query=[("module", b"thumbnail\x00")])
# Issue 18: str.isdigit() took "²", int() did not: a 500 on /v1/admin/outbox/dead.
@example(path_values=[_PINNED_UUID] * 3, query=[("limit", "²".encode())])
def test_no_path_or_query_parameter_makes_a_route_answer_5xx(
    http: Http, rule: str, method: str, path_values: list[bytes], query: list[tuple[str, bytes]]
) -> None:
    values = iter(path_values)
    path = _PARAM.sub(lambda _: quote(next(values), safe=""), rule)
    # Some, not all, of the parameters: a request with one bad URL part ends at the check,
    # and the others must reach the database too.
    url = path + "?" + "&".join(f"{name}={quote(value, safe='')}" for name, value in query)
    body, headers = (
        raw_form(file_part(data=b"not an image"))
        if rule == "/v1/attachments"
        else (b'{"reason": "fuzz"}', {"Content-Type": "application/json"})
    )

    reply = http.request(url, body if method == "POST" else None, headers | ADMIN, method=method)

    assert reply.status < 500, (url, reply.body[:500])
