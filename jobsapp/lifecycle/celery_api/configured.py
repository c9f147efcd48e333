"""Celery's ``app.on_after_configure`` for jobsapp's shipped app, which is configured as
``jobsapp.celery_app`` is imported: before a team's task module (``JOBSAPP_IMPORTS``) can
connect to it.

Celery documents periodic tasks added in a receiver of that signal
(``@app.on_after_configure.connect``, then ``sender.add_periodic_task(...)``): on an app
already configured, Celery never calls a receiver connected late, and the entries were
silently not scheduled. Here a receiver connected once the app is configured is called at
once, with what Celery sends it (``sender`` the app, ``source`` its configuration), as it
would have been had it connected earlier; an exception it raises is logged, as Celery's
signals log a receiver's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.utils.dispatch import Signal

log = logging.getLogger(__name__)


class AfterConfigure(Signal):
    """``app.on_after_configure`` that also calls a receiver connected too late for it."""

    def __init__(self, app: Celery) -> None:
        super().__init__(name="app.on_after_configure", providing_args=["source"])
        self.app = app

    def connect(self, *args: Any, **kwargs: Any) -> Any:
        connected = super().connect(*args, **kwargs)
        late = kwargs.get("sender") in (None, self.app)
        if args and callable(args[0]):  # connect(receiver) and @connect
            if late:
                self._call_if_configured(args[0])
            return connected

        def decorate(receiver: Callable[..., Any]) -> Any:  # @connect(weak=False, ...)
            done = connected(receiver)
            if late:
                self._call_if_configured(receiver)
            return done

        return decorate

    def _call_if_configured(self, receiver: Callable[..., Any]) -> None:
        if not getattr(self.app, "configured", False):  # not in celery-types' stubs
            return  # Celery calls it when the app is configured
        try:
            receiver(signal=self, sender=self.app, source=self.app.conf)
        except Exception:
            log.exception("Signal handler %r raised", receiver)
