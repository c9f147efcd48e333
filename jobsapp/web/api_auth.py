"""Who may upload and read attachments (``/v1/attachments``).

A producer sends ``Authorization: Bearer $JOBSAPP_API_TOKEN``; the admin token is accepted
too (an operator may read what producers can). Which requests need it:

- the embedded default (no server URL set, a developer's machine) with no token set: none,
  so the README's first command works without one;
- any deployment with a server URL: every request, and a web started there without
  ``JOBSAPP_API_TOKEN`` stops at start with one line (``settings.served_api_problem``);
  an app built in-process without it answers 403, closed rather than open;
- a token set on the embedded default is asked for as well.

The token is compared in constant time, in its length too (SHA-256 digests).
"""

from __future__ import annotations

import hashlib
import hmac

from flask import Request, Response, jsonify
from flask.typing import ResponseReturnValue

from jobsapp.settings import get_settings, served_api_problem
from jobsapp.web import auth


def refusal(req: Request) -> ResponseReturnValue | None:
    """The answer that refuses ``req``, or None when it may proceed."""
    settings = get_settings()
    if settings.api_token is None and settings.embedded:
        return None
    if proxy_identity(req) is not None:
        return None
    if settings.api_token is None:
        return _error(403, "forbidden", served_api_problem(settings) or "")
    given = auth.bearer(req)
    if given is not None and (_matches(given, settings.api_token) or auth.token_matches(given)):
        return None
    response, status = _error(401, "unauthorized", "Send Authorization: Bearer <API token>.")
    response.headers["WWW-Authenticate"] = 'Bearer realm="jobsapp-api"'
    return response, status


def proxy_identity(req: Request) -> str | None:  # noqa: ARG001 - the hook's signature
    """THE HOOK for a trusted proxy's identity: the name of the user an authenticating
    proxy in front vouches for, which admits the request like a token. None: no proxy
    identity is trusted yet (the proxy identities of web/auth.py will answer here)."""
    return None


def _matches(given: str, token: str) -> bool:
    digests = (hashlib.sha256(value.encode()).digest() for value in (given, token))
    return hmac.compare_digest(*digests)


def _error(status: int, code: str, reason: str) -> tuple[Response, int]:
    return jsonify({"error": code, "reason": reason}), status
