"""What a run keeps of its body's return value: JSON, up to a size cap.

The same JSON that carries a task's arguments carries its result, so a value is refused
where Celery's JSON serializer would raise ``EncodeError``; the cap keeps one run row from
carrying an unbounded document through every read of the row.
"""

from __future__ import annotations

import json
from typing import Any

from jobsapp.lifecycle.errors import ResultRefused

JSON_HINTS = {
    "datetime": "pass an ISO string (.isoformat())", "date": "pass an ISO string (.isoformat())",
    "UUID": "pass str(value)", "Decimal": "pass str(value)", "bytes": "pass base64 text",
}  # fmt: skip
_ANY_JSON = "pass str, int, float, bool, None, list, dict"


class NotJson(TypeError):
    def __init__(self, kind: type) -> None:
        super().__init__(kind.__name__)
        self.kind = kind


def encode(value: Any) -> str:
    """``value`` as compact JSON; ``NotJson`` names the type of the first part JSON cannot
    carry (a float for NaN and infinities, which JSON has no spelling for)."""
    found: list[type] = []

    def refuse(leaf: Any) -> Any:
        found.append(type(leaf))
        raise TypeError

    try:
        return json.dumps(value, default=refuse, allow_nan=False, ensure_ascii=False,
                          separators=(",", ":"))  # fmt: skip
    except (TypeError, ValueError):
        raise NotJson(found[0] if found else float) from None


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
    """``value`` if the run can keep it as its result, else ``ResultRefused`` saying why."""
    if value is None:
        return None
    try:
        size = len(encode(value).encode())
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
    return value


def _not_json(task: str, what: str, instead: str) -> ResultRefused:
    return ResultRefused(f"{task} returned {what}, not JSON: {instead}",
                         error_code="result_not_json")  # fmt: skip
