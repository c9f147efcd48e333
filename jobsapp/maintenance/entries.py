"""Beat's maintenance entries: present whatever schedule a deployment declares.

A deployment adds its own periodic tasks the Celery way (``beat_schedule`` in its
``celeryconfig.py``, or ``app.conf.beat_schedule = {...}``). Either replaces the whole
setting, and the reaper, the relay and the other passes would silently stop with it, so
the shipped entries are merged back by entry name. A deployment may change a shipped
entry (its cadence, its options, even its name: entries are matched by the task they run),
but a schedule that leaves a maintenance pass out on purpose is refused with one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobsapp.settings import SettingsError

MAINTENANCE_PREFIX = "jobsapp.maintenance."


def _task_of(spec: Any) -> str | None:
    task = spec.get("task") if isinstance(spec, Mapping) else None
    return task if isinstance(task, str) else None


def with_maintenance(shipped: Mapping[str, Any], deployment: Mapping[str, Any]) -> dict[str, Any]:
    """``deployment``'s entries plus each shipped maintenance entry whose pass it does not
    run under a name of its own. ``None`` as a shipped entry's value, or a shipped name
    reused for another task, would stop a pass: ``SettingsError`` names it."""
    named = {_task_of(spec) for spec in deployment.values()}
    merged = {
        name: spec
        for name, spec in shipped.items()
        if name not in deployment and _task_of(spec) not in named
    }
    merged.update((name, spec) for name, spec in deployment.items() if spec is not None)
    needed = {t for t in map(_task_of, shipped.values()) if t and t.startswith(MAINTENANCE_PREFIX)}
    if missing := sorted(needed - {_task_of(spec) for spec in merged.values()}):
        dropped = [n for n in deployment if _task_of(shipped.get(n)) in missing]
        raise SettingsError(
            f"beat_schedule: {', '.join(repr(n) for n in dropped)} would stop "
            f"{', '.join(missing)}, which the job lifecycle needs; change an entry's "
            "schedule instead of removing or reusing it (docs/periodic.md)"
        )
    return merged
