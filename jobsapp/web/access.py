"""Who sent a request, and what they may do: ``identity_of(request)``.

Three ways in, tried in this order:

- the deployment's identity provider: an authenticating proxy (oauth2-proxy, Pomerium,
  Cloudflare Access, an ingress with OIDC) names the user in ``JOBSAPP_AUTH_PROXY_HEADER``.
  The header is believed only from a peer within ``JOBSAPP_AUTH_PROXY_TRUSTED``; from any
  other address it is refused (403, logged): whoever can reach the app directly could
  otherwise name themselves anyone. The identities of ``JOBSAPP_OPERATORS`` are operators,
  every other one a viewer;
- the console's login session (``web/auth.py``), opened with the admin token: an operator;
- the admin token as ``Authorization: Bearer``: an operator. Its checks are throttled per
  client address (``web/throttle.py``).

A viewer sees every page and reads the API; only an operator acts (replay, cancel, run now,
pause and resume, bulk, outbox retry, reconcile).
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from enum import StrEnum

from flask import Request, g

from jobsapp.settings import get_settings
from jobsapp.web import auth, throttle

log = logging.getLogger(__name__)

# What the audit trail names an action taken with the shared token once a provider is
# configured: never a name typed at login.
TOKEN_ACTOR = "admin-token"  # noqa: S105 - a name, not a secret
_CACHED = "jobsapp_identity"


class Role(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"


@dataclass(frozen=True)
class Identity:
    """``name``: the provider's identity when ``proven``, else the shared token's holder
    (a name typed at login, or ``TOKEN_ACTOR``)."""

    name: str
    role: Role
    proven: bool

    @property
    def may_act(self) -> bool:
        return self.role is Role.OPERATOR


class Refused(Exception):
    """A request that names someone it may not: answered ``status`` with ``reason``."""

    def __init__(self, status: int, reason: str, retry_after: int | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.retry_after = retry_after


def enabled() -> bool:
    """Whether anyone can be identified: the admin token or a provider is configured."""
    settings = get_settings()
    return settings.admin_token is not None or settings.auth_proxy is not None


def identity_of(request: Request) -> Identity | None:
    """Who sent ``request`` (the provider's header, the console session, the admin token as
    a bearer), or None: nobody known. Raises Refused: the provider's header from an
    untrusted address (403), or a client that must wait after failed guesses (429).
    Resolved once per request."""
    if _CACHED not in g:
        g.jobsapp_identity = _resolve(request)
    found: Identity | None = g.jobsapp_identity
    return found


def _resolve(request: Request) -> Identity | None:
    proxy = get_settings().auth_proxy
    if proxy is not None and (named := request.headers.get(proxy.header, "").strip()):
        peer = request.remote_addr or ""
        if not _trusted(peer):
            log.warning("refused %s from %s: not a trusted proxy", proxy.header, peer)
            raise Refused(
                403,
                f"{proxy.header} is believed only from the authenticating proxy; "
                f"{peer} is not within JOBSAPP_AUTH_PROXY_TRUSTED",
            )
        # As JOBSAPP_OPERATORS is matched: one person is one actor in the audit trail,
        # however the provider spells their name today.
        named = named.lower()
        role = Role.OPERATOR if named in proxy.operators else Role.VIEWER
        return Identity(named, role, proven=True)
    if request.path.startswith("/admin") and auth.signed_in():
        typed = TOKEN_ACTOR if proxy is not None else auth.actor()
        return Identity(typed, Role.OPERATOR, proven=False)
    given = auth.bearer(request)
    if given is None or get_settings().admin_token is None:
        return None
    try:
        known = throttle.checked(
            client_address(request), "admin bearer token", lambda: auth.token_matches(given)
        )
    except throttle.Throttled as wait:
        raise Refused(429, str(wait), wait.retry_after) from None
    return Identity(TOKEN_ACTOR, Role.OPERATOR, proven=False) if known else None


def audit_name(who: Identity, declared: str) -> str:
    """The name an action is audited under: the provider's identity, never a typed one once
    a provider is configured; else the self-declared one (the shared token's habit)."""
    if who.proven or get_settings().auth_proxy is not None:
        return who.name
    return declared


def client_address(request: Request) -> str:
    """The client's address: the peer's, or behind a trusted proxy the address it appended
    to ``X-Forwarded-For`` (the last one: earlier ones are the client's own claim)."""
    peer = request.remote_addr or ""
    forwarded = request.headers.get("X-Forwarded-For", "")
    if forwarded and _trusted(peer):
        return forwarded.rsplit(",", 1)[-1].strip() or peer
    return peer


def _trusted(peer: str) -> bool:
    proxy = get_settings().auth_proxy
    if proxy is None:
        return False
    try:
        address = ipaddress.ip_address(peer)
    except ValueError:
        return False
    return any(address in network for network in proxy.trusted)


def may_not_act(who: Identity) -> str:
    """The line a viewer's action is refused with."""
    return (
        f"{who.name} is a viewer: only an operator may act "
        "(JOBSAPP_OPERATORS lists the operators' identities)."
    )
