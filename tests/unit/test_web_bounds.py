"""The web's bounds without a server: upload slots refuse rather than queue, and a late
request's connection stops being read."""

from __future__ import annotations

import socket
from dataclasses import dataclass

import pytest

from jobsapp.web.server import Deadlines
from jobsapp.web.upload_bound import Busy, Slots


def test_a_request_beyond_the_slots_is_refused_and_a_freed_slot_admits_again() -> None:
    slots = Slots(2)
    with slots.held(), slots.held():
        with pytest.raises(Busy) as refused, slots.held():
            pass
        assert refused.value.limit == 2
    with slots.held():
        pass


def test_a_refusal_holds_no_slot() -> None:
    slots = Slots(1)
    with slots.held():
        for _ in range(3):
            with pytest.raises(Busy), slots.held():
                pass
    with slots.held():
        pass


def test_no_slot_at_all_is_refused_as_a_setting() -> None:
    with pytest.raises(ValueError, match="admits nothing"):
        Slots(0)


@dataclass
class Conn:
    sock: socket.socket


def test_only_a_connection_past_its_deadline_stops_being_read() -> None:
    now = [0.0]
    # Its own thread sleeps through the test: the test cuts, on its clock.
    deadlines = Deadlines(tick=3600, clock=lambda: now[0])
    late_server, late_client = socket.socketpair()
    kept_server, kept_client = socket.socketpair()
    late, kept = Conn(late_server), Conn(kept_server)
    with deadlines.watch(late, 10), deadlines.watch(kept, 10):
        deadlines.extend(kept, 30)  # the headers are in: the body has its own time
        now[0] = 11
        assert deadlines.cut_late() == 1
        # The late one reads its end at once, as if its client had stopped sending.
        assert late_server.recv(1) == b""
        kept_client.sendall(b"x")
        assert kept_server.recv(1) == b"x"
    now[0] = 100
    assert deadlines.cut_late() == 0  # no longer watched once its request ended
    for s in (late_server, late_client, kept_server, kept_client):
        s.close()
