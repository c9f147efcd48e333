"""The web's input checks before any route runs: the URL, and the upload's multipart form."""

from __future__ import annotations

import io

import pytest

from jobsapp.attachments.validation import RejectedUpload
from jobsapp.web.multipart import MAX_PART_HEADER_BYTES, FormLimits, read_file
from jobsapp.web.urls import raw_url, url_problem

BOUNDARY = "b0undary"
LIMITS = FormLimits(max_file_bytes=10, max_parts=3, max_field_bytes=5)


@pytest.mark.parametrize(
    ("path", "query", "problem"),
    [
        (b"/v1/attachments/x", b"limit=5", None),
        ("/v1/caf\u00e9/\u202e".encode(), "state=\uff51".encode(), None),
        (b"/v1/a\x00", b"", "control character"),
        (b"/v1/a", b"module=a\x00", "control character"),
        (b"/v1/a\n", b"", "control character"),
        (b"/v1/\xff", b"", "path is not valid UTF-8"),
        (b"/v1/\xc0\x80", b"", "path is not valid UTF-8"),  # an overlong NUL
        (b"/v1/\xed\xa0\x80", b"", "path is not valid UTF-8"),  # a lone surrogate
        (b"/v1/a", b"x=\xff", "query string is not valid UTF-8"),
    ],
)
def test_a_url_is_taken_only_as_utf8_without_controls(
    path: bytes, query: bytes, problem: str | None
) -> None:
    found = url_problem(path, query)
    assert found == problem or (problem is not None and found is not None and problem in found)


def test_the_raw_request_target_wins_over_the_decoded_path() -> None:
    # The development server decoded %FF to U+FFFD in PATH_INFO; the target keeps the byte.
    environ = {"RAW_URI": "/v/a%FF?x=%00&y=a+b", "PATH_INFO": "/v/a\xef\xbf\xbd"}
    assert raw_url(environ) == (b"/v/a\xff", b"x=\x00&y=a b")
    assert raw_url({"PATH_INFO": "/v/caf\xc3\xa9", "QUERY_STRING": "x=%00"}) == (
        "/v/café".encode(),
        b"x=\x00",
    )


def form(*parts: bytes, end: bytes = b"--b0undary--\r\n") -> io.BytesIO:
    return io.BytesIO(b"".join(b"--b0undary\r\n" + p + b"\r\n" for p in parts) + end)


def file_part(data: bytes = b"img", filename: bytes = b"a.png", name: bytes = b"file") -> bytes:
    head = b'Content-Disposition: form-data; name="%s"; filename="%s"' % (name, filename)
    return head + b"\r\n\r\n" + data


def field(value: bytes) -> bytes:
    return b'Content-Disposition: form-data; name="note"\r\n\r\n' + value


def refusal(stream: io.BytesIO) -> tuple[int, str, str]:
    with pytest.raises(RejectedUpload) as refused:
        read_file(stream, BOUNDARY, LIMITS)
    return refused.value.status, refused.value.code, refused.value.reason


def test_the_file_part_is_read_with_its_name_and_other_parts_are_dropped() -> None:
    stream = form(field(b"hi"), file_part(b"first", "é.png".encode()), file_part(b"x", name=b"y"))
    assert read_file(stream, BOUNDARY, LIMITS) == (b"first", "é.png")


def test_two_file_parts_are_a_400_not_the_first_alone() -> None:
    """``curl -F file=@a.png -F file=@b.png``: an answer for one image would tell the
    client both were kept."""
    status, code, reason = refusal(form(file_part(b"first"), file_part(b"second")))
    assert (status, code) == (400, "more_than_one_file")
    assert "more than one 'file' part" in reason


def test_a_file_over_the_limit_is_kept_to_one_byte_past_it() -> None:
    assert read_file(form(file_part(bytes(50))), BOUNDARY, LIMITS) == (bytes(11), "a.png")


def test_each_form_limit_is_named_in_its_413() -> None:
    assert refusal(form(field(b"x"), field(b"x"), field(b"x"), file_part()))[:2] == (
        413,
        "too_many_parts",
    )
    status, code, reason = refusal(form(field(b"123456"), file_part()))
    assert (status, code) == (413, "field_too_large")
    assert "5 bytes" in reason


@pytest.mark.parametrize(
    "stream",
    [
        # 2 MB of one header, then of many: the decoder would hold it all to find its end.
        form(file_part(filename=b"a" * 2_000_000)),
        form(b"X-Pad: 1\r\n" * 200_000 + file_part()),
        # A preamble that never reaches the first boundary is held the same way.
        io.BytesIO(b"p" * 2_000_000 + form(file_part()).getvalue()),
    ],
    ids=["long-header", "many-headers", "long-preamble"],
)
def test_a_part_header_over_its_limit_is_a_413_that_names_it(stream: io.BytesIO) -> None:
    status, code, reason = refusal(stream)
    assert (status, code) == (413, "part_header_too_large")
    assert f"{MAX_PART_HEADER_BYTES} bytes" in reason


def test_a_part_header_just_under_the_limit_is_read() -> None:
    filename = b"a" * (MAX_PART_HEADER_BYTES - 100)
    assert read_file(form(file_part(b"img", filename)), BOUNDARY, LIMITS) == (
        b"img",
        filename.decode(),
    )


def test_an_unreadable_form_is_a_400_with_its_cause() -> None:
    status, code, reason = refusal(form(file_part(filename="café.png".encode("latin-1"))))
    assert (status, code) == (400, "unreadable_form")
    assert "not UTF-8" in reason
    assert refusal(form(file_part(), end=b"--b0und"))[:2] == (400, "unreadable_form")
    with pytest.raises(RejectedUpload, match="boundary"):
        read_file(form(file_part()), "", LIMITS)


def test_a_form_without_the_file_field_is_missing_file() -> None:
    assert refusal(form(field(b"x"), file_part(name=b"image")))[:2] == (400, "missing_file")
