"""jobsapp.contrib.django refuses a Django connection it cannot join (no I/O: an in-memory
SQLite connection stands for Django on another database)."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import pytest

from jobsapp.contrib.django import _driver


def test_a_connection_other_than_postgres_is_refused_by_name() -> None:
    refused = pytest.raises(TypeError, match="got sqlite3")
    with closing(sqlite3.connect(":memory:")) as conn, refused:
        _driver(conn)
