"""Who may use the operator routes: the bearer token (API) and the browser's login session.

A login is a row of ``web_sessions`` (web/session_tables.py), named in the cookie by a
random id: every console request reads it, so a logout ends the session at once (a cookie
saved before it is refused), ``SESSION_LIFETIME`` after the login it ends whatever the
browser does, and ``IDLE_TIMEOUT`` without a page view ends it too (the live pages'
refreshes do not count as views). A session remembers the token it was opened with (an
HMAC of it, ``token_mark``): under another token it ends on the server, so rotating the
token ends every session for good, even if the old token comes back: the first session
check of a process under a new token ends every session opened under another. The cookie is
Flask's, signed with a key derived from ``JOBSAPP_ADMIN_TOKEN`` and a server secret
(``JOBSAPP_SECRET_KEY``, else a random one the first web process keeps in ``web_secrets``),
so a visitor's cookie is no oracle to test token guesses against. The cookie is ``HttpOnly`` (no
script reads it), ``SameSite=Strict`` (no other site's page sends it), limited to ``/admin``
and ``Secure`` whenever the request came over https (gunicorn sets the scheme from
``X-Forwarded-Proto`` of a trusted proxy).

Every POST of a form carries the session's CSRF token; the login form too, so another
site cannot log a browser into a session of its choosing.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
from datetime import datetime, timedelta
from typing import Any

from flask import Flask, Request, g, request, session
from flask.sessions import SecureCookieSessionInterface
from itsdangerous import URLSafeTimedSerializer
from sqlalchemy import Table, insert, or_, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError

from jobsapp.db import console_engine, utcnow
from jobsapp.settings import get_settings
from jobsapp.web.session_tables import WebSecret, WebSession

log = logging.getLogger(__name__)

CSRF_FIELD = "csrf_token"
SESSION_LIFETIME = timedelta(hours=8)
IDLE_TIMEOUT = timedelta(hours=1)
DEFAULT_ACTOR = "web"
# A session's last view is written at most this often (not one write per page).
_SEEN_EVERY = timedelta(minutes=1)
_LIVE_HEADER = "X-Jobsapp-Live"
_SID = "sid"
_CSRF = "csrf"
_ACTOR = "actor"
_SECRET_NAME = "session"  # noqa: S105 - the row's name, not a secret
_SESSIONS: Table = WebSession.__table__  # type: ignore[assignment]
_SECRETS: Table = WebSecret.__table__  # type: ignore[assignment]
_secrets: dict[str, str] = {}
_secrets_lock = threading.Lock()
_swept: dict[str, str] = {}


class AdminSessionInterface(SecureCookieSessionInterface):
    """Flask's cookie session, signed with a key derived from the admin token and the server
    secret; only the console's pages (``/admin``, the cookie's path) have one."""

    salt = "jobsapp-admin-session"

    def get_signing_serializer(self, app: Flask) -> URLSafeTimedSerializer | None:  # noqa: ARG002
        settings = get_settings()
        token = settings.admin_token
        if (token is None and settings.auth_proxy is None) or not request.path.startswith("/admin"):
            return None  # Flask's null session: the API and uploads read no secret
        try:
            # Behind a provider with no token the session carries the CSRF token only.
            key = session_key(token or "")
        except DBAPIError:
            # The secret lives in the database: while it is down the console has no
            # session, and its pages answer 503 through their own handler.
            log.warning("admin session unavailable: the database is unreachable")
            return None
        return URLSafeTimedSerializer(
            key,
            salt=self.salt,
            serializer=self.serializer,
            signer_kwargs={
                "key_derivation": self.key_derivation,
                "digest_method": self.digest_method,
            },
        )

    def get_cookie_secure(self, app: Flask) -> bool:  # noqa: ARG002 - per request, not per app
        return request.is_secure


def init_app(app: Flask) -> None:
    app.session_interface = AdminSessionInterface()
    app.config.update(
        SESSION_COOKIE_NAME="jobsapp_admin",
        SESSION_COOKIE_PATH="/admin",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
        PERMANENT_SESSION_LIFETIME=SESSION_LIFETIME,
    )


def session_key(token: str) -> bytes:
    # Not the token itself (a leaked signing key must not be a working bearer token), and
    # not the token alone (a visitor's cookie would let anyone test guesses offline).
    return hmac.new(
        token.encode(), b"jobsapp admin session" + server_secret().encode(), hashlib.sha256
    ).digest()


def server_secret() -> str:
    """``JOBSAPP_SECRET_KEY``, else the random secret the web processes share through the
    database (made by the first that needs it; read once per process)."""
    settings = get_settings()
    if settings.secret_key:
        return settings.secret_key
    with _secrets_lock:
        known = _secrets.get(settings.database_url)
        if known is None:
            known = _secrets[settings.database_url] = _stored_secret()
        return known


def _stored_secret() -> str:
    engine = console_engine()
    read = select(_SECRETS.c.value).where(_SECRETS.c.name == _SECRET_NAME)
    with engine.connect() as conn:
        found = conn.execute(read).scalar()
    if found is not None:
        return str(found)
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(_SECRETS).values(
                    name=_SECRET_NAME, created_at=utcnow(), value=secrets.token_urlsafe(48)
                )
            )
    except IntegrityError:
        pass  # another process made it first: theirs is the one
    with engine.connect() as conn:
        return str(conn.execute(read).scalar_one())


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
    """A fresh session (never the one the login form came with) that names its operator,
    kept on the server."""
    sid, now = secrets.token_urlsafe(32), utcnow()
    with console_engine().begin() as conn:
        conn.execute(
            insert(_SESSIONS).values(
                id_hash=_hashed(sid),
                actor=actor,
                created_at=now,
                seen_at=now,
                token_mark=token_mark(),
            )
        )
    session.clear()
    session.permanent = True
    session[_SID] = sid
    session[_ACTOR] = actor
    session[_CSRF] = secrets.token_urlsafe(32)


def log_out() -> None:
    """End the session on the server (a saved copy of the cookie is refused from now on)."""
    sid = session.get(_SID)
    if isinstance(sid, str):
        _end(_hashed(sid))
    session.clear()


def _end(key: str) -> None:
    with console_engine().begin() as conn:
        conn.execute(
            update(_SESSIONS)
            .where(_SESSIONS.c.id_hash == key, _SESSIONS.c.ended_at.is_(None))
            .values(ended_at=utcnow())
        )


def _end_other_tokens_sessions() -> None:
    """Whenever this process sees a token other than the last one it swept under: end the
    sessions opened under another (a cookie of the old token would verify again if the
    token came back)."""
    mark = token_mark()
    with _secrets_lock:
        if _swept.get(get_settings().database_url) == mark:
            return
        _swept[get_settings().database_url] = mark
    with console_engine().begin() as conn:
        conn.execute(
            update(_SESSIONS)
            .where(
                _SESSIONS.c.ended_at.is_(None),
                or_(_SESSIONS.c.token_mark.is_(None), _SESSIONS.c.token_mark != mark),
            )
            .values(ended_at=utcnow())
        )


def token_mark() -> str:
    """Names the admin token a session is opened with, without being it (nor a cheap
    oracle of it: keyed by the server secret)."""
    token = get_settings().admin_token or ""
    return hmac.new(server_secret().encode(), token.encode(), hashlib.sha256).hexdigest()


def signed_in() -> bool:
    """Whether the request's session is a live login: not ended, within its lifetime from
    the login and its idle timeout; a page view (not a live refresh) keeps it alive."""
    known: bool | None = g.get("jobsapp_signed_in")
    if known is None:
        known = g.jobsapp_signed_in = _live_session()
    return known


def _live_session() -> bool:
    _end_other_tokens_sessions()
    sid = session.get(_SID)
    if not isinstance(sid, str):
        return False
    key, now = _hashed(sid), utcnow()
    with console_engine().connect() as conn:
        row = conn.execute(select(_SESSIONS).where(_SESSIONS.c.id_hash == key)).mappings().first()
    if row is None or not _alive(row, now):
        return False
    if not hmac.compare_digest(row["token_mark"] or "", token_mark()):
        _end(key)  # opened with a token that is no longer the one: ended on the server
        return False
    if not request.headers.get(_LIVE_HEADER) and now - row["seen_at"] > _SEEN_EVERY:
        with console_engine().begin() as conn:
            conn.execute(update(_SESSIONS).where(_SESSIONS.c.id_hash == key).values(seen_at=now))
    return True


def _alive(row: Any, now: datetime) -> bool:
    return (
        row["ended_at"] is None
        and now - row["created_at"] <= SESSION_LIFETIME
        and now - row["seen_at"] <= IDLE_TIMEOUT
    )


def _hashed(sid: str) -> str:
    return hashlib.sha256(sid.encode()).hexdigest()


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
