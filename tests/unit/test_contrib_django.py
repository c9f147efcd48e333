"""jobsapp.contrib.django refuses a Django connection it cannot join (no I/O: an in-memory
SQLite connection stands for Django on another database or driver)."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import pytest

from jobsapp.contrib.django import _check_driver


def test_a_connection_other_than_psycopg2_is_refused_by_name() -> None:
    refused = pytest.raises(TypeError, match="got sqlite3")
    with closing(sqlite3.connect(":memory:")) as conn, refused:
        _check_driver(conn)
