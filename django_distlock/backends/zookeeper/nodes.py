"""What the ZooKeeper backend keeps in its nodes: names, kinds, lease windows.

A contender node is named ``<token>-<sequence>``. The token of a shared
lease starts with ``r.`` (a dot never occurs in :func:`~..base.new_token`),
so a node's kind is read from its name alone, without fetching its data.
Permits live in a tree of their own, so their nodes need no mark.
"""

from __future__ import annotations

import json
import threading
import time
import zlib
from dataclasses import dataclass, field

from ...keys import decode_name, encode_name
from ..base import holder_identity
from ..kinds import EXCLUSIVE, SHARED, Kind

__all__ = [
    "SHARED_MARK",
    "NodeInfo",
    "ZkNode",
    "child_kind",
    "child_token",
    "ms",
    "node_data",
    "pack_name",
    "read_info",
    "seq",
    "unpack_name",
]

#: The start of every shared lease's token (and so of its node's name).
SHARED_MARK = "r."
#: Names longer than this (compressed) are stored truncated.
MAX_STORED_NAME = 512 * 1024


@dataclass
class ZkNode:
    """Where a lease lives: its node, last known version and session.

    Only the holder writes its node once it holds, but from two threads: the
    renewal and the caller's ``release()`` or ``extend()``. Each takes
    ``writing`` around its write, so none sends a version that another's
    write, landed but not yet answered, has made stale.
    """

    path: str
    version: int
    session: int
    acquired_ms: int = 0
    writing: threading.Lock = field(
        default_factory=threading.Lock, repr=False, compare=False
    )


@dataclass
class NodeInfo:
    """A contender node's data: waiting ("w") or holding ("h"), and who."""

    state: str
    window_ms: int
    host: str = ""
    pid: int | None = None
    thread: str = ""
    acquired_ms: int = 0
    limit: int | None = None

    def expires(self, mtime: int) -> int:
        """Return the server time (ms) at which the node's window ends."""
        return mtime + self.window_ms


def seq(child: str) -> int:
    """Return the sequence number of a contender node's name."""
    return int(child.rsplit("-", 1)[1])


def child_token(child: str) -> str:
    """Return the lease token a contender node's name carries."""
    return child.rsplit("-", 1)[0]


def child_kind(child: str) -> Kind:
    """Return the kind (exclusive or shared) of a lock's contender node."""
    return SHARED if child.startswith(SHARED_MARK) else EXCLUSIVE


def ms(seconds: float) -> int:
    """Return ``seconds`` as whole milliseconds, rounded up (at least 1)."""
    return max(1, int(seconds * 1000 + 0.999))


def node_data(
    state: str, window_ms: int, acquired_ms: int | None = None, limit: int | None = None
) -> bytes:
    """Return the data of a contender node of the calling thread."""
    host, pid, thread = holder_identity()
    info = {
        "s": state,
        "x": window_ms,
        "h": host,
        "p": pid,
        "th": thread,
        "a": acquired_ms or int(time.time() * 1000),
    }
    if limit is not None:
        info["l"] = limit
    return json.dumps(info, separators=(",", ":")).encode()


def read_info(data: bytes) -> NodeInfo:
    """Parse a contender node's data (a node of unknown form: expired at once)."""
    try:
        info = json.loads(data)
        limit = info.get("l")
        return NodeInfo(
            state=str(info["s"]),
            window_ms=int(info["x"]),
            host=str(info.get("h", "")),
            pid=info.get("p"),
            thread=str(info.get("th", "")),
            acquired_ms=int(info.get("a") or 0),
            limit=None if limit is None else int(limit),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return NodeInfo("?", 0)


def pack_name(name: str) -> bytes:
    """Return ``name`` as stored in its lock (or semaphore) node."""
    raw = encode_name(name)
    if len(raw) < 1024:
        return b"r" + raw
    packed = zlib.compress(raw)
    if len(packed) > MAX_STORED_NAME:
        # Keep a readable prefix: the lock itself is keyed by the digest.
        return b"t" + raw[:MAX_STORED_NAME]
    return b"z" + packed


def unpack_name(data: bytes) -> str:
    """Return the name :func:`pack_name` stored."""
    kind, body = data[:1], data[1:]
    if kind == b"z":
        body = zlib.decompress(body)
    return decode_name(body)
