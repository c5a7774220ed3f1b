"""The Redlock algorithm's vocabulary: the steps it yields, and what a lease stores.

A step is :class:`Fanout` (one pipelined round trip to the nodes),
:class:`Block` (wait on one node's wake list) or :class:`Sleep`; the
executors (:mod:`.fanout`) carry them out and answer with each node's
replies or a :class:`Failed`.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from ...keys import decode_name, encode_name
from ..redis.keys import LockKeys
from ..scripts import load_script

__all__ = ["Block", "Failed", "Fanout", "Sleep", "pack_meta", "unpack_meta"]

_HERE = __name__.rpartition(".")[0]
ACQUIRE = load_script(_HERE, "acquire")
COMMIT = load_script(_HERE, "commit")
RELEASE = load_script(_HERE, "release")
EXTEND = load_script(_HERE, "extend")
ACQUIRE_SHARED = load_script(_HERE, "acquire_shared")
RELEASE_SHARED = load_script(_HERE, "release_shared")
EXTEND_SHARED = load_script(_HERE, "extend_shared")
SCRIPTS = (
    ACQUIRE,
    COMMIT,
    RELEASE,
    EXTEND,
    ACQUIRE_SHARED,
    RELEASE_SHARED,
    EXTEND_SHARED,
)


#: A counter below this was never raised to the clock floor (it is new);
#: the floor is ``unix_seconds << FENCE_SHIFT``.
FENCE_SHIFT = 20
FENCE_FLOOR_MIN = 1 << FENCE_SHIFT
#: How long after its expected next attempt a waiter's registration lives (ms).
WAITER_GRACE_MS = 1000
#: Longest single blocking wait on a wake list (seconds).
MAX_WAIT_SLICE = 1.0
#: How long a node that failed is skipped: timed out, refused (seconds).
DOWN_AFTER_TIMEOUT = 1.0
DOWN_AFTER_ERROR = 0.2
#: A lease on a minority of nodes older than this is stale (seconds).
STALE_AFTER = 10.0
#: How long acquire keeps retrying while no quorum answers (seconds).
NO_QUORUM_GRACE = 1.0


class Failed:
    """A node that did not answer a step (down, timed out, or an error).

    ``asked`` is False when the step was never sent to the node (skipped
    while it is down or quarantined): only a node that was asked may have
    carried out a step whose reply it did not give.
    """

    __slots__ = ("asked", "error")

    def __init__(self, error: BaseException | str, asked: bool = True):
        self.error = error
        self.asked = asked

    def __repr__(self) -> str:
        return f"<failed: {self.error}>"


@dataclass
class Fanout:
    """A step: send ``commands`` to every node (or ``nodes``), read the replies.

    The executor answers with one entry per node: the list of replies, or a
    :class:`Failed`. ``skip_quarantined`` leaves out nodes that restarted
    too recently to be trusted with a new lease; ``force`` asks nodes even
    while they are marked down. ``decided``, given the results so far, says
    whether the step has succeeded already (it is asked only once a quorum
    of nodes answered: it counts a quorum's agreement); the executor then stops
    reading (the remaining nodes answer :data:`UNREAD`; their replies are
    read and dropped with the connection's next use, or in this step after
    all once a connection owes :data:`MAX_OWED_REPLIES`), so a step waits for
    the quorum's slowest node, not for the slowest of all.
    """

    commands: list[tuple]
    nodes: list[int] | None = None
    skip_quarantined: bool = False
    force: bool = False
    decided: Callable[[list], bool] | None = None


#: What a node answers when the step was not sent to it.
NOT_ASKED = Failed("not asked", asked=False)
#: What a node answers when the step was decided before its reply was read.
UNREAD = Failed("not read: the step was decided without this node")

#: Replies a connection may owe (sent, not read yet) before a step reads it
#: even though the quorum decided without it: the nodes that answer last
#: would otherwise owe more with every step, kept in socket buffers (or the
#: server's) for as long as the process lives.
MAX_OWED_REPLIES = 32


def read_now(prelude: int, owes: int) -> bool:
    """Whether a node the quorum decided without must be read all the same:
    its debt is due, or it is a new connection whose prelude tells whether
    the node restarted (a vote it casts later must not skip that check)."""
    return prelude > 0 or owes > MAX_OWED_REPLIES


def lost_scripts(result: object) -> bool:
    """Whether a node's ``result`` says it forgot our scripts (NOSCRIPT)."""
    if not isinstance(result, Failed):
        return False
    import redis

    return isinstance(result.error, redis.exceptions.NoScriptError)


@dataclass
class Block:
    """A step: BLPOP ``key`` on node ``node`` for up to ``seconds``.

    The executor answers with the popped item, None on timeout, or False if
    the node could not be asked.
    """

    node: int
    key: str
    seconds: float


@dataclass
class Sleep:
    """A step: sleep ``seconds``."""

    seconds: float


class Node:
    """What one process knows about one Redis node (shared by all threads)."""

    def __init__(self, index: int, url: str):
        self.index = index
        self.url = url
        self.down_until = 0.0
        self.run_id: str | None = None
        self.quarantine_until = 0.0
        self.last_error: object = "timed out"

    def fail(self, timed_out: bool, error: object = None) -> None:
        if error is not None:
            self.last_error = error
        delay = DOWN_AFTER_TIMEOUT if timed_out else DOWN_AFTER_ERROR
        self.down_until = time.monotonic() + delay

    def seen(self, info: bytes | str, restart_delay: float) -> None:
        """Record a fresh connection's ``INFO server``; quarantine on restart."""
        if isinstance(info, bytes):
            info = info.decode(errors="replace")
        fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
        run_id = fields.get("run_id")
        uptime = float(fields.get("uptime_in_seconds", "0") or 0)
        if self.run_id is not None and run_id != self.run_id and restart_delay > 0:
            # The node restarted (and may have lost every lease it held):
            # the delayed-restart rule, enforced from this side.
            self.quarantine_until = time.monotonic() + max(0.0, restart_delay - uptime)
        self.run_id = run_id


def pack_meta(name: str, host: str, pid: int, thread: str, acquired: float) -> bytes:
    """Return the holder description stored beside a lease (one hash field).

    A JSON header (no raw newline can occur in it), a newline, then the exact
    name: one field is cheaper for the node than five.
    """
    return (
        _meta_head(host, pid, thread)
        + b"%d]\n" % int(acquired * 1000)
        + encode_name(name)
    )


@functools.lru_cache(maxsize=1024)
def _meta_head(host: str, pid: int, thread: str) -> bytes:
    # json.dumps([host, pid, thread, ms]) without its last item: the same
    # holder describes itself on every acquisition.
    return json.dumps([host, pid, thread]).encode()[:-1] + b", "


def unpack_meta(raw: bytes) -> tuple[str, str, int | None, str, float | None]:
    """Inverse of :func:`pack_meta`: (name, host, pid, thread, acquired)."""
    header, _sep, name = raw.partition(b"\n")
    try:
        host, pid, thread, acquired = json.loads(header)
    except (ValueError, TypeError):
        return decode_name(name), "", None, "", None
    return decode_name(name), host, pid, thread, acquired / 1000


#: The start of every shared lease's token (a waiter registered under such a
#: token is a reader: it does not keep other readers out).
SHARED_MARK = "r."


def reader_keys(lease_key: str) -> tuple[str, str]:
    """Return the readers zset and the readers' descriptions hash of a lock."""
    return lease_key + ":r", lease_key + ":m"


@functools.lru_cache(maxsize=4096)
def lock_keys(prefix: str, name: str) -> tuple[str, str, str, str]:
    lease = LockKeys(prefix, name).lease
    return lease, lease + ":c", lease + ":z", lease + ":w"


def ms(seconds: float) -> int:
    return max(1, int(math.ceil(seconds * 1000)))
