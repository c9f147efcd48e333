"""Test images, generated in memory with Pillow: valid, unusual and hostile files."""

from __future__ import annotations

import functools
import io
import struct
import zlib
from typing import Any

from hypothesis import strategies as st
from PIL import ExifTags, Image, ImageCms

RED = (255, 0, 0)
GREEN = (0, 255, 0)
BLUE = (0, 0, 255)
WHITE = (255, 255, 255)

EMPTY = b""
TEXT = b"name,salary\nalice,100\n"
SVG = b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>'
EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"
PDF = b"%PDF-1.7\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n"
HTML = b"<!doctype html><html><body><img src=x onerror=alert(1)></body></html>"

# sRGB primaries adapted to the D50 white of the ICC connection space.
_D50 = (0.9642, 1.0, 0.8249)
_SRGB_RED = (0.4360747, 0.2225045, 0.0139322)
_SRGB_GREEN = (0.3850649, 0.7168786, 0.0971045)
_SRGB_BLUE = (0.1430804, 0.0606169, 0.7141733)


def encode(img: Image.Image, fmt: str, **params: Any) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, fmt, **params)
    return buffer.getvalue()


def solid(fmt: str, size: tuple[int, int] = (64, 48)) -> bytes:
    """A plain red image."""
    return encode(Image.new("RGB", size, RED), fmt)


def mpo() -> bytes:
    """A camera-style multi-picture JPEG (primary image plus a second one)."""
    primary, second = Image.new("RGB", (64, 48), RED), Image.new("RGB", (32, 24), BLUE)
    return encode(primary, "MPO", save_all=True, append_images=[second])


@functools.cache
def large_jpeg() -> bytes:
    """A 12 MP (4000x3000) photo-sized JPEG, built from gradients so it is quick to make."""
    size = (4000, 3000)
    linear = Image.linear_gradient("L").resize(size)
    radial = Image.radial_gradient("L").resize(size)
    mirrored = linear.transpose(Image.Transpose.FLIP_TOP_BOTTOM)
    return encode(Image.merge("RGB", (linear, radial, mirrored)), "JPEG", quality=80)


