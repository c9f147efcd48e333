"""Check an uploaded file's bytes before anything durable happens.

Nothing the client declares (content type, file name) is trusted: the format comes from the
magic bytes, the dimensions from the image header, and the image must decode completely.
What the check decodes is bounded (``Limits.max_decode_bytes``): a JPEG larger than that is
decoded at a reduced scale, which still reads every scan; a PNG has its chunks, checksums
and zlib stream checked row by row without building the image; a WebP or GIF frame larger
than that has its header checked here and is decoded by the worker only (``corrupt_image``).
"""

from __future__ import annotations

import hashlib
import io
import math
import re
import struct
import unicodedata
import zlib
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
_PILLOW_BYTES = 4
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_CHUNK_OVERHEAD = 12
_IHDR_LENGTH = 13
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
# (x0, y0, dx, dy) of the seven Adam7 passes.
_ADAM7 = (
    (0, 0, 8, 8),
    (4, 0, 8, 8),
    (0, 4, 4, 8),
    (2, 0, 4, 4),
    (0, 2, 2, 4),
    (1, 0, 2, 2),
    (0, 1, 1, 2),
)
_MAX_FILTER = 4
_INFLATE_STEP = 1 << 20
_MAX_DISPLAY_NAME = 255
_MAX_EXTENSION = 16
_DEFAULT_DISPLAY_NAME = "upload"
_PATH_SEPARATORS = re.compile(r"[/\\]")


@dataclass(frozen=True)
class Limits:
    """What an upload may be; the defaults suit photos and screenshots."""

    max_bytes: int = 25 * 1024 * 1024
    max_pixels: int = 50_000_000
    formats: frozenset[str] = SUPPORTED_FORMATS
    # Pixel memory the check may allocate (Pillow keeps 4 bytes per RGB(A) pixel): 16 MP.
    max_decode_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.max_pixels < 1 or self.max_decode_bytes < 1:
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


def display_size(img: Image.Image, data: bytes) -> tuple[int, int]:
    """Size of the image ``data`` opened as ``img`` once its EXIF orientation is applied."""
    width, height = img.size
    if orientation(img, data) in _SWAPPING_ORIENTATIONS:
        return height, width
    return width, height


def orientation(img: Image.Image, data: bytes) -> int:
    """The EXIF orientation (1 when there is none), read without decoding any pixel.

    Pillow's PNG ``getexif()`` decodes the whole image to look for an eXIf chunk after the
    image data; the chunks are scanned here instead.
    """
    if img.format == "PNG" and "exif" not in img.info:
        found = next((payload for kind, payload in _png_chunks(data) if kind == b"eXIf"), None)
        if found is None:
            return 1
        exif = Image.Exif()
        exif.load(found)
    else:
        exif = img.getexif()
    value = exif.get(ExifTags.Base.Orientation, 1)
    return value if isinstance(value, int) else 1


def sanitize_display_name(name: str | None) -> str:
    """Make a client file name safe to show; it is never used to build a storage key."""
    base = _PATH_SEPARATORS.split(name or "")[-1]
    # Format characters go too: a right-to-left override makes "x\u202egpj.exe" show as
    # "xexe.jpg".
    visible = "".join(ch for ch in base if not unicodedata.category(ch).startswith("C"))
    # Normalise after removing characters, since a removal can bring combinable marks together.
    cleaned = _shortened(unicodedata.normalize("NFC", visible)).strip()
    if cleaned in {"", ".", ".."}:
        return _DEFAULT_DISPLAY_NAME
    return cleaned


def _shortened(name: str) -> str:
    """``name`` within the column's length, its extension kept: a cut ".jpg" is what a
    person (and a download's Save As) reads the file by."""
    if len(name) <= _MAX_DISPLAY_NAME:
        return name
    stem, dot, extension = name.rpartition(".")
    if not dot or not stem or len(extension) > _MAX_EXTENSION:
        return name[:_MAX_DISPLAY_NAME]
    return stem[: _MAX_DISPLAY_NAME - len(extension) - 1] + dot + extension


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
        # Before decoding: a reduced-scale JPEG decode changes img.size.
        size = display_size(img, data)
        # Only the first frame is rendered, so it is the one that has to decode.
        _decode_within(img, data, limits.max_decode_bytes)
        return size


def _decode_within(img: ImageFile.ImageFile, data: bytes, budget: int) -> None:
    width, height = img.size
    bytes_per_pixel = _PILLOW_BYTES if len(img.mode) > 1 else 1
    if width * height * bytes_per_pixel <= budget:
        img.load()
    elif img.format == "JPEG":
        # libjpeg scales by 1/2, 1/4 or 1/8 while decoding every scan of the file.
        img.draft(None, (math.ceil(width / 8), math.ceil(height / 8)))
        img.load()
    elif img.format == "PNG":
        check_png_stream(data)


