"""What a failed attempt keeps of its exception: the body's own, described and scrubbed.

Shared by the attempt's own outcome (``attempt``) and a body that ends its run failed
itself (``RunContext.failing``), so both store the same detail and read the same in
``jobsapp summary``, the console and Flower.
"""

from __future__ import annotations

import json
import math
import traceback
from typing import Any

from jobsapp.lifecycle.rules.errors import PermanentError, RetryRequested
from jobsapp.lifecycle.rules.scrub import describe_exception, scrub

# A stored traceback keeps its innermost frames, scrubbed and cut to this many characters.
TRACEBACK_FRAMES = 20
TRACEBACK_LIMIT = 8000
# The exception's arguments are kept as Celery's JSON results keep them (each one JSON can
# hold as it is, any other as its repr), up to this many characters of JSON and this
# nesting; a larger set is not kept (``get()`` then rebuilds the exception from its message).
ARGS_LIMIT = 8000
ARGS_DEPTH = 8


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
    """What a failed attempt stores on its event: type, message, arguments (as JSON keeps
    them: ``get()`` rebuilds the exception from them, as Celery's backend does), innermost
    frames; all scrubbed.

    The formatted traceback holds source lines, never frame locals.
    """
    cause = cause_of(exc)
    frames = "".join(traceback.format_exception(cause, limit=-TRACEBACK_FRAMES))
    detail: dict[str, Any] = {
        "type": f"{type(cause).__module__}.{type(cause).__qualname__}",
        "message": scrub(str(cause), secrets=secrets),
        "traceback": scrub(frames, limit=TRACEBACK_LIMIT, secrets=secrets),
    }
    args = [_as_json(arg, secrets, ARGS_DEPTH) for arg in cause.args]
    if len(json.dumps(args)) <= ARGS_LIMIT:
        detail["args"] = args
    return detail


def _as_json(value: Any, secrets: tuple[str, ...], depth: int) -> Any:
    """``value`` as JSON keeps it, scrubbed; its repr where JSON cannot (Celery's
    ``ensure_serializable``), a float that is not finite among them (no JSON number)."""
    if isinstance(value, str):
        return scrub(value, secrets=secrets)
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    if depth > 0 and isinstance(value, (list, tuple)):
        return [_as_json(item, secrets, depth - 1) for item in value]
    if depth > 0 and isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {
            scrub(k, secrets=secrets): _as_json(v, secrets, depth - 1) for k, v in value.items()
        }
    return scrub(repr(value), secrets=secrets)
