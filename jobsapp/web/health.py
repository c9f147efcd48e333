"""``/healthz``: the web process answers and reaches its database.

Compose (and any orchestrator) gates traffic on this check; a web process that cannot
reach the system of record can accept nothing, so it reports 503 rather than "ok".
"""

from __future__ import annotations

import logging

from flask import jsonify
from flask_openapi3.blueprint import APIBlueprint
from flask_openapi3.models.tag import Tag
from sqlalchemy import text
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from jobsapp.db import get_engine
from jobsapp.web import schemas
from jobsapp.web.openapi import OPEN, Answer, errors, json_answer

log = logging.getLogger(__name__)

_RETRY_AFTER_S = "5"

health = APIBlueprint("health", __name__, abp_tags=[Tag(name="operations")])


@health.get(
    "/healthz",
    summary="The web process answers and reaches its database",
    operation_id="healthz",
    security=OPEN,
    responses={200: json_answer(schemas.Health, "Alive"), **errors(503)},
)
def healthz() -> Answer:
    try:
        with get_engine().connect() as conn:
            conn.execute(text("SELECT 1"))
    except (OperationalError, InterfaceError, PoolTimeout) as exc:
        # The class name only: a driver's message can carry the host and user.
        log.warning("healthz: database unreachable: %s", type(exc).__name__)
        body = {"error": "unavailable", "reason": "The database is unreachable."}
        return jsonify(body), 503, {"Retry-After": _RETRY_AFTER_S}
    return jsonify({"status": "ok"})
