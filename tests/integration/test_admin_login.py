"""The admin UI's login through the real Flask app in process (no server, no database):
the cookie's attributes over http and https, a wrong token, and the ``next`` link that
must never lead off the site."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from flask.testing import FlaskClient

from jobsapp.web.app import create_app
from tests.support.attachments import environment

TOKEN = "login-test-token"


@pytest.fixture
def client() -> Iterator[FlaskClient]:
    with environment(JOBSAPP_ADMIN_TOKEN=TOKEN):
        yield create_app().test_client()


def log_in(
    client: FlaskClient, base: str, token: str = TOKEN, next_: str = ""
) -> tuple[int, str, str]:
    """(status, Location, Set-Cookie) of a login through the form."""
    form = client.get("/admin/login", base_url=base).get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', form)
    assert csrf is not None
    reply = client.post("/admin/login", base_url=base, data={
        "csrf_token": csrf[1], "token": token, "name": "dana", "next": next_})  # fmt: skip
    return reply.status_code, reply.headers.get("Location", ""), reply.headers.get("Set-Cookie", "")


@pytest.mark.parametrize(("base", "secure"), [("http://admin.local", False),
                                              ("https://admin.local", True)])  # fmt: skip
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

    with environment(JOBSAPP_ADMIN_TOKEN="rotated-token"):
        after = client.get(signed_in_probe, base_url=base)

    assert after.status_code == 302
    assert after.headers["Location"].startswith("/admin/login")
