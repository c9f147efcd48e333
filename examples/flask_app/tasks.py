"""The example's job. A worker finds it through ``JOBSAPP_IMPORTS``:

JOBSAPP_IMPORTS=examples.flask_app.tasks celery -A jobsapp worker
"""

from __future__ import annotations

import hashlib

from sqlalchemy import update
from sqlalchemy.orm import Session

from examples.flask_app.models import Upload
from jobsapp.celery_app import app
from jobsapp.db import get_engine
from jobsapp.lifecycle import PermanentError, lifecycle_task


@lifecycle_task(app, name="uploads.measure", key="measure:{upload_id}", max_attempts=5)
def measure(upload_id: int) -> None:
    with Session(get_engine()) as session, session.begin():
        upload = session.get(Upload, upload_id)
        if upload is None:
            raise PermanentError(f"upload {upload_id} does not exist")
        # Conditional, so a redelivered message writes nothing twice.
        session.execute(
            update(Upload)
            .where(Upload.id == upload_id, Upload.sha256.is_(None))
            .values(size=len(upload.content), sha256=hashlib.sha256(upload.content).hexdigest())
        )
