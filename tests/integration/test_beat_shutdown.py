"""A beat told to stop (SIGTERM from systemd or Kubernetes, Ctrl-C) stops at once and hands
its lease back, whatever it was doing.

Celery's handler (``celery.apps.beat.Beat.install_sync_handler``) closes the scheduler inside
the signal handler, wherever the main thread is, then raises ``SystemExit``. Inside a
maintenance pass's transaction, the lease's release then waited on that transaction's own
lock: SQLite's busy timeout (30 s) on the embedded default, for ever on PostgreSQL when the
pass held the lease's row (a renewal between a pass's batches). Here the real Celery
handler and service run a beat in this process, and its reaper pass is told to stop while it
holds the lease's row.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery.apps.beat import Beat
from celery.beat import Service
from sqlalchemy import Engine, update

from jobsapp.celery_app import app
from jobsapp.db import get_engine
from jobsapp.maintenance import lease
from jobsapp.maintenance.lease import LEASES
from jobsapp.maintenance.scheduler import LEASE_NAME, LeasedScheduler

# A write that keeps the lease's row (PostgreSQL) or the database (SQLite) locked until
# its transaction ends, as a renewal between a pass's batches does.
TOUCH_LEASE = update(LEASES).where(LEASES.c.name == LEASE_NAME).values(holder=LEASES.c.holder)


@pytest.fixture
def handlers_kept() -> Iterator[None]:
    """Celery's handler is installed in this process for the test, and taken back after."""
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in kept.items():
        signal.signal(sig, handler)


def _stopped_inside_its_transaction(*_args: Any, **_kwargs: Any) -> None:
    with get_engine().begin() as conn:
        conn.execute(TOUCH_LEASE)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs here, and its SystemExit leaves the transaction
    raise AssertionError("SIGTERM's handler never ran")


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("handlers_kept", "lease_check_kept")
def test_a_beat_told_to_stop_inside_a_pass_stops_at_once_and_hands_its_lease_back(
    db: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app.loader.import_default_modules()  # beat's tasks, the maintenance passes among them
    monkeypatch.setattr(
        app.tasks["jobsapp.maintenance.reaper"], "run", _stopped_inside_its_transaction
    )
    service = Service(
        app=app, scheduler_cls=LeasedScheduler, schedule_filename=str(tmp_path / "schedule")
    )
    Beat(app=app).install_sync_handler(service)

    started = time.monotonic()
    service.start()
    stopped_after = time.monotonic() - started

    assert stopped_after < 10, f"beat took {stopped_after:.1f} s to stop"
    assert "beat lease not released" not in caplog.text
    with db.connect() as conn:
        assert lease.holder_of(conn, LEASE_NAME) is None, "the lease was not handed back"
