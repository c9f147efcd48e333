"""Settings of the Django example: one PostgreSQL database shared with jobsapp.

The database comes from ``JOBSAPP_DATABASE_URL``, so the Django rows, the run rows and the
outbox rows live in one database and commit in one transaction.
"""

from __future__ import annotations

import os
import secrets
from urllib.parse import unquote, urlsplit

_db = urlsplit(os.environ["JOBSAPP_DATABASE_URL"])

# An example never ships a key: a deployment sets DJANGO_SECRET_KEY.
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or secrets.token_urlsafe(32)
DEBUG = False
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
INSTALLED_APPS = ["examples.django_app.shop"]
MIDDLEWARE = [
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
]
ROOT_URLCONF = "examples.django_app.urls"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.path.lstrip("/"),
        "USER": unquote(_db.username or ""),
        "PASSWORD": unquote(_db.password or ""),
        "HOST": _db.hostname or "",
        "PORT": str(_db.port or ""),
    }
}
