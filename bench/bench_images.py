"""Image jobs: peak memory and time of the v1 variant set, validation, and WebP effort.

Run: ``.venv/bin/python -m bench.bench_images [--quick | --smoke]`` (no services needed;
``python -m bench images`` runs it too). Every measurement is a fresh child process that
reports ``VmHWM`` (its own peak RSS) and the RSS just before the work, so cases never
pollute each other. Printed as markdown tables for docs/performance.md.

Paths compared, on the same synthetic photo-like sources (bench/sample_images.py):
- ``naive``: what a first version does: per variant, decode the whole file, turn it
  upright, resize, save (WebP, same quality and effort as jobsapp);
- ``jobsapp``: ``render_all`` under the default ``JOBSAPP_IMAGE_MEMORY_BUDGET_MB``;
- ``unbounded``: ``render_all`` with no budget (full size whatever it costs).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from PIL import Image, ImageMath

from bench import sample_images

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024

# name -> (make the source bytes, what it is)
Case = tuple[Callable[[], bytes], str]
CASES: dict[str, Case] = {
    "jpeg12": (lambda: sample_images.jpeg(sample_images.PHOTO_12MP), "12 MP JPEG (4000x3000)"),
    "jpeg50": (lambda: sample_images.jpeg(sample_images.PHOTO_50MP), "50 MP JPEG (8160x6120)"),
    "png50": (lambda: sample_images.png(sample_images.SQUARE_50MP), "50 MP RGBA PNG (7071x7071)"),
    "png12": (lambda: sample_images.png((3464, 3464)), "12 MP RGBA PNG (3464x3464)"),
    "jpeg1": (lambda: sample_images.jpeg((1200, 900)), "1 MP JPEG (1200x900)"),
}
SIZES = {"full": ["jpeg12", "jpeg50", "png50"], "quick": ["jpeg12", "png12"], "smoke": ["jpeg1"]}
PATHS = {"full": ["naive", "jobsapp", "unbounded"], "quick": ["naive", "jobsapp"],
         "smoke": ["naive", "jobsapp"]}  # fmt: skip
WEBP_METHODS = (0, 1, 2, 3, 4, 5, 6)

# --------------------------------------------------------------------- in the child


def _kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field))


def _naive(source: bytes) -> dict[str, tuple[int, int]]:
    import io

    from PIL import ImageOps

    from jobsapp.attachments.pipeline import get_pipeline, output_size

    sizes = {}
    for spec in get_pipeline(1).variants:
        img = ImageOps.exif_transpose(Image.open(io.BytesIO(source)))
        img = img.convert("RGBA" if img.has_transparency_data else "RGB")
        target = output_size(spec, *img.size)
        if spec.kind == "square":
            img = ImageOps.fit(img, target, Image.Resampling.LANCZOS)
        elif target != img.size:
            img = img.resize(target, Image.Resampling.LANCZOS)
        img.save(io.BytesIO(), "WEBP", quality=spec.quality, method=4)
        sizes[spec.name] = img.size
    return sizes


def _render(source: bytes, budget: int | None) -> dict[str, tuple[int, int]]:
    from jobsapp.attachments.pipeline import render_all

    return {k: (v.width, v.height) for k, v in render_all(source, 1, budget).items()}


def _validate(source: bytes) -> dict[str, tuple[int, int]]:
    from jobsapp.attachments.validation import inspect_upload

    info = inspect_upload(source)
    return {"upload": (info.width, info.height)}


def _child(path: str, how: str) -> None:
    import time

    from jobsapp.settings import DEFAULT_IMAGE_MEMORY_BUDGET_MB

    source = Path(path).read_bytes()
    work: dict[str, Callable[[], dict[str, tuple[int, int]]]] = {
        "naive": lambda: _naive(source),
        "jobsapp": lambda: _render(source, DEFAULT_IMAGE_MEMORY_BUDGET_MB * MIB),
        "unbounded": lambda: _render(source, None),
        "validate": lambda: _validate(source),
    }
    baseline, started = _kib("VmRSS:"), time.perf_counter()
    sizes = work[how]()
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "baseline_kib": baseline, "peak_kib": _kib("VmHWM:"),
                      "sizes": sizes}))  # fmt: skip


# -------------------------------------------------------------------- in the parent


def measure(path: Path, how: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_images", "--child", str(path), how],
        capture_output=True, text=True, check=True, cwd=ROOT, timeout=1800,
    )  # fmt: skip
    result: dict[str, object] = json.loads(done.stdout)
    return result


def _mib(kib: object) -> str:
    return f"{int(str(kib)) / 1024:.0f}"


def memory_table(size: str, workdir: Path) -> tuple[list[str], list[str]]:
    rows = ["| source | path | time s | peak RSS MiB | above baseline MiB | optimized |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    ratios = []
    for case in SIZES[size]:
        make, label = CASES[case]
        path = workdir / case
        path.write_bytes(make())
        results = {how: measure(path, how) for how in [*PATHS[size], "validate"]}
        for how, r in results.items():
            sizes = r["sizes"]
            assert isinstance(sizes, dict)
            shape = sizes.get("optimized") or sizes["upload"]
            above = int(str(r["peak_kib"])) - int(str(r["baseline_kib"]))
            rows.append(f"| {label} | {how} | {float(str(r['seconds'])):.2f} | "
                        f"{_mib(r['peak_kib'])} | {_mib(above)} | {shape[0]}x{shape[1]} |")
        naive, ours = results["naive"], results["jobsapp"]
        speedup = float(str(naive["seconds"])) / float(str(ours["seconds"]))
        ratios.append(f"images {label}: v1 set {speedup:.2f}x the naive Pillow path, peak RSS "
                      f"{_mib(ours['peak_kib'])} MiB (naive {_mib(naive['peak_kib'])} MiB)")
    return rows, ratios


def ssim(a: Image.Image, b: Image.Image) -> float:
    """Mean SSIM of two same-size images' luminance over 8x8 blocks (Wang et al. 2004)."""
    x, y = a.convert("L").convert("F"), b.convert("L").convert("F")
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2

    def mean8(img: Image.Image) -> Image.Image:
        return img.reduce(8)

    def product(p: Image.Image, q: Image.Image) -> Image.Image:
        result = ImageMath.lambda_eval(lambda v: v["p"] * v["q"], p=p, q=q)
        assert isinstance(result, Image.Image)
        return result

    mx, my = mean8(x), mean8(y)
    vx, vy, cxy = mean8(product(x, x)), mean8(product(y, y)), mean8(product(x, y))
    index = ImageMath.lambda_eval(
        lambda v: ((2 * v["mx"] * v["my"] + c1) * (2 * (v["cxy"] - v["mx"] * v["my"]) + c2))
        / ((v["mx"] * v["mx"] + v["my"] * v["my"] + c1)
           * (v["vx"] - v["mx"] * v["mx"] + v["vy"] - v["my"] * v["my"] + c2)),
        mx=mx, my=my, vx=vx, vy=vy, cxy=cxy,
    )  # fmt: skip
    assert isinstance(index, Image.Image)
    mean = index.reduce(index.size).getpixel((0, 0))
    assert isinstance(mean, float)
    return mean


