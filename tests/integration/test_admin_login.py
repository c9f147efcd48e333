"""The admin UI's login through the real Flask app in process (no server; the sessions are
rows of the journal's database): the cookie's attributes over http and https, a wrong
token, the ``next`` link that must never lead off the site, and sessions that end."""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from flask.testing import FlaskClient
from itsdangerous import BadSignature, URLSafeTimedSerializer
from sqlalchemy import Engine, text, update

from jobsapp.db import utcnow
from jobsapp.web import auth
from jobsapp.web.app import create_app
from tests.support.attachments import environment
from tests.support.web import TOKEN, log_in


@pytest.fixture
def client(pg: Engine) -> Iterator[FlaskClient]:
    del pg  # the sessions' rows: a migrated journal, emptied
    with environment(JOBSAPP_ADMIN_TOKEN=TOKEN):
        yield create_app().test_client()


@pytest.mark.parametrize(
    ("base", "secure"), [("http://admin.local", False), ("https://admin.local", True)]
)
def test_the_session_cookie_is_secure_exactly_over_https(
    client: FlaskClient, base: str, secure: bool
) -> None:
    status, location, cookie = log_in(client, base)

    assert (status, location) == (303, "/admin")
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
    assert {"httponly", "path", "expires"} <= attributes
    assert "SameSite=Strict" in cookie
    assert "Path=/admin" in cookie
    assert ("secure" in attributes) is secure


def test_a_wrong_token_is_a_401_and_no_session(client: FlaskClient) -> None:
    status, _, _ = log_in(client, "http://admin.local", token="guess")

    assert status == 401
    landing = client.get("/admin", base_url="http://admin.local")
    assert (landing.status_code, landing.headers["Location"]) == (302, "/admin/login?next=/admin?")


@pytest.mark.parametrize(
    ("next_", "location"),
    [
        ("/admin/jobs?state=failed", "/admin/jobs?state=failed"),
        ("https://evil.example/admin", "/admin"),
        ("//evil.example/admin", "/admin"),
        ("/admin//evil.example", "/admin"),
        ("/admin\\@evil.example", "/admin"),
        ("/v1/attachments", "/admin"),
    ],
)
def test_login_returns_only_to_a_page_of_the_ui(
    client: FlaskClient, next_: str, location: str
) -> None:
    assert log_in(client, "http://admin.local", next_=next_)[1] == location


def test_rotating_the_token_ends_every_session(client: FlaskClient) -> None:
    base = "http://admin.local"
    # A bad filter is answered (400) only to a signed-in browser, before any database read.
    signed_in_probe = "/admin/jobs?state=bogus"
    assert log_in(client, base)[0] == 303
    assert client.get(signed_in_probe, base_url=base).status_code == 400

    with environment(JOBSAPP_ADMIN_TOKEN="rotated-token-7f3a9c2e5b1d8064-new"):
        after = client.get(signed_in_probe, base_url=base)

    assert after.status_code == 302
    assert after.headers["Location"].startswith("/admin/login")


def test_a_session_ended_by_a_rotation_stays_ended_when_the_old_token_comes_back(
    client: FlaskClient,
) -> None:
    """Issue 34: the session ended only because its cookie no longer verified, so rotating
    back to the old token (a rollback of the configuration) brought it back to life."""
    base = "http://admin.local"
    signed_in_probe = "/admin/jobs?state=bogus"
    assert log_in(client, base)[0] == 303
    assert client.get(signed_in_probe, base_url=base).status_code == 400

    with environment(JOBSAPP_ADMIN_TOKEN="rotated-token-7f3a9c2e5b1d8064-new"):
        assert client.get(signed_in_probe, base_url=base).status_code == 302
    back = client.get(signed_in_probe, base_url=base)

    assert back.status_code == 302


BASE = "http://admin.local"


def _cookie(client: FlaskClient) -> str:
    found = client.get_cookie("jobsapp_admin", domain="admin.local", path="/admin")
    assert found is not None
    return found.value


