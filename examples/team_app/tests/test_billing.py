"""The team's own tests of its lifecycle tasks, on jobsapp's testing kit alone: installing
``jobsapp[testing]`` gives the ``jobsapp`` fixture; nothing else is set up (docs/testing.md)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from billing.tasks import charge, export, invoice, notify, remind, settle
from billing.views import DAY, request_invoice


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


def test_a_retry_runs_once_the_clock_reaches_its_delay(jobsapp: Any) -> None:
    settle.delay("acct-8")
    assert jobsapp.drain() == {"retried": 1}
    jobsapp.assert_enqueued(settle, args=("acct-8",), countdown=300)
    assert jobsapp.drain() == {}  # due in five minutes: nothing runs yet
    jobsapp.advance(300)
    assert jobsapp.drain() == {"succeeded": 1}
    (run,) = jobsapp.assert_succeeded(settle)
    assert (run.attempts, run.result) == (2, "settled acct-8")


def test_a_view_enqueues_the_invoice_now_and_a_reminder_tomorrow(jobsapp: Any) -> None:
    status, body = request_invoice(SimpleNamespace(method="POST", POST={"account": "acct-7"}))
    assert status == 202
    jobsapp.assert_enqueued(invoice, args=("acct-7",))
    jobsapp.assert_enqueued(remind, args=("acct-7",), countdown=DAY)
    assert jobsapp.drain() == {"succeeded": 1}  # the invoice; the reminder waits
    (run,) = jobsapp.runs(invoice)
    assert str(run.job_id) == body["job_id"]
    jobsapp.advance(DAY)
    assert jobsapp.drain() == {"succeeded": 1}
    assert [r.result for r in jobsapp.assert_succeeded(remind)] == ["reminded acct-7"]


def test_a_view_refuses_a_request_without_an_account(jobsapp: Any) -> None:
    assert request_invoice(SimpleNamespace(method="POST", POST={}))[0] == 400
    jobsapp.refute_enqueued(invoice)
    jobsapp.refute_enqueued(remind)


def test_two_exports_of_an_account_run_at_once_and_a_third_waits(jobsapp: Any) -> None:
    for month in ("2026-10", "2026-11", "2026-12"):
        export.delay("acct-4", month)
    assert [r.waiting for r in jobsapp.runs(export)] == [False, False, True]
    assert len(jobsapp.enqueued(export, key="export:acct-4")) == 3
    assert jobsapp.drain() == {"succeeded": 3}  # the third once a slot freed
    runs = jobsapp.assert_succeeded(export, key="export:acct-4")
    assert [r.result for r in runs][-1] == "exported acct-4 2026-12"


def test_nothing_leaks_from_one_test_to_the_next(jobsapp: Any) -> None:
    jobsapp.refute_enqueued(invoice)
    assert jobsapp.runs(invoice) == []


@pytest.mark.usefixtures("jobsapp_worker")
def test_a_real_worker_answers_a_call() -> None:
    assert invoice.delay("acct-3").get(timeout=30) == "invoiced acct-3"
