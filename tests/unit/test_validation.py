"""Upload validation: hostile files are refused with the right status, valid ones described."""

from __future__ import annotations

import hashlib
import unicodedata
import warnings
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageFile

from jobsapp.attachments.validation import (
    DEFAULT_LIMITS,
    ImageInfo,
    Limits,
    RejectedUpload,
    inspect_upload,
    sanitize_display_name,
    sniff_format,
)
from tests.unit import images


def rejection(data: bytes, limits: Limits = DEFAULT_LIMITS) -> tuple[int, str]:
    with pytest.raises(RejectedUpload) as caught:
        inspect_upload(data, limits)
    assert caught.value.reason
    return caught.value.status, caught.value.code


@pytest.mark.parametrize(
    ("data", "status", "code"),
    [
        pytest.param(images.EMPTY, 400, "empty_file", id="zero-byte"),
        pytest.param(images.TEXT, 415, "unsupported_format", id="text"),
        pytest.param(images.SVG, 415, "unsupported_format", id="svg"),
        pytest.param(images.EPS, 415, "unsupported_format", id="eps"),
        pytest.param(images.PDF, 415, "unsupported_format", id="pdf"),
        pytest.param(images.HTML, 415, "unsupported_format", id="html"),
        pytest.param(images.solid("BMP"), 415, "unsupported_format", id="bmp"),
        pytest.param(images.truncated_jpeg(), 422, "corrupt_image", id="truncated-jpeg"),
        pytest.param(b"\xff\xd8\xff\xe0" + bytes(100), 422, "corrupt_image", id="jpeg-magic-only"),
        pytest.param(b"GIF89a" + bytes(100), 422, "corrupt_image", id="gif-magic-only"),
        pytest.param(b"RIFF\x10\x00\x00\x00WEBPVP8 ", 422, "corrupt_image", id="webp-magic-only"),
        pytest.param(images.png_header_only(10, 10), 422, "corrupt_image", id="png-bad-idat"),
        pytest.param(images.png_header_only(0, 10), 422, "corrupt_image", id="png-zero-width"),
        pytest.param(images.png_header_only(100_000, 100_000), 422, "pixel_limit", id="png-bomb"),
    ],
)
def test_hostile_files_are_rejected(data: bytes, status: int, code: str) -> None:
    assert rejection(data) == (status, code)


def test_too_large_is_rejected_before_anything_else() -> None:
    # Not even an image: the size check must come first and not look at the content.
    assert rejection(images.TEXT, Limits(max_bytes=10)) == (413, "too_large")


def test_size_at_the_limit_is_accepted() -> None:
    data = images.solid("PNG")
    assert inspect_upload(data, Limits(max_bytes=len(data))).size == len(data)


def test_pixel_limit_is_checked_from_the_header() -> None:
    data = images.solid("PNG", size=(100, 100))
    assert rejection(data, Limits(max_pixels=9_999)) == (422, "pixel_limit")
    assert inspect_upload(data, Limits(max_pixels=10_000)).width == 100


def test_pillow_bomb_warning_becomes_pixel_limit() -> None:
    # 100 MP is between Pillow's warning and error thresholds: only its warning fires.
    header = images.png_header_only(10_000, 10_000)
    generous = Limits(max_pixels=10**9)
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        assert rejection(header, generous) == (422, "pixel_limit")
    with pytest.warns(Image.DecompressionBombWarning):
        assert rejection(header) == (422, "pixel_limit")


def test_format_outside_the_allowed_set_is_unsupported() -> None:
    assert rejection(images.solid("JPEG"), Limits(formats=frozenset({"PNG"}))) == (
        415,
        "unsupported_format",
    )


def test_magic_of_one_format_with_body_of_another_is_corrupt() -> None:
    png = images.solid("PNG")
    assert rejection(b"\xff\xd8\xff" + png) == (422, "corrupt_image")


