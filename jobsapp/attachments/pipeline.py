"""Versioned image variants: what each pipeline version produces, and producing it.

Planning (versions, storage keys, output sizes) is pure. Rendering takes the source bytes
and returns encoded variant bytes; it never touches files or the network.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar, Literal
from uuid import UUID

from PIL import Image, ImageCms, ImageOps

from .validation import CONTENT_TYPES, SUPPORTED_FORMATS, display_size, orientation

VariantKind = Literal["fit", "square", "reencode"]
OutputFormat = Literal["WEBP", "JPEG"]

# As in Pillow's thumbnail(): decode and reduce to no less than twice the target, then
# resample; close to resampling the full image, at a fraction of the cost.
REDUCING_GAP = 2.0

# libwebp's effort per kind of variant, pinned because outputs must be byte-identical across
# runs. The full-size re-encode uses method 0, chosen by measurement (docs/performance.md):
# a third of method 4's time on a 12 MP photo, no whole-image token buffer (half the memory),
# 10% fewer bytes, SSIM against the source 0.967 instead of 0.970. Resized variants are at
# most 1 MP and keep libwebp's default.
_WEBP_METHOD: dict[VariantKind, int] = {"fit": 4, "square": 4, "reencode": 0}
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
# Modes every encoder takes as they are, so rendering never copies them.
_ENCODABLE_MODES = frozenset({"RGB", "RGBA"})
_PILLOW_RGB_BYTES = 4
_SINGLE_BAND_BYTES = {"I": 4, "F": 4, "I;16": 2, "I;16L": 2, "I;16B": 2, "I;16N": 2}
_OPAQUE = 255
# libwebp's working memory per output pixel, measured on photo-like noise
# (bench/bench_images.py): at method 0 (full size) its ARGB and YUV copies of the input, and
# for an alpha plane its lossless (VP8L) encoder; from method 3 on (resized variants) also
# the token buffer of the whole image.
_ENCODE_BYTES = 7
_ENCODE_ALPHA_BYTES = 24
# A resized variant: its intermediate and output (Pillow, 4 bytes a pixel, (2+1)^2 + 1 of
# them with reducing_gap=2) and its encode at method 4.
_RESIZED_BYTES_PER_PIXEL = 10 * _PILLOW_RGB_BYTES + 34
_ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "RGBa", "La"})
# What a render allocates whatever the size: libwebp's and Pillow's fixed buffers.
_FIXED_BYTES = 16 * 1024 * 1024
# libjpeg's decode reductions, applied to the size the variants need.
_JPEG_DIVISORS = (1, 2, 4, 8)
_MIB = 1024 * 1024


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


class ImageTooLarge(PipelineError):
    """Rendering the source would take more memory than the per-job budget allows.

    Permanent for this budget; an operator who raises the budget can replay the job.
    """

    error_code = "memory_budget"
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


def render_all(
    source: bytes, version: int, memory_budget: int | None = None
) -> dict[str, RenderedVariant]:
    """Render every variant of a version from one decode of the source.

    ``memory_budget`` (bytes) bounds what the render allocates: a JPEG is decoded at a
    smaller scale, and otherwise the full-size variant is scaled down, until it fits; a
    source whose decode alone would exceed it is refused with ``ImageTooLarge`` before any
    pixel is decoded.
    """
    return _render(source, get_pipeline(version).variants, memory_budget)


def render_variant(
    source: bytes, spec: VariantSpec, memory_budget: int | None = None
) -> RenderedVariant:
    """Render one variant: upright, sRGB, metadata-free; raises CorruptImage if undecodable."""
    return _render(source, (spec,), memory_budget)[spec.name]


def decode_bytes(mode: str, size: tuple[int, int], *, transposed: bool) -> int:
    """Memory for the decoded source, plus the full-size copy that converting its mode to
    RGB(A), or turning it upright, makes."""
    copies = (mode not in _ENCODABLE_MODES) + transposed
    return size[0] * size[1] * (_bytes_per_pixel(mode) + copies * _PILLOW_RGB_BYTES)


def encode_bytes(pixels: int, *, alpha: bool) -> int:
    """libwebp's working memory for a full-size output of ``pixels``."""
    return pixels * (_ENCODE_ALPHA_BYTES if alpha else _ENCODE_BYTES)


