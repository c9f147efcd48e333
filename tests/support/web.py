"""The console as a test drives it: a login through the form."""

from __future__ import annotations

import re

from flask.testing import FlaskClient

TOKEN = "login-test-token-7f3a9c2e5b1d8064"


def log_in(
    client: FlaskClient, base: str, token: str = TOKEN, next_: str = ""
) -> tuple[int, str, str]:
    """(status, Location, Set-Cookie) of a login through the form."""
    form = client.get("/admin/login", base_url=base).get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', form)
    assert csrf is not None
    reply = client.post(
        "/admin/login",
        base_url=base,
        data={"csrf_token": csrf[1], "token": token, "name": "dana", "next": next_},
    )
    return reply.status_code, reply.headers.get("Location", ""), reply.headers.get("Set-Cookie", "")