@pytest.mark.parametrize(
    ("data", "fmt", "content_type", "size"),
    [
        pytest.param(images.solid("JPEG", (64, 48)), "JPEG", "image/jpeg", (64, 48), id="jpeg"),
        pytest.param(images.png_with_alpha(), "PNG", "image/png", (200, 100), id="png"),
        pytest.param(images.solid("WEBP", (30, 20)), "WEBP", "image/webp", (30, 20), id="webp"),
        pytest.param(images.animated_gif(), "GIF", "image/gif", (40, 30), id="gif"),
        pytest.param(images.animated_webp(), "WEBP", "image/webp", (40, 30), id="anim-webp"),
        pytest.param(images.cmyk_jpeg(), "JPEG", "image/jpeg", (64, 48), id="cmyk"),
        pytest.param(images.palette_png(), "PNG", "image/png", (64, 48), id="palette"),
        pytest.param(images.grey16_png(), "PNG", "image/png", (32, 24), id="grey16"),
        pytest.param(images.large_jpeg(), "JPEG", "image/jpeg", (4000, 3000), id="12mp"),
        pytest.param(images.mpo(), "JPEG", "image/jpeg", (64, 48), id="camera-mpo"),
    ],
)
def test_valid_images_are_described(
    data: bytes, fmt: str, content_type: str, size: tuple[int, int]
) -> None:
    info = inspect_upload(data)
    assert info == ImageInfo(
        format=fmt,
        content_type=content_type,
        width=size[0],
        height=size[1],
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_dimensions_are_as_displayed_after_exif_orientation(fmt: str) -> None:
    info = inspect_upload(images.rotated_photo(fmt, orientation=6))
    assert (info.width, info.height) == (400, 600)


def test_extension_follows_the_sniffed_format() -> None:
    assert inspect_upload(images.solid("JPEG")).extension == "jpg"
    assert inspect_upload(images.animated_gif()).extension == "gif"


@pytest.mark.parametrize(
    ("head", "fmt"),
    [
        (b"\xff\xd8\xff\xdb", "JPEG"),
        (b"\x89PNG\r\n\x1a\n\x00", "PNG"),
        (b"GIF87a", "GIF"),
        (b"GIF89a", "GIF"),
        (b"RIFF\x00\x00\x00\x00WEBPVP8X", "WEBP"),
        (b"RIFF\x00\x00\x00\x00WAVEfmt ", None),
        (b"\xff\xd8", None),
        (b"<svg", None),
        (b"%PDF-1.7", None),
        (b"", None),
    ],
)
def test_sniff_format(head: bytes, fmt: str | None) -> None:
    assert sniff_format(head) == fmt


def test_truncated_images_are_not_tolerated_anywhere() -> None:
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


def test_validation_refuses_to_run_with_truncated_loading_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(RuntimeError, match="LOAD_TRUNCATED_IMAGES"):
        inspect_upload(images.truncated_jpeg())


@pytest.mark.parametrize(
    "make",
    [
        lambda: Limits(max_bytes=0),
        lambda: Limits(max_pixels=0),
        lambda: Limits(formats=frozenset({"TIFF"})),
    ],
)
def test_limits_reject_nonsense(make: Callable[[], Limits]) -> None:
    with pytest.raises(ValueError, match=r"positive|not supported"):
        make()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("../../etc/passwd", "passwd"),
        ("..\\..\\windows\\win.ini", "win.ini"),
        ("C:\\Users\\ann\\photo.jpg", "photo.jpg"),
        ("/abs/path/cv.pdf", "cv.pdf"),
        ("photos/", "upload"),
        ("..", "upload"),
        ("   ", "upload"),
        ("", "upload"),
        (None, "upload"),
        ("a\x00b\nc\td.jpg", "abcd.jpg"),
        ("invoice\u202egpj.exe", "invoicegpj.exe"),
        ("cafe\u0301.png", "caf\u00e9.png"),
        ("  spaced name.png  ", "spaced name.png"),
        ("x" * 300, "x" * 255),
        ("x" * 1000 + ".jpeg", "x" * 250 + ".jpeg"),
        ("x" * 300 + "." + "y" * 40, ("x" * 300 + "." + "y" * 40)[:255]),
    ],
)
def test_sanitize_display_name(name: str | None, expected: str) -> None:
    assert sanitize_display_name(name) == expected


@given(st.one_of(st.none(), st.text(max_size=400)))
def test_sanitized_names_are_always_safe_to_show(name: str | None) -> None:
    cleaned = sanitize_display_name(name)
    assert 0 < len(cleaned) <= 255
    assert "/" not in cleaned
    assert "\\" not in cleaned
    assert cleaned not in {".", ".."}
    assert cleaned == cleaned.strip()
    assert unicodedata.is_normalized("NFC", cleaned)
    assert not any(unicodedata.category(ch).startswith("C") for ch in cleaned)


@given(st.text(min_size=260, max_size=400), st.sampled_from([".jpg", ".png", ".webp", ".jpeg"]))
def test_a_long_names_extension_survives_its_cut(stem: str, extension: str) -> None:
    cleaned = sanitize_display_name("x" + stem.replace("/", "").replace("\\", "") + extension)
    assert cleaned.endswith(extension)


_MAGIC = [b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF89a", b"RIFF\x00\x00\x00\x00WEBP"]
upload_bytes = st.one_of(
    st.binary(max_size=256),
    st.tuples(st.sampled_from(_MAGIC), st.binary(max_size=256)).map(b"".join),
    images.damaged_images(),
)


def outcome(data: bytes) -> ImageInfo | RejectedUpload:
    try:
        return inspect_upload(data)
    except RejectedUpload as rejected:
        return rejected


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(upload_bytes)
def test_arbitrary_bytes_are_either_described_or_rejected(data: bytes) -> None:
    # Anything but a RejectedUpload escaping inspect_upload fails this test.
    result = outcome(data)
    if isinstance(result, RejectedUpload):
        assert result.status in {400, 413, 415, 422}
    else:
        assert result.size == len(data)
        assert result.width * result.height <= DEFAULT_LIMITS.max_pixels
