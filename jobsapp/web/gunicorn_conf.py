"""gunicorn's settings for the web process: ``gunicorn -c python:jobsapp.web.gunicorn_conf``.

gunicorn writes its own error log (boot, workers, timeouts) and access log through
loggers it configures itself, apart from the app's root logger. Its logger class here
gives their handlers the app's ScrubFilter (an access line may carry a token in its
query string) and, with ``JOBSAPP_LOG_FORMAT=json``, the app's JSON formatter: every line
a gunicorn web writes is then JSON.

The worker is gunicorn's threaded one with a deadline for reading each request
(``jobsapp.web.server``): a slow client holds one thread for a bounded time, never a whole
worker. ``--threads`` on the command line overrides the count.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

# gunicorn has no type hints: its Logger is Any to mypy.
from gunicorn.glogging import Logger  # type: ignore[import-untyped]

from jobsapp import logs


class JobsappLogger(Logger):  # type: ignore[misc]
    def setup(self, cfg: Any) -> None:
        # Called at start and on every reopen (SIGUSR1): the handlers are new each time.
        super().setup(cfg)
        for log in (self.error_log, self.access_log):
            logs.scrub_handlers(log)
            logs.format_handlers(log)


logger_class = JobsappLogger
worker_class = "jobsapp.web.server.Worker"
# Per worker process: room for the uploads it admits (JOBSAPP_UPLOAD_CONCURRENCY, 4) and
# for every other request beside them (/healthz, reads, the console).
threads = 16


def web_bind(env: Mapping[str, str]) -> str:
    """``JOBSAPP_WEB_BIND`` if set; else every interface on ``$PORT``, the port a platform
    (Heroku, Cloud Run, a Procfile runner) assigns; else loopback for a developer's machine."""
    if bind := env.get("JOBSAPP_WEB_BIND", "").strip():
        return bind
    if port := env.get("PORT", "").strip():
        return f"0.0.0.0:{port}"
    return "127.0.0.1:8000"


bind = [web_bind(os.environ)]
