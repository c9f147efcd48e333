"""Validation decodes within ``Limits.max_decode_bytes``: what the web process allocates.

Large JPEGs are decoded at a reduced scale, large PNGs are checked as a stream; the same
hostile files are refused either way. Peak RSS is read in a child process (``VmHWM``).
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from bench import sample_images
from jobsapp.attachments.validation import DEFAULT_LIMITS, Limits, RejectedUpload, inspect_upload
from tests.unit import images

MIB = 1024 * 1024
# Every pixel check on the streaming path.
STREAMED = Limits(max_decode_bytes=1)

_CHILD = """
import json, sys
from jobsapp.attachments.validation import inspect_upload
data = open(sys.argv[1], "rb").read()
def kib(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field))
baseline = kib("VmRSS:")
info = inspect_upload(data)
print(json.dumps({"above_baseline": (kib("VmHWM:") - baseline) * 1024,
                  "size": [info.width, info.height]}))
"""


def validate_in_child(tmp_path: Path, data: bytes) -> dict[str, object]:
    path = tmp_path / "upload"
    path.write_bytes(data)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize(
    ("make", "size"),
    [
        # Decoded whole, the PNG took 194 MiB and the JPEG 76 MiB of the web process.
        (lambda: sample_images.png(sample_images.SQUARE_50MP), [7071, 7071]),
        (lambda: sample_images.jpeg((5200, 3900)), [5200, 3900]),
    ],
    ids=["50mp-png", "20mp-jpeg"],
)
def test_validating_a_large_image_stays_within_the_decode_bound(
    tmp_path: Path, make: object, size: list[int]
) -> None:
    assert callable(make)
    result = validate_in_child(tmp_path, make())
    assert result["size"] == size
    assert result["above_baseline"] <= DEFAULT_LIMITS.max_decode_bytes  # type: ignore[operator]


@pytest.mark.parametrize(
    "data",
    [
        images.solid("PNG", (300, 200)),
        images.png_with_alpha(),
        images.palette_png(),
        images.grey16_png(),
        images.la_png(),
        images.encode(Image.new("1", (37, 11)), "PNG"),
    ],
    ids=["rgb", "rgba", "palette", "grey16", "la", "bilevel"],
)
def test_valid_pngs_pass_the_streamed_check(data: bytes) -> None:
    streamed, decoded = inspect_upload(data, STREAMED), inspect_upload(data)
    assert streamed == decoded


def _png(ihdr: tuple[int, ...], raw: bytes, *, tail: bytes = b"") -> bytes:
    chunks = [
        (b"IHDR", struct.pack(">IIBBBBB", *ihdr)),
        (b"IDAT", zlib.compress(raw) + tail),
        (b"IEND", b""),
    ]
    return b"\x89PNG\r\n\x1a\n" + b"".join(
        struct.pack(">I", len(p)) + k + p + struct.pack(">I", zlib.crc32(k + p)) for k, p in chunks
    )


GREY_4x2 = (4, 2, 8, 0, 0, 0, 0)
# (x0, y0, dx, dy) of the Adam7 passes; Pillow reads interlaced PNGs but never writes them.
ADAM7 = (
    (0, 0, 8, 8),
    (4, 0, 8, 8),
    (0, 4, 4, 8),
    (2, 0, 4, 4),
    (0, 2, 2, 4),
    (1, 0, 2, 2),
    (0, 1, 1, 2),
)


def _adam7_grey(width: int, height: int) -> bytes:
    """The raw (filter type 0) rows of an interlaced 8-bit grey gradient, pass by pass."""
    rows = []
    for x0, y0, dx, dy in ADAM7:
        xs = range(x0, width, dx)
        if xs:
            ys = range(y0, height, dy)
            rows += [b"\x00" + bytes((x * 7 + y * 3) % 256 for x in xs) for y in ys]
    return b"".join(rows)


ROWS = b"\x00abcd\x01efgh"


def _flip_crc(data: bytes) -> bytes:
    return data[:-5] + bytes([data[-5] ^ 1]) + data[-4:]


@pytest.mark.parametrize(
    "data",
    [
        _png(GREY_4x2, ROWS[:-1]),
        _png(GREY_4x2, ROWS + b"\x00ijkl"),
        _png(GREY_4x2, b"\x00abcd\x05efgh"),
        _png(GREY_4x2, ROWS, tail=b"junk"),
        _png(GREY_4x2, ROWS)[:-12],
        _png(GREY_4x2, ROWS)[:40],
        _flip_crc(_png(GREY_4x2, ROWS)),
        _png((4, 2, 8, 7, 0, 0, 0), ROWS),
        images.png_header_only(10, 10),
    ],
    ids=[
        "short-rows",
        "extra-row",
        "bad-filter",
        "data-after-zlib",
        "no-iend",
        "cut",
        "bad-crc",
        "bad-colour-type",
        "header-only",
    ],
)
def test_damaged_pngs_are_refused_by_the_streamed_check(data: bytes) -> None:
    with pytest.raises(RejectedUpload) as refused:
        inspect_upload(data, STREAMED)
    assert (refused.value.status, refused.value.code) == (422, "corrupt_image")


@pytest.mark.parametrize(("width", "height"), [(1, 1), (3, 2), (8, 8), (13, 29), (40, 3)])
def test_interlaced_pngs_are_walked_pass_by_pass(width: int, height: int) -> None:
    raw = _adam7_grey(width, height)
    data = _png((width, height, 8, 0, 0, 0, 1), raw)
    assert inspect_upload(data, STREAMED) == inspect_upload(data)
    with pytest.raises(RejectedUpload):
        inspect_upload(_png((width, height, 8, 0, 0, 0, 1), raw[:-1]), STREAMED)


def test_the_well_formed_reference_png_passes() -> None:
    # The damaged cases above differ from this one by their defect only.
    assert inspect_upload(_png(GREY_4x2, ROWS), STREAMED).width == 4


def test_a_truncated_jpeg_is_refused_at_reduced_scale_too() -> None:
    with pytest.raises(RejectedUpload) as refused:
        inspect_upload(images.truncated_jpeg(), Limits(max_decode_bytes=1))
    assert refused.value.code == "corrupt_image"


def test_orientation_is_applied_on_the_streamed_path() -> None:
    info = inspect_upload(images.rotated_photo("PNG", orientation=6), STREAMED)
    assert (info.width, info.height) == (400, 600)


def test_a_reduced_jpeg_decode_reports_the_full_dimensions() -> None:
    info = inspect_upload(images.large_jpeg(), Limits(max_decode_bytes=MIB))
    assert (info.width, info.height) == (4000, 3000)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["1", "L", "LA", "RGB", "RGBA", "P", "I;16"]),
    st.integers(1, 40),
    st.integers(1, 40),
    st.booleans(),
)
def test_every_png_layout_passes_the_streamed_check(
    mode: str, width: int, height: int, interlace: bool
) -> None:
    data = images.encode(
        Image.linear_gradient("L").resize((width, height)).convert(mode),
        "PNG",
        interlace=int(interlace),
    )
    assert inspect_upload(data, STREAMED) == inspect_upload(data)
