"""The shape of a run, at the end of its summary: the modules that took longest, the
seconds each floor of tests/ took, and per xdist worker how long it was busy and when its
last module ended.

The suite's wall time is the parallel run's busiest worker plus the serial run: a module
that ends last alone, or a worker idle at the end, shows here (tests/README.md).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import pytest

SHOWN = 15
# A run of a few modules (a developer's) has no shape worth printing.
AT_LEAST = 10


@dataclass
class Module:
    name: str
    seconds: float = 0.0  # setup + call + teardown of its tests
    start: float = float("inf")
    stop: float = 0.0
    worker: str = "-"


class Shape:
    def __init__(self) -> None:
        self.modules: dict[str, Module] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        name = report.nodeid.split("::", 1)[0]
        module = self.modules.setdefault(name, Module(name))
        module.seconds += report.duration
        module.start = min(module.start, report.start)
        module.stop = max(module.stop, report.stop)
        node = getattr(report, "node", None)  # set by xdist on the controller's copy
        if node is not None:
            module.worker = node.gateway.id

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if len(self.modules) < AT_LEAST:
            return
        began = min(m.start for m in self.modules.values())
        write = terminalreporter.write_line
        terminalreporter.section(f"slowest {SHOWN} modules (seconds; from-to after the start)")
        for m in sorted(self.modules.values(), key=lambda m: -m.seconds)[:SHOWN]:
            span = f"{m.start - began:.0f}-{m.stop - began:.0f}"
            write(f"{m.seconds:7.1f}  {span:>9}  {m.worker:>4}  {m.name}")
        floors: dict[str, float] = defaultdict(float)
        for m in self.modules.values():
            floors[m.name.split("/")[1] if m.name.count("/") > 1 else "-"] += m.seconds
        totals = ", ".join(f"{floor} {secs:.0f}" for floor, secs in sorted(floors.items()))
        write(f"by floor: {totals}")
        workers: dict[str, list[Module]] = defaultdict(list)
        for m in self.modules.values():
            workers[m.worker].append(m)
        if len(workers) < 2:
            return
        terminalreporter.section("per worker (seconds after the start)")
        for worker, mods in sorted(workers.items()):
            last = max(mods, key=lambda m: m.stop)
            busy = sum(m.seconds for m in mods)
            write(
                f"{worker}: {len(mods)} modules, busy {busy:.0f}, "
                f"ended {last.stop - began:.0f} with {last.name}"
            )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(Shape(), "jobsapp-run-shape")
