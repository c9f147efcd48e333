"""Flask: an upload form whose row and job commit together (examples/flask_app).

Both producer paths, ``apply_async(session=...)`` and ``transaction(app)``, against
PostgreSQL, the Redis broker and a real in-process worker.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine, delete, func, insert, select
from sqlalchemy.orm import Session

from examples.flask_app.app import create_app
from examples.flask_app.models import Upload
from examples.flask_app.tasks import measure
from jobsapp.celery_app import app as celery_app
from jobsapp.db import get_engine
from jobsapp.lifecycle.producer.enqueue import transaction
from tests.integration.frameworks.conftest import queued_messages
from tests.support.journal_view import run_count
from tests.support.waiting import eventually

PATHS = ("/uploads/session", "/uploads/transaction")


class Boom(Exception):
    """Raised inside the transaction to roll it back."""


@pytest.fixture
def flask_app(db: Engine) -> Flask:
    flask_app = create_app()
    with db.begin() as conn:
        conn.execute(delete(Upload))
    return flask_app


@pytest.fixture
def client(flask_app: Flask) -> FlaskClient:
    return flask_app.test_client()


def uploads(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(Upload)).scalar_one())


def post_file(client: FlaskClient, path: str, content: bytes) -> dict[str, object]:
    data = {"file": (io.BytesIO(content), "cat.txt")}
    response = client.post(path, data=data, content_type="multipart/form-data")
    assert response.status_code == 202, response.data
    body: dict[str, object] = response.get_json()
    return body


def test_form_offers_both_paths_as_multipart(client: FlaskClient) -> None:
    page = client.get("/").get_data(as_text=True)
    assert page.count('enctype="multipart/form-data"') == 2
    assert all(f'action="{path}"' in page for path in PATHS)


@pytest.mark.parametrize("path", PATHS)
def test_upload_commits_row_and_job_and_the_worker_measures_it(
    client: FlaskClient, worker: object, path: str
) -> None:
    content = b"a file the worker measures " + path.encode()
    accepted = post_file(client, path, content)
    assert accepted["enqueue"] == "enqueued"
    shown = eventually(
        lambda: (
            (body := client.get(f"/uploads/{accepted['upload']}").get_json())["sha256"] and body
        ),
        timeout=60,
    )
    assert shown["sha256"] == hashlib.sha256(content).hexdigest()
    assert shown["size"] == len(content)


@pytest.mark.parametrize("path", PATHS)
def test_empty_upload_is_refused_with_nothing_written(
    client: FlaskClient, db: Engine, redis_clean: None, path: str
) -> None:
    response = client.post(
        path, data={"file": (io.BytesIO(b""), "empty.txt")}, content_type="multipart/form-data"
    )
    assert response.status_code == 400
    assert (uploads(db), run_count(db), queued_messages()) == (0, 0, 0)


def _session_then_fail() -> None:
    with Session(get_engine()) as session, session.begin():
        upload = Upload(filename="x", content=b"x")
        session.add(upload)
        session.flush()
        measure.apply_async(kwargs={"upload_id": upload.id}, session=session)
        raise Boom


def _transaction_then_fail() -> None:
    with transaction(celery_app) as batch:
        row = insert(Upload).values(filename="x", content=b"x").returning(Upload.id)
        upload_id = batch.conn.execute(row).scalar_one()
        measure.enqueue_in(batch, kwargs={"upload_id": upload_id})
        raise Boom


@pytest.mark.parametrize("write", [_session_then_fail, _transaction_then_fail])
def test_rolled_back_upload_leaves_no_row_no_job_no_message(
    flask_app: Flask, db: Engine, redis_clean: None, write: Callable[[], None]
) -> None:
    with pytest.raises(Boom):
        write()
    assert (uploads(db), run_count(db), queued_messages()) == (0, 0, 0)