def png_with_alpha(size: tuple[int, int] = (200, 100)) -> bytes:
    """Opaque red left half, fully transparent right half."""
    img = Image.new("RGBA", size, (0, 0, 0, 0))
    img.paste((*RED, 255), (0, 0, size[0] // 2, size[1]))
    return encode(img, "PNG")


def halves(
    size: tuple[int, int], first: tuple[int, int, int], second: tuple[int, int, int]
) -> Image.Image:
    """Left half ``first``, right half ``second``."""
    img = Image.new("RGB", size, second)
    img.paste(first, (0, 0, size[0] // 2, size[1]))
    return img


def banded_png(size: tuple[int, int], band: int) -> bytes:
    """Green, with ``band`` pixels of red at the start and blue at the end of the long side."""
    width, height = size
    img = Image.new("RGB", size, GREEN)
    if width >= height:
        img.paste(RED, (0, 0, band, height))
        img.paste(BLUE, (width - band, 0, width, height))
    else:
        img.paste(RED, (0, 0, width, band))
        img.paste(BLUE, (0, height - band, width, height))
    return encode(img, "PNG")


def private_exif(orientation: int) -> Image.Exif:
    """EXIF with an orientation, a camera serial and a GPS position."""
    exif = Image.Exif()
    exif[ExifTags.Base.Orientation] = orientation
    exif[ExifTags.Base.BodySerialNumber] = "SN-123456"
    exif[ExifTags.Base.GPSInfo] = {
        ExifTags.GPS.GPSLatitudeRef: "N",
        ExifTags.GPS.GPSLatitude: (52.0, 22.0, 1.5),
        ExifTags.GPS.GPSLongitudeRef: "E",
        ExifTags.GPS.GPSLongitude: (4.0, 53.0, 2.5),
    }
    return exif


XMP = (
    b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-'
    b'syntax-ns#"><rdf:Description xmlns:exif="http://ns.adobe.com/exif/1.0/" '
    b'exif:GPSLatitude="52,22.025N"/></rdf:RDF></x:xmpmeta>'
)


def rotated_photo(fmt: str = "JPEG", orientation: int = 6) -> bytes:
    """600x400 as stored (left half red, right half blue), with EXIF incl. GPS, XMP and ICC.

    Orientation 6 means the viewer turns it 90° clockwise: 400x600 with red on top.
    """
    params: dict[str, Any] = {
        "exif": private_exif(orientation),
        "xmp": XMP,
        "icc_profile": srgb_profile(),
    }
    if fmt == "JPEG":
        params["comment"] = b"shot at home"
    return encode(halves((600, 400), RED, BLUE), fmt, **params)


def animated_gif() -> bytes:
    frames = [Image.new("RGB", (40, 30), color) for color in (RED, GREEN, BLUE)]
    return encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)


def animated_webp() -> bytes:
    frames = [Image.new("RGBA", (40, 30), (*color, 255)) for color in (RED, GREEN, BLUE)]
    return encode(frames[0], "WEBP", save_all=True, append_images=frames[1:], duration=100)


def cmyk_jpeg() -> bytes:
    """Pure cyan in CMYK, no profile."""
    return encode(Image.new("CMYK", (64, 48), (255, 0, 0, 0)), "JPEG", quality=95)


def palette_png(transparent: bool = True) -> bytes:
    """P mode: index 0 red, index 1 blue; left half index 0, which is transparent if asked."""
    img = Image.new("P", (64, 48), 1)
    img.putpalette([*RED, *BLUE])
    img.paste(0, (0, 0, 32, 48))
    return encode(img, "PNG", transparency=0) if transparent else encode(img, "PNG")


def grey16_png(value: int = 32768) -> bytes:
    """16-bit greyscale, which Pillow opens as I;16."""
    return encode(Image.new("I;16", (32, 24), value), "PNG")


def la_png() -> bytes:
    return encode(Image.new("LA", (32, 24), (128, 64)), "PNG")


@functools.cache
def noisy_jpeg() -> bytes:
    return encode(Image.effect_noise((256, 256), 64).convert("RGB"), "JPEG", quality=90)


def truncated_jpeg() -> bytes:
    """A JPEG cut off partway through its scan data."""
    data = noisy_jpeg()
    return data[: len(data) * 6 // 10]


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims the given size, followed by a token IDAT that is not valid."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", ihdr)
        + _chunk(b"IDAT", b"\x00" * 8)
        + _chunk(b"IEND", b"")
    )


def _chunk(kind: bytes, payload: bytes) -> bytes:
    crc = zlib.crc32(kind + payload)
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)


@functools.cache
def srgb_profile() -> bytes:
    return ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()


@functools.cache
def swapped_primaries_profile() -> bytes:
    """A linear RGB ICC profile whose red primary is sRGB's green and vice versa.

    Pure red in this space is pure green in sRGB, so a conversion that happened is visible.
    """
    curve = b"curv" + bytes(4) + struct.pack(">I", 0)  # no entries: identity curve
    tags = [
        (b"wtpt", _xyz(_D50)),
        (b"rXYZ", _xyz(_SRGB_GREEN)),
        (b"gXYZ", _xyz(_SRGB_RED)),
        (b"bXYZ", _xyz(_SRGB_BLUE)),
        (b"rTRC", curve),
        (b"gTRC", curve),
        (b"bTRC", curve),
    ]
    offset = 128 + 4 + 12 * len(tags)
    table, body = b"", b""
    for signature, data in tags:
        table += signature + struct.pack(">II", offset + len(body), len(data))
        body += data
    size = offset + len(body)
    header = (
        struct.pack(">I", size)
        + b"lcms"
        + struct.pack(">I", 0x02100000)
        + b"mntrRGB XYZ "
        + bytes(12)
        + b"acsp"
        + bytes(24)
        + struct.pack(">I", 0)
        + _s15(_D50)
        + bytes(48)
    )
    return header + struct.pack(">I", len(tags)) + table + body


def _xyz(values: tuple[float, float, float]) -> bytes:
    return b"XYZ " + bytes(4) + _s15(values)


def _s15(values: tuple[float, float, float]) -> bytes:
    return struct.pack(">3i", *(round(v * 65536) for v in values))


def damaged_images() -> st.SearchStrategy[bytes]:
    """Small valid images of each format with a few bytes overwritten and maybe cut short."""
    seeds = [
        solid("JPEG", (16, 12)),
        solid("PNG", (16, 12)),
        solid("WEBP", (16, 12)),
        animated_gif(),
        palette_png(),
    ]
    return st.sampled_from(seeds).flatmap(_damage)


@st.composite
def _damage(draw: st.DrawFn, seed: bytes) -> bytes:
    data = bytearray(seed)
    for _ in range(draw(st.integers(0, 4))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data[: draw(st.integers(1, len(data)))])
