"""The pure parts of the start-up checks: schema verdicts and what a line may show."""

from __future__ import annotations

from jobsapp.preflight import reason_of, safe_url, schema_problem

KNOWN = ("0001", "0002", "0003")


def test_a_database_at_head_is_fine() -> None:
    assert schema_problem(["0003"], ["0003"], KNOWN) is None


def test_an_empty_database_needs_the_upgrade() -> None:
    assert schema_problem([], ["0003"], KNOWN) == (
        "it has no jobsapp tables (this jobsapp needs revision 0003)"
    )


def test_a_database_behind_names_both_revisions() -> None:
    assert schema_problem(["0002"], ["0003"], KNOWN) == (
        "it is at revision 0002, this jobsapp needs 0003"
    )


def test_a_database_migrated_by_a_newer_jobsapp_is_not_refused() -> None:
    # A rolling deploy migrates first; the old code keeps running on the expanded schema.
    assert schema_problem(["0004"], ["0003"], KNOWN) is None


def test_a_password_never_reaches_the_line() -> None:
    assert safe_url("postgresql+psycopg2://app:s3cret@db:5432/jobs") == (
        "postgresql+psycopg2://app:***@db:5432/jobs"
    )
    assert safe_url("redis://:s3cret@cache:6379/0") == "redis://:***@cache:6379/0"
    assert safe_url("sqlite:////var/jobsapp.db") == "sqlite:////var/jobsapp.db"


def test_the_reason_is_the_first_line_of_the_innermost_error() -> None:
    class Wrapped(Exception):
        def __init__(self, orig: BaseException) -> None:
            super().__init__("(driver) long wrapper text")
            self.orig = orig

    inner = OSError("connection refused\n\tIs the server running on that host?")

    assert reason_of(Wrapped(inner)) == "connection refused"
    assert reason_of(ValueError()) == "ValueError"
