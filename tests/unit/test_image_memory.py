"""The per-job memory budget: estimates (pure), refusal and downscaling, and peak RSS.

Peak RSS is read in a fresh child process per case, from ``VmHWM``: the high-water mark of
the child's own address space. (``ru_maxrss`` would not do: Linux carries the forking
parent's resident size over into the child's, across exec.)
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from bench import sample_images
from jobsapp.attachments.pipeline import (
    ImageTooLarge,
    decode_bytes,
    encode_bytes,
    full_size_bytes,
    full_size_within,
    get_pipeline,
    render_all,
    render_variant,
)
from jobsapp.settings import DEFAULT_IMAGE_MEMORY_BUDGET_MB, SettingsError, load_settings

MIB = 1024 * 1024
V1 = get_pipeline(1)
THUMBNAIL, CROP, OPTIMIZED = V1.variants

# Renders ``source`` in a fresh interpreter and reports its peak RSS above the baseline
# measured just before rendering (imports and the source bytes excluded).
_CHILD = """
import json, sys
from jobsapp.attachments.pipeline import render_all
source = open(sys.argv[1], "rb").read()
budget = int(sys.argv[2]) if sys.argv[2] != "none" else None
def kib(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field))
baseline = kib("VmRSS:")
variants = render_all(source, 1, budget)
print(json.dumps({"above_baseline": (kib("VmHWM:") - baseline) * 1024,
                  "sizes": {k: [v.width, v.height] for k, v in variants.items()}}))
"""


def render_in_child(tmp_path: Path, source: bytes, budget: int | None) -> dict[str, object]:
    path = tmp_path / "source"
    path.write_bytes(source)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(budget or "none")],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


# Estimates


def test_decode_counts_pillows_four_bytes_per_colour_pixel() -> None:
    assert decode_bytes("RGB", (1000, 1000), transposed=False) == 4_000_000
    assert decode_bytes("RGBA", (1000, 1000), transposed=False) == 4_000_000
    # A mode the encoder cannot take is converted: the RGB copy lives beside the source.
    assert decode_bytes("L", (1000, 1000), transposed=False) == 5_000_000
    assert decode_bytes("CMYK", (1000, 1000), transposed=False) == 8_000_000
    # Turning an image upright makes a second full-size image.
    assert decode_bytes("RGB", (1000, 1000), transposed=True) == 8_000_000


def test_an_alpha_plane_costs_more_to_encode() -> None:
    assert encode_bytes(1000, alpha=True) > encode_bytes(1000, alpha=False) > 0


def test_full_size_is_kept_when_its_encode_fits() -> None:
    spare = encode_bytes(4000 * 3000, alpha=False)
    kept = full_size_within((4000, 3000), (4000, 3000), spare, rgba=False, transparent=False)
    assert kept == (4000, 3000)


def test_full_size_is_scaled_down_to_what_fits_keeping_the_aspect() -> None:
    spare = encode_bytes(4000 * 3000, alpha=False) // 4
    size = full_size_within((4000, 3000), (4000, 3000), spare, rgba=False, transparent=False)
    width, height = size
    assert 1000 < width < 2000
    assert abs(width / height - 4 / 3) < 0.01
    assert full_size_bytes(size, (4000, 3000), rgba=False, transparent=False) <= spare


def test_scaling_an_rgba_source_pays_for_pillows_premultiplied_copy() -> None:
    plain = full_size_bytes((1000, 1000), (4000, 4000), rgba=False, transparent=False)
    rgba = full_size_bytes((1000, 1000), (4000, 4000), rgba=True, transparent=False)
    assert rgba - plain >= 4000 * 4000 * 4


def test_no_room_at_all_is_refused() -> None:
    with pytest.raises(ImageTooLarge):
        full_size_within((4000, 3000), (4000, 3000), 1, rgba=False, transparent=False)


# Rendering under a budget


def test_a_source_whose_decode_exceeds_the_budget_is_refused_before_decoding() -> None:
    source = sample_images.png((2000, 2000))
    with pytest.raises(ImageTooLarge) as refused:
        render_all(source, 1, memory_budget=8 * MIB)
    assert refused.value.error_code == "memory_budget"
    assert refused.value.permanent
    assert "memory budget" in str(refused.value)


def test_under_a_tight_budget_the_full_size_variant_is_scaled_down() -> None:
    source = sample_images.png((2000, 1000))
    variants = render_all(source, 1, memory_budget=64 * MIB)
    optimized = variants["optimized"]
    assert optimized.width < 2000
    assert optimized.width == 2 * optimized.height
    assert Image.open(io.BytesIO(optimized.data)).size == (optimized.width, optimized.height)
    # The small variants keep their promised sizes.
    assert (variants["thumbnail"].width, variants["crop"].width) == (256, 512)


def test_without_pressure_the_budget_changes_nothing() -> None:
    source = sample_images.jpeg((1200, 900))
    assert render_all(source, 1, memory_budget=512 * MIB) == render_all(source, 1)


def test_a_large_jpeg_under_a_tight_budget_is_decoded_at_a_reduced_scale() -> None:
    source = sample_images.jpeg(sample_images.PHOTO_12MP)
    optimized = render_variant(source, OPTIMIZED, memory_budget=96 * MIB)
    assert (optimized.width, optimized.height) == (2000, 1500)


# Peak RSS in a child process


def test_a_large_transparent_png_stays_within_the_budget(tmp_path: Path) -> None:
    # 12 MP RGBA: unbounded, its full-size WebP (alpha plane included) takes ~400 MiB.
    budget = 160 * MIB
    result = render_in_child(tmp_path, sample_images.png((3464, 3464)), budget)
    assert result["above_baseline"] <= budget  # type: ignore[operator]
    sizes = result["sizes"]
    assert isinstance(sizes, dict)
    assert sizes["thumbnail"] == [256, 256]
    assert 0 < sizes["optimized"][0] < 3464


def test_the_50_mp_png_stays_within_the_default_budget(tmp_path: Path) -> None:
    # Unbounded, this PNG peaks at 1.8 GiB above the baseline (docs/performance.md).
    budget = DEFAULT_IMAGE_MEMORY_BUDGET_MB * MIB
    source = sample_images.png(sample_images.SQUARE_50MP)
    result = render_in_child(tmp_path, source, budget)
    assert result["above_baseline"] <= budget  # type: ignore[operator]


def test_the_budget_is_a_setting_in_mib() -> None:
    assert load_settings({}).image_memory_budget == DEFAULT_IMAGE_MEMORY_BUDGET_MB * MIB
    assert load_settings({"JOBSAPP_IMAGE_MEMORY_BUDGET_MB": "256"}).image_memory_budget == 256 * MIB
    with pytest.raises(SettingsError, match="JOBSAPP_IMAGE_MEMORY_BUDGET_MB"):
        load_settings({"JOBSAPP_IMAGE_MEMORY_BUDGET_MB": "0"})
