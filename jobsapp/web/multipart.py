"""The upload's multipart/form-data body: the ``file`` part, or a refusal that says why.

Werkzeug's form parser answers each of its limits (parts, text field size) with the same
bare 413, and drops the whole form, silently, when it cannot decode it (a file name sent
in raw Latin-1): the client was told "missing file" or "file too large" for something
else. The body is read here with Werkzeug's sans-IO decoder instead, keeping only what an
upload needs, and each refusal names its limit or its cause.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import IO

from werkzeug.sansio.multipart import (
    Data,
    Epilogue,
    Event,
    Field,
    File,
    MultipartDecoder,
    NeedData,
    State,
)

from jobsapp.attachments.validation import RejectedUpload

FILE_FIELD = "file"
# An upload is one file; a few other parts are tolerated (some clients add a name field).
MAX_PARTS = 16
MAX_FIELD_BYTES = 64 * 1024
# A part's headers are a disposition, a type and a file name: a few hundred bytes. The
# decoder holds them whole until their blank line comes, so they need their own bound.
MAX_PART_HEADER_BYTES = 16 * 1024
_READ_BYTES = 64 * 1024


class BodyEnded(Exception):
    """The body ended before the length its request declared: its client stopped sending,
    or the server stopped reading (a deadline)."""


@dataclass(frozen=True)
class FormLimits:
    max_file_bytes: int
    max_parts: int = MAX_PARTS
    max_field_bytes: int = MAX_FIELD_BYTES
    max_header_bytes: int = MAX_PART_HEADER_BYTES


@dataclass
class _Reading:
    """What the events so far built: the file's bytes and name, and the counts to limit."""

    limits: FormLimits
    parts: int = 0
    field_bytes: int = 0
    # "file": the upload; "field": a text part; "other": a file part of another name, dropped.
    current: str = "other"
    filename: str | None = None
    chunks: list[bytes] = field(default_factory=list)
    kept: int = 0
    found: bool = False

    def take(self, event: Event) -> None:
        if isinstance(event, Field | File):
            self._start(event)
        elif isinstance(event, Data):
            self._data(event.data)

    def _start(self, event: Field | File) -> None:
        self.parts += 1
        if self.parts > self.limits.max_parts:
            raise RejectedUpload(
                413,
                "too_many_parts",
                f"The form has more than "
                f"{self.limits.max_parts} parts; send the image alone in "
                f"the field '{FILE_FIELD}'.",
            )
        if isinstance(event, Field):
            self.current, self.field_bytes = "field", 0
        elif event.name != FILE_FIELD:
            self.current = "other"
        elif self.found:
            # Taking the first and answering 201 told the client its second image was kept.
            raise RejectedUpload(
                400,
                "more_than_one_file",
                f"The form has more than one '{FILE_FIELD}' part; upload one image a request.",
            )
        else:
            self.current, self.found, self.filename = "file", True, event.filename

    def _data(self, data: bytes) -> None:
        if self.current == "field":
            self.field_bytes += len(data)
            if self.field_bytes > self.limits.max_field_bytes:
                raise RejectedUpload(
                    413,
                    "field_too_large",
                    "A form field other than the "
                    "file is larger than the limit of "
                    f"{self.limits.max_field_bytes} bytes.",
                )
        elif self.current == "file" and self.kept <= self.limits.max_file_bytes:
            # One byte past the limit is enough for the validator to refuse the size.
            self.chunks.append(data)
            self.kept += len(data)


def read_file(
    stream: IO[bytes], boundary: str, limits: FormLimits, length: int | None = None
) -> tuple[bytes, str | None]:
    """The ``file`` part's bytes (at most one past the limit) and its client file name;
    ``length`` is the body's declared length (``BodyEnded`` if fewer bytes come)."""
    if not boundary:
        raise _unreadable("the Content-Type names no boundary")
    decoder = MultipartDecoder(boundary.encode("latin-1", errors="replace"))
    reading = _Reading(limits)
    received = 0
    while True:
        chunk = stream.read(_READ_BYTES)
        received += len(chunk)
        if not chunk and length is not None and received < length:
            raise BodyEnded(f"{received} of {length} bytes")
        decoder.receive_data(chunk or None)
        if _drain(decoder, reading) or not chunk:
            break
    if not reading.found:
        raise missing_file()
    return b"".join(reading.chunks)[: limits.max_file_bytes + 1], reading.filename


def _drain(decoder: MultipartDecoder, reading: _Reading) -> bool:
    """Feed the decoder's events to ``reading``; True once the form is complete."""
    try:
        while not isinstance(event := decoder.next_event(), NeedData):
            if isinstance(event, Epilogue):
                return True
            reading.take(event)
    except UnicodeDecodeError:
        raise _unreadable(
            "a part's headers are not UTF-8 (a file name in another encoding?); send them as UTF-8"
        ) from None
    except ValueError as bad:
        raise _unreadable(str(bad)) from None
    _bound_held(decoder, reading.limits)
    return False


# The decoder's states that hold every byte until a line they wait for: the first
# boundary (the preamble), or the blank line that ends a part's headers.
_WAITING_FOR_A_LINE = (State.PREAMBLE, State.PART)


def _bound_held(decoder: MultipartDecoder, limits: FormLimits) -> None:
    if decoder.state in _WAITING_FOR_A_LINE and len(decoder.buffer) > limits.max_header_bytes:
        raise RejectedUpload(
            413,
            "part_header_too_large",
            "A part's headers (or the text "
            "before the first part) are larger than the limit of "
            f"{limits.max_header_bytes} bytes.",
        )


def missing_file() -> RejectedUpload:
    return RejectedUpload(
        400, "missing_file", f"Send the image as multipart/form-data in the field '{FILE_FIELD}'."
    )


def _unreadable(why: str) -> RejectedUpload:
    return RejectedUpload(400, "unreadable_form", f"The multipart form cannot be read: {why}.")
