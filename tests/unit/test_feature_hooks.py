"""Features enter the producer's fast path only through the filters an app registers at
setup (lifecycle/transport/hooks.py), and the worker's claim only through the holds it
registers (lifecycle/worker/claim.py) or the rate a task declares: a plain app's publish
and claim enter none of them."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from celery import Celery

import jobsapp
from jobsapp.celery_app import app as shipped
from jobsapp.lifecycle import lifecycle_task
from jobsapp.lifecycle.flow.gating import held_while_paused, while_paused
from jobsapp.lifecycle.journal import PendingMessage
from jobsapp.lifecycle.transport import outbox
from jobsapp.lifecycle.transport.hooks import add_publish_filter, publish_filters
from jobsapp.lifecycle.worker import claim, key_limits

ROOT = Path(__file__).resolve().parents[2]
PUBLISH_PATH = ("lifecycle/transport/outbox.py", "lifecycle/transport/hooks.py")


def _message() -> PendingMessage:
    return PendingMessage(
        1, uuid.uuid4(), 1, "t", {"module": "jobs"}, datetime.now(UTC), 0, 0, queue=None
    )


def _plain_app() -> Celery:
    """A Celery app with no lifecycle task."""
    return Celery("plain", broker="memory://", set_as_current=False)


def _team_app() -> Celery:
    """A team's own app with one lifecycle task of no feature: no rate, no limit, no key."""
    team = Celery("team", broker="memory://", set_as_current=False)
    lifecycle_task(team, name="team.job", lazy=False, shared=False)(_body)
    return team


def _body() -> None:
    """A task body with no feature."""


def test_a_plain_app_has_no_publish_filter() -> None:
    assert list(publish_filters(_plain_app())) == []


def test_a_teams_app_gets_the_pause_filter_with_its_first_lifecycle_task() -> None:
    """An operator may pause any queue: a team's own app's fast path holds back a paused
    queue's messages as the deployment's does, and registers the filter once."""
    team = _team_app()
    assert list(publish_filters(team)) == [held_while_paused]
    lifecycle_task(team, name="team.other", lazy=False, shared=False)(_body)
    assert list(publish_filters(team)) == [held_while_paused]


def test_the_deployment_app_registers_the_pause_filter_once() -> None:
    assert list(publish_filters(shipped)) == [held_while_paused]
    add_publish_filter(shipped, held_while_paused)
    assert list(publish_filters(shipped)) == [held_while_paused]


def test_a_filter_registered_on_one_app_is_entered_by_its_publishes_only() -> None:
    seen: list[str] = []

    def hold_all(app: Celery, messages: Sequence[PendingMessage]) -> Sequence[PendingMessage]:
        seen.append(app.main or "")
        return []

    holding, plain = _plain_app(), _plain_app()
    holding.main = "holding"
    add_publish_filter(holding, hold_all)
    assert outbox.publish_now(holding, [_message()]) == 0  # held: nothing reaches a broker
    assert seen == ["holding"]
    assert list(publish_filters(plain)) == []


def test_the_publish_path_imports_no_feature_gate() -> None:
    """Flow control's pause check is registered, not imported, by the publish path."""
    root = Path(jobsapp.__file__).resolve().parent
    for module in PUBLISH_PATH:
        tree = ast.parse((root / module).read_text())
        imported = [
            f"{node.module}.{alias.name}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
            for alias in node.names
        ]
        assert not [name for name in imported if "flow.gating" in name], module


def test_a_plain_app_has_no_claim_hold() -> None:
    assert claim.claim_holds(_plain_app()) == ()


def test_a_teams_app_and_the_deployment_app_get_the_pause_hold_once() -> None:
    team = _team_app()
    assert claim.claim_holds(team) == (while_paused,)
    lifecycle_task(team, name="team.other", lazy=False, shared=False)(_body)
    claim.add_claim_hold(shipped, while_paused)
    assert claim.claim_holds(team) == claim.claim_holds(shipped) == (while_paused,)


FLOW = str(Path(jobsapp.__file__).resolve().parent / "lifecycle" / "flow")
CLAIM = claim.__file__
KEY_LIMITS = key_limits.__file__


def _probed(scenario: str, url: str) -> dict[str, Any]:
    """tests/support/claim_probe.py's attempt, in a process of its own."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.claim_probe", scenario, url],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    found["entered"] = {tuple(pair) for pair in found["entered"]}
    return found


def test_a_plain_job_on_an_app_with_no_hold_enters_no_flow_or_key_limit_code(
    sqlite_url: str,
) -> None:
    probed = _probed("plain", sqlite_url)
    assert probed["state"] == "succeeded", probed["ran"]
    assert (CLAIM, "claim") in probed["entered"]
    assert not [(f, name) for f, name in probed["entered"] if f.startswith(FLOW) or f == KEY_LIMITS]


def test_the_pause_hold_keeps_a_paused_queues_job_at_claim(sqlite_url: str) -> None:
    probed = _probed("paused", sqlite_url)
    assert probed["ran"] == f"not run: {claim.Refusal.PAUSED.value}"
    assert (f"{FLOW}/gating.py", "while_paused") in probed["entered"]
    assert (probed["state"], probed["attempts"]) == ("queued", 0)
