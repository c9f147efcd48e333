"""Versioned image variants: what each pipeline version produces, and producing it.

Planning (versions, storage keys, output sizes) is pure. Rendering takes the source bytes
and returns encoded variant bytes; it never touches files or the network.
"""

from __future__ import annotations

import hashlib
import io
import math
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar, Literal
from uuid import UUID

from PIL import Image, ImageCms, ImageOps

from .validation import CONTENT_TYPES, SUPPORTED_FORMATS, display_size

VariantKind = Literal["fit", "square", "reencode"]
OutputFormat = Literal["WEBP", "JPEG"]

# As in Pillow's thumbnail(): decode and reduce to no less than twice the target, then
# resample; close to resampling the full image, at a fraction of the cost.
REDUCING_GAP = 2.0

# libwebp's default effort; pinned because outputs must be byte-identical across runs.
_WEBP_METHOD = 4
# The largest side each encoder can write; a wider panorama is scaled down to fit.
_MAX_SIDE: dict[str, int] = {"WEBP": 16383, "JPEG": 65500}
_WHITE = (255, 255, 255)
_SOURCE_FORMATS = tuple(sorted(SUPPORTED_FORMATS))
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")
_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)*")
_SRGB = ImageCms.createProfile("sRGB")
_ICC_SPACE = {"RGB": "RGB", "CMYK": "CMYK", "L": "GRAY"}
_WITHOUT_ALPHA = {"LA": "L", "RGBA": "RGB"}
# Modes the colour step takes as they are; others are converted to RGB or RGBA first.
_DIRECT_MODES = frozenset({"L", "LA", "RGB", "RGBA", "CMYK"})
_SIXTEEN_TO_EIGHT_BITS = 1 / 256


class PipelineError(Exception):
    """A variant cannot be produced. ``permanent`` tells whether retrying is pointless."""

    error_code: ClassVar[str] = "pipeline_error"
    permanent: ClassVar[bool] = False


class UnknownPipeline(PipelineError):
    """The pipeline version is not in this build's registry.

    Not permanent: during a rolling deploy an older worker can meet a version that a newer
    one knows.
    """

    error_code = "unknown_pipeline"


class CorruptImage(PipelineError):
    """The source does not decode; no retry can change that."""

    error_code = "corrupt_image"
    permanent = True


@dataclass(frozen=True)
class VariantSpec:
    """One output of a pipeline version.

    ``size`` is the bound in pixels: the longest side for "fit" (never upscaled), the side of
    the centred crop for "square". "reencode" has none: it keeps the source size, unless that
    exceeds what the encoder can write.
    """

    name: str
    kind: VariantKind
    size: int | None
    format: OutputFormat
    quality: int

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"variant name {self.name!r} cannot be part of a storage key")
        if (self.size is None) != (self.kind == "reencode"):
            raise ValueError("exactly the reencode variants have no size")
        if self.size is not None and self.size < 1:
            raise ValueError("variant size must be positive")
        if not 1 <= self.quality <= 100:
            raise ValueError("quality must be within 1-100")


@dataclass(frozen=True)
class PipelineVersion:
    """A numbered, immutable set of variants."""

    number: int
    variants: tuple[VariantSpec, ...]

    def __post_init__(self) -> None:
        names = [spec.name for spec in self.variants]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate variant names in pipeline {self.number}: {names}")


@dataclass(frozen=True)
class PlannedVariant:
    """The output dimensions a variant will have."""

    name: str
    width: int
    height: int


@dataclass(frozen=True)
class RenderedVariant:
    """An encoded variant, ready to publish."""

    data: bytes
    sha256: str
    width: int
    height: int
    content_type: str


# Storage keys embed the version number, so a published version must never change:
# add a new number instead.
PIPELINES: Mapping[int, PipelineVersion] = MappingProxyType(
    {
        1: PipelineVersion(
            1,
            (
                VariantSpec("thumbnail", "fit", 256, "WEBP", 80),
                VariantSpec("crop", "square", 512, "WEBP", 80),
                VariantSpec("optimized", "reencode", None, "WEBP", 82),
            ),
        ),
        2: PipelineVersion(
            2,
            (
                VariantSpec("thumbnail", "fit", 512, "WEBP", 80),
                VariantSpec("crop", "square", 1024, "WEBP", 80),
                VariantSpec("optimized", "reencode", None, "WEBP", 75),
            ),
        ),
    }
)


