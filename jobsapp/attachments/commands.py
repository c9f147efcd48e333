"""``jobsapp reprocess`` and ``jobsapp verify``: the attachment operator commands.

``register(subparsers)`` adds them to the ``jobsapp`` command; ``python -m
jobsapp.attachments.commands`` runs them on their own. Output goes to stdout, one line
per step, flushed, so a supervisor or a pipe sees progress as it happens.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from jobsapp import logs, preflight
from jobsapp.progress import progress_bar, working
from jobsapp.settings import SettingsError, get_settings

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from jobsapp.attachments.reprocess import Progress
    from jobsapp.attachments.verify import Report
    from jobsapp.storage import ObjectStore

EXIT_OK = 0
EXIT_DRIFT = 1
# Bad input or configuration, or the store or database cannot be reached: no verdict.
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # the shell's code for a process ended by SIGINT


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def complain(line: str) -> None:
    sys.stderr.write(f"jobsapp: {line}\n")


# --- reprocess --------------------------------------------------------------------------


def reprocess(args: argparse.Namespace) -> int:
    if args.as_job:
        return reprocess_as_job(args)
    from jobsapp.attachments.pipeline import UnknownPipeline
    from jobsapp.attachments.reprocess import reprocess_to
    from jobsapp.db import get_engine

    last: list[Progress] = []

    def show(progress: Progress) -> None:
        last[:] = [progress]
        update(
            progress.seen,
            progress.total,
            f"enqueued {progress.seen}/{progress.total} (new {progress.enqueued}, "
            f"already queued {progress.in_flight}, busy {progress.busy})",
        )

    try:
        with progress_bar(f"reprocess to v{args.to_version}") as update:
            done = reprocess_to(
                get_engine(),
                args.to_version,
                batch=args.batch,
                progress=show,
                retry_failed=args.retry_failed,
                pause=args.pause,
            )
    except (UnknownPipeline, ValueError) as bad:
        complain(str(bad))
        return EXIT_USAGE
    except KeyboardInterrupt:
        seen = f"{last[0].seen}/{last[0].total}" if last else "0"
        # Each batch is one transaction: what committed stays, the rest was rolled back.
        say(
            f"interrupted after {seen}: run the same command again to go on "
            "(jobs already enqueued are found, not enqueued twice)"
        )
        return EXIT_INTERRUPTED
    say(reprocess_summary(done))
    return EXIT_OK


def reprocess_as_job(args: argparse.Namespace) -> int:
    """Hand the walk to a worker as a lifecycle job (``reprocess_runs``), one per version."""
    from jobsapp.attachments.pipeline import UnknownPipeline
    from jobsapp.attachments.reprocess import start_backfill

    try:
        job = start_backfill(
            args.to_version, batch=args.batch, pause=args.pause, retry_failed=args.retry_failed
        )
    except (UnknownPipeline, ValueError) as bad:
        complain(str(bad))
        return EXIT_USAGE
    if job.holder is not None:
        say(f"a backfill to v{args.to_version} is already active: job {job.holder}")
        return EXIT_OK
    say(
        f"backfill to v{args.to_version}: job {job.job_id} ({job.outcome.value}); "
        "follow it with: jobsapp summary --module reprocess"
    )
    return EXIT_OK


def reprocess_summary(done: Progress) -> str:
    text = (
        f"done: {done.seen} attachments to v{done.version}: {done.enqueued} enqueued, "
        f"{done.in_flight} already queued, {done.busy} busy "
        "(another job holds the key)"
    )
    if done.failed_before:
        text += (
            f"; {done.failed_before} left out, their v{done.version} job failed before "
            "(--retry-failed runs them again)"
        )
    return text + f". Each stays ready on its version until v{done.version} is published."


# --- verify -----------------------------------------------------------------------------


def verify(args: argparse.Namespace) -> int:
    from jobsapp.attachments import verify as check
    from jobsapp.attachments.store import get_store
    from jobsapp.db import get_engine
    from jobsapp.storage import StorageError

    engine, store = get_engine(), get_store()
    try:
        with working("verify: reading the bucket and the database"):
            report = check.verify(engine, store, deep=args.deep, batch=args.batch)
        show_report(report)
        if report.clean or not args.repair:
            return EXIT_OK if report.clean else EXIT_DRIFT
        return _repair(engine, store, report, args)
    except StorageError as exc:
        # Not drift: nothing can be said about the store until it answers.
        complain(f"object store unavailable: {exc}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        say("interrupted: run the same command again")
        return EXIT_INTERRUPTED


def _repair(engine: Engine, store: ObjectStore, report: Report, args: argparse.Namespace) -> int:
    from jobsapp.attachments import verify as check

    plan = check.plan_repair(report)
    done = check.repair(engine, store, plan, batch=args.batch)
    say(
        f"repair: deleted {done.orphans_deleted} orphans and {done.corrupt_deleted} corrupt "
        f"objects; requeued {len(plan.reruns)} attachments; "
        f"{len(plan.unrepairable)} problems cannot be repaired"
    )
    if done.orphans_restored:
        say(f"repair: put back {done.orphans_restored} orphans a publish adopted meanwhile")
    for problem in plan.unrepairable:
        say(f"UNREPAIRABLE {problem.line()} (the original is needed to render again)")
    if done.jobs:
        say(f"waiting up to {args.wait:g}s for {len(done.jobs)} jobs (a worker must be running)")
        states = check.wait_for(engine, done.jobs, timeout=args.wait)
        for job_id, state in states.items():
            if state != "succeeded":
                say(f"job {job_id} (attachment {done.jobs[job_id]}) is {state}")
        rewritten = check.record_rewritten(engine, store, plan.reruns, done.jobs, states)
        if rewritten:
            say(f"repair: {rewritten} variant rows now describe their re-rendered objects")
    again = check.verify(engine, store, deep=args.deep, batch=args.batch)
    show_report(again, title="after repair")
    return EXIT_OK if again.clean else EXIT_DRIFT


def show_report(report: Report, *, title: str = "verify") -> None:
    say(
        f"{title}: {report.attachments} ready attachments, {report.objects} objects checked; "
        f"{len(report.problems)} problems, {len(report.orphans)} orphans"
        f" ({report.in_flight} unnamed objects of work in flight)"
    )
    for problem in report.problems:
        say(problem.line())
    for orphan in report.orphans:
        say(f"ORPHAN   {orphan.key} ({orphan.size} bytes, {orphan.modified_at.isoformat()})")


# --- wiring -----------------------------------------------------------------------------


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _seconds(raw: str) -> float:
    value = float(raw)
    if not value >= 0:
        raise argparse.ArgumentTypeError("must be zero or more seconds")
    return value


def register(subparsers: Any) -> None:
    """Add ``reprocess`` and ``verify`` to an argparse ``add_subparsers()`` object."""
    again = subparsers.add_parser(
        "reprocess", help="enqueue ready attachments on an older pipeline version for a newer one"
    )
    again.add_argument("--to-version", type=int, required=True, help="the pipeline version")
    again.add_argument("--batch", type=_positive_int, default=100, help="attachments per commit")
    again.add_argument(
        "--pause", type=_seconds, default=0.0, help="seconds between batches, to spare the workers"
    )
    again.add_argument(
        "--retry-failed",
        action="store_true",
        help="also run the attachments whose job at the version failed",
    )
    again.add_argument(
        "--as-job",
        action="store_true",
        help="run it as a lifecycle job on a worker (reprocess_runs)",
    )
    again.set_defaults(handler=reprocess)
    check = subparsers.add_parser(
        "verify", help="cross-check published attachments against the object store"
    )
    check.add_argument(
        "--repair",
        action="store_true",
        help="delete orphans and corrupt objects, re-run their jobs",
    )
    check.add_argument(
        "--deep",
        action="store_true",
        help="hash every object's bytes, not only its stored checksum",
    )
    check.add_argument(
        "--wait", type=_seconds, default=600.0, help="seconds to wait for the repair jobs"
    )
    check.add_argument("--batch", type=_positive_int, default=200, help="rows per query")
    check.set_defaults(handler=verify)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jobsapp", description=__doc__)
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        get_settings()
        logs.configure()
    except SettingsError as bad:
        preflight.report(preflight.configuration_failure(bad))
        return EXIT_USAGE
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
