"""Real processes for end-to-end tests: workers, beats, producers and one-off commands.

Every process starts in a session of its own, so a SIGKILL of its process group takes a
prefork worker's children with it, and nothing is ever killed by name. A ``Launcher``
remembers all it started; its ``kill_all`` (a fixture finalizer) leaves none behind.

Run as ``python -m tests.support.procs enqueue '<json>'`` this module is the producer: it
enqueues the given jobs through the journal (fast-path publish after COMMIT) and prints
one JSON line per job. A crash point armed in its environment kills it on the way.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
WORKER_FLAGS = (
    "--pool=prefork",
    "-c",
    "1",
    "--without-gossip",
    "--without-mingle",
    "--without-heartbeat",
    "-l",
    "info",
)


def beat_argv(schedule_file: Path, level: str = "info") -> list[str]:
    """``celery -A jobsapp beat`` keeping its schedule in ``schedule_file``."""
    return [str(BIN / "celery"), "-A", "jobsapp", "beat", "-s", str(schedule_file), "-l", level]


def service_env(
    *,
    database_url: str,
    broker_url: str,
    var_dir: Path,
    settings: Mapping[str, str],
) -> dict[str, str]:
    """The environment of every process of one test module.

    The test process's own JOBSAPP_* variables (set by conftest for the in-process
    worker) are dropped, so a subprocess sees only this module's database and broker.
    Counters and the dedup fast path share the broker's Redis database: one flush of
    it resets everything the processes of a test left behind.
    """
    base = {k: v for k, v in os.environ.items() if not k.startswith("JOBSAPP_")}
    return {
        **base,
        "PYTHONPATH": str(ROOT),
        "JOBSAPP_DATABASE_URL": database_url,
        "JOBSAPP_BROKER_URL": broker_url,
        "JOBSAPP_TEST_REDIS_URL": broker_url,
        "JOBSAPP_REDIS_URL": broker_url,
        "JOBSAPP_IMPORTS": "tests.support.tasks",
        "JOBSAPP_VAR_DIR": str(var_dir),
        "JOBSAPP_STORAGE_URL": f"file://{var_dir / 'storage'}",
        **settings,
    }


@dataclass
class Proc:
    """One started process, its log file, and the means to kill it."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the process group and reap the leader: no cleanup code runs."""
        with contextlib.suppress(ProcessLookupError):  # the group is already gone
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)

    def wait_for_log(self, pattern: str, *, timeout: float = 30.0) -> re.Match[str]:
        """The first match of ``pattern`` in the log; fails early if the process died."""
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern, self.log())
            if found:
                return found
            if not self.alive():
                raise AssertionError(
                    f"{self.name} exited ({self.popen.returncode}) before "
                    f"logging {pattern!r}:\n{self.log()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.name} did not log {pattern!r} in {timeout}s:\n{self.log()[-3000:]}"
                )
            time.sleep(0.05)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)


