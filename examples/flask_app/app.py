"""An upload form whose row and job commit together, on either of jobsapp's two paths.

``POST /uploads/session`` joins an ORM ``Session`` (``apply_async(session=...)``: published
by the session's after-commit hook); ``POST /uploads/transaction`` uses
``jobsapp.lifecycle.producer.enqueue.transaction`` (a Core connection, published after its COMMIT).

    JOBSAPP_DATABASE_URL=postgresql+psycopg2://... JOBSAPP_BROKER_URL=redis://... \
    JOBSAPP_STORAGE_URL=s3://bucket/prefix flask --app examples.flask_app.app run
"""

from __future__ import annotations

from typing import Any

from flask import Flask, abort, request
from sqlalchemy import insert
from sqlalchemy.orm import Session
from werkzeug.datastructures import FileStorage

from examples.flask_app.models import Base, Upload
from examples.flask_app.tasks import measure
from jobsapp.celery_app import app as celery_app
from jobsapp.db import get_engine
from jobsapp.lifecycle import JobHandle, transaction

FORM = """<!doctype html>
<title>Upload</title>
<form method="post" action="/uploads/session" enctype="multipart/form-data">
  <input type="file" name="file" required> <button>Upload (ORM session)</button>
</form>
<form method="post" action="/uploads/transaction" enctype="multipart/form-data">
  <input type="file" name="file" required> <button>Upload (transaction)</button>
</form>
"""


def create_app() -> Flask:
    flask_app = Flask(__name__)
    flask_app.config["MAX_CONTENT_LENGTH"] = 5 * 1024 * 1024
    # An example's shortcut: a real project creates its tables with its migrations.
    Base.metadata.create_all(get_engine())
    flask_app.get("/")(upload_form)
    flask_app.post("/uploads/session")(upload_with_session)
    flask_app.post("/uploads/transaction")(upload_in_transaction)
    flask_app.get("/uploads/<int:upload_id>")(show_upload)
    return flask_app


def upload_form() -> str:
    return FORM


def upload_with_session() -> tuple[dict[str, Any], int]:
    name, content = _file()
    with Session(get_engine()) as session, session.begin():
        upload = Upload(filename=name, content=content)
        session.add(upload)
        session.flush()  # assigns upload.id inside the transaction
        upload_id = upload.id
        job = measure.apply_async(kwargs={"upload_id": upload_id}, session=session)
    return _accepted(upload_id, job)


def upload_in_transaction() -> tuple[dict[str, Any], int]:
    name, content = _file()
    with transaction(celery_app) as batch:
        row = insert(Upload).values(filename=name, content=content).returning(Upload.id)
        upload_id = batch.conn.execute(row).scalar_one()
        job = measure.enqueue_in(batch, kwargs={"upload_id": upload_id})
    return _accepted(upload_id, job)


def show_upload(upload_id: int) -> dict[str, Any]:
    with Session(get_engine()) as session:
        upload = session.get(Upload, upload_id)
        if upload is None:
            abort(404)
        return {
            "id": upload.id,
            "filename": upload.filename,
            "size": upload.size,
            "sha256": upload.sha256,
        }


def _file() -> tuple[str, bytes]:
    file: FileStorage | None = request.files.get("file")
    content = file.read() if file is not None else b""
    if file is None or not content:
        abort(400, "choose a non-empty file")
    return file.filename or "upload", content


def _accepted(upload_id: int, job: JobHandle) -> tuple[dict[str, Any], int]:
    return {"upload": upload_id, "job_id": job.id, "enqueue": job.outcome.value}, 202
