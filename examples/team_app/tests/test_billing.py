"""The team's own tests of its lifecycle tasks, on jobsapp's testing kit alone: installing
``jobsapp[testing]`` gives the ``jobsapp`` fixture; nothing else is set up (docs/testing.md)."""

from __future__ import annotations

from typing import Any

import pytest
from billing.tasks import charge, invoice, notify


def test_invoice_is_enqueued_and_runs(jobsapp: Any) -> None:
    invoice.delay("acct-1")
    invoice.delay("acct-1")  # same key: one run
    jobsapp.assert_enqueued(invoice, args=("acct-1",))
    assert len(jobsapp.enqueued(invoice)) == 1
    assert jobsapp.drain()["succeeded"] == 1
    (run,) = jobsapp.runs(invoice)
    assert (run.state, run.result) == ("succeeded", "invoiced acct-1")


def test_a_body_runs_through_the_lifecycle_in_a_unit_test(jobsapp: Any) -> None:
    run = jobsapp.perform(invoice, "acct-2")
    assert (run.state, run.attempts, run.result) == ("succeeded", 1, "invoiced acct-2")


def test_a_transient_failure_is_retried_as_the_same_job(jobsapp: Any) -> None:
    charge.delay("acct-5")
    assert jobsapp.drain() == {"retried": 1, "succeeded": 1}
    (run,) = jobsapp.runs(charge)
    assert (run.state, run.attempts, run.result) == ("succeeded", 2, "charged acct-5")


def test_a_chain_runs_its_steps_in_order(jobsapp: Any) -> None:
    (invoice.s("acct-6") | notify.s()).delay()
    assert jobsapp.drain()["succeeded"] == 2
    (sent,) = jobsapp.runs(notify)
    assert sent.result == "sent: invoiced acct-6"


def test_nothing_leaks_from_one_test_to_the_next(jobsapp: Any) -> None:
    jobsapp.refute_enqueued(invoice)
    assert jobsapp.runs(invoice) == []


@pytest.mark.usefixtures("jobsapp_worker")
def test_a_real_worker_answers_a_call() -> None:
    assert invoice.delay("acct-3").get(timeout=30) == "invoiced acct-3"
