"""How a permit's release hands it over on SQLite: a datagram to its waiter.

SQLite cannot signal from one connection to another, but every process of
one SQLite database runs on one host. So a thread that queues for a permit
binds a Unix datagram socket in Linux's abstract namespace (no file to
clean up: the name goes with the socket) and names it in its place in the
queue; a release that frees a permit grants it to the waiter first in line,
in its transaction, and once it has committed sends that waiter's bell a
datagram with the waiter's token and fencing token. A datagram sent between
a waiter's attempt and its wait stays in the socket's buffer, so no grant
goes unheard; one left over from an earlier wait names another token and is
passed over. A bell that nobody has bound any more (:func:`rings`) tells
that its waiter has gone.
"""

from __future__ import annotations

import secrets
import socket
import sys
import threading
from collections.abc import Iterable

__all__ = ["AVAILABLE", "SQL_FUNCTION", "Bells", "rings"]

#: Longest datagram a bell reads: a token, a space and a fencing token.
MESSAGE_SIZE = 128

#: Whether this platform has Linux's abstract socket namespace.
AVAILABLE = sys.platform.startswith("linux") and hasattr(socket, "AF_UNIX")
#: The name under which the backend's SQLite connections know :func:`rings`.
SQL_FUNCTION = "distlock_bell_rings"


def _socket() -> socket.socket:
    return socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)


def rings(name: str | None) -> bool:
    """Return False if no socket is bound to the bell ``name`` any more.

    Its thread has ended, or its process has died, and with it the waiter
    whose place names the bell. Connecting to the name sends nothing, so the
    waiter, if it is there, is not woken. A bell that cannot be told apart
    (any other error) counts as ringing.
    """
    if name is None:
        return True
    with _socket() as probe:
        try:
            probe.connect("\0" + name)
        except ConnectionRefusedError:
            return False
        except OSError:
            pass
    return True


class Bells:
    """Each thread's bell (a bound datagram socket), and ringing others'."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._sender: socket.socket | None = None
        self._lock = threading.Lock()

    def _mine(self) -> socket.socket | None:
        bell = getattr(self._local, "bell", None)
        return None if bell is None else bell[0]

    def own(self) -> str:
        """Return the name of this thread's bell, bound on first use."""
        bell = getattr(self._local, "bell", None)
        if bell is None:
            sock = _socket()
            name = "distlock_wait_" + secrets.token_hex(8)
            sock.bind("\0" + name)
            bell = self._local.bell = (sock, name)
        return bell[1]

    def forget(self) -> None:
        """In a forked child: close the bell and sender the parent's thread
        left it. Whoever read the parent's bell would take the parent's
        wake-ups, and while the child kept it open the parent's waiter,
        dead or alive, would look alive (:func:`rings`)."""
        inherited = [self._mine(), self._sender]
        self._local = threading.local()
        self._sender = None
        self._lock = threading.Lock()
        for sock in inherited:
            if sock is not None:
                sock.close()

    def drain(self) -> None:
        """Drop the wake-ups this thread's bell has had so far."""
        sock = self._mine()
        if sock is None:
            return
        sock.setblocking(False)
        try:
            while True:
                sock.recv(MESSAGE_SIZE)
        except BlockingIOError:
            pass

    def wait(self, timeout: float) -> bytes | None:
        """Wait up to ``timeout`` seconds for this thread's bell to ring.

        Return the datagram (empty: a wake-up without a grant), or None if
        none came.
        """
        sock = self._mine()
        if sock is None:
            return None  # no place names a bell of this thread yet: try again now
        sock.settimeout(max(timeout, 0.0))
        try:
            return sock.recv(MESSAGE_SIZE)
        except TimeoutError:
            return None

    def ring(self, messages: Iterable[tuple[str, bytes]]) -> None:
        """Send each bell its message; a bell whose thread has gone is passed."""
        with self._lock:
            if self._sender is None:
                self._sender = _socket()
            sender = self._sender
        for name, message in messages:
            try:
                sender.sendto(message, socket.MSG_DONTWAIT, "\0" + name)
            except OSError:
                # Refused: the waiter has gone (its place is passed over).
                # Full: it has datagrams it has not read yet.
                pass
