"""Pipeline planning (pure) and rendering (Pillow), all in memory."""

from __future__ import annotations

import contextlib
import io
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, JpegImagePlugin

from jobsapp.attachments.pipeline import (
    PIPELINES,
    CorruptImage,
    PipelineVersion,
    PlannedVariant,
    RenderedVariant,
    UnknownPipeline,
    VariantSpec,
    get_pipeline,
    latest_version,
    original_key,
    plan_variants,
    render_all,
    render_variant,
    variant_key,
)
from jobsapp.attachments.validation import RejectedUpload, inspect_upload
from tests.unit import images

ATTACHMENT = uuid.UUID("0b7e3f0c-4c1a-4d55-9a43-1f6f0d3b2a10")
V1 = get_pipeline(1)
THUMBNAIL, CROP, OPTIMIZED = V1.variants
dimensions = st.integers(min_value=1, max_value=100_000)


def decoded(variant: RenderedVariant) -> Image.Image:
    img = Image.open(io.BytesIO(variant.data))
    img.load()
    return img


def alpha_at(img: Image.Image, xy: tuple[int, int]) -> int:
    pixel = img.getpixel(xy)
    assert isinstance(pixel, tuple)
    return pixel[3]


def close_to(actual: Any, expected: tuple[int, ...], tolerance: int = 40) -> bool:
    return all(abs(a - e) <= tolerance for a, e in zip(actual, expected, strict=True))


# Planning


def test_registry_numbers_match_their_keys() -> None:
    assert all(number == pipeline.number for number, pipeline in PIPELINES.items())
    assert latest_version() == max(PIPELINES) == 2


def test_version_1_variants() -> None:
    assert [(s.name, s.kind, s.size, s.format) for s in V1.variants] == [
        ("thumbnail", "fit", 256, "WEBP"),
        ("crop", "square", 512, "WEBP"),
        ("optimized", "reencode", None, "WEBP"),
    ]


def test_version_2_is_the_retina_set() -> None:
    thumbnail, crop, optimized = get_pipeline(2).variants
    assert (thumbnail.size, crop.size, optimized.quality) == (512, 1024, 75)


def test_unknown_version() -> None:
    with pytest.raises(UnknownPipeline) as caught:
        get_pipeline(99)
    assert caught.value.error_code == "unknown_pipeline"
    assert not caught.value.permanent


def test_plan_of_a_large_landscape_photo() -> None:
    assert plan_variants(1, 4000, 3000) == [
        PlannedVariant("thumbnail", 256, 192),
        PlannedVariant("crop", 512, 512),
        PlannedVariant("optimized", 4000, 3000),
    ]


def test_plan_of_a_small_image_never_upscales() -> None:
    assert plan_variants(1, 300, 120) == [
        PlannedVariant("thumbnail", 256, 102),
        PlannedVariant("crop", 120, 120),
        PlannedVariant("optimized", 300, 120),
    ]


def test_plan_keeps_a_panorama_within_what_webp_can_encode() -> None:
    assert plan_variants(1, 30_000, 1_000)[2] == PlannedVariant("optimized", 16383, 546)


def test_plan_rejects_empty_dimensions() -> None:
    with pytest.raises(ValueError, match="positive"):
        plan_variants(1, 0, 10)


@given(dimensions, dimensions)
def test_thumbnail_fits_never_upscales_and_keeps_the_aspect(width: int, height: int) -> None:
    thumbnail = plan_variants(1, width, height)[0]
    assert 1 <= thumbnail.width <= min(width, 256)
    assert 1 <= thumbnail.height <= min(height, 256)
    if max(width, height) > 256:
        assert max(thumbnail.width, thumbnail.height) == 256
        # Rounding to whole pixels moves each side by at most half a pixel.
        assert abs(thumbnail.width * height - thumbnail.height * width) <= max(width, height)
    else:
        assert (thumbnail.width, thumbnail.height) == (width, height)


@given(dimensions, dimensions)
def test_crop_is_square(width: int, height: int) -> None:
    crop = plan_variants(1, width, height)[1]
    assert crop.width == crop.height == min(width, height, 512)