@dataclass
class Launcher:
    env: dict[str, str]
    workdir: Path
    started: list[Proc] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _seq: int = 0

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Proc:
        with self._lock:
            self._seq += 1
            log_path = self.workdir / f"{self._seq:02d}-{name}.log"
            with log_path.open("wb") as out:
                popen = subprocess.Popen(
                    list(argv),
                    cwd=ROOT,
                    env={**self.env, **(env or {})},
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            proc = Proc(name, popen, log_path)
            self.started.append(proc)
            return proc

    def worker(
        self, name: str, env: Mapping[str, str] | None = None, *, flags: Sequence[str] = ()
    ) -> Proc:
        """``celery -A jobsapp worker`` named ``name@host`` (with Celery's ``flags`` besides
        the usual ones); call ``ready()`` before use."""
        argv = [str(BIN / "celery"), "-A", "jobsapp", "worker", *WORKER_FLAGS, *flags]
        argv += ["-n", f"{name}@%h"]
        return self.start(name, argv, env)

    def beat(self, name: str, env: Mapping[str, str] | None = None) -> Proc:
        return self.start(name, beat_argv(self.workdir / f"{name}-schedule"), env)

    def jobsapp(self, name: str, *args: str, env: Mapping[str, str] | None = None) -> Proc:
        return self.start(name, [str(BIN / "jobsapp"), *args], env)

    def producer(self, jobs: Iterable[Mapping[str, Any]], *, crash_at: str | None = None) -> Proc:
        payload = json.dumps(list(jobs), default=str)
        env = {"JOBSAPP_CRASH_AT": crash_at} if crash_at else None
        return self.start(
            "producer", [sys.executable, "-m", "tests.support.procs", "enqueue", payload], env
        )

    def enqueue(self, *jobs: Mapping[str, Any], timeout: float = 30.0) -> list[dict[str, Any]]:
        """Enqueue from a producer process; returns what it printed, one dict per job."""
        proc = self.producer(jobs)
        code = proc.wait(timeout)
        assert code == 0, f"producer failed ({code}):\n{proc.log()}"
        lines = [line for line in proc.log().splitlines() if line.startswith("{")]
        return [json.loads(line) for line in lines]

    def kill_all(self) -> None:
        """Kill every process group this launcher started, even those already exited."""
        with self._lock:
            procs = list(self.started)
        for proc in procs:
            proc.kill()

    def dump_logs(self) -> None:
        """Print each log's tail: pytest shows it when the test failed."""
        for proc in self.started:
            print(f"----- {proc.log_path.name} (pid {proc.pid}, exit {proc.popen.returncode})")
            print(proc.log()[-4000:])


def finished(
    argv: Sequence[str], env: Mapping[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``argv`` run to its end (two minutes at most), its output captured as text."""
    return subprocess.run(
        list(argv), env=env, cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


@contextlib.contextmanager
def launching(env: dict[str, str], workdir: Path) -> Iterator[Launcher]:
    """A launcher whose processes are all killed, and their logs printed, on the way out."""
    launcher = Launcher(env, workdir)
    try:
        yield launcher
    finally:
        launcher.kill_all()
        launcher.dump_logs()


def ready(*procs: Proc, timeout: float = 30.0) -> None:
    """Wait until each worker consumes and each beat has decided whether it leads."""
    for proc in procs:
        proc.wait_for_log(r" ready\.|is the leader|standing by", timeout=timeout)


class Supervisor:
    """Keeps ``size`` workers running, replacing any whose process exited.

    What systemd's ``Restart=always`` or Kubernetes does for a real deployment: a job
    that kills its worker must not take the capacity down with it.
    """

    def __init__(self, launcher: Launcher, size: int, prefix: str = "sup") -> None:
        self._launcher = launcher
        self._prefix = prefix
        self.workers = [launcher.worker(f"{prefix}{i}") for i in range(size)]
        self.restarts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="supervisor", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            for i, proc in enumerate(self.workers):
                if not proc.alive():
                    self.restarts += 1
                    self.workers[i] = self._launcher.worker(f"{self._prefix}{i}")

    def stop(self) -> None:
        """Stop restarting; the launcher kills the processes."""
        self._stop.set()
        self._thread.join(timeout=5)


def _enqueue_main(payload: str) -> int:
    from jobsapp.celery_app import app
    from tests.support import tasks  # noqa: F401 - registers the test tasks on the app

    for job in json.loads(payload):
        task = app.tasks[job["task"]]
        handle = task.apply_async(
            kwargs=job.get("kwargs", {}), job_id=job.get("job_id"), **job.get("options", {})
        )
        holder = str(handle.holder) if handle.holder else None
        print(
            json.dumps(
                {"job_id": str(handle.job_id), "outcome": str(handle.outcome), "holder": holder}
            ),
            flush=True,
        )
    return 0


def main(argv: Sequence[str]) -> int:
    if len(argv) == 2 and argv[0] == "enqueue":
        return _enqueue_main(argv[1])
    print("usage: python -m tests.support.procs enqueue '<json list of jobs>'", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
