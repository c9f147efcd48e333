"""``python -m bench NAME... [--quick | --smoke]``: benchmarks, on servers of their own.

NAME is lifecycle, images, upload, maintenance, scale, profile, limits, flow, growth or all (several
names run in the order given). The run
starts its own Postgres clusters (fsync on, as production runs it, and fsync off, as the tests run
it), Redis and S3 with scripts/services.sh (state under var/bench/, ports from
--port-base), runs the benchmarks, writes PNG plots to --out, prints every ratio line at
the end and stops the servers, also on failure or Ctrl-C. Must run as root (Postgres runs
via runuser).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import os
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from bench import services

# A benchmark: (the bench's servers, size name, output dir) -> its ratio lines.
Benchmark = Callable[[services.Services, str, Path], list[str]]


def _lifecycle(svc: services.Services, size: str, out: Path) -> list[str]:
    from bench import bench_lifecycle

    return bench_lifecycle.main(svc, size, out)


def _upload(svc: services.Services, size: str, out: Path) -> list[str]:
    from bench import bench_upload

    return bench_upload.main(svc, size, out)


def _maintenance(svc: services.Services, size: str, out: Path) -> list[str]:
    from bench import bench_maintenance

    return bench_maintenance.main(svc, size, out)


def _scale(svc: services.Services, size: str, out: Path) -> list[str]:
    from bench import bench_scale

    return bench_scale.main(svc, size, out)


def _limits(svc: services.Services, size: str, out: Path) -> list[str]:
    from bench import bench_limits

    return bench_limits.main(svc, size, out)


def _flow(svc: services.Services, size: str, out: Path) -> list[str]:
    from bench import bench_flow

    return bench_flow.main(svc, size, out)


def _growth(svc: services.Services, size: str, out: Path, sizes: Sequence[int] = ()) -> list[str]:
    from bench import bench_growth

    return bench_growth.main(svc, size, out, tuple(sizes))


def _profile(svc: services.Services, size: str, out: Path, refs: Sequence[str] = ()) -> list[str]:
    from bench import bench_profile

    return bench_profile.main(svc, size, out, refs)


# The image benchmark (bench/bench_images.py) is i10-images' module: registered here when
# it exists, called as ``main(quick=...)`` (plus ``smoke=`` if it takes one) with the
# JOBSAPP_TEST_* variables pointing at the bench's servers; a list it returns is its
# ratio lines.
IMAGES_MODULE = "bench.bench_images"


def _images(_svc: services.Services, size: str, _out: Path) -> list[str]:
    if importlib.util.find_spec(IMAGES_MODULE) is None:
        return ["images: bench/bench_images.py is not on this branch yet (skipped)"]
    images = importlib.import_module(IMAGES_MODULE)
    options: dict[str, bool] = {"quick": size != "full"}
    if "smoke" in inspect.signature(images.main).parameters:
        options["smoke"] = size == "smoke"
    lines = images.main(**options)
    return [str(line) for line in lines] if isinstance(lines, list) else []


BENCHMARKS: dict[str, Benchmark] = {
    "lifecycle": _lifecycle,
    "images": _images,
    "upload": _upload,
    "maintenance": _maintenance,
    "scale": _scale,
    "profile": _profile,
    "limits": _limits,
    "flow": _flow,
    "growth": _growth,
}


def _test_env(svc: services.Services) -> None:
    """Modules written against the test services read these; point them at ours."""
    os.environ.update(
        {
            "JOBSAPP_TEST_DATABASE_URL": svc.durable.pg_url("bench"),
            "JOBSAPP_TEST_REDIS_URL": svc.durable.redis_url(0),
            "JOBSAPP_TEST_S3_ENDPOINT_URL": svc.durable.s3_endpoint,
            "JOBSAPP_TEST_S3_BUCKET": services.S3_BUCKET,
            **services.S3_KEYS,
        }
    )


def _absolute(text: str) -> Path:
    """services.sh starts the servers from elsewhere: a relative path would miss."""
    return Path(text).resolve()


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in text.split(","))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("name", nargs="+", choices=[*BENCHMARKS, "all"])
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--quick",
        action="store_const",
        dest="size",
        const="quick",
        help="small sizes, all under 5 minutes",
    )
    size.add_argument(
        "--smoke",
        action="store_const",
        dest="size",
        const="smoke",
        help="tiny sizes: checks that every benchmark still runs",
    )
    parser.set_defaults(size="full")
    parser.add_argument(
        "--port-base",
        type=int,
        default=services.DEFAULT_PORT_BASE,
        help="first of 13 ports (and those +10000 for S3's gRPC)",
    )
    parser.add_argument(
        "--state-dir",
        type=_absolute,
        default=services.ROOT / "var" / "bench",
        help="server state; wiped at start (must be readable by postgres)",
    )
    parser.add_argument(
        "--out",
        type=_absolute,
        default=services.ROOT / "var" / "bench" / "out",
        help="plots and worker logs",
    )
    parser.add_argument(
        "--ref",
        action="append",
        default=[],
        help="profile: a commit to profile instead of this checkout (checked "
        "out with git worktree for the run); repeat for before/after",
    )
    parser.add_argument(
        "--sizes",
        type=_sizes,
        default=(),
        help="growth: the journal sizes (runs, comma-separated) instead of the run's own",
    )
    return parser.parse_args(argv)


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    # SIGTERM's default would end the process without unwinding: the servers and workers
    # would outlive it. As an exception, every ``finally`` on the way out stops them.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    names = list(BENCHMARKS) if "all" in args.name else list(dict.fromkeys(args.name))
    benchmarks: dict[str, Benchmark] = {
        **BENCHMARKS,
        "profile": partial(_profile, refs=args.ref),
        "growth": partial(_growth, sizes=args.sizes),
    }
    # A run killed with SIGKILL leaves its servers up: stop them before wiping their state.
    services.stop(args.port_base, args.state_dir / "servers")
    shutil.rmtree(args.state_dir / "servers", ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    started, lines = time.monotonic(), []
    compare = args.size != "smoke"  # the fsync-off cluster: figures to compare, none in smoke
    with services.started(args.port_base, args.state_dir / "servers", compare=compare) as svc:
        _test_env(svc)
        for name in names:
            print(f"\n==== {name} ({args.size})", flush=True)
            began = time.monotonic()
            lines += benchmarks[name](svc, args.size, args.out)
            print(f"==== {name} took {time.monotonic() - began:.0f}s", flush=True)
    print(f"\n==== ratios ({args.size}, {time.monotonic() - started:.0f}s; plots in {args.out})")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
