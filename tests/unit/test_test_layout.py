"""Shared test helpers live in tests/support (or a folder's own support modules): no test
module imports another test module, whose fixtures and collection would come along."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _imported_test_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        found |= {
            n for n in names if n.startswith("tests.") and n.split(".")[-1].startswith("test_")
        }
    own = ".".join(path.relative_to(TESTS.parent).with_suffix("").parts)
    return found - {own}  # a module may name itself to a child process it starts


def test_no_test_module_imports_another() -> None:
    importing = {
        str(path.relative_to(TESTS)): sorted(found)
        for path in sorted(TESTS.rglob("*.py"))
        if (found := _imported_test_modules(path))
    }
    assert importing == {}, f"move what they share to tests/support: {importing}"