def check_png_stream(data: bytes) -> None:
    """Check a PNG as a decoder reads it, in bounded memory: chunk CRCs, a complete zlib
    stream of exactly the rows the header promises, a valid filter type on every row.

    Raises ValueError describing the first defect.
    """
    chunks = _png_chunks(data)
    header = next(chunks, None)
    if header is None or header[0] != b"IHDR" or len(header[1]) != _IHDR_LENGTH:
        raise ValueError("PNG does not start with IHDR")
    walker = _RowWalker(_png_rows(*struct.unpack(">IIBBBBB", header[1])))
    inflater = zlib.decompressobj()
    for kind, payload in chunks:
        if kind == b"IDAT":
            _inflate(inflater, payload, walker)
        elif kind == b"IEND":
            break
    else:
        raise ValueError("PNG has no IEND chunk")
    if not inflater.eof or not walker.finished():
        raise ValueError("PNG image data ends early")


def _png_chunks(data: bytes) -> Iterator[tuple[bytes, bytes]]:
    offset = len(_PNG_MAGIC)
    while offset + _CHUNK_OVERHEAD <= len(data):
        (length,) = struct.unpack_from(">I", data, offset)
        end = offset + 8 + length
        if end + 4 > len(data):
            raise ValueError("PNG chunk runs past the end of the file")
        kind, payload = data[offset + 4 : offset + 8], data[offset + 8 : end]
        (crc,) = struct.unpack_from(">I", data, end)
        if zlib.crc32(kind + payload) != crc:
            raise ValueError(f"PNG chunk {kind!r} fails its CRC")
        yield kind, payload
        offset = end + 4


def _png_rows(
    width: int, height: int, depth: int, colour: int, _c: int, _f: int, interlace: int
) -> Iterator[tuple[int, int]]:
    """``(rows, bytes per row)`` of each pass in stream order, filter bytes included."""
    if colour not in _PNG_CHANNELS or interlace not in (0, 1):
        raise ValueError("PNG header has an unknown colour type or interlace method")
    bits = depth * _PNG_CHANNELS[colour]
    for x0, y0, dx, dy in _ADAM7 if interlace else ((0, 0, 1, 1),):
        pass_width, pass_height = -(-(width - x0) // dx), -(-(height - y0) // dy)
        if pass_width > 0 and pass_height > 0:
            yield pass_height, 1 + -(-pass_width * bits // 8)


def _inflate(inflater: zlib._Decompress, payload: bytes, walker: _RowWalker) -> None:
    pending = payload
    while pending and not inflater.eof:
        walker.feed(inflater.decompress(pending, _INFLATE_STEP))
        pending = inflater.unconsumed_tail
    if inflater.eof and (pending or inflater.unused_data):
        raise ValueError("PNG has data after the end of its zlib stream")


class _RowWalker:
    """Follows the row boundaries through the inflated stream and checks every filter byte.

    Whole rows of a chunk are checked with one slice, so a tall, narrow image costs no
    Python loop per row.
    """

    def __init__(self, runs: Iterator[tuple[int, int]]) -> None:
        self._runs = runs
        self._rows_left, self._row_bytes = 0, 1
        # Bytes of the current row already seen; 0 means the next byte is a filter type.
        self._into_row = 0

    def finished(self) -> bool:
        """Whether every row has arrived (call once, at the end of the stream)."""
        return self._rows_left == 0 and next(self._runs, None) is None

    def feed(self, chunk: bytes) -> None:
        offset = 0
        while offset < len(chunk):
            if self._rows_left == 0:
                self._rows_left, self._row_bytes = next(self._runs, (0, 1))
                if self._rows_left == 0:
                    raise ValueError("PNG image data is longer than its rows")
            offset = self._take(chunk, offset)

    def _take(self, chunk: bytes, offset: int) -> int:
        available = len(chunk) - offset
        if self._into_row:
            taken = min(self._row_bytes - self._into_row, available)
            self._into_row = (self._into_row + taken) % self._row_bytes
            if self._into_row == 0:
                self._rows_left -= 1
            return offset + taken
        whole = min(self._rows_left, available // self._row_bytes)
        span = max(whole, 1) * self._row_bytes
        if max(chunk[offset : offset + span : self._row_bytes]) > _MAX_FILTER:
            raise ValueError("PNG row has an unknown filter type")
        if whole:
            self._rows_left -= whole
            return offset + whole * self._row_bytes
        self._into_row = available
        return len(chunk)


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
