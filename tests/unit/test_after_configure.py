"""``app.on_after_configure`` on jobsapp's shipped app: a receiver connected after the app
was configured (a team's task module imported after ``jobsapp.celery_app``) is called, once,
as Celery calls one connected in time (tests/e2e/test_deployment_beat.py runs Celery's
documented periodic-task receiver under a real beat)."""

from __future__ import annotations

from typing import Any

from celery import Celery

from jobsapp.lifecycle.celery_api.configured import AfterConfigure


def _app() -> Celery:
    app = Celery("after-configure-test")
    app.on_after_configure = AfterConfigure(app)  # type: ignore[assignment]
    return app


def test_a_receiver_connected_before_configuration_is_called_once_by_celery() -> None:
    app, heard = _app(), []
    app.on_after_configure.connect(lambda sender, **_: heard.append(sender), weak=False)
    assert heard == []
    assert app.conf.task_default_queue  # configures the app
    assert heard == [app]


def test_a_receiver_connected_after_configuration_is_called_at_once() -> None:
    app, heard = _app(), []
    assert app.conf.task_default_queue
    seen: list[Any] = []

    @app.on_after_configure.connect
    def plain(sender: Any, source: Any, **_: Any) -> None:
        heard.append(("plain", sender, source is app.conf))

    @app.on_after_configure.connect(weak=False)
    def with_options(sender: Any, **_: Any) -> None:
        heard.append(("with options", sender, True))

    app.on_after_configure.connect(lambda **kw: seen.append(kw), sender=object(), weak=False)
    assert heard == [("plain", app, True), ("with options", app, True)]
    assert seen == []  # connected for another sender


def test_a_late_receiver_that_raises_is_logged_not_raised(caplog: Any) -> None:
    app = _app()
    assert app.conf.task_default_queue

    def broken(**_: Any) -> None:
        raise RuntimeError("boom")

    app.on_after_configure.connect(broken, weak=False)
    assert "Signal handler" in caplog.text
    assert "boom" in caplog.text
