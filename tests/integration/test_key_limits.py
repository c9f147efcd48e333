"""``limit=N`` and ``fair``: the key's slots in the journal (journal/slots.py)."""

from __future__ import annotations

from pathlib import Path

from tests.support.migrations import sqlite_then_postgres


def test_migration_0016_goes_down_and_up_again_on_both_dialects(tmp_path: Path) -> None:
    sqlite_then_postgres(tmp_path, "key_slots", "key_limit", below="0013")