def resized_bytes(specs: Sequence[VariantSpec], upright: tuple[int, int], *, alpha: bool) -> int:
    """Peak memory of the resized variants (thumbnails, crops), made one after the other.

    Each goes through an intermediate of about twice its size (``reducing_gap=2``). With an
    alpha band, Pillow's resize first premultiplies a full-size copy of the source, and the
    transparency check copies one band.
    """
    pixels = [math.prod(output_size(s, *upright)) for s in specs if s.size is not None]
    peak = max(pixels, default=0) * _RESIZED_BYTES_PER_PIXEL
    if alpha:
        peak += math.prod(upright) * (_PILLOW_RGB_BYTES if pixels else 1)
    return peak


def full_size_within(
    target: tuple[int, int],
    source: tuple[int, int],
    spare: int,
    *,
    rgba: bool,
    transparent: bool,
) -> tuple[int, int]:
    """The largest size, at the aspect of ``target``, whose resize and encode fit in ``spare``.

    ``source`` is the decoded size the variant is made from; ``rgba`` whether it has an alpha
    band, ``transparent`` whether any pixel is not opaque (libwebp then encodes the alpha).
    """
    size = target
    while full_size_bytes(size, source, rgba=rgba, transparent=transparent) > spare:
        if max(size) <= 1:
            raise ImageTooLarge("the per-job memory budget leaves no room to encode the image")
        size = _fit_within(*target, max(size) * 9 // 10)
    return size


def full_size_bytes(
    out: tuple[int, int], source: tuple[int, int], *, rgba: bool, transparent: bool
) -> int:
    """Peak memory of making a full-size variant of size ``out`` from ``source``.

    Encoding needs libwebp's working memory beside the output image. Scaling down comes
    first, and on its own peak: Pillow premultiplies a copy of an RGBA source, reduces it by
    an integer factor down to twice the output, then resamples through an intermediate as
    wide as the output and as tall as the reduced source.
    """
    pixels = math.prod(out)
    encode = encode_bytes(pixels, alpha=transparent)
    if out == source:
        return encode
    factor = max(1, int(min(s / o for s, o in zip(source, out, strict=True)) / REDUCING_GAP))
    reduced = (math.ceil(source[0] / factor), math.ceil(source[1] / factor))
    resize = (
        math.prod(source) * rgba
        + (math.prod(reduced) if factor > 1 else 0)
        + out[0] * reduced[1]
        + pixels
    ) * _PILLOW_RGB_BYTES
    return max(resize, encode + pixels * _PILLOW_RGB_BYTES)


def _render(
    source: bytes, specs: Sequence[VariantSpec], budget: int | None
) -> dict[str, RenderedVariant]:
    with _decoded_upright(source, specs, budget) as (upright, spare):
        srgb = _to_srgb(upright)
        transparent = _has_transparency(srgb)
        return {
            spec.name: _rendered(srgb, spec, _target(spec, srgb, spare, transparent=transparent))
            for spec in specs
        }


def _target(
    spec: VariantSpec, img: Image.Image, spare: int | None, *, transparent: bool
) -> tuple[int, int]:
    target = output_size(spec, *img.size)
    if spec.size is not None or spare is None:
        return target
    rgba = img.mode == "RGBA"
    return full_size_within(target, img.size, spare, rgba=rgba, transparent=transparent)


def _has_transparency(img: Image.Image) -> bool:
    # libwebp encodes no alpha plane for an image that is opaque everywhere.
    if img.mode != "RGBA":
        return False
    alpha_range = img.getextrema()[-1]
    return isinstance(alpha_range, tuple) and alpha_range[0] < _OPAQUE


def _rendered(img: Image.Image, spec: VariantSpec, target: tuple[int, int]) -> RenderedVariant:
    shaped = _resize(img, spec, target)
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


@contextmanager
def _decoded_upright(
    source: bytes, specs: Sequence[VariantSpec], budget: int | None
) -> Iterator[tuple[Image.Image, int | None]]:
    """First frame, decoded once, no larger than needed, upright; with the budget left."""
    with _undecodable_as_corrupt(), Image.open(io.BytesIO(source), formats=_SOURCE_FORMATS) as img:
        upright = display_size(img, source)
        transposed = orientation(img, source) != 1
        request = _scaled(img.size, _draft_scale(upright, specs))
        if budget is not None and img.format == "JPEG":
            request = _within(img.mode, request, budget, transposed=transposed)
        # JPEG only (a no-op elsewhere): the decoder scales by 1/2, 1/4 or 1/8 as it decodes.
        img.draft(None, request)
        fixed = _FIXED_BYTES + decode_bytes(img.mode, img.size, transposed=transposed)
        alpha = img.mode in _ALPHA_MODES or "transparency" in img.info
        _check_budget(fixed + resized_bytes(specs, upright, alpha=alpha), budget)
        img.load()
        # In place: without it Pillow returns a full-size copy even when nothing turns.
        ImageOps.exif_transpose(img, in_place=True)
        yield img, None if budget is None else budget - fixed


def _check_budget(need: int, budget: int | None) -> None:
    if budget is not None and need > budget:
        raise ImageTooLarge(
            f"rendering needs about {need // _MIB} MiB, more than the per-job memory budget "
            f"of {budget // _MIB} MiB"
        )


def _within(mode: str, size: tuple[int, int], budget: int, *, transposed: bool) -> tuple[int, int]:
    """The largest of libjpeg's reductions of ``size`` whose decode and encode fit the budget."""
    for divisor in _JPEG_DIVISORS:
        reduced = (max(1, size[0] // divisor), max(1, size[1] // divisor))
        need = _FIXED_BYTES + decode_bytes(mode, reduced, transposed=transposed)
        if need + encode_bytes(math.prod(reduced), alpha=False) <= budget:
            return reduced
    return reduced


def _scaled(size: tuple[int, int], scale: float) -> tuple[int, int]:
    return math.ceil(size[0] * scale), math.ceil(size[1] * scale)


def _bytes_per_pixel(mode: str) -> int:
    # Pillow stores every multi-band mode (LA and P with alpha included) in 4 bytes a pixel.
    return _PILLOW_RGB_BYTES if Image.getmodebands(mode) > 1 else _SINGLE_BAND_BYTES.get(mode, 1)


def _draft_scale(upright: tuple[int, int], specs: Sequence[VariantSpec]) -> float:
    # The variant that keeps the most detail sets the scale of the one decode.
    return min(1.0, max(_variant_scale(upright, spec) for spec in specs))


def _variant_scale(upright: tuple[int, int], spec: VariantSpec) -> float:
    # The part of the image that ends up in the output, and how much it shrinks; the scale is
    # the same in both orientations, so it applies to the stored size directly.
    target = output_size(spec, *upright)
    if spec.size is None:
        return max(t / r for t, r in zip(target, upright, strict=True))
    region = (min(upright), min(upright)) if spec.kind == "square" else upright
    return REDUCING_GAP * max(t / r for t, r in zip(target, region, strict=True))


def _to_srgb(img: Image.Image) -> Image.Image:
    """RGB or RGBA in sRGB, whatever the source mode and embedded profile.

    RGB and RGBA, the modes of large sources, are converted in place: no full-size copy.
    """
    icc = img.info.get("icc_profile")
    img = _normalise_mode(img)
    profile = _source_profile(icc, img.mode)
    if img.mode in _ENCODABLE_MODES:
        if profile is not None:
            _convert_in_place(img, profile)
        return img
    alpha = img.getchannel("A") if img.mode in _WITHOUT_ALPHA else None
    colour = img if alpha is None else img.convert(_WITHOUT_ALPHA[img.mode])
    converted = None if profile is None else _profile_to_srgb(colour, profile)
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


def _source_profile(icc: object, mode: str) -> ImageCms.ImageCmsProfile | None:
    """The embedded ICC profile, if it is readable and describes ``mode``'s colour space."""
    space = _ICC_SPACE.get(_WITHOUT_ALPHA.get(mode, mode))
    if not isinstance(icc, bytes) or not icc or space is None:
        return None
    try:
        profile = ImageCms.ImageCmsProfile(io.BytesIO(icc))
    except (OSError, ImageCms.PyCMSError):
        # A damaged profile does not make the pixels unusable; browsers ignore it too.
        return None
    return profile if profile.profile.xcolor_space.strip() == space else None


def _convert_in_place(img: Image.Image, profile: ImageCms.ImageCmsProfile) -> None:
    # LittleCMS leaves the alpha band of an RGBA image as it is.
    with contextlib.suppress(ImageCms.PyCMSError):
        ImageCms.profileToProfile(img, profile, _SRGB, outputMode=img.mode, inPlace=True)


def _profile_to_srgb(colour: Image.Image, profile: ImageCms.ImageCmsProfile) -> Image.Image | None:
    try:
        return ImageCms.profileToProfile(colour, profile, _SRGB, outputMode="RGB")
    except ImageCms.PyCMSError:
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
        img.save(buffer, "WEBP", quality=spec.quality, method=_WEBP_METHOD[spec.kind])
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
    except (MemoryError, PipelineError):
        raise
    except Exception as exc:
        # Pillow reports undecodable bytes with many exception types (OSError, SyntaxError,
        # struct.error...); whichever it is, the same bytes will fail the same way again.
        raise CorruptImage(f"source image cannot be decoded: {exc}") from exc
