"""Named crash points for fault tests: SIGKILL this process at a chosen window.

Disarmed unless the process started with ``JOBSAPP_CRASH_AT`` naming points
(comma-separated). Arming is read once at import, from the environment only, so nothing
reachable over HTTP can arm a point, and a disarmed point costs one set lookup.
"""

from __future__ import annotations

import os
import signal

POINTS = frozenset(
    {
        "after_staging",
        "after_commit_before_publish",
        "after_publish_before_confirm",
        "between_publish_round_trips",
        "before_publish_mark",
        "after_s3_write_before_commit",
        "after_result_commit_before_ack",
        "after_attachment_failed_before_run_outcome",
        "mid_run",
        "before_heartbeat",
        "reopen_after_update",
        "step_after_commit_before_successors",
    }
)


def _armed(raw: str) -> frozenset[str]:
    names = frozenset(n.strip() for n in raw.split(",") if n.strip())
    unknown = names - POINTS
    if unknown:
        raise ValueError(f"JOBSAPP_CRASH_AT names unknown crash points: {sorted(unknown)}")
    return names


ARMED = _armed(os.environ.get("JOBSAPP_CRASH_AT", ""))


def hit(name: str) -> None:
    """Die here, without cleanup, if ``name`` is armed in this process."""
    if name in ARMED:
        os.kill(os.getpid(), signal.SIGKILL)
