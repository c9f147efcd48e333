"""jobsapp: Celery jobs whose lifecycle is enforced in the database.

``celery -A jobsapp`` finds the Celery app as ``jobsapp.app``; it is imported lazily so
that importing a submodule (a model, a pure rule) does not build the app.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("jobsapp")
except PackageNotFoundError:  # a checkout on PYTHONPATH, never installed
    __version__ = "0+unknown"

if TYPE_CHECKING:
    from celery import Celery

    app: Celery


def __getattr__(name: str) -> Any:
    if name in ("app", "celery"):
        from jobsapp.celery_app import app

        return app
    raise AttributeError(f"module 'jobsapp' has no attribute {name!r}")
