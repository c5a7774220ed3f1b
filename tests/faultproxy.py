"""A TCP proxy on a free loopback port that can lose a reply on purpose.

``drop_next_reply()`` makes the proxy forward the client's next request, then
swallow the server's answer and cut both connections: the client sent a
request whose outcome it cannot know. ``drop_next_request()`` cuts the
connection instead of forwarding the request (a connection killed under a
request in flight: the server never ran it, the client cannot know that).
While ``refuse()`` is in force, new connections are closed as soon as they
are accepted (a server that does not answer); ``accept()`` lifts it.
Everything runs in daemon threads of the test process and stops with
:meth:`close`.
"""

from __future__ import annotations

import socket
import threading

from .servers import free_port


class DropReplyProxy:
    """Forward 127.0.0.1:``port`` to ``upstream``; lose a reply on demand."""

    def __init__(self, upstream_host: str, upstream_port: int):
        self.upstream = (upstream_host, upstream_port)
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._lock = threading.Lock()
        self._drop_armed = False
        self._drop_request = False
        self._refusing = False
        self._closed = False
        self._sockets: set[socket.socket] = set()
        #: Set when a reply was swallowed (the trap sprang).
        self.dropped = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def drop_next_reply(self, match=None, *, then_refuse: bool = True) -> None:
        """Swallow the answer to the next request sent on any connection
        (the next one for which ``match(data)`` is true, if given), then
        refuse new connections unless ``then_refuse`` is False."""
        with self._lock:
            self._drop_armed = True
            self._drop_request = False
            self._match = match
            self.dropped.clear()
            self._refuse_after_drop = then_refuse

    def drop_next_request(self, match=None, *, then_refuse: bool = True) -> None:
        """Like :meth:`drop_next_reply`, but the request never reaches the
        server: the proxy cuts both connections instead of forwarding it."""
        self.drop_next_reply(match, then_refuse=then_refuse)
        with self._lock:
            self._drop_request = True

    def refuse(self) -> None:
        with self._lock:
            self._refusing = True

    def accept(self) -> None:
        with self._lock:
            self._refusing = False

    def close(self) -> None:
        self._closed = True
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            sockets = list(self._sockets)
        for s in sockets:
            _shut(s)

    def _serve(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refusing = self._refusing
            if refusing:
                _shut(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                _shut(client)
                continue
            with self._lock:
                self._sockets |= {client, server}
            pair = {"swallow": False}
            threading.Thread(
                target=self._pump, args=(client, server, pair, True), daemon=True
            ).start()
            threading.Thread(
                target=self._pump, args=(server, client, pair, False), daemon=True
            ).start()

    def _pump(self, src, dst, pair, from_client: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if from_client:
                    with self._lock:
                        if self._drop_armed and (
                            self._match is None or self._match(data)
                        ):
                            self._drop_armed = False
                            pair["swallow"] = True
                            if self._refuse_after_drop:
                                self._refusing = True
                            if self._drop_request:
                                self.dropped.set()
                                break
                    dst.sendall(data)
                elif pair["swallow"]:
                    # The server answered; the client never hears it.
                    self.dropped.set()
                    break
                else:
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            _shut(src)
            _shut(dst)


def _shut(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass
