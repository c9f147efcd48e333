"""CPU seconds of a process and its descendants, read from /proc (Linux)."""

from __future__ import annotations

import os
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def parse_stat(line: str) -> tuple[int, float]:
    """(parent pid, CPU seconds incl. reaped children) from one /proc/PID/stat line.

    The command name may hold spaces and parentheses, so fields count from the last ')'.
    Fields after it: state ppid ... utime(12th) stime cutime cstime.
    """
    fields = line[line.rindex(")") + 2 :].split()
    ticks = sum(int(f) for f in fields[11:15])
    return int(fields[1]), ticks / _TICKS


def _all_stats() -> dict[int, tuple[int, float]]:
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stats[int(entry.name)] = parse_stat((entry / "stat").read_text())
            except (FileNotFoundError, ProcessLookupError):
                continue  # exited while we listed
    return stats


def tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and every live descendant (dead ones count in cutime)."""
    stats = _all_stats()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
            todo.extend(children.get(pid, []))
    return total
