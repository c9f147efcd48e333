"""``/healthz`` reports whether the web process reaches its database (compose gates on it)."""

from __future__ import annotations

from sqlalchemy import Engine

from tests.support.attachments import environment


def test_healthz_is_ok_while_the_database_answers(db: Engine) -> None:
    from jobsapp.web.app import create_app

    with environment(JOBSAPP_DATABASE_URL=db.url.render_as_string(hide_password=False)):
        reply = create_app().test_client().get("/healthz")

    assert reply.status_code == 200
    assert reply.get_json() == {"status": "ok"}


def test_healthz_is_a_503_when_the_database_is_down() -> None:
    from jobsapp.web.app import create_app

    # Nothing listens on port 9: every connection attempt is refused at once.
    with environment(JOBSAPP_DATABASE_URL="postgresql+psycopg2://postgres@127.0.0.1:9/none"):
        reply = create_app().test_client().get("/healthz")

    assert reply.status_code == 503
    assert reply.get_json()["error"] == "unavailable"
    assert "127.0.0.1" not in reply.get_json()["reason"]
    assert int(reply.headers["Retry-After"]) > 0
