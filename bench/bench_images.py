"""Image jobs: speed, peak memory and WebP effort of the v1 variant set, and validation.

Run: ``.venv/bin/python -m bench.bench_images [--quick | --smoke]`` (no services needed;
``python -m bench images`` runs it too). Every measurement is a fresh child process that
reports ``VmHWM`` (its own peak RSS), the RSS just before the work, and the work's wall and
CPU time, so cases never pollute each other. The full size runs every case in 3 interleaved
rounds and reports medians. Printed as markdown tables for docs/performance.md.

Paths compared, on the same synthetic photo-like sources (bench/sample_images.py):
- ``naive``: what a first version does: per variant, decode the whole file, turn it
  upright, resize, save (WebP at the pipeline's quality and libwebp's default effort, 4);
- ``jobsapp``: ``render_all`` under the default ``JOBSAPP_IMAGE_MEMORY_BUDGET_MB``;
- ``unbounded``: ``render_all`` with no budget (full size whatever it costs);
- ``pyvips``: the same three outputs through libvips (what Active Storage and imgproxy
  use): ``thumbnail_buffer`` per variant (shrink-on-load, upright, sRGB, a centred crop for
  the square), saved at the pipeline's quality and WebP effort, without metadata;
- ``validate``: the web process's upload check, ``inspect_upload``.

Images/s per core is images per CPU-second of the child (``time.process_time``, every
thread's time): libvips works on a thread pool, and wall time would credit it the other
core as if it were free.
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageMath, ImageOps

from bench import sample_images
from jobsapp.attachments.pipeline import (
    _WEBP_METHOD,
    VariantSpec,
    get_pipeline,
    output_size,
    render_all,
)
from jobsapp.attachments.validation import inspect_upload
from jobsapp.settings import DEFAULT_IMAGE_MEMORY_BUDGET_MB

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024
# The largest side libwebp can write: the bound of a full-size ("reencode") WebP variant.
WEBP_MAX_SIDE = 16383


@dataclass(frozen=True)
class Case:
    make: Callable[[], bytes]
    label: str  # in the tables
    short: str  # in the ratio lines


CASES: dict[str, Case] = {
    "jpeg12": Case(
        lambda: sample_images.jpeg(sample_images.PHOTO_12MP), "12 MP JPEG (4000x3000)", "12MP JPEG"
    ),
    "jpeg24": Case(
        lambda: sample_images.jpeg(sample_images.PHOTO_24MP), "24 MP JPEG (6000x4000)", "24MP JPEG"
    ),
    "jpeg50": Case(
        lambda: sample_images.jpeg(sample_images.PHOTO_50MP), "50 MP JPEG (8160x6120)", "50MP JPEG"
    ),
    "png50": Case(
        lambda: sample_images.png(sample_images.SQUARE_50MP),
        "50 MP RGBA PNG (7071x7071)",
        "50MP PNG",
    ),
    "png12": Case(
        lambda: sample_images.png((3464, 3464)), "12 MP RGBA PNG (3464x3464)", "12MP PNG"
    ),
    "jpeg1": Case(lambda: sample_images.jpeg((1200, 900)), "1 MP JPEG (1200x900)", "1MP JPEG"),
}
# Each size's first case is the JPEG its per-core ratio lines are quoted for.
SIZES = {
    "full": ["jpeg12", "jpeg24", "jpeg50", "png50"],
    "quick": ["jpeg12", "png12"],
    "smoke": ["jpeg1"],
}
PATHS = {
    "full": ["naive", "jobsapp", "unbounded", "pyvips", "validate"],
    "quick": ["naive", "jobsapp", "pyvips", "validate"],
    "smoke": ["naive", "jobsapp", "pyvips", "validate"],
}
ROUNDS = {"full": 3, "quick": 1, "smoke": 1}
WEBP_METHODS = (0, 1, 2, 3, 4, 5, 6)

# What each path made: variant name -> (width, height, encoded bytes).
Outputs = dict[str, tuple[int, int, int]]

# --------------------------------------------------------------------- in the child


def _kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field))


def _naive(source: bytes) -> Outputs:
    outputs = {}
    for spec in get_pipeline(1).variants:
        img = ImageOps.exif_transpose(Image.open(io.BytesIO(source)))
        img = img.convert("RGBA" if img.has_transparency_data else "RGB")
        target = output_size(spec, *img.size)
        if spec.kind == "square":
            img = ImageOps.fit(img, target, Image.Resampling.LANCZOS)
        elif target != img.size:
            img = img.resize(target, Image.Resampling.LANCZOS)
        buffer = io.BytesIO()
        img.save(buffer, "WEBP", quality=spec.quality, method=4)
        outputs[spec.name] = (*img.size, buffer.tell())
    return outputs


def _render(source: bytes, budget: int | None) -> Outputs:
    rendered = render_all(source, 1, budget).items()
    return {name: (v.width, v.height, len(v.data)) for name, v in rendered}


def _pyvips(source: bytes) -> Outputs:
    outputs = {}
    for spec in get_pipeline(1).variants:
        width, height, data = vips_variant(source, spec)
        outputs[spec.name] = (width, height, len(data))
    return outputs


def vips_variant(source: bytes, spec: VariantSpec) -> tuple[int, int, bytes]:
    """One v1 variant through libvips: its width, height and WebP bytes."""
    import pyvips  # loaded before the baseline (see _child); a Pillow child never loads it

    bound = _vips_bound(source, spec)
    crop = "centre" if spec.kind == "square" else "none"
    img = pyvips.Image.thumbnail_buffer(source, bound, height=bound, size="down", crop=crop)
    data = img.webpsave_buffer(
        Q=spec.quality, effort=_WEBP_METHOD[spec.kind], keep=pyvips.enums.ForeignKeep.NONE
    )
    return img.width, img.height, data


def _vips_bound(source: bytes, spec: VariantSpec) -> int:
    """The side of the box thumbnail fits the variant in (and crops it to, if square)."""
    import pyvips

    if spec.kind != "square":
        return WEBP_MAX_SIDE if spec.size is None else spec.size
    # The crop is never larger than the shorter side, as in the pipeline: thumbnail alone
    # would crop a 700x500 source to 512x500. The shorter side is the same either way up.
    header = pyvips.Image.new_from_buffer(source, "")
    return output_size(spec, header.width, header.height)[0]


def _validate(source: bytes) -> Outputs:
    info = inspect_upload(source)
    return {"upload": (info.width, info.height, 0)}


WORK: dict[str, Callable[[bytes], Outputs]] = {
    "naive": _naive,
    "jobsapp": lambda source: _render(source, DEFAULT_IMAGE_MEMORY_BUDGET_MB * MIB),
    "unbounded": lambda source: _render(source, None),
    "pyvips": _pyvips,
    "validate": _validate,
}


def _child(path: str, how: str) -> None:
    source = Path(path).read_bytes()
    if how == "pyvips":
        # A worker has its libraries loaded before its first job: not part of the work.
        importlib.import_module("pyvips")
    baseline, started, cpu = _kib("VmRSS:"), time.perf_counter(), time.process_time()
    outputs = WORK[how](source)
    print(
        json.dumps(
            {
                "seconds": time.perf_counter() - started,
                "cpu_seconds": time.process_time() - cpu,
                "baseline_kib": baseline,
                "peak_kib": _kib("VmHWM:"),
                "outputs": outputs,
            }
        )
    )


# -------------------------------------------------------------------- in the parent


@dataclass(frozen=True)
class Measured:
    """One child's run of one path on one source."""

    seconds: float
    cpu_seconds: float
    baseline_kib: int
    peak_kib: int
    outputs: Outputs

    @property
    def per_core(self) -> float:
        """Images per CPU-second."""
        return 1 / self.cpu_seconds


