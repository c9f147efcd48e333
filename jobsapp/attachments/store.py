"""The object store attachments live in, built from the settings.

Keys are made here from server-side values only: ``staging/{uuid}`` for an upload that
is not processed yet, and the pipeline's ``variant_key``/``original_key`` under
``attachments/`` for what is published.
"""

from __future__ import annotations

import uuid
from functools import cache

from jobsapp.settings import get_settings
from jobsapp.storage import ObjectStore, store_from_url

# The pipeline's key prefix of published objects (variants and originals).
PUBLISHED_PREFIX = "attachments"
STAGING_PREFIX = "staging/"


def get_store() -> ObjectStore:
    """The configured store; follows the settings, so clearing them switches stores."""
    settings = get_settings()
    return _store_for(
        settings.storage_url, settings.s3_endpoint_url, settings.s3_region, settings.s3_public_url
    )


@cache
def _store_for(
    url: str, endpoint_url: str | None, region: str | None, public_url: str | None
) -> ObjectStore:
    # One client per configuration: boto3 clients are thread-safe and pool connections.
    return store_from_url(url, endpoint_url=endpoint_url, region=region, public_url=public_url)


def clear_store_cache() -> None:
    """Forget built stores (tests that change the storage settings)."""
    _store_for.cache_clear()


def staging_key(attachment_id: uuid.UUID) -> str:
    if not isinstance(attachment_id, uuid.UUID):
        raise TypeError("attachment_id must be a UUID")
    return f"{STAGING_PREFIX}{attachment_id}"
