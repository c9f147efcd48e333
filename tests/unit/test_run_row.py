"""``journal.Run`` types the columns every run table shares: a column added to
``tables.RunMixin`` without its field (or a field naming no column) fails here."""

from __future__ import annotations

import dataclasses

import pytest

from jobsapp.lifecycle.journal import Run, registry
from jobsapp.lifecycle.journal.tables import RunMixin
from tests.support.runs import a_run


def test_the_fields_are_the_shared_columns() -> None:
    shared = set(RunMixin.__annotations__)
    assert {f.name for f in dataclasses.fields(Run)} - {"columns"} == shared


@pytest.mark.parametrize("spec", list(registry.all_tables()), ids=lambda s: s.module)
def test_every_run_table_has_the_shared_columns(spec: registry.RunTable) -> None:
    fields = {f.name for f in dataclasses.fields(Run)} - {"columns"}
    assert fields <= set(spec.table.c.keys())


def test_a_run_keeps_its_own_columns_and_cannot_be_changed() -> None:
    run = a_run(params={"args": [1]})
    assert run.columns["params"] == {"args": [1]}
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.state = "running"  # type: ignore[misc]


def test_a_run_never_claimed_has_no_token_to_fence_with() -> None:
    with pytest.raises(ValueError, match="never claimed"):
        assert a_run().claimed_token
