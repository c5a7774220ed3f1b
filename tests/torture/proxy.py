"""A TCP fault proxy for one Redis node (loopback only), run in a thread.

Clients connect to :attr:`FaultProxy.port`; every connection is forwarded to
the node. The test then injects faults into the traffic:

- :meth:`delay` holds every chunk for a while before forwarding it;
- :meth:`partition` cuts the link: data in both directions is silently
  dropped (the peers see a black hole and time out, as with a real network
  partition); :meth:`heal` closes the connections that lost data, so no
  client ever reads a stream with a hole in it;
- :meth:`drop_replies` drops a reply *after the server ran the command* and
  closes the connection: the client cannot know whether its command
  happened.
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading

__all__ = ["FaultProxy"]


class FaultProxy:
    """Forward ``127.0.0.1:<port>`` to ``127.0.0.1:<upstream_port>`` with faults."""

    def __init__(self, upstream_port: int, seed: int = 0):
        self.upstream_port = upstream_port
        self.port = 0
        self.latency = 0.0
        self.cut = False
        self.drop_probability = 0.0
        self.dropped_replies = 0
        self.forwarded_chunks = 0
        self._random = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._server = None
        self._conns: set[_Link] = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(
            target=self._main, name=f"proxy-{upstream_port}", daemon=True
        )

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> FaultProxy:
        """Start listening on a free loopback port; return self."""
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fault proxy did not start")
        return self

    def stop(self) -> None:
        """Close every connection and stop the proxy thread."""
        if not self._thread.is_alive():
            return
        self._loop.call_soon_threadsafe(self._shutdown)
        self._thread.join(10)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._accept, sock=sock)
        )
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    def _shutdown(self) -> None:
        self._server.close()
        for link in list(self._conns):
            link.close()
        tasks = [t for t in asyncio.all_tasks(self._loop) if not t.done()]

        async def drain():
            # Aborted links end their pumps within a few loop iterations.
            if tasks:
                await asyncio.wait(tasks, timeout=2)
            self._loop.stop()

        self._loop.create_task(drain())

    # -- faults ------------------------------------------------------------

    def delay(self, seconds: float) -> None:
        """Hold every chunk ``seconds`` before forwarding it (0: no delay)."""
        self.latency = seconds

    def partition(self) -> None:
        """Black-hole all traffic, on open and new connections."""
        self.cut = True

    def heal(self) -> None:
        """End the partition; close connections that lost data meanwhile."""
        self.cut = False
        self._loop.call_soon_threadsafe(self._close_damaged)

    def drop_replies(self, probability: float) -> None:
        """Drop each reply with ``probability``, then close that connection."""
        self.drop_probability = probability

    def reset_all(self) -> None:
        """Close every open connection (as a proxy or NAT restart would)."""
        self._loop.call_soon_threadsafe(
            lambda: [link.close() for link in list(self._conns)]
        )

    def _close_damaged(self) -> None:
        for link in list(self._conns):
            if link.damaged:
                link.close()

    # -- forwarding --------------------------------------------------------

    async def _accept(self, reader, writer) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(
                "127.0.0.1", self.upstream_port
            )
        except OSError:
            writer.close()
            return
        link = _Link(writer, up_writer)
        self._conns.add(link)
        try:
            await asyncio.gather(
                self._pump(link, reader, up_writer, upstream=True),
                self._pump(link, up_reader, writer, upstream=False),
            )
        finally:
            link.close()
            self._conns.discard(link)

    async def _pump(self, link, reader, writer, upstream: bool) -> None:
        try:
            while not link.closed:
                data = await reader.read(65536)
                if not data:
                    break
                if self.latency:
                    await asyncio.sleep(self.latency)
                if self.cut:
                    link.damaged = True
                    continue
                if (
                    not upstream
                    and self.drop_probability
                    and self._random.random() < self.drop_probability
                ):
                    # The server ran the command; its reply never arrives.
                    self.dropped_replies += 1
                    break
                if link.damaged:
                    break
                writer.write(data)
                self.forwarded_chunks += 1
                await writer.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            link.close()


class _Link:
    """One client connection and its upstream twin."""

    def __init__(self, client_writer, upstream_writer):
        self.writers = (client_writer, upstream_writer)
        self.closed = False
        self.damaged = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for writer in self.writers:
            try:
                writer.transport.abort()
            except Exception:  # noqa: S110 - already closed
                pass
