"""The watcher of the database backend's calls (deadlines.py), on sockets.

A socket pair stands in for a lock connection whose server stopped
answering: a call blocked reading it must be cut once its deadline passes,
and a call that returned in time must be left alone. A stopped PostgreSQL
server is in test_database_partition.py.
"""

from __future__ import annotations

import os
import socket
import threading
import time

from django_distlock.backends.database import deadlines
from django_distlock.backends.database.deadlines import Deadlines


def test_a_call_past_its_deadline_loses_its_socket():
    watcher = Deadlines()
    ours, server = socket.socketpair()
    try:
        key = watcher.start(ours.fileno(), 0.2)
        started = time.monotonic()
        assert ours.recv(1) == b"", "the blocked read should see the socket shut"
        waited = time.monotonic() - started
        assert watcher.end(key) is True
        assert 0.2 <= waited < 0.2 + 10 * deadlines.TICK
        # The descriptor is still the caller's to close.
        os.fstat(ours.fileno())
    finally:
        ours.close()
        server.close()


def test_a_call_in_time_is_left_alone():
    watcher = Deadlines()
    ours, server = socket.socketpair()
    try:
        key = watcher.start(ours.fileno(), 0.5)
        server.sendall(b"x")
        assert ours.recv(1) == b"x"
        assert watcher.end(key) is False
        time.sleep(0.5 + 2 * deadlines.TICK)
        server.sendall(b"y")  # the socket still works
        assert ours.recv(1) == b"y"
    finally:
        ours.close()
        server.close()


def test_the_watcher_exits_when_idle_and_comes_back(monkeypatch):
    monkeypatch.setattr(deadlines, "IDLE_EXIT", 0.1)
    watcher = Deadlines()
    ours, server = socket.socketpair()
    try:
        watcher.end(watcher.start(ours.fileno(), 5))
        first = watcher._watcher
        first.join(5)
        assert not first.is_alive()
        key = watcher.start(ours.fileno(), 0.1)
        assert ours.recv(1) == b""
        assert watcher.end(key) is True
        assert watcher._watcher is not first
    finally:
        ours.close()
        server.close()


def test_many_threads_each_cut_on_its_own():
    watcher = Deadlines()
    pairs = [socket.socketpair() for _ in range(8)]
    cut: dict[int, bool] = {}

    def call(i: int) -> None:
        ours, server = pairs[i]
        late = i % 2 == 0
        key = watcher.start(ours.fileno(), 0.2 if late else 5)
        if not late:
            server.sendall(b"x")
        ours.recv(1)
        cut[i] = watcher.end(key)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert cut == {i: i % 2 == 0 for i in range(8)}
    finally:
        for a, b in pairs:
            a.close()
            b.close()
