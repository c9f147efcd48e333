"""Procrastinate 3 on the same Postgres: ``procrastinate --app=bench.peer_procrastinate.app``.

Its worker runs as its own process with ``--concurrency 2`` (two jobs at once in one
asyncio loop); jobs are kept after completion, as Procrastinate ships.
"""

from __future__ import annotations

import os

import procrastinate

from bench.tasks import count_done

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("BENCH_PEER_DSN", ""))
)


@app.task(name="bench.procrastinate_noop")
def noop() -> None:
    count_done()