def effort_table(size: str) -> list[str]:
    """WebP effort (``method``) for the optimized variant: time, bytes, SSIM vs method 6."""
    import io
    import time

    source = CASES["jpeg1" if size == "smoke" else "jpeg12"][0]()
    img = Image.open(io.BytesIO(source))
    img.load()
    encoded = {}
    for method in WEBP_METHODS:
        started = time.perf_counter()
        buffer = io.BytesIO()
        img.save(buffer, "WEBP", quality=82, method=method)
        encoded[method] = (time.perf_counter() - started, buffer.getvalue())
    reference = Image.open(io.BytesIO(encoded[WEBP_METHODS[-1]][1]))
    original = img
    rows = ["| method | encode s | bytes | SSIM vs method 6 | SSIM vs source |",
            "|---|---|---|---|---|"]
    for method, (seconds, data) in encoded.items():
        out = Image.open(io.BytesIO(data))
        rows.append(f"| {method} | {seconds:.2f} | {len(data)} | {ssim(out, reference):.4f} | "
                    f"{ssim(out, original):.4f} |")  # fmt: skip
    return rows


def main(quick: bool = False, smoke: bool = False) -> list[str]:
    """Print the tables; return the ratio lines (``python -m bench`` collects them)."""
    size = "smoke" if smoke else "quick" if quick else "full"
    with tempfile.TemporaryDirectory(prefix="bench-images-") as workdir:
        rows, ratios = memory_table(size, Path(workdir))
    print("\n".join(rows))
    print()
    print("\n".join(effort_table(size)))
    return ratios


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("PATH", "HOW"), help=argparse.SUPPRESS)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true")
    group.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.child:
        _child(*args.child)
    else:
        print("\n".join(main(quick=args.quick, smoke=args.smoke)))
