"""A rendered variant's bytes as an HTTP answer: streamed from local storage, or a redirect
to a short-lived presigned URL (S3). Shared by the attachments API (a producer's token) and
the console (an operator's session: its cookie never reaches /v1)."""

from __future__ import annotations

from uuid import UUID

from flask import Response
from werkzeug.exceptions import NotFound

from jobsapp.attachments import service


def variant_answer(attachment_id: UUID, name: str) -> Response:
    try:
        read = service.open_variant(attachment_id, name)
    except service.VariantMissing:
        # Not a passing outage: a retry would never find it (a 503 said retry).
        raise NotFound(
            "This variant was published, but storage no longer has its object; "
            "an operator can reprocess the attachment (jobsapp verify names it)."
        ) from None
    if read is None:
        raise NotFound("This attachment has no such variant, or it is not ready yet.")
    if read.url is not None:
        # The signature expires: a cached redirect must not outlive it.
        headers = {"Location": read.url, "Cache-Control": "no-store"}
        return Response(status=302, headers=headers, mimetype="text/plain")
    response = Response(read.stream, content_type=read.content_type, direct_passthrough=True)
    response.content_length = read.size
    # A variant's bytes never change under its SHA-256, so it is the natural strong ETag.
    response.set_etag(read.sha256)
    return response
