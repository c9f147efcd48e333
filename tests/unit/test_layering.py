"""Dependencies point down: no module of jobsapp imports from a higher floor, and the
modules import each other without a cycle (docs/architecture.md draws the floors).

Every ``import`` of the package's source is read with ``ast``, those inside functions too
(a late import is still a dependency). A floor is declared per module prefix, the longest
prefix winning, so ``jobsapp.lifecycle.journal`` and anything under it is the engine's
floor whether the journal is one module or a package. Imports between modules of one
floor are allowed; the cycle check keeps them one-way.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import jobsapp

PACKAGE = Path(jobsapp.__file__).resolve().parent

FLOOR_NAMES = (
    "base",
    # The engine, bottom up: its pure rules; the journal (tables and statements); flow
    # control's gates; the transport between journal and broker; Celery's client APIs
    # answered from the journal; the producer; the worker (with the log formatting, whose
    # records carry the run's trace and are scrubbed by the engine's own scrubber: a
    # delivery names its job in them); workflows; and the base Task that puts them together.
    "rules",
    "journal",
    "flow",
    "transport",
    "celery_api",
    "producer",
    "worker",
    "workflows",
    "task",
    "domain",
    "web",
    "demo",
    "cli",
)
F = {name: floor for floor, name in enumerate(FLOOR_NAMES)}
BASE, DOMAIN, WEB, DEMO, CLI = F["base"], F["domain"], F["web"], F["demo"], F["cli"]
FLOORS = {
    # What every floor may use: settings, connections, object storage, startup checks.
    "jobsapp.settings": BASE,
    "jobsapp.db": BASE,
    "jobsapp.held": BASE,
    "jobsapp.storage": BASE,
    "jobsapp.crashpoints": BASE,
    "jobsapp.shipped": BASE,
    "jobsapp.progress": BASE,
    "jobsapp.preflight": BASE,
    **{f"jobsapp.lifecycle.{name}": F[name] for name in FLOOR_NAMES[F["rules"] : F["task"]]},
    "jobsapp.lifecycle": F["task"],
    "jobsapp.logs": F["worker"],
    # What runs on the engine: the domain's tasks, beat's passes, the operator's views and
    # actions, and the Celery app they are declared on (with the package's face, whose
    # ``app`` is what ``celery -A jobsapp`` loads).
    "jobsapp": DOMAIN,
    "jobsapp.celery_app": DOMAIN,
    "jobsapp.attachments": DOMAIN,
    "jobsapp.maintenance": DOMAIN,
    "jobsapp.monitor": DOMAIN,
    "jobsapp.operator": DOMAIN,
    "jobsapp.schema": DOMAIN,
    "jobsapp.contrib": DOMAIN,
    "jobsapp.web": WEB,
    # The console's session tables are declarations on the journal's Base, which the
    # schema (Alembic's metadata) registers: data of the web, on the domain's floor.
    "jobsapp.web.session_tables": DOMAIN,
    # ``jobsapp demo`` runs the web and a worker on a throwaway database; the command line
    # starts it, and everything else.
    "jobsapp.demo": DEMO,
    "jobsapp.cli": CLI,
    # The users' test kit and its pytest plugin: it drives the app and its tasks.
    "jobsapp.testing": CLI,
}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    top_level: bool  # runs when the importer is imported (not in a function, not for types)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def floor_of(module: str) -> int:
    prefixes = [p for p in FLOORS if module == p or module.startswith(p + ".")]
    assert prefixes, f"{module} has no floor: add it to FLOORS"
    return FLOORS[max(prefixes, key=len)]


def _target(base: str, name: str) -> str:
    """``from base import name``: the submodule when ``name`` is one, else ``base``."""
    return f"{base}.{name}" if f"{base}.{name}" in modules() else base


def _absolute(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = importer if modules()[importer].name == "__init__.py" else importer.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


# What holds statements: ``except`` clauses and ``case`` arms are not statements themselves.
_BLOCKS = (ast.stmt, ast.excepthandler, ast.match_case)


def _walk(importer: str, nodes: list[ast.stmt], top: bool) -> Iterator[Import]:
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(importer, alias.name, node.lineno, top)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(importer, node)
            for alias in node.names:
                yield Import(importer, _target(base, alias.name), node.lineno, top)
        else:
            here = (
                top
                and not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
                and not (isinstance(node, ast.If) and _is_type_checking(node))
            )
            children = [c for c in ast.iter_child_nodes(node) if isinstance(c, _BLOCKS)]
            yield from _walk(importer, children, here)


@cache
def imports() -> tuple[Import, ...]:
    found = []
    for name, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        found += [i for i in _walk(name, tree.body, True) if i.imported.split(".")[0] == "jobsapp"]
    return tuple(found)


def test_every_module_has_a_floor() -> None:
    for name in modules():
        floor_of(name)


def test_no_module_imports_from_a_higher_floor() -> None:
    upward = [
        f"{i.importer}:{i.line} ({FLOOR_NAMES[floor_of(i.importer)]}) imports {i.imported} "
        f"({FLOOR_NAMES[floor_of(i.imported)]})"
        for i in imports()
        if floor_of(i.imported) > floor_of(i.importer)
    ]
    assert not upward, "\n".join(["upward imports:", *upward])


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the path that closes it, or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for nxt in sorted(graph.get(node, ())):
            found = visit(nxt, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start, [])
        if found:
            return found
    return None


def test_no_import_cycle_between_modules() -> None:
    """Imports that run at import time; a parent package's ``__init__`` (which Python
    loads first) is not counted, as it only re-exports what its modules define."""
    graph: dict[str, set[str]] = {}
    for i in imports():
        if i.top_level and i.imported != i.importer:
            graph.setdefault(i.importer, set()).add(i.imported)
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle or ())


def test_no_module_name_is_used_twice() -> None:
    """A name says one thing: ``claim`` is the worker's, the journal's file is
    ``claiming``."""
    seen: dict[str, list[str]] = {}
    for name, path in modules().items():
        if path.name != "__init__.py":
            seen.setdefault(path.stem, []).append(name)
    assert not {stem: names for stem, names in seen.items() if len(names) > 1}


def test_the_engine_is_a_few_rooms() -> None:
    """The engine's modules live in its floors' packages; only the base Task, which
    puts them together, sits at the top."""
    top = sorted(p.name for p in (PACKAGE / "lifecycle").glob("*.py"))
    assert top == ["__init__.py", "task.py"]
