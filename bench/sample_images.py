"""Synthetic photo-like test images, made in memory: no downloads, realistic file sizes.

Smooth gradients carry the large-scale structure, fine noise the texture a camera sensor
adds, so JPEG and PNG compress them about as well as they compress photos.
"""

from __future__ import annotations

import functools
import io

from PIL import Image

# The sizes the memory figures are quoted for.
PHOTO_12MP = (4000, 3000)
PHOTO_24MP = (6000, 4000)
PHOTO_50MP = (8160, 6120)
# The PNG: just under the 50 MP upload limit.
SQUARE_50MP = (7071, 7071)


def photo(size: tuple[int, int], mode: str = "RGB", noise: float = 40.0) -> Image.Image:
    """Gradients plus noise, in ``RGB`` or ``RGBA`` (a soft alpha ramp)."""
    bands = [_gradient(size, turn) for turn in range(3)]
    grain = Image.effect_noise(size, noise)
    textured = [Image.blend(band, grain, 0.3) for band in bands]
    if mode == "RGBA":
        textured.append(_gradient(size, 3))
    return Image.merge(mode, textured)


@functools.cache
def jpeg(size: tuple[int, int], quality: int = 85) -> bytes:
    """A camera-like JPEG of ``size``."""
    return _encode(photo(size), "JPEG", quality=quality)


@functools.cache
def png(size: tuple[int, int], mode: str = "RGBA") -> bytes:
    """A large, well-compressing PNG (a screenshot or render rather than a photo)."""
    return _encode(photo(size, mode, noise=0.0), "PNG", compress_level=1)


def _gradient(size: tuple[int, int], turn: int) -> Image.Image:
    ramp = Image.linear_gradient("L") if turn % 2 == 0 else Image.radial_gradient("L")
    return ramp.rotate(90 * turn).resize(size, Image.Resampling.BILINEAR)


def _encode(img: Image.Image, fmt: str, **params: object) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, fmt, **params)
    return buffer.getvalue()