@given(st.sampled_from(sorted(PIPELINES)), dimensions, dimensions)
def test_planning_is_pure(version: int, width: int, height: int) -> None:
    assert plan_variants(version, width, height) == plan_variants(version, width, height)


@pytest.mark.parametrize(
    "spec",
    [
        {"name": "Thumb/../x", "kind": "fit", "size": 10, "format": "WEBP", "quality": 80},
        {"name": "thumb", "kind": "fit", "size": None, "format": "WEBP", "quality": 80},
        {"name": "thumb", "kind": "reencode", "size": 10, "format": "WEBP", "quality": 80},
        {"name": "thumb", "kind": "square", "size": 0, "format": "WEBP", "quality": 80},
        {"name": "thumb", "kind": "fit", "size": 10, "format": "WEBP", "quality": 0},
    ],
)
def test_variant_spec_rejects_nonsense(spec: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message is not the contract
        VariantSpec(**spec)


def test_pipeline_version_rejects_duplicate_names() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        PipelineVersion(9, (THUMBNAIL, THUMBNAIL))


# Storage keys


def test_variant_key_layout() -> None:
    assert (
        variant_key("attachments", ATTACHMENT, 1, "thumbnail")
        == "attachments/0b7e3f0c-4c1a-4d55-9a43-1f6f0d3b2a10/v1/thumbnail"
    )


def test_original_key_layout() -> None:
    assert (
        original_key("prod/attachments", ATTACHMENT, "jpg")
        == "prod/attachments/0b7e3f0c-4c1a-4d55-9a43-1f6f0d3b2a10/original.jpg"
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda: variant_key("", ATTACHMENT, 1, "thumbnail"),
        lambda: variant_key("attachments/", ATTACHMENT, 1, "thumbnail"),
        lambda: variant_key("../secrets", ATTACHMENT, 1, "thumbnail"),
        lambda: variant_key("attachments", ATTACHMENT, 0, "thumbnail"),
        lambda: variant_key("attachments", ATTACHMENT, 1, "../../x"),
        lambda: original_key("attachments", ATTACHMENT, "jpg/../../x"),
        lambda: original_key("attachments", ATTACHMENT, ""),
    ],
)
def test_keys_refuse_anything_but_plain_parts(call: Callable[[], str]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message is not the contract
        call()


def test_keys_refuse_a_string_attachment_id() -> None:
    with pytest.raises(TypeError):
        variant_key("attachments", "../../x", 1, "thumbnail")  # type: ignore[arg-type]


# Rendering


def test_variants_of_a_large_jpeg_have_the_planned_sizes() -> None:
    source = images.large_jpeg()
    thumbnail = render_variant(source, THUMBNAIL)
    crop = render_variant(source, CROP)
    assert (thumbnail.width, thumbnail.height) == (256, 192)
    assert (crop.width, crop.height) == (512, 512)
    assert decoded(thumbnail).size == (256, 192)
    assert decoded(crop).size == (512, 512)
    assert thumbnail.content_type == crop.content_type == "image/webp"


def test_thumbnail_of_a_large_jpeg_decodes_at_reduced_scale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drafted: list[tuple[int, int]] = []
    original_draft = JpegImagePlugin.JpegImageFile.draft

    def spy(self: JpegImagePlugin.JpegImageFile, mode: str | None, size: Any) -> Any:
        result = original_draft(self, mode, size)
        drafted.append(self.size)
        return result

    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", spy)
    render_variant(images.large_jpeg(), THUMBNAIL)
    # libjpeg scales by 1/4 here: the 12 MP image is decoded as 0.75 MP.
    assert drafted == [(1000, 750)]


def test_camera_mpo_renders_its_primary_image() -> None:
    img = decoded(render_variant(images.mpo(), OPTIMIZED))
    assert img.size == (64, 48)
    assert close_to(img.getpixel((10, 10)), images.RED)


def test_optimized_keeps_the_size() -> None:
    source = images.solid("PNG", (300, 200))
    optimized = render_variant(source, OPTIMIZED)
    assert (optimized.width, optimized.height) == (300, 200)


@pytest.mark.parametrize("size", [(900, 500), (500, 900)])
def test_crop_is_centred(size: tuple[int, int]) -> None:
    crop = decoded(render_variant(images.banded_png(size, band=200), CROP)).convert("RGB")
    assert crop.size == (500, 500)
    for corner in [(0, 0), (499, 0), (0, 499), (499, 499), (250, 250)]:
        assert close_to(crop.getpixel(corner), images.GREEN), corner


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_exif_orientation_is_applied(fmt: str) -> None:
    variants = render_all(images.rotated_photo(fmt, orientation=6), 1)
    sizes = {name: (v.width, v.height) for name, v in variants.items()}
    assert sizes == {"thumbnail": (171, 256), "crop": (400, 400), "optimized": (400, 600)}
    upright = decoded(variants["optimized"]).convert("RGB")
    assert close_to(upright.getpixel((200, 100)), images.RED)
    assert close_to(upright.getpixel((200, 500)), images.BLUE)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_outputs_carry_no_metadata(fmt: str) -> None:
    for variant in render_all(images.rotated_photo(fmt), 1).values():
        img = Image.open(io.BytesIO(variant.data))
        assert len(img.getexif()) == 0
        assert not {"exif", "xmp", "icc_profile", "comment"} & set(img.info)
        for marker in (b"Exif", b"EXIF", b"XMP", b"ICCP", b"GPS", b"SN-123456"):
            assert marker not in variant.data


def test_jpeg_output_carries_no_metadata_either() -> None:
    spec = VariantSpec("mail", "fit", 128, "JPEG", 85)
    variant = render_variant(images.rotated_photo("JPEG"), spec)
    img = Image.open(io.BytesIO(variant.data))
    assert variant.content_type == "image/jpeg"
    assert (img.format, img.size) == ("JPEG", (85, 128))
    assert len(img.getexif()) == 0
    assert not {"exif", "xmp", "icc_profile", "comment"} & set(img.info)


def test_alpha_is_preserved_in_webp() -> None:
    for variant in render_all(images.png_with_alpha(), 1).values():
        img = decoded(variant)
        assert img.mode == "RGBA"
        assert alpha_at(img, (0, 0)) == 255
        assert alpha_at(img, (img.width - 1, 0)) == 0


def test_alpha_is_composited_on_white_for_jpeg() -> None:
    spec = VariantSpec("mail", "fit", 128, "JPEG", 90)
    img = decoded(render_variant(images.png_with_alpha(), spec))
    assert img.mode == "RGB"
    assert close_to(img.getpixel((5, 5)), images.RED)
    assert close_to(img.getpixel((img.width - 5, 5)), images.WHITE)


@pytest.mark.parametrize("source", [images.animated_gif(), images.animated_webp()])
def test_animated_input_renders_its_first_frame(source: bytes) -> None:
    for variant in render_all(source, 1).values():
        img = decoded(variant)
        assert getattr(img, "n_frames", 1) == 1
        assert close_to(img.convert("RGB").getpixel((10, 10)), images.RED)


def test_cmyk_becomes_rgb() -> None:
    img = decoded(render_variant(images.cmyk_jpeg(), OPTIMIZED))
    assert img.mode == "RGB"
    assert close_to(img.getpixel((10, 10)), (0, 255, 255))


def test_embedded_icc_profile_is_converted_to_srgb() -> None:
    red_in_swapped_space = images.encode(
        Image.new("RGB", (32, 32), images.RED),
        "PNG",
        icc_profile=images.swapped_primaries_profile(),
    )
    img = decoded(render_variant(red_in_swapped_space, THUMBNAIL))
    assert close_to(img.getpixel((16, 16)), images.GREEN)
    assert "icc_profile" not in img.info


def test_a_damaged_icc_profile_is_ignored() -> None:
    source = images.encode(Image.new("RGB", (32, 32), images.RED), "JPEG", icc_profile=b"junk")
    img = decoded(render_variant(source, THUMBNAIL))
    assert close_to(img.getpixel((16, 16)), images.RED)


def test_palette_transparency_becomes_alpha() -> None:
    img = decoded(render_variant(images.palette_png(transparent=True), OPTIMIZED))
    assert img.mode == "RGBA"
    assert alpha_at(img, (5, 5)) == 0
    assert close_to(img.getpixel((60, 5)), (*images.BLUE, 255))


def test_opaque_palette_becomes_rgb() -> None:
    img = decoded(render_variant(images.palette_png(transparent=False), OPTIMIZED))
    assert img.mode == "RGB"
    assert close_to(img.getpixel((5, 5)), images.RED)


def test_sixteen_bit_grey_keeps_its_brightness() -> None:
    img = decoded(render_variant(images.grey16_png(32768), OPTIMIZED))
    assert close_to(img.getpixel((5, 5)), (128, 128, 128), tolerance=3)


@pytest.mark.parametrize(
    ("mode", "color", "params", "expected_mode"),
    [
        ("1", 1, {}, "RGB"),
        ("L", 200, {}, "RGB"),
        ("L", 200, {"transparency": 200}, "RGBA"),
        ("RGB", images.RED, {"transparency": images.RED}, "RGBA"),
        ("P", 0, {}, "RGB"),
        ("LA", (200, 100), {}, "RGBA"),
        ("RGBA", (*images.RED, 128), {}, "RGBA"),
        ("I;16", 40000, {}, "RGB"),
    ],
)
def test_every_png_mode_becomes_rgb_or_rgba(
    mode: str, color: Any, params: dict[str, Any], expected_mode: str
) -> None:
    source = images.encode(Image.new(mode, (20, 10), color), "PNG", **params)
    assert decoded(render_variant(source, THUMBNAIL)).mode == expected_mode


def test_extreme_aspect_ratios_render_as_planned() -> None:
    source = images.encode(Image.new("RGB", (8000, 16), images.RED), "JPEG")
    rendered = render_all(source, 1)
    assert [(v.width, v.height) for v in rendered.values()] == [(256, 1), (16, 16), (8000, 16)]


def test_grey_with_alpha() -> None:
    img = decoded(render_variant(images.la_png(), OPTIMIZED))
    assert img.mode == "RGBA"
    assert close_to(img.getpixel((5, 5)), (128, 128, 128, 64), tolerance=3)


@pytest.mark.parametrize(
    "source",
    [images.rotated_photo(), images.png_with_alpha(), images.animated_gif(), images.cmyk_jpeg()],
)
def test_rendering_is_deterministic(source: bytes) -> None:
    first, second = render_all(source, 1), render_all(source, 1)
    assert {name: v.data for name, v in first.items()} == {
        name: v.data for name, v in second.items()
    }
    assert all(v.sha256 == second[name].sha256 for name, v in first.items())


@pytest.mark.parametrize("version", sorted(PIPELINES))
def test_rendered_sizes_match_the_plan(version: int) -> None:
    rendered = render_all(images.rotated_photo(), version)
    planned = plan_variants(version, 400, 600)
    assert [
        PlannedVariant(p.name, rendered[p.name].width, rendered[p.name].height) for p in planned
    ] == planned


@pytest.mark.parametrize(
    "source",
    [images.truncated_jpeg(), images.TEXT, images.EMPTY, images.png_header_only(10, 10)],
)
def test_undecodable_source_is_a_permanent_error(source: bytes) -> None:
    with pytest.raises(CorruptImage) as caught:
        render_variant(source, THUMBNAIL)
    assert caught.value.error_code == "corrupt_image"
    assert caught.value.permanent


@settings(max_examples=100, deadline=None)
@given(images.damaged_images())
def test_what_validation_accepts_renders_as_planned(data: bytes) -> None:
    try:
        info = inspect_upload(data)
    except RejectedUpload:
        # The pipeline may be more lenient, but when it fails it must be as CorruptImage.
        with contextlib.suppress(CorruptImage):
            render_variant(data, THUMBNAIL)
        return
    rendered = render_all(data, 1)
    assert [
        PlannedVariant(name, v.width, v.height) for name, v in rendered.items()
    ] == plan_variants(1, info.width, info.height)
