"""Who may use the operator routes: the bearer token (API) and the browser's login session.

The session is Flask's signed cookie, keyed by a key derived from ``JOBSAPP_ADMIN_TOKEN``:
no second secret to configure, and rotating the token ends every session at once. The
cookie is ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's page
sends it), limited to ``/admin`` and ``Secure`` whenever the request came over https
(gunicorn sets the scheme from ``X-Forwarded-Proto`` of a trusted proxy). A signed cookie
cannot be revoked before it expires, so it expires after ``SESSION_LIFETIME``; logging out
clears it in the browser.

Every POST of a form carries the session's CSRF token; the login form too, so another
site cannot log a browser into a session of its choosing.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta

from flask import Flask, Request, request, session
from flask.sessions import SecureCookieSessionInterface
from itsdangerous import URLSafeTimedSerializer

from jobsapp.settings import get_settings

CSRF_FIELD = "csrf_token"
SESSION_LIFETIME = timedelta(hours=8)
DEFAULT_ACTOR = "web"
_SIGNED_IN = "admin"
_CSRF = "csrf"
_ACTOR = "actor"


class AdminSessionInterface(SecureCookieSessionInterface):
    """Flask's cookie session, signed with a key derived from the admin token."""

    salt = "jobsapp-admin-session"

    def get_signing_serializer(self, app: Flask) -> URLSafeTimedSerializer | None:  # noqa: ARG002
        token = get_settings().admin_token
        if token is None:
            return None
        return URLSafeTimedSerializer(
            session_key(token), salt=self.salt, serializer=self.serializer,
            signer_kwargs={"key_derivation": self.key_derivation,
                           "digest_method": self.digest_method},
        )  # fmt: skip

    def get_cookie_secure(self, app: Flask) -> bool:  # noqa: ARG002 - per request, not per app
        return request.is_secure


def init_app(app: Flask) -> None:
    app.session_interface = AdminSessionInterface()
    app.config.update(
        SESSION_COOKIE_NAME="jobsapp_admin", SESSION_COOKIE_PATH="/admin",
        SESSION_COOKIE_HTTPONLY=True, SESSION_COOKIE_SAMESITE="Strict",
        PERMANENT_SESSION_LIFETIME=SESSION_LIFETIME,
    )  # fmt: skip


def session_key(token: str) -> bytes:
    # Not the token itself: a leaked signing key must not be a working bearer token.
    return hmac.new(token.encode(), b"jobsapp admin session", hashlib.sha256).digest()


# ------------------------------------------------------------------------- the token


def token_matches(given: str | None) -> bool:
    """Whether ``given`` is the admin token, in constant time (also in its length)."""
    token = get_settings().admin_token
    if token is None or given is None:
        return False
    return hmac.compare_digest(_digest(given), _digest(token))


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


def bearer(req: Request) -> str | None:
    """The credentials of ``Authorization: Bearer ...``, if that is what was sent."""
    scheme, _, credentials = req.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        return None
    return credentials.strip()


# --------------------------------------------------------------------- the session


def log_in(actor: str) -> None:
    """A fresh session (never the one the login form came with) that names its operator."""
    session.clear()
    session.permanent = True
    session[_SIGNED_IN] = True
    session[_ACTOR] = actor
    session[_CSRF] = secrets.token_urlsafe(32)


def log_out() -> None:
    session.clear()


def signed_in() -> bool:
    return session.get(_SIGNED_IN) is True


def actor() -> str:
    """Who the audit rows name: the name given at login (self-declared, like the API's)."""
    name = session.get(_ACTOR)
    return name if isinstance(name, str) and name else DEFAULT_ACTOR


def csrf_token() -> str:
    """The session's CSRF token, made on first use (the login form's session too)."""
    token = session.get(_CSRF)
    if not isinstance(token, str):
        token = session[_CSRF] = secrets.token_urlsafe(32)
    return token


def csrf_ok(given: str | None) -> bool:
    expected = session.get(_CSRF)
    if not isinstance(expected, str) or given is None:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())