def get_pipeline(version: int) -> PipelineVersion:
    """The registered pipeline; raises UnknownPipeline for a version this build lacks."""
    try:
        return PIPELINES[version]
    except KeyError:
        raise UnknownPipeline(f"no image pipeline version {version}") from None


def latest_version() -> int:
    """The version new attachments are rendered with."""
    return max(PIPELINES)


def variant_key(prefix: str, attachment_id: UUID, version: int, variant: str) -> str:
    """Storage key of a rendered variant, built from server-side values only."""
    if version < 1:
        raise ValueError("pipeline versions start at 1")
    return f"{_attachment_root(prefix, attachment_id)}/v{version}/{_checked_name(variant)}"


def original_key(prefix: str, attachment_id: UUID, ext: str) -> str:
    """Storage key of the original upload; ``ext`` comes from the sniffed format."""
    return f"{_attachment_root(prefix, attachment_id)}/original.{_checked_name(ext)}"


def output_size(spec: VariantSpec, width: int, height: int) -> tuple[int, int]:
    """Dimensions the variant will have for an upright source of the given size."""
    if width < 1 or height < 1:
        raise ValueError("image dimensions must be positive")
    if spec.size is None:
        return _fit_within(width, height, _MAX_SIDE[spec.format])
    if spec.kind == "square":
        side = min(width, height, spec.size)
        return side, side
    return _fit_within(width, height, spec.size)


def plan_variants(version: int, width: int, height: int) -> list[PlannedVariant]:
    """Output dimensions of every variant of a version, for an upright source size."""
    return [
        PlannedVariant(spec.name, *output_size(spec, width, height))
        for spec in get_pipeline(version).variants
    ]


def render_all(source: bytes, version: int) -> dict[str, RenderedVariant]:
    """Render every variant of a version.

    Each variant decodes the source itself, only as large as it needs: a thumbnail of a large
    JPEG never pays for the full-size decode that the re-encoded variant needs.
    """
    return {spec.name: render_variant(source, spec) for spec in get_pipeline(version).variants}


def render_variant(source: bytes, spec: VariantSpec) -> RenderedVariant:
    """Render one variant: upright, sRGB, metadata-free; raises CorruptImage if undecodable."""
    upright, target = _decode_upright(source, spec)
    shaped = _resize(_to_srgb(upright), spec, target)
    data = _encode(shaped, spec)
    return RenderedVariant(
        data=data,
        sha256=hashlib.sha256(data).hexdigest(),
        width=shaped.width,
        height=shaped.height,
        content_type=CONTENT_TYPES[spec.format],
    )


def _attachment_root(prefix: str, attachment_id: UUID) -> str:
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(f"invalid storage prefix {prefix!r}")
    # Type hints do not stop a caller from passing a client-supplied string.
    if not isinstance(attachment_id, UUID):
        raise TypeError("attachment_id must be a UUID")
    return f"{prefix}/{attachment_id}"


def _checked_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"{name!r} cannot be part of a storage key")
    return name


def _fit_within(width: int, height: int, bound: int) -> tuple[int, int]:
    longest = max(width, height)
    if longest <= bound:
        return width, height
    return _scale(width, bound, longest), _scale(height, bound, longest)