# (case, path) -> one Measured per round
Results = dict[tuple[str, str], list[Measured]]


def measure(path: Path, how: str) -> Measured:
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_images", "--child", str(path), how],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=1800,
    )
    raw = json.loads(done.stdout)
    outputs = {name: (w, h, n) for name, (w, h, n) in raw.pop("outputs").items()}
    return Measured(**raw, outputs=outputs)


def run(size: str, workdir: Path) -> Results:
    """Every path on every case, in interleaved rounds (each round sees the same load)."""
    sources = {case: workdir / case for case in SIZES[size]}
    for case, path in sources.items():
        path.write_bytes(CASES[case].make())
    results: Results = defaultdict(list)
    for _ in range(ROUNDS[size]):
        for case, path in sources.items():
            for how in PATHS[size]:
                results[(case, how)].append(measure(path, how))
    return results


def speedup(ours: Sequence[Measured], theirs: Sequence[Measured], field: str) -> float:
    """How many times less ``field`` (a time) ours took: the median over rounds of each
    round's ratio, as rounds share the machine's drift."""
    return statistics.median(
        float(getattr(t, field) / getattr(o, field)) for o, t in zip(ours, theirs, strict=True)
    )


def _median(rows: Sequence[Measured], field: str) -> float:
    return statistics.median(float(getattr(row, field)) for row in rows)


