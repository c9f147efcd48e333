"""Celery's own client APIs answered from the journal: the result backend (backend.py),
the job's ``AsyncResult`` (handle.py) and ``app.control.revoke`` made durable
(revoke.py)."""