def _scale(length: int, bound: int, longest: int) -> int:
    # Integer round-half-up, so planning never depends on float rounding.
    return max(1, (2 * length * bound + longest) // (2 * longest))


def _decode_upright(source: bytes, spec: VariantSpec) -> tuple[Image.Image, tuple[int, int]]:
    """First frame, decoded no larger than the variant needs and turned upright."""
    with _undecodable_as_corrupt(), Image.open(io.BytesIO(source), formats=_SOURCE_FORMATS) as img:
        upright = display_size(img)
        target = output_size(spec, *upright)
        # JPEG only (a no-op elsewhere): the decoder scales by 1/2, 1/4 or 1/8 as it decodes.
        img.draft(None, _draft_size(img.size, upright, spec, target))
        img.load()
        return ImageOps.exif_transpose(img), target


def _draft_size(
    stored: tuple[int, int], upright: tuple[int, int], spec: VariantSpec, target: tuple[int, int]
) -> tuple[int, int]:
    # The part of the image that ends up in the output, and how much it shrinks; the scale is
    # the same in both orientations, so it applies to the stored size directly.
    region = (min(upright), min(upright)) if spec.kind == "square" else upright
    scale = REDUCING_GAP * max(t / r for t, r in zip(target, region, strict=True))
    return math.ceil(stored[0] * scale), math.ceil(stored[1] * scale)


def _to_srgb(img: Image.Image) -> Image.Image:
    """RGB or RGBA in sRGB, whatever the source mode and embedded profile."""
    icc = img.info.get("icc_profile")
    img = _normalise_mode(img)
    alpha = img.getchannel("A") if img.mode in _WITHOUT_ALPHA else None
    colour = img if alpha is None else img.convert(_WITHOUT_ALPHA[img.mode])
    converted = _icc_to_srgb(colour, icc)
    rgb = colour.convert("RGB") if converted is None else converted
    if alpha is not None:
        rgb.putalpha(alpha)
    return rgb


def _normalise_mode(img: Image.Image) -> Image.Image:
    if img.mode.startswith("I"):
        # 16-bit greyscale: a plain convert() clips every value above 255 to white.
        eight_bit = img.convert("I").point(lambda value: value * _SIXTEEN_TO_EIGHT_BITS)
        return eight_bit.convert("L")
    if img.mode in _DIRECT_MODES and "transparency" not in img.info:
        return img
    # Palettes, bilevel and a transparent colour key become plain RGB or RGBA.
    return img.convert("RGBA" if img.has_transparency_data else "RGB")


def _icc_to_srgb(colour: Image.Image, icc: object) -> Image.Image | None:
    space = _ICC_SPACE.get(colour.mode)
    if not isinstance(icc, bytes) or not icc or space is None:
        return None
    try:
        profile = ImageCms.ImageCmsProfile(io.BytesIO(icc))
        if profile.profile.xcolor_space.strip() != space:
            return None
        return ImageCms.profileToProfile(colour, profile, _SRGB, outputMode="RGB")
    except (OSError, ImageCms.PyCMSError):
        # A damaged profile does not make the pixels unusable; browsers ignore it too.
        return None


def _resize(img: Image.Image, spec: VariantSpec, target: tuple[int, int]) -> Image.Image:
    box = _centred_square(img.size) if spec.kind == "square" else None
    if box is None and img.size == target:
        return img
    return img.resize(target, Image.Resampling.LANCZOS, box=box, reducing_gap=REDUCING_GAP)


def _centred_square(size: tuple[int, int]) -> tuple[int, int, int, int]:
    width, height = size
    side = min(width, height)
    left, top = (width - side) // 2, (height - side) // 2
    return left, top, left + side, top + side


def _encode(img: Image.Image, spec: VariantSpec) -> bytes:
    # No source metadata may reach an output (EXIF carries GPS; XMP and comments anything),
    # and some encoders read it from info: JPEG copies the source's comment.
    img.info.clear()
    buffer = io.BytesIO()
    if spec.format == "JPEG":
        _on_white(img).save(buffer, "JPEG", quality=spec.quality, optimize=True, progressive=True)
    else:
        img.save(buffer, "WEBP", quality=spec.quality, method=_WEBP_METHOD)
    return buffer.getvalue()


def _on_white(img: Image.Image) -> Image.Image:
    # JPEG has no alpha: show transparent areas as they would look on a white page.
    if img.mode != "RGBA":
        return img
    background = Image.new("RGB", img.size, _WHITE)
    background.paste(img, mask=img.getchannel("A"))
    return background


@contextmanager
def _undecodable_as_corrupt() -> Iterator[None]:
    try:
        yield
    except MemoryError:
        raise
    except Exception as exc:
        # Pillow reports undecodable bytes with many exception types (OSError, SyntaxError,
        # struct.error...); whichever it is, the same bytes will fail the same way again.
        raise CorruptImage(f"source image cannot be decoded: {exc}") from exc
