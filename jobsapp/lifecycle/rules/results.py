"""What the journal keeps of a call's arguments and of its body's return value: JSON as
Celery's JSON serializer writes it, the result up to a size cap.

Celery's ``json`` serializer (kombu.utils.json) carries ``datetime``, ``date``, ``time``,
``Decimal``, ``UUID`` and ``bytes`` as ``{"__type__": ..., "__value__": ...}`` and gives
them back as the same types; a run row keeps that encoded form (``stored``), and what reads
it for a body or a caller decodes it with kombu's own hook (``decoded``), so both receive
what they would from Celery. A value kombu cannot encode is refused where Celery would
raise ``EncodeError``, and so are NaN and the infinities (the journal's JSON columns have
no spelling for them); the cap keeps one run row from carrying an unbounded document
through every read of the row.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from kombu.utils import json as kombu_json

from jobsapp.lifecycle.rules.errors import ArgumentRefused, ResultRefused

JSON_HINTS = {
    "set": "pass a list",
    "frozenset": "pass a list",
    "dict": "a dict of just __type__ and __value__ is kombu's marker of a type it does not "
    "know: add a key",
}
# A running row's ``result`` holding update_state's progress, not a return value.
PROGRESS_MARK = "__jobsapp_progress__"
# A succeeded run's result that names the job answering for it (lifecycle/replace.py).
REPLACED_MARK = "__jobsapp_replaced_by__"
_ANY_JSON = (
    "pass str, int, float, bool, None, list, dict, or one of kombu's JSON types "
    "(datetime, date, time, Decimal, UUID, bytes)"
)


class NotJson(TypeError):
    def __init__(self, kind: type) -> None:
        super().__init__(kind.__name__)
        self.kind = kind


class _Encoder(kombu_json.JSONEncoder):
    """kombu's encoder, noting what it could not encode and whether it used its markers."""

    def __init__(self) -> None:
        super().__init__(allow_nan=False, ensure_ascii=False, separators=(",", ":"))
        self.refused: type | None = None
        self.marked = False

    def default(self, o: Any) -> Any:
        try:
            encoded = super().default(o)
        except TypeError:
            self.refused = type(o)
            raise
        self.marked = True
        return encoded


def _encoded(value: Any) -> tuple[str, bool]:
    """kombu's JSON of ``value``, and whether it holds kombu's markers (then it is read
    back through ``decoded``: a marker kombu could not decode is refused here, where
    Celery's worker would fail to decode the message)."""
    encoder = _Encoder()
    try:
        text = encoder.encode(value)
    except (TypeError, ValueError):
        raise NotJson(encoder.refused or float) from None
    marked = encoder.marked or '"__type__"' in text
    if marked:
        try:
            decoded(json.loads(text))
        except ValueError:
            raise NotJson(dict) from None
    return text, marked


def encode(value: Any) -> str:
    """``value`` as compact JSON, as kombu encodes it; ``NotJson`` names the type of the
    first part it cannot carry (a float for NaN and infinities)."""
    return _encoded(value)[0]


def stored(value: Any) -> Any:
    """``value`` as the journal's JSON column keeps it: itself when it is plain JSON, else
    kombu's encoded form (``NotJson`` as ``encode``)."""
    text, marked = _encoded(value)
    return json.loads(text) if marked else value


def stored_arguments(task: str, value: Any, max_bytes: int) -> Any:
    """``stored(value)`` for a job's arguments, refused (``ArgumentRefused``) when their
    compact UTF-8 JSON is over ``max_bytes`` (``JOBSAPP_ARGS_MAX_BYTES``)."""
    text, marked = _encoded(value)
    # A character takes at most 4 bytes: most arguments are measured without encoding them.
    if len(text) > max_bytes // 4 and (size := len(text.encode())) > max_bytes:
        raise ArgumentRefused(
            f"the arguments of {task} are {size} bytes of JSON, over the cap of {max_bytes} "
            "bytes (JOBSAPP_ARGS_MAX_BYTES): store large input elsewhere and pass its key"
        )
    return json.loads(text) if marked else value


def decoded(value: Any) -> Any:
    """A stored value as Celery's JSON serializer would give it back (kombu's hook, applied
    from the leaves up as ``json.loads`` applies it)."""
    if isinstance(value, dict):
        return kombu_json.object_hook({k: decoded(v) for k, v in value.items()})
    if isinstance(value, list):
        return [decoded(v) for v in value]
    return value


def non_json(value: Any) -> type | None:
    """The type of the first value in ``value`` that JSON cannot carry, or None."""
    try:
        encode(value)
    except NotJson as bad:
        return bad.kind
    return None


def hint(kind: type) -> str:
    """What to pass instead of a ``kind`` value."""
    return JSON_HINTS.get(kind.__name__, _ANY_JSON)


def checked(task: str, value: Any, max_bytes: int) -> Any:
    """What the run keeps of ``value`` as its result (``stored``), else ``ResultRefused``
    saying why."""
    if value is None:
        return None
    try:
        text, marked = _encoded(value)
        size = len(text.encode())
    except NotJson as bad:
        raise _not_json(task, f"a {bad.kind.__name__}", hint(bad.kind)) from None
    except UnicodeEncodeError:  # PostgreSQL's json refuses an unpaired surrogate too
        raise _not_json(task, "text with a lone surrogate", "pass valid Unicode") from None
    if size > max_bytes:
        raise ResultRefused(
            f"{task} returned {size} bytes of JSON, over the result cap of {max_bytes} bytes "
            "(JOBSAPP_RESULT_MAX_BYTES): store large output elsewhere and return its key",
            error_code="result_too_large",
        )
    return json.loads(text) if marked else value


def _not_json(task: str, what: str, instead: str) -> ResultRefused:
    return ResultRefused(
        f"{task} returned {what}, not JSON: {instead}", error_code="result_not_json"
    )


def progress_of(kept: Any, attempts: int) -> Mapping[str, Any] | None:
    """update_state's progress a running row holds (its ``result``, ``kept``) for its
    current attempt (its ``attempts``), if any."""
    if not isinstance(kept, Mapping) or not isinstance(kept.get(PROGRESS_MARK), Mapping):
        return None
    shown: Mapping[str, Any] = kept[PROGRESS_MARK]
    return shown if shown.get("attempt") == attempts else None


def progress(state: str, meta: Any, attempt: int) -> dict[str, Any]:
    """The ``result`` value update_state writes on a running row."""
    return {PROGRESS_MARK: {"state": state, "meta": meta, "attempt": attempt}}


def replaced_by(result: Any) -> uuid.UUID | None:
    """The job a succeeded run handed its answer to (``Task.replace``), if its ``result``
    is the mark lifecycle/replace.py writes."""
    if isinstance(result, Mapping) and isinstance(named := result.get(REPLACED_MARK), str):
        return uuid.UUID(named)
    return None