def _session_rows(pg: Engine, **values: object) -> None:
    with pg.begin() as conn:
        conn.execute(update(auth.WebSession.__table__).values(**values))


def _page_with(cookie: str) -> int:
    with environment(JOBSAPP_ADMIN_TOKEN=TOKEN):
        other = create_app().test_client()
        other.set_cookie("jobsapp_admin", cookie, domain="admin.local", path="/admin")
        return other.get("/admin", base_url=BASE).status_code


def test_a_cookie_saved_before_logout_is_refused_after_it(client: FlaskClient) -> None:
    log_in(client, BASE)
    saved = _cookie(client)
    assert _page_with(saved) == 200
    client.post(
        "/admin/logout",
        base_url=BASE,
        data={
            "csrf_token": re.search(
                r'name="csrf_token" value="([^"]+)"',
                client.get("/admin", base_url=BASE).get_data(as_text=True),
            )[1]
        },
    )
    # It answered 200 after logout, and still 7 h later: a signed cookie alone cannot end.
    assert _page_with(saved) == 302


@pytest.mark.parametrize(
    ("column", "ago"),
    [("created_at", timedelta(hours=8, minutes=1)), ("seen_at", timedelta(hours=1, minutes=1))],
)
def test_a_session_ends_at_its_lifetime_or_when_idle(
    client: FlaskClient, pg: Engine, column: str, ago: timedelta
) -> None:
    log_in(client, BASE)
    assert client.get("/admin", base_url=BASE).status_code == 200
    _session_rows(pg, **{column: utcnow() - ago})
    assert client.get("/admin", base_url=BASE).status_code == 302


def test_the_live_refresh_does_not_keep_a_session_alive(client: FlaskClient, pg: Engine) -> None:
    log_in(client, BASE)
    idle = utcnow() - timedelta(minutes=50)
    _session_rows(pg, seen_at=idle)
    live = client.get("/admin", base_url=BASE, headers={"X-Jobsapp-Live": "1"})
    assert live.status_code == 200
    with pg.connect() as conn:
        seen = conn.execute(auth.WebSession.__table__.select()).mappings().one()["seen_at"]
    assert seen == idle


def test_a_visitors_cookie_cannot_test_token_guesses(client: FlaskClient) -> None:
    client.get("/admin/login", base_url=BASE)
    cookie = _cookie(client)
    # The old key, derived from the token alone: anyone holding a cookie could check a guess.
    token_only = hmac.new(TOKEN.encode(), b"jobsapp admin session", hashlib.sha256).digest()
    guessing = URLSafeTimedSerializer(
        token_only, salt="jobsapp-admin-session", signer_kwargs={"key_derivation": "hmac"}
    )
    with pytest.raises(BadSignature):
        guessing.loads(cookie)


def test_a_console_query_past_its_timeout_answers_503_and_frees_the_worker(
    client: FlaskClient, pg: Engine
) -> None:
    """Console queries ran without a time limit (10 s searches at 10^6 rows, re-run by the
    live view every 5 s): each transaction is bounded by JOBSAPP_CONSOLE_TIMEOUT."""
    log_in(client, BASE)
    with environment(JOBSAPP_CONSOLE_TIMEOUT="0.3"), pg.connect() as holder:
        # The list's query waits behind this lock: a query as slow as it likes.
        holder.execute(text("LOCK TABLE job_runs IN ACCESS EXCLUSIVE MODE"))
        began = time.monotonic()
        page = client.get("/admin/jobs", base_url=BASE)
        took = time.monotonic() - began
        api = client.get("/v1/admin/jobs", base_url=BASE, headers=_bearer())
        holder.rollback()
    assert (page.status_code, page.headers["Retry-After"]) == (503, "5")
    assert "The database is unavailable" in page.get_data(as_text=True)
    assert took < 3
    assert api.status_code == 503
    assert client.get("/admin/jobs", base_url=BASE).status_code == 200


def _bearer() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}