def _mib(kib: float) -> str:
    return f"{kib / 1024:.0f}"


def _row(label: str, how: str, rows: Sequence[Measured]) -> str:
    above = statistics.median(row.peak_kib - row.baseline_kib for row in rows)
    width, height, data = rows[0].outputs.get("optimized") or rows[0].outputs["upload"]
    shape = f"{width}x{height} | " + (f"{data / 1024:.0f}" if data else "-")
    return (
        f"| {label} | {how} | {_median(rows, 'seconds'):.2f} | "
        f"{_median(rows, 'cpu_seconds'):.2f} | {_median(rows, 'per_core'):.2f} | "
        f"{_mib(_median(rows, 'peak_kib'))} | {_mib(above)} | {shape} |"
    )


def memory_table(size: str, results: Results) -> list[str]:
    rows = [
        "| source | path | wall s | CPU s | images/s per core | peak RSS MiB | "
        "above baseline MiB | `optimized` | `optimized` KiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case in SIZES[size]:
        rows += [_row(CASES[case].label, how, results[(case, how)]) for how in PATHS[size]]
    return rows


def ratio_lines(size: str, results: Results) -> list[str]:
    """Per case, wall-time speed-up and peak RSS against the naive path; then, on the
    size's JPEG, jobsapp's per-core throughput against the naive path's and pyvips'."""
    lines = []
    for case in SIZES[size]:
        naive, ours = results[(case, "naive")], results[(case, "jobsapp")]
        lines.append(
            f"images {CASES[case].label}: v1 set {speedup(ours, naive, 'seconds'):.2f}x "
            f"the naive Pillow path, peak RSS {_mib(_median(ours, 'peak_kib'))} MiB "
            f"(naive {_mib(_median(naive, 'peak_kib'))} MiB)"
        )
    jpeg = SIZES[size][0]
    ours = results[(jpeg, "jobsapp")]
    for other in ("naive", "pyvips"):
        ratio = speedup(ours, results[(jpeg, other)], "cpu_seconds")
        lines.append(f"images: jobsapp/{other} {CASES[jpeg].short} ratio: {ratio:.2f}")
    return lines


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
        lambda v: (
            ((2 * v["mx"] * v["my"] + c1) * (2 * (v["cxy"] - v["mx"] * v["my"]) + c2))
            / (
                (v["mx"] * v["mx"] + v["my"] * v["my"] + c1)
                * (v["vx"] - v["mx"] * v["mx"] + v["vy"] - v["my"] * v["my"] + c2)
            )
        ),
        mx=mx,
        my=my,
        vx=vx,
        vy=vy,
        cxy=cxy,
    )
    assert isinstance(index, Image.Image)
    mean = index.reduce(index.size).getpixel((0, 0))
    assert isinstance(mean, float)
    return mean


def effort_table(size: str) -> list[str]:
    """WebP effort (``method``) for the optimized variant: time, bytes, SSIM vs method 6."""
    source = CASES["jpeg1" if size == "smoke" else "jpeg12"].make()
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
    rows = [
        "| method | encode s | bytes | SSIM vs method 6 | SSIM vs source |",
        "|---|---|---|---|---|",
    ]
    for method, (seconds, data) in encoded.items():
        out = Image.open(io.BytesIO(data))
        rows.append(
            f"| {method} | {seconds:.2f} | {len(data)} | {ssim(out, reference):.4f} | "
            f"{ssim(out, original):.4f} |"
        )
    return rows


def main(quick: bool = False, smoke: bool = False) -> list[str]:
    """Print the tables; return the ratio lines (``python -m bench`` collects them)."""
    size = "smoke" if smoke else "quick" if quick else "full"
    with tempfile.TemporaryDirectory(prefix="bench-images-") as workdir:
        results = run(size, Path(workdir))
    print(f"{ROUNDS[size]} round(s), medians; images/s per core = 1 / CPU s of the child")
    print("\n".join(memory_table(size, results)))
    print()
    print("\n".join(effort_table(size)))
    return ratio_lines(size, results)


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
