"""Commands over a redis-py connection's socket, with as few system calls as can be.

redis-py connects (TLS, AUTH, SELECT, the protocol handshake) and parses
(hiredis); the hot paths of the Redis and Redlock backends then write and
read the socket themselves. A Python socket timeout costs a ``poll()``
before every send and every receive, so a connected socket is switched to
blocking mode bounded by *kernel* timeouts (``SO_RCVTIMEO``/``SO_SNDTIMEO``):
a command costs one ``send`` and, usually, one ``recv``. Where that does not
apply (no hiredis, TLS), redis-py's own reads are used.

redis-py puts its Python timeout back whenever it reads the socket itself
(a health check, a blocking command with its own timeout); callers check
``sock.gettimeout()`` and call :func:`kernel_timeouts` again.
"""

from __future__ import annotations

import asyncio
import functools
import math
import select
import socket
import ssl
import struct
import time

from .wakeup import Wakeup

__all__ = [
    "Replies",
    "close_now",
    "kernel_timeouts",
    "pack",
    "readable",
    "read_replies",
    "ready_replies",
    "timed_out",
]


def kernel_timeouts(conn, seconds: float | None) -> bool:
    """Bound ``conn``'s socket by kernel timeouts of ``seconds`` (None: none).

    Return False, changing nothing, if the connection is not one this module
    reads itself (no hiredis reader, or a TLS socket).
    """
    sock = conn._sock
    if getattr(conn._parser, "_reader", None) is None or isinstance(
        sock, ssl.SSLSocket
    ):
        return False
    seconds = seconds or 0.0  # 0: no timeout
    whole = int(seconds)
    tv = struct.pack("ll", whole, int((seconds - whole) * 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
    sock.settimeout(None)
    return True


def timed_out(error: BaseException) -> bool:
    """Whether ``error`` is a timeout (a kernel timeout surfaces as EAGAIN)."""
    import redis

    return isinstance(
        error, (redis.exceptions.TimeoutError, TimeoutError, BlockingIOError)
    )


def read_replies(
    conn, count: int, deadline: float = math.inf, slack: float = 0.0
) -> list:
    """Read ``count`` replies from ``conn``'s socket through its hiredis reader.

    Error replies come back as values (the reader is built that way), so the
    connection stays in step whatever the server answers. Each receive is
    one system call bounded by the kernel timeout; only when less than
    ``slack`` is left before ``deadline`` is the wait cut shorter with a
    ``poll()``. Raise OSError (TimeoutError on a deadline) if the socket
    fails or closes.
    """
    sock = conn._sock
    if sock is None or sock.gettimeout() is not None:
        return _read_replies_slowly(conn, count, deadline, slack)
    parser = conn._parser
    reader, buffer = parser._reader, parser._buffer
    replies: list = []
    while not _collect(reader, replies, count):
        left = deadline - time.monotonic()
        if left < slack and not readable(sock, left):
            raise TimeoutError("timed out")
        received = sock.recv_into(buffer)
        if received == 0:
            raise ConnectionResetError("connection closed by the server")
        reader.feed(buffer, 0, received)
    return replies


def close_now(conn) -> None:
    """Close a ``redis.asyncio`` connection at once, without awaiting.

    Safe in a task being cancelled: the connection is never used again, so
    an unread reply on it can never be taken for another command's. (Its
    ``disconnect()`` would wait for the stream protocol that :class:`Replies`
    replaced, which is never told of the close.)
    """
    try:
        conn._close()  # redis-py's own no-wait close of the transport
    except Exception:  # noqa: S110 - the loop may be closed: nothing to do
        pass


def ready_replies(conn):
    """Return the reader of ``conn``'s replies if ``conn`` can take a command
    as it is: connected, and not gone stale while idle (closed by the
    server, or holding bytes nobody asked for). None: connect it afresh."""
    replies = conn.__dict__.get("_distlock_replies")
    if replies is None or not conn.is_connected or replies.stale():
        return None
    return replies


def pack(conn, commands: list[tuple]) -> bytes:
    """Return ``commands`` in the wire format, packed by hiredis if it is there."""
    pack_command = _hiredis_packer()
    if pack_command is None:
        return b"".join(conn.pack_commands(commands))
    return b"".join([pack_command(command) for command in commands])


def readable(sock, seconds: float) -> bool:
    """Whether ``sock`` has input (data, or the peer's close) within ``seconds``."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(max(0, math.ceil(seconds * 1000))))


def _collect(reader, replies: list, count: int) -> bool:
    """Move the complete replies ``reader`` holds into ``replies``, up to
    ``count`` in all; return whether there are ``count`` now."""
    pending = _NOT_ENOUGH_DATA or _not_enough_data()
    while len(replies) < count:
        reply = reader.gets()
        if reply is pending:
            return False
        replies.append(reply)
    return True


#: What redis-py's hiredis reader answers while a reply is incomplete (read
#: on first use: importing redis-py is left to the backends that need it).
_NOT_ENOUGH_DATA = None


def _not_enough_data() -> object:
    global _NOT_ENOUGH_DATA
    from redis._parsers.hiredis import NOT_ENOUGH_DATA

    _NOT_ENOUGH_DATA = NOT_ENOUGH_DATA
    return NOT_ENOUGH_DATA


@functools.cache
def _hiredis_packer():
    try:
        from hiredis import pack_command
    except ImportError:
        return None
    return pack_command


def _read_replies_slowly(conn, count: int, deadline: float, slack: float) -> list:
    # Without hiredis, or over TLS: redis-py's parser and its socket timeout.
    # (gettimeout() is None only after kernel_timeouts(), which refuses
    # those connections.)
    parser = conn._parser
    replies = []
    for _ in range(count):
        left = deadline - time.monotonic()
        if left > slack:
            replies.append(parser.read_response())
        else:
            replies.append(parser.read_response(timeout=max(left, 0.0001)))
    return replies


class Replies(asyncio.Protocol):
    """The replies of one ``redis.asyncio`` connection, read without streams.

    redis.asyncio reads through a ``StreamReader`` (a buffer, a waiter
    future, three coroutine levels per read). After connecting, the
    backend puts this protocol on the connection's transport instead: bytes
    go straight into the connection's hiredis reader, and a reader waits on
    one :class:`~.wakeup.Wakeup`, which resumes it in the loop iteration
    that received its reply. Writes still go through the transport; they
    are small, and reading the reply proves they went out, so there is no
    ``drain()``.
    """

    def __init__(
        self, reader, loop: asyncio.AbstractEventLoop, sock=None, transport=None
    ):
        self.reader = reader
        self.loop = loop
        self.transport = transport
        self.poll = None
        if sock is not None:
            self.poll = select.poll()
            self.poll.register(sock, select.POLLIN)
        self.error: BaseException | None = None
        self.waiter: Wakeup | None = None
        #: Replies to commands sent earlier that nobody will ask for: whoever
        #: reads next drops them first (see the Redlock executor).
        self.owed = 0

    @classmethod
    def take_over(cls, conn) -> Replies | None:
        """Put a Replies on ``conn``'s new transport (and on ``conn``, for
        :func:`ready_replies`); None without hiredis."""
        reader = getattr(conn._parser, "_reader", None)
        if reader is None:
            return None
        transport = conn._writer.transport
        replies = cls(
            reader,
            asyncio.get_running_loop(),
            transport.get_extra_info("socket"),
            transport,
        )
        stream = conn._reader
        if stream._buffer:  # bytes the stream already holds come first
            reader.feed(bytes(stream._buffer))
            stream._buffer.clear()
        transport.set_protocol(replies)
        conn._distlock_replies = replies
        return replies

    def stale(self) -> bool:
        """Whether the connection closed, or holds bytes nobody asked for
        (while it owes replies, bytes are expected).

        Also asks the socket itself (one poll): the loop may not have run
        since the server closed it, or since a stray reply arrived.
        """
        if self.error is not None:
            return True
        if self.owed:
            return False
        return bool(self.reader.has_data()) or (
            self.poll is not None and bool(self.poll.poll(0))
        )

    def write(self, data: bytes) -> None:
        """Send ``data`` (packed commands) on the connection."""
        self.transport.write(data)

    def take(self, count: int) -> list | None:
        """Return the next ``count`` replies if they are all in, else None
        (and the connection must not be used again: some may be consumed)."""
        replies: list = []
        return replies if _collect(self.reader, replies, count) else None

    async def read(self, count: int) -> list:
        """Return the next ``count`` replies (error replies as values)."""
        replies: list = []
        while not _collect(self.reader, replies, count):
            if self.error is not None:
                raise self.error
            self.waiter = Wakeup(self.loop)
            try:
                await self.waiter
            finally:
                self.waiter = None
        return replies

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        self._wake()

    def eof_received(self) -> bool:
        self._fail(ConnectionResetError("connection closed by the server"))
        return False  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionResetError("connection closed"))

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    def _wake(self) -> None:
        # The waiting task may run (and send its next command) inside set().
        waiter = self.waiter
        if waiter is not None:
            waiter.set()
