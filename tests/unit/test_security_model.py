"""docs/operators.md's security model names every route the web serves."""

from __future__ import annotations

import re
from pathlib import Path

from jobsapp.web.app import create_app

DOC = Path(__file__).resolve().parents[2] / "docs" / "operators.md"
_PARAM = re.compile(r"<(?:\w+:)?\w+>|\{\w+\}")


def _documented() -> list[str]:
    """The endpoints of the table's first column, parameters as ``{}``, without methods."""
    section = DOC.read_text().split("## The web's security model", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    cells = [row.split("|")[1] for row in rows]
    named = [name for cell in cells for name in re.findall(r"`([^`]+)`", cell)]
    return [_PARAM.sub("{}", name.split(" ")[-1]) for name in named]


def _covers(entry: str, path: str) -> bool:
    if entry.endswith("/..."):
        return path.startswith(entry.removesuffix("..."))
    if entry.startswith(".../"):
        return path.endswith(entry.removeprefix("..."))
    return path == entry


def test_every_route_has_a_row() -> None:
    entries = _documented()
    paths = {_PARAM.sub("{}", rule.rule) for rule in create_app().url_map.iter_rules()}
    assert paths
    assert sorted(p for p in paths if not any(_covers(e, p) for e in entries)) == []
