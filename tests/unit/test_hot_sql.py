"""The hot statements' text is held in tests/golden/, one file per statement and dialect
(tests/support/golden.py): a change to the SQL of a claim, a heartbeat, a finish, the reaper
or the relay fails here until its golden file is rewritten by ``GOLDEN_UPDATE=1``,
so the change shows in review. tests/integration/test_bounded_reads.py checks that the
paths send these statements, and explains each on a planted journal."""

from __future__ import annotations

import pytest

from tests.support import golden


def _check(name: str, dialect: str, text: str) -> None:
    file = golden.path(name, dialect)
    if golden.UPDATE:
        file.write_text(text)
    assert file.exists(), f"no golden text of {name} ({file}): run with GOLDEN_UPDATE=1"
    assert file.read_text() == text, f"{name} changed; GOLDEN_UPDATE=1 rewrites {file}"


@pytest.mark.parametrize("name", sorted(golden.HOT))
def test_the_text_of_a_hot_statement_is_its_golden_text(name: str) -> None:
    on_postgres = golden.as_file(golden.compiled(name, "postgresql"))
    _check(name, "postgresql", on_postgres)
    on_sqlite = golden.compiled(name, "sqlite")
    if on_sqlite and golden.as_file(on_sqlite) != on_postgres:
        _check(name, "sqlite", golden.as_file(on_sqlite))
    else:  # SQLite runs PostgreSQL's text, or no statement of this name
        assert not golden.path(name, "sqlite").exists()


def test_every_golden_file_names_a_hot_statement() -> None:
    names = {p.name.split(".")[0] for p in golden.GOLDEN.glob("*.sql")}
    assert names == set(golden.HOT)
