"""A deadline on each call of a PostgreSQL lock connection.

libpq has no read timeout. Its keepalive probes and ``tcp_user_timeout``
(:data:`.sessions.LIBPQ_TIMEOUTS`) end a connection whose server's machine
stopped answering, but a server process that is itself stopped (SIGSTOP, a
paused container, a hung postmaster) on a machine that still acknowledges
every packet leaves a statement waiting for as long as it stays stopped.
One thread per process watches the calls in flight and shuts down the
socket of one that outlasts its deadline: the driver then fails it as a
lost connection, and the backend reports ``LockBackendError``. MySQL's
drivers have a read timeout of their own (:data:`.sessions.MYSQL_TIMEOUTS`).
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time

__all__ = ["DEADLINES", "LISTING_DEADLINE", "STATEMENT_DEADLINE", "Deadlines"]

#: Seconds a lock operation's statements may take (the MySQL drivers'
#: ``read_timeout`` of the lock connections). The longest a lock statement
#: waits in the server is for a row that another lock connection's
#: transaction holds, and the server ends such a session once it has sat
#: idle in its transaction for ``IDLE_TRANSACTION_TIMEOUT`` (3 s).
STATEMENT_DEADLINE = 6.0
#: Seconds a listing of every holder, or a purge of stale rows, may take:
#: 100,000 leases are listed in about a second, and the admin page lists
#: them within a request, which a WSGI server cuts off after 30 s (gunicorn's
#: default).
LISTING_DEADLINE = 20.0
#: How often the watcher looks; a call is cut at most this much late.
TICK = 0.25
#: Seconds the watcher lives on with nothing to watch.
IDLE_EXIT = 30.0


def _shut_down(fileno: int) -> None:
    """Shut the socket behind ``fileno`` down, in both directions.

    On a duplicate of the descriptor: the socket is shut down for every
    descriptor of it, and the driver's own one stays open for the driver to
    close.
    """
    try:
        sock = socket.socket(fileno=os.dup(fileno))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()


class Deadlines:
    """The calls in flight of one process's lock connections, and their
    watcher.

    ``start`` before a call and ``end`` after it, on the calling thread;
    the connection must not be closed in between, so that the descriptor
    the watcher shuts down is still the connection's.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys = itertools.count()
        #: key -> (monotonic deadline, socket descriptor)
        self._running: dict[int, tuple[float, int]] = {}
        self._watcher: threading.Thread | None = None
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        # In a forked child: the parent's calls and its thread are not ours.
        self._lock = threading.Lock()
        self._running, self._watcher = {}, None

    def start(self, fileno: int, seconds: float) -> int:
        """Watch a call on descriptor ``fileno`` for ``seconds``; return its key."""
        key = next(self._keys)
        with self._lock:
            self._running[key] = (time.monotonic() + seconds, fileno)
            if self._watcher is None:
                self._watcher = threading.Thread(
                    target=self._watch, name="django_distlock deadlines", daemon=True
                )
                self._watcher.start()
        return key

    def end(self, key: int) -> bool:
        """Stop watching call ``key``; return True if its deadline cut it."""
        with self._lock:
            return self._running.pop(key, None) is None

    def _watch(self) -> None:
        idle_since = time.monotonic()
        while True:
            time.sleep(TICK)
            now = time.monotonic()
            with self._lock:
                if not self._running:
                    if now - idle_since > IDLE_EXIT:
                        self._watcher = None
                        return
                    continue
                idle_since = now
                for key, (deadline, fileno) in list(self._running.items()):
                    if now >= deadline:
                        # Under the lock: ``end`` cannot return, so the
                        # connection cannot be closed, until it is done.
                        del self._running[key]
                        _shut_down(fileno)


#: The process's one watcher of lock calls.
DEADLINES = Deadlines()
