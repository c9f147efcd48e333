"""A live page whose reads were slow tells its script to ask again later (issue 37): an open
tab on a large journal does not keep the database busy every 5 seconds."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine

from jobsapp.monitor import summary
from jobsapp.web import ui
from jobsapp.web.app import create_app
from tests.support.attachments import environment
from tests.support.web import TOKEN


def test_a_live_page_that_answered_slowly_asks_again_later(
    pg: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [100.0]
    monkeypatch.setattr(ui, "monotonic", lambda: clock[0])
    health = summary.health

    def slow_health(*args: Any, **kwargs: Any) -> summary.Health:
        clock[0] += 1.2  # the overview's reads took 1.2 s
        return health(*args, **kwargs)

    auth = {"Authorization": f"Bearer {TOKEN}"}
    live = {**auth, ui.LIVE_HEADER: "1"}
    with environment(JOBSAPP_ADMIN_TOKEN=TOKEN):
        client = create_app().test_client()
        quick = client.get("/admin", headers=live)
        monkeypatch.setattr(summary, "health", slow_health)
        slow = client.get("/admin", headers=live)
        page = client.get("/admin", headers=auth)

    assert quick.headers[ui.LIVE_EVERY_HEADER] == "5000"
    assert slow.headers[ui.LIVE_EVERY_HEADER] == "12000"
    # The page's first load starts its script at the same pace.
    assert 'data-live="12000"' in page.get_data(as_text=True)
