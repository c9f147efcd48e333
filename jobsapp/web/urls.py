"""What a URL must be before any route looks at it, and the variant-name route converter.

Werkzeug hands a view whatever the client percent-encoded: a NUL (which PostgreSQL refuses
in a string, so the query fails as a 500), bytes that are no UTF-8 (decoded to U+FFFD, so
two different URLs look the same), control characters that end up in logs. Every request is
checked here first and answered 400 with the reason; the checks are pure.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote_to_bytes

from werkzeug.routing import BaseConverter

# The variant names pipelines may declare (pipeline.VariantSpec): lowercase ASCII.
VARIANT_NAME = r"[a-z0-9][a-z0-9_-]{0,62}"


class VariantNameConverter(BaseConverter):
    """``<variant:name>``: a name no pipeline could declare is no route (404), not a query."""

    regex = VARIANT_NAME


def raw_url(environ: Mapping[str, Any]) -> tuple[bytes, bytes]:
    """The request's path and query as the client's bytes, percent-decoded.

    From the request target the server received (``RAW_URI``, ``REQUEST_URI``): the
    development server has already turned invalid UTF-8 in ``PATH_INFO`` into U+FFFD.
    """
    target = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if target:
        path, _, query = str(target).partition("?")
        return unquote_to_bytes(path), _query_bytes(query)
    return str(environ.get("PATH_INFO", "")).encode("latin-1"), _query_bytes(
        str(environ.get("QUERY_STRING", ""))
    )


def url_problem(path: bytes, query: bytes) -> str | None:
    """Why a percent-decoded path or query cannot be taken, or None."""
    text = _utf8(path)
    if text is None:
        return "The URL path is not valid UTF-8."
    arguments = _utf8(query)
    if arguments is None:
        return "The query string is not valid UTF-8."
    if _has_control(text) or _has_control(arguments):
        return "The URL contains a control character (NUL, a line break, ...)."
    return None


def _query_bytes(query: str) -> bytes:
    return unquote_to_bytes(query.replace("+", " "))


def _utf8(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _has_control(text: str) -> bool:
    # Cc: C0 and C1 controls, NUL included. Format characters (Cf, e.g. U+202E) are left to
    # each parameter's own check: they are not a danger to the database or to logs.
    return any(unicodedata.category(char) == "Cc" for char in text)
