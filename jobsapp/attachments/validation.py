"""Check an uploaded file's bytes before anything durable happens.

Nothing the client declares (content type, file name) is trusted: the format comes from the
magic bytes, the dimensions from the image header, and the image must decode completely.
"""

from __future__ import annotations

import hashlib
import io
import re
import unicodedata
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType

from PIL import ExifTags, Image, ImageFile

SUPPORTED_FORMATS: frozenset[str] = frozenset({"JPEG", "PNG", "WEBP", "GIF"})

CONTENT_TYPES: Mapping[str, str] = MappingProxyType(
    {"JPEG": "image/jpeg", "PNG": "image/png", "WEBP": "image/webp", "GIF": "image/gif"}
)

EXTENSIONS: Mapping[str, str] = MappingProxyType(
    {"JPEG": "jpg", "PNG": "png", "WEBP": "webp", "GIF": "gif"}
)

# Camera JPEGs carrying a Multi-Picture index are reported by Pillow as MPO; the primary
# image is still an ordinary JPEG.
_PILLOW_FORMAT_ALIASES: dict[str, str] = {"MPO": "JPEG"}

# EXIF orientations whose transform swaps width and height (transpose and the 90° turns).
_SWAPPING_ORIENTATIONS = frozenset({5, 6, 7, 8})

_SNIFF_BYTES = 12
_MAX_DISPLAY_NAME = 255
_DEFAULT_DISPLAY_NAME = "upload"
_PATH_SEPARATORS = re.compile(r"[/\\]")


@dataclass(frozen=True)
class Limits:
    """What an upload may be; the defaults suit photos and screenshots."""

    max_bytes: int = 25 * 1024 * 1024
    max_pixels: int = 50_000_000
    formats: frozenset[str] = SUPPORTED_FORMATS

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.max_pixels < 1:
            raise ValueError("limits must be positive")
        if not self.formats <= SUPPORTED_FORMATS:
            unknown = sorted(self.formats - SUPPORTED_FORMATS)
            raise ValueError(f"formats not supported by the sniffer: {unknown}")


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class ImageInfo:
    """What was learnt from a valid upload.

    ``width`` and ``height`` are the displayed dimensions, i.e. after the EXIF orientation is
    applied, so they match what the pipeline renders.
    """

    format: str
    content_type: str
    width: int
    height: int
    size: int
    sha256: str

    @property
    def extension(self) -> str:
        """File extension for the original's storage key, derived from the sniffed format."""
        return EXTENSIONS[self.format]


class RejectedUpload(Exception):
    """The upload is refused; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, code: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.code = code
        self.reason = reason


def sniff_format(head: bytes) -> str | None:
    """Pillow format name from the leading magic bytes, or None when not an accepted image."""
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "GIF"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    return None


def inspect_upload(data: bytes, limits: Limits = DEFAULT_LIMITS) -> ImageInfo:
    """Validate an upload, cheapest checks first, and describe it.

    Raises RejectedUpload for anything that is not a complete, decodable image within limits.
    """
    _check_size(len(data), limits)
    fmt = _check_format(data, limits)
    width, height = _check_image(data, fmt, limits)
    return ImageInfo(
        format=fmt,
        content_type=CONTENT_TYPES[fmt],
        width=width,
        height=height,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )


def display_size(img: Image.Image) -> tuple[int, int]:
    """Size of the image once its EXIF orientation is applied."""
    width, height = img.size
    if img.getexif().get(ExifTags.Base.Orientation) in _SWAPPING_ORIENTATIONS:
        return height, width
    return width, height


def sanitize_display_name(name: str | None) -> str:
    """Make a client file name safe to show; it is never used to build a storage key."""
    base = _PATH_SEPARATORS.split(name or "")[-1]
    # Format characters go too: a right-to-left override makes "x\u202egpj.exe" show as
    # "xexe.jpg".
    visible = "".join(ch for ch in base if not unicodedata.category(ch).startswith("C"))
    # Normalise after removing characters, since a removal can bring combinable marks together.
    cleaned = unicodedata.normalize("NFC", visible)[:_MAX_DISPLAY_NAME].strip()
    if cleaned in {"", ".", ".."}:
        return _DEFAULT_DISPLAY_NAME
    return cleaned


def _check_size(size: int, limits: Limits) -> None:
    if size == 0:
        raise RejectedUpload(400, "empty_file", "The uploaded file is empty.")
    if size > limits.max_bytes:
        raise RejectedUpload(
            413, "too_large", f"The file is larger than the limit of {limits.max_bytes} bytes."
        )


def _check_format(data: bytes, limits: Limits) -> str:
    fmt = sniff_format(data[:_SNIFF_BYTES])
    if fmt is None or fmt not in limits.formats:
        allowed = ", ".join(sorted(limits.formats))
        raise RejectedUpload(
            415, "unsupported_format", f"The file is not an accepted image format ({allowed})."
        )
    return fmt


def _check_image(data: bytes, fmt: str, limits: Limits) -> tuple[int, int]:
    _require_strict_decoding()
    with _pillow_failures_rejected(), Image.open(io.BytesIO(data), formats=[fmt]) as img:
        _check_header(img, fmt, limits)
        # Only the first frame is rendered, so it is the one that has to decode.
        img.load()
        return display_size(img)


def _check_header(img: ImageFile.ImageFile, fmt: str, limits: Limits) -> None:
    # Image.open has read only the header so far: this runs before any pixel is decoded.
    width, height = img.size
    if width * height > limits.max_pixels:
        raise RejectedUpload(
            422,
            "pixel_limit",
            f"The image has {width}x{height} pixels, more than the limit of {limits.max_pixels}.",
        )
    detected = img.format or ""
    detected = _PILLOW_FORMAT_ALIASES.get(detected, detected)
    if detected != fmt:
        raise RejectedUpload(422, "corrupt_image", "The image data does not match its format.")


def _require_strict_decoding() -> None:
    # With this flag on, Pillow pads a truncated image with grey instead of failing, and a
    # damaged upload would be accepted. It is process-wide, so refuse to run under it.
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise RuntimeError("PIL.ImageFile.LOAD_TRUNCATED_IMAGES must stay False")


@contextmanager
def _pillow_failures_rejected() -> Iterator[None]:
    try:
        yield
    except (RejectedUpload, MemoryError):
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        # Pillow's own bomb guard fires inside Image.open, before our pixel check can run;
        # the warning arrives as an exception when warnings are configured as errors.
        raise RejectedUpload(
            422, "pixel_limit", "The image has more pixels than the limit."
        ) from exc
    except Exception as exc:
        # Hostile bytes surface from Pillow's parsers as many exception types (OSError,
        # SyntaxError, struct.error, IndexError...); all of them mean the upload is unusable.
        raise RejectedUpload(
            422, "corrupt_image", "The image is damaged or truncated and cannot be decoded."
        ) from exc
