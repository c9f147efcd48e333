"""The publish pool is found without reading Celery's settings, and still follows them."""

from __future__ import annotations

from celery import Celery

from jobsapp.lifecycle.transport import publisher


def _host(app: Celery) -> str:
    with publisher.producer(app) as producer:
        return str(producer.connection.hostname)


def test_publishes_follow_a_broker_url_changed_on_a_live_app() -> None:
    """No connection is made here (kombu connects on first use); the producer handed out
    names the broker the app's settings name at the time."""
    app = Celery("pool-follows", broker="redis://first.invalid:6379/0")
    assert _host(app) == "first.invalid"
    app.conf.broker_url = "redis://second.invalid:6379/0"
    assert _host(app) == "second.invalid"
    app.conf.broker_write_url = "redis://writer.invalid:6379/0"
    assert _host(app) == "writer.invalid"
