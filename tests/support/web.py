"""The console as a test drives it: a login through the form, a form's CSRF token, a
scrape of the metrics."""

from __future__ import annotations

import re

from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from jobsapp.web.app import create_app

TOKEN = "login-test-token-7f3a9c2e5b1d8064"


def log_in(
    client: FlaskClient, base: str, token: str = TOKEN, next_: str = ""
) -> tuple[int, str, str]:
    """(status, Location, Set-Cookie) of a login through the form."""
    form = client.get("/admin/login", base_url=base).get_data(as_text=True)
    reply = client.post(
        "/admin/login",
        base_url=base,
        data={"csrf_token": csrf_of(form), "token": token, "name": "dana", "next": next_},
    )
    return reply.status_code, reply.headers.get("Location", ""), reply.headers.get("Set-Cookie", "")


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(headers: dict[str, str] | None = None, path: str = "/metrics/cluster") -> Samples:
    reply = create_app().test_client().get(path, headers=headers or {})
    assert reply.status_code == 200, reply.get_data(as_text=True)
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(reply.get_data(as_text=True))
        for s in family.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found is not None
    return found[1]
