"""Remove secrets from error text before it is stored, returned by the API or logged.

Everything that reaches ``jobs.last_error``, ``job_events.reason``, an API response or a log
line goes through :func:`scrub`, or :func:`describe_exception`, which calls it. The module is
pure (no I/O, no environment lookups): callers pass the secrets they know about, typically
``known_secrets_from_env(os.environ)`` computed once at start-up.

Trade-offs, pinned by ``tests/unit/test_scrub.py``:

* Masking too much is better than leaking. A bare value is masked up to the next whitespace
  (or ``&``), so a trailing comma or bracket may go with it, and an ``Authorization`` header
  is masked up to the end of its line.
* A value is only masked when the name next to it says it is secret (SECRET, PASSWORD,
  TOKEN, API_KEY, ...). A bare ``key``, as in ``concurrency_key``, does not count, because
  this application's errors are full of idempotency and concurrency keys that are needed for
  debugging; ``key=...`` is only masked as a query parameter of a URL. A name that holds a
  keyword but no secret (``max_tokens=5``) is masked all the same.
* Only the secret itself is masked: schemes, user names, hosts, parameter names and the
  ``AKIA``/``ASIA`` prefix stay, so the text still shows what failed and where.
* Patterns cannot see a secret that has no recognisable shape and no name next to it
  (a raw password in a ``/`` separated path, say), nor a label glued to a preceding letter
  (``xBearer abc``). Such values are caught only when the caller passes them in ``secrets``.
* The output is a fixed point of :func:`scrub`, so text scrubbed by a producer and again by
  the API or the logger does not change a second time.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Final
from urllib.parse import quote, unquote

__all__ = [
    "DEFAULT_LIMIT",
    "MASK",
    "TRUNCATION_MARK",
    "describe_exception",
    "known_secrets_from_env",
    "scrub",
]

MASK: Final = "***"
# Unquoted values stop at "…", so the marker after a cut such as "password: " is never taken
# for the value; otherwise a second scrub would mask it and truncation could not stay stable.
# A secret containing "…" would show its tail; such secrets are not expected.
TRUNCATION_MARK: Final = "…[truncated]"
DEFAULT_LIMIT: Final = 2000

# Shorter "secrets" would match ordinary words and shred the message without protecting much.
_MIN_KNOWN_SECRET_LEN: Final = 4
_MIN_ENV_SECRET_LEN: Final = 6
# How many links of an exception chain are worth a database row; deeper ones are noise.
_MAX_CHAIN: Final = 3
# Only the start of the text survives truncation, so scanning megabytes is wasted work (and a
# way to stall a worker with a huge error body). The slack covers masks that shorten the text.
_SCAN_FACTOR: Final = 4
_SCAN_SLACK: Final = 4096
_MAX_PASSES: Final = 4
_MAX_TRUNCATION_STEPS: Final = 64

# --- patterns, applied in the order of _RULES -------------------------------------------------

_PEM_PRIVATE_KEY_RE: Final = re.compile(
    # A block cut off before its END line (by an upstream limit) is still masked to the end.
    r"(?P<begin>-----BEGIN (?P<kind>[A-Z0-9 ]{0,40}PRIVATE KEY)-----).*?"
    r"(?:-----END (?P=kind)-----|\Z)",
    re.DOTALL,
)

_URL_USERINFO_RE: Final = re.compile(
    # No word boundary before the scheme: "...EXAMPLEpostgresql://" must match too. The bound
    # on the scheme length keeps the scan linear on long tokens without "://".
    # The password runs to the *last* "@" before the path, so a raw "@" in it is masked whole.
    r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]{0,30}://[^\s:/?#@]*:)(?P<password>[^\s/?#]*)@"
)

_AUTH_HEADER_RE: Final = re.compile(
    # The optional backslash and quote cover headers inside (escaped) JSON and Python reprs.
    r"(?P<head>(?<![A-Za-z])(?:proxy-)?authorization\\?[\"']?[ \t]*[:=][ \t]*\\?[\"']?)"
    # Only well-known scheme names are kept; anything else might be the credential itself.
    r"(?:(?P<scheme>bearer|basic|digest|token|negotiate|aws4-hmac-sha256)[ \t]+)?"
    # SigV4 credentials contain spaces and commas, so the rest of the line goes.
    r"(?:[^\r\n\"'\\…]|\\(?![\"']))+",
    re.IGNORECASE,
)

_QUERY_SECRET_RE: Final = re.compile(
    # Generic names such as "key" or "sig" are only trusted right after "?", "&" or ";"
    # (";" also catches HTML-escaped "&amp;"); elsewhere they are ordinary words.
    r"(?P<head>[?&;](?:x-amz-signature|x-amz-credential|x-amz-security-token|signature"
    r"|awsaccesskeyid|sig|token|access_token|api_key|apikey|key|password|secret)=)"
    r"[^&#\s\"'…]+",
    re.IGNORECASE,
)

_BASIC_RE: Final = re.compile(
    # "Basic" is also an English word ("Basic validation failed"). Credentials are base64 of
    # "user:password": at least 8 characters, and in practice a digit, "+", "/", "=" or a
    # lower-to-upper case change somewhere, which plain words do not have.
    r"\b(?P<head>Basic[ \t]+)"
    r"(?=[A-Za-z0-9+/]*(?:[0-9+/=]|[a-z][A-Z]))"
    r"[A-Za-z0-9+/]{8,}={0,2}(?![A-Za-z0-9+/=])"
)

_SENSITIVE_NAME_WORDS: Final = (
    r"secret|passw(?:or)?d|token|api[_-]?key|access[_-]?key|private[_-]?key"
    r"|signature|credential"
)
# An identifier holding one of the words, followed by its separator. Atomic: once the
# identifier is read to its end, trying other keyword positions inside it cannot help, and on
# "tokentoken..." it would be quadratic. The closing quote or ")" covers JSON keys and
# Postgres "Key (api_token)=(...)".
_SECRET_NAME_AND_SEPARATOR: Final = (
    rf"(?>[\w.\-]*?(?:{_SENSITIVE_NAME_WORDS})[\w.\-]*)"
    r"(?<!error)(?<!exception)(?<!warning)"  # "InvalidTokenError: ..." names a type
    r"(?:\\?[\"']|\))?[ \t]*[:=][ \t]*"
)

# Labels in front of a value: in "token: password: x" or "Bearer password: x" the secret is x,
# and in "password: MyPassword: x" it may be both words. A whole chain of labels is therefore
# masked together with the value that ends it. A label needs the space after its separator;
# without it the word is a value ("MyPassword=1").
_LABEL_CHAIN: Final = rf"(?:(?:bearer|basic)[ \t]+|{_SECRET_NAME_AND_SEPARATOR}(?<=[ \t]))*"

# The whole word goes, not just its token68 characters: stopping at an unexpected "=" or ":"
# would leave the rest of the token in the text. Not "\b": the header may be glued to a
# preceding "_" or digit.
_BEARER_RE: Final = re.compile(
    rf"(?<![A-Za-z])(?P<head>bearer[ \t]+){_LABEL_CHAIN}[^\s\"'\\…]+",
    re.IGNORECASE,
)

_NAMED_SECRET_RE: Final = re.compile(
    rf"""
    (?P<head>
        (?<![\w.\-])                    # a whole identifier, but not a URL's user name;
        (?!(?<=://)[\w.\-]*:[^\s/?#]*@)  # one lookahead, as an alternation would backtrack
        {_SECRET_NAME_AND_SEPARATOR}
    )
    (?P<value>
        \\"(?:[^\\\n]|\\(?!"))*(?:\\")?   # \"value\" inside an escaped JSON string
      | "(?:[^"\\\n]|\\.)*"?              # "value"; the closing quote may have been cut off
      | '(?:[^'\\\n]|\\.)*'?              # 'value'
      | (?P<scheme>(?:bearer|basic)[ \t]+)?   # kept: it tells which kind of credential it was
        {_LABEL_CHAIN}
        (?:"(?:[^"\\\n]|\\.)*"?|'(?:[^'\\\n]|\\.)*'?|[^\s"'&…]+)
    )
    """,
    re.IGNORECASE | re.VERBOSE,
)

_JWT_RE: Final = re.compile(r"\beyJ[A-Za-z0-9_\-]{4,}\.eyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]*")

# Key ids are not secret on their own, but they name the account and half of a credential.
# An id glued to other letters is not taken: masking it could expose a word boundary that an
# earlier rule needed, and such glued ids do not occur in real messages.
_AWS_KEY_ID_RE: Final = re.compile(
    r"(?<![A-Za-z0-9])(?P<head>AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"
)

# --- environment -------------------------------------------------------------------------------

# KEY must stand as a word (or follow API/ACCESS/PRIVATE): MONKEY_PATCH or KEYBOARD are not secret.
_SECRET_ENV_NAME_RE: Final = re.compile(
    r"SECRET|PASSW(?:OR)?D|TOKEN|(?:^|_|API|ACCESS|PRIVATE)KEY(?:_|$)", re.IGNORECASE
)
# Names about a secret rather than holding one: masking "jobsapp" everywhere because of
# REDIS_KEY_PREFIX=jobsapp would make every module path unreadable. An id (AWS_ACCESS_KEY_ID)
# names a credential without being one; AWS key ids are still masked by their AKIA pattern.
_SECRET_METADATA_SUFFIXES: Final = (
    "_ID",
    "_FILE",
    "_PATH",
    "_DIR",
    "_PREFIX",
    "_HEADER",
    "_NAME",
    "_TTL",
    "_SECONDS",
    "_TIMEOUT",
)
_URL_ENV_SUFFIXES: Final = ("_URL", "_URI", "_DSN")


def scrub(text: str, *, limit: int = DEFAULT_LIMIT, secrets: Iterable[str] = ()) -> str:
    """Return ``text`` with secrets masked, cut to at most ``limit`` characters.

    ``secrets`` are exact strings to mask wherever they appear (also percent-encoded); the
    result is a fixed point: ``scrub(scrub(t, ...), ...) == scrub(t, ...)``.
    """
    if limit < len(TRUNCATION_MARK):
        raise ValueError(f"limit must be at least {len(TRUNCATION_MARK)}, got {limit}")
    known = _known_secrets_pattern(frozenset(secrets))
    budget = limit * _SCAN_FACTOR + _SCAN_SLACK
    clipped = len(text) > budget
    redacted = _redact(_clip(text, budget) if clipped else text, known)
    if not clipped and len(redacted) <= limit:
        return redacted
    return _truncate(redacted, limit, known)


def describe_exception(
    exc: BaseException, *, secrets: Iterable[str] = (), limit: int = DEFAULT_LIMIT
) -> str:
    """``"TypeName: message"`` of ``exc`` and up to three chained causes, scrubbed.

    Only ``str()`` of each exception is used, never the traceback, whose frames hold locals.
    """
    parts = [_summary(exc)]
    parts.extend(f"{link} {_summary(cause)}" for link, cause in _chain(exc))
    return scrub("; ".join(parts), limit=limit, secrets=secrets)


def known_secrets_from_env(environ: Mapping[str, str]) -> tuple[str, ...]:
    """Values worth masking verbatim: secret-looking variables and passwords in ``*_URL``s."""
    found: set[str] = set()
    for name, raw in environ.items():
        value = raw.strip()
        if _is_secret_env_name(name):
            found.add(value)
        if name.upper().endswith(_URL_ENV_SUFFIXES):
            found.update(_url_passwords(value))
    return tuple(sorted(s for s in found if len(s) >= _MIN_ENV_SECRET_LEN))


# --- redaction -----------------------------------------------------------------------------


def _mask_pem(match: re.Match[str]) -> str:
    # Keep the block type (RSA, EC, OPENSSH ...) because it tells which key leaked into the text.
    return f"{match['begin']}{MASK}-----END {match['kind']}-----"


def _mask_head(match: re.Match[str]) -> str:
    return f"{match['head']}{MASK}"


def _mask_url_password(match: re.Match[str]) -> str:
    return f"{match['head']}{MASK}@"


def _mask_auth_header(match: re.Match[str]) -> str:
    scheme = match["scheme"]
    return f"{match['head']}{scheme} {MASK}" if scheme else f"{match['head']}{MASK}"


def _mask_named_value(match: re.Match[str]) -> str:
    return f"{match['head']}{_mask_value(match['value'], match['scheme'])}"


def _mask_value(value: str, scheme: str | None) -> str:
    """Mask a value but keep its quotes, so JSON and reprs keep their shape."""
    for quote_mark in ('\\"', '"', "'"):
        if value.startswith(quote_mark):
            closed = len(value) >= 2 * len(quote_mark) and value.endswith(quote_mark)
            return f"{quote_mark}{MASK}{quote_mark if closed else ''}"
    if scheme:
        return f"{scheme.rstrip()} {MASK}"
    return MASK


_RULES: Final[tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], str]], ...]] = (
    (_PEM_PRIVATE_KEY_RE, _mask_pem),
    (_URL_USERINFO_RE, _mask_url_password),
    (_AUTH_HEADER_RE, _mask_auth_header),
    (_QUERY_SECRET_RE, _mask_head),
    # Bearer/Basic run before named values: "token: Bearer x" must not lose only "Bearer".
    (_BEARER_RE, _mask_head),
    (_BASIC_RE, _mask_head),
    (_NAMED_SECRET_RE, _mask_named_value),
    (_JWT_RE, lambda _match: MASK),
    (_AWS_KEY_ID_RE, _mask_head),
)


def _redact(text: str, known: re.Pattern[str] | None) -> str:
    """Apply all rules until nothing changes.

    One pass is not always enough: masking a quoted value can, for example, remove the "/"
    that kept a URL rule from seeing the "@" of a userinfo. Real text settles in one or two
    passes; the cap only guards against a pathological ping-pong.
    """
    for _ in range(_MAX_PASSES):
        redacted = _redact_once(text, known)
        if redacted == text:
            break
        text = redacted
    return text


def _redact_once(text: str, known: re.Pattern[str] | None) -> str:
    # Known secrets go first: a pattern that masks only part of one (a raw "/" in a URL
    # password, say) would otherwise leave the rest visible.
    if known is not None:
        text = known.sub(MASK, text)
    for pattern, replace in _RULES:
        text = pattern.sub(replace, text)
    return text


@functools.lru_cache(maxsize=32)
def _known_secrets_pattern(secrets: frozenset[str]) -> re.Pattern[str] | None:
    # Cached because the same configured secrets are passed on every call.
    variants = {
        variant
        for secret in secrets
        if len(secret) >= _MIN_KNOWN_SECRET_LEN
        for variant in (secret, quote(secret, safe=""))
    }
    if not variants:
        return None
    # Longest first, so a secret that contains another one is masked whole.
    ordered = sorted(variants, key=lambda s: (-len(s), s))
    return re.compile("|".join(re.escape(s) for s in ordered))


# --- truncation ----------------------------------------------------------------------------


def _clip(text: str, budget: int) -> str:
    head = text[:budget]
    # A secret cut in two may no longer match its pattern; dropping the partial last word
    # keeps its first half out of the output. A single giant word is kept as it is.
    cut = max(head.rfind(c) for c in " \t\r\n")
    return head[:cut] if cut > 0 else head


def _truncate(redacted: str, limit: int, known: re.Pattern[str] | None) -> str:
    """Keep the start and append the marker, never splitting or creating a mask.

    A cut can leave half a value (``password=hun``) or the first 16 characters of a longer
    token that now looks like an AWS key id; a second ``scrub`` would change such a result.
    Backing off one character at a time until the result is stable keeps ``scrub``
    idempotent. In practice it takes a few steps at most.
    """
    # A cut inside "***" would leave "*" or "**", which reads like a different mask.
    head = redacted[: limit - len(TRUNCATION_MARK)].rstrip("*")
    for _ in range(_MAX_TRUNCATION_STEPS):
        candidate = head + TRUNCATION_MARK
        if not head or _redact(candidate, known) == candidate:
            return candidate
        head = head[:-1]
    # Pathological text that never settles: the marker alone is stable and leaks nothing.
    return TRUNCATION_MARK


# --- exceptions and environment ------------------------------------------------------------


def _summary(exc: BaseException) -> str:
    name = type(exc).__name__
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not hide the original failure
        message = "<unprintable message>"
    return f"{name}: {message}" if message else name


def _chain(exc: BaseException) -> Iterator[tuple[str, BaseException]]:
    """Follow the chain the way tracebacks do: explicit cause first, else unsuppressed context."""
    seen = {id(exc)}
    current = exc
    for _ in range(_MAX_CHAIN):
        if current.__cause__ is not None:
            link, following = "caused by", current.__cause__
        elif current.__context__ is not None and not current.__suppress_context__:
            link, following = "while handling", current.__context__
        else:
            return
        if id(following) in seen:  # chains can be cyclic when code re-raises stored errors
            return
        seen.add(id(following))
        yield link, following
        current = following


def _is_secret_env_name(name: str) -> bool:
    upper = name.upper()
    return bool(_SECRET_ENV_NAME_RE.search(upper)) and not upper.endswith(_SECRET_METADATA_SUFFIXES)


def _url_passwords(value: str) -> set[str]:
    # A value may hold several URLs (Kombu failover lists use ";"), hence finditer. Both the
    # encoded and the decoded form are kept: messages quote either.
    passwords: set[str] = set()
    for match in _URL_USERINFO_RE.finditer(value):
        password = match["password"]
        passwords.update((password, unquote(password)))
    return passwords
