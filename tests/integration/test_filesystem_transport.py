"""The embedded default's broker (kombu's filesystem transport) as jobsapp selects it.

kombu's writer creates a message file under its final name and writes it after, and its
consumer takes any such file without waiting for the writer: an empty or torn file reached
``json.loads`` in the worker's consumer, whose ``JSONDecodeError`` stopped it (a clean-clone
CI on a loaded machine: ``celery inspect ping`` beside an embedded worker got no answer).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

from jobsapp.celery_app import _transport
from jobsapp.lifecycle.transport.filesystem_transport import PART, STALE

FILESYSTEM = "filesystem://"


def _connection(folder: Path, transport: Any) -> Connection:
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder)}
    options["processed_folder"] = str(folder.parent / "processed")
    options["store_processed"] = False
    return Connection(FILESYSTEM, transport=transport, transport_options=options)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "queue").mkdir()
    (tmp_path / "processed").mkdir()
    return tmp_path / "queue"


def test_a_torn_message_file_is_dropped_with_a_line_and_the_next_is_delivered(
    folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with _connection(folder, _transport(FILESYSTEM)) as conn:
        queue = conn.SimpleQueue("jobs")
        # What a consumer met between kombu's writer's open() and its write(): an empty
        # file under the queue's name, older than the whole message after it. kombu orders
        # names as strings: "0_" comes before any message's milliseconds ("1_" came after
        # them whenever the machine's monotonic clock read 1xxxxx ms).
        (folder / "0_torn.jobs.msg").write_bytes(b"")
        queue.put({"n": 1})
        with caplog.at_level(logging.ERROR):
            got = _first(queue)
        assert got.payload == {"n": 1}
        got.ack()
        queue.close()
    assert "the message file cannot be parsed" in caplog.text
    assert not any(folder.iterdir())


def _first(queue: Any) -> Any:
    """The first message the queue delivers (a dropped file is an empty poll, as kombu's
    own ``Empty``)."""
    for _ in range(5):
        try:
            return queue.get(timeout=1)
        except queue.Empty:
            continue
    raise AssertionError("no message delivered")


def test_a_message_appears_under_its_queues_name_only_once_whole(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[str]] = []
    real_replace = os.replace

    def watched(src: str, dst: str) -> None:
        seen.append(sorted(p.name for p in folder.iterdir()))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", watched)
    with _connection(folder, _transport(FILESYSTEM)) as conn:
        conn.SimpleQueue("jobs").put({"n": 1})
    # While the file was written, no name a consumer takes (``*.jobs.msg``) was there.
    assert seen
    assert all(not n.endswith(".jobs.msg") for names in seen for n in names)
    assert [p.name.endswith(".jobs.msg") for p in folder.iterdir()] == [True]


def test_a_writers_unfinished_file_is_removed_once_stale_and_a_fresh_one_kept(
    folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # What a writer killed between its write and its rename left, and one still writing.
    stale = folder / f"1_dead.jobs.msg{PART}"
    fresh = folder / f"2_alive.jobs.msg{PART}"
    for each in (stale, fresh):
        each.write_bytes(b'{"half')
    long_ago = time.time() - STALE - 5
    os.utime(stale, (long_ago, long_ago))
    with _connection(folder, _transport(FILESYSTEM)) as conn:
        queue = conn.SimpleQueue("jobs")
        with caplog.at_level(logging.WARNING), pytest.raises(queue.Empty):
            queue.get(timeout=0.5)
        queue.close()
    assert sorted(p.name for p in folder.iterdir()) == [fresh.name]
    assert f"removed {stale.name}" in caplog.text
