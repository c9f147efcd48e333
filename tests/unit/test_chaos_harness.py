"""The chaos harness never shares a broker another session may be using."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.harness import RabbitBroker


def test_without_rabbitmqctl_a_rabbit_broker_is_refused_not_shared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the harness fell back to the default vhost and purged its queue, where another
    session's messages may wait."""
    monkeypatch.setenv("JOBSAPP_SVC_DIR", str(tmp_path))  # no node of scripts/services.sh here
    with pytest.raises(RuntimeError, match="could not create the vhost 'chaos-x'"):
        RabbitBroker.create("amqp://guest:guest@127.0.0.1:9//", "redis://127.0.0.1:9/0", "chaos-x")
