"""What a failed attempt keeps of its exception: the body's own, described and scrubbed.

Shared by the attempt's own outcome (``attempt``) and a body that ends its run failed
itself (``RunContext.failing``), so both store the same detail and read the same in
``jobsapp summary``, the console and Flower.
"""

from __future__ import annotations

import traceback
from typing import Any

from jobsapp.lifecycle.rules.errors import PermanentError, RetryRequested
from jobsapp.lifecycle.rules.scrub import describe_exception, scrub

# A stored traceback keeps its innermost frames, scrubbed and cut to this many characters.
TRACEBACK_FRAMES = 20
TRACEBACK_LIMIT = 8000


def cause_of(exc: BaseException) -> BaseException:
    """The body's own exception: the one ``self.retry(exc=...)`` names, if any."""
    return exc.cause if isinstance(exc, RetryRequested) and exc.cause else exc


def describe(exc: BaseException, secrets: tuple[str, ...]) -> str:
    """The run's ``last_error``: the body's exception, scrubbed, with a permanent error's
    code first."""
    cause = cause_of(exc)
    text = describe_exception(cause, secrets=secrets)
    code = getattr(cause, "error_code", None)
    return f"[{code}] {text}" if isinstance(cause, PermanentError) and code else text


def failure_detail(exc: BaseException, secrets: tuple[str, ...]) -> dict[str, Any]:
    """What a failed attempt stores on its event: type, message, arguments (when plain
    text and numbers: ``get()`` rebuilds the exception from them, as Celery's backend
    does), innermost frames; all scrubbed.

    The formatted traceback holds source lines, never frame locals.
    """
    cause = cause_of(exc)
    frames = "".join(traceback.format_exception(cause, limit=-TRACEBACK_FRAMES))
    detail: dict[str, Any] = {
        "type": f"{type(cause).__module__}.{type(cause).__qualname__}",
        "message": scrub(str(cause), secrets=secrets),
        "traceback": scrub(frames, limit=TRACEBACK_LIMIT, secrets=secrets),
    }
    if all(isinstance(arg, (str, int, float, bool)) or arg is None for arg in cause.args):
        detail["args"] = [
            scrub(a, secrets=secrets) if isinstance(a, str) else a for a in cause.args
        ]
    return detail
