"""Redlock: one lock over several independent Redis masters, held by a quorum.

The algorithm is the one of the Redis documentation ("Distributed Locks with
Redis"): the same lease is set on every node, the lock is held if a majority
(``N // 2 + 1``) granted it and time is left on it after subtracting the
elapsed time and a clock drift allowance; otherwise it is undone everywhere.

Every step is **one pipelined round trip to all nodes at once**: the command
is packed once, written to one socket per node, and only then are the replies
read, with a deadline shared by all nodes (``NODE_TIMEOUT``). A node that does
not answer by then counts as failed, its connection is discarded (it may still
owe a reply) and the node is skipped for a short while, so a stopped node
costs one ``NODE_TIMEOUT`` and not one per call. The synchronous executor
stops reading once a quorum decided the step (``Fanout.decided``) and reads
the rest with the connection's next use. The algorithm is written once
as generators that yield steps (like the single-instance backend) and driven
by a synchronous executor (redis-py connections, one per node and thread) or
an asyncio one (``redis.asyncio`` connections, one per node and task).

Per node, a lock uses the single-instance key names (:class:`~.redis.LockKeys`):
the lease ``<prefix>:{<digest>}`` (a string ``<token>\n<fence>\n<holder>``,
so a grant is one ``SET NX PX``), plus ``:c`` (fencing counter), ``:z``
(registered waiters) and ``:w`` (wake list), all under one hash tag.

Fencing tokens: see ``docs/backends/redlock.md``. In short, a node grants with
``counter + 1``; the token is the largest value among the granting nodes (the
clock floor ``caller_seconds * 2**20`` if the counters are new), and it is
stored on a majority of nodes that hold the lease *before* the acquisition
returns (a second round trip only when the nodes did not already agree), so
every later acquisition, whose majority meets that one, gets a larger token.
A first attempt is plain ``SET NX PX`` + ``INCR`` per node, no script.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import random
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..exceptions import LockBackendError
from ..keys import decode_name, encode_name, glob_escape
from . import wire
from .base import Holder, Lease, current_pid, holder_identity, new_token
from .redis import LockKeys
from .scripts import load_script
from .steps import StepsBackend


def _no_client_setinfo() -> dict[str, None]:
    """Return the connection keywords that turn CLIENT SETINFO off.

    Newer redis-py replaced ``lib_name``/``lib_version`` (deprecated since)
    by ``driver_info``; both spell "send nothing" as None.
    """
    import inspect

    from redis.connection import AbstractConnection

    if "driver_info" in inspect.signature(AbstractConnection.__init__).parameters:
        return {"driver_info": None}
    return {"lib_name": None, "lib_version": None}


try:
    from asyncio import timeout as async_timeout
except ImportError:  # Python 3.10: redis-py depends on async-timeout there
    from async_timeout import timeout as async_timeout

__all__ = ["RedlockBackend"]

ACQUIRE = load_script("redlock_acquire.lua")
COMMIT = load_script("redlock_commit.lua")
RELEASE = load_script("redlock_release.lua")
EXTEND = load_script("redlock_extend.lua")
SCRIPTS = (ACQUIRE, COMMIT, RELEASE, EXTEND)

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


class _Failed:
    """A node that did not answer a step (down, timed out, or an error)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | str):
        self.error = error

    def __repr__(self) -> str:
        return f"<failed: {self.error}>"


@dataclass
class Fanout:
    """A step: send ``commands`` to every node (or ``nodes``), read the replies.

    The executor answers with one entry per node: the list of replies, or a
    :class:`_Failed`. ``skip_quarantined`` leaves out nodes that restarted
    too recently to be trusted with a new lease; ``force`` asks nodes even
    while they are marked down. ``decided``, given the results so far, says
    whether the step has succeeded already (it is asked only once a quorum
    of nodes answered: it counts a quorum's agreement); the executor then stops
    reading (the remaining nodes answer :data:`_UNREAD`; their replies are
    read and dropped with the connection's next use, or in this step after
    all once a connection owes :data:`MAX_OWED_REPLIES`), so a step waits for
    the quorum's slowest node, not for the slowest of all.
    """

    commands: list[tuple]
    nodes: list[int] | None = None
    skip_quarantined: bool = False
    force: bool = False
    decided: Callable[[list], bool] | None = None


#: What a node answers when the step was decided before its reply was read.
_UNREAD = _Failed("not read: the step was decided without this node")

#: Replies a connection may owe (sent, not read yet) before a step reads it
#: even though the quorum decided without it: the nodes that answer last
#: would otherwise owe more with every step, kept in socket buffers (or the
#: server's) for as long as the process lives.
MAX_OWED_REPLIES = 32


def _read_now(prelude: int, owes: int) -> bool:
    """Whether a node the quorum decided without must be read all the same:
    its debt is due, or it is a new connection whose prelude tells whether
    the node restarted (a vote it casts later must not skip that check)."""
    return prelude > 0 or owes > MAX_OWED_REPLIES


def _lost_scripts(result: object) -> bool:
    """Whether a node's ``result`` says it forgot our scripts (NOSCRIPT)."""
    if not isinstance(result, _Failed):
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


class _Node:
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


@functools.lru_cache(maxsize=4096)
def _keys(prefix: str, name: str) -> tuple[str, str, str, str]:
    lease = LockKeys(prefix, name).lease
    return lease, lease + ":c", lease + ":z", lease + ":w"


def _ms(seconds: float) -> int:
    return max(1, int(math.ceil(seconds * 1000)))


def _prelude() -> list[tuple]:
    # Sent ahead of the first command on every new connection, in the same
    # write: the node's identity (restart detection) and our scripts (a
    # restarted node has an empty script cache).
    return [("INFO", "server")] + [("SCRIPT", "LOAD", s.source) for s in SCRIPTS]


class _Conns(threading.local):
    def __init__(self) -> None:
        self.pid = current_pid()
        self.conns: dict[int, Any] = {}


class _StreamReplies:
    """A :class:`~.wire.Replies` look-alike over redis.asyncio's own parser,
    for connections without a hiredis reader (e.g. a ``parser_class`` in
    ``CONNECTION_POOL_KWARGS``)."""

    def __init__(self, conn):
        self.conn = conn
        self.owed = 0
        self.error = None

    def stale(self) -> bool:
        return False  # no cheap check: a dead connection fails its read

    def write(self, data: bytes) -> None:
        self.conn._writer.write(data)

    def take(self, count: int) -> None:
        return None

    async def read(self, count: int) -> list:
        import redis

        replies: list = []
        for _ in range(count):
            try:
                replies.append(await self.conn.read_response(timeout=math.inf))
            except redis.exceptions.ResponseError as e:
                replies.append(e)
        return replies


class RedlockBackend(StepsBackend):
    """Locks held by a majority of independent Redis masters (Redlock).

    ``LOCATION`` is a list of at least 3 redis URLs (an odd count is best).
    OPTIONS: ``NODE_TIMEOUT`` (seconds a node may take to answer one step,
    default 0.1), ``SOCKET_CONNECT_TIMEOUT`` (default: NODE_TIMEOUT),
    ``DRIFT_FACTOR`` (default 0.01), ``RETRY_JITTER`` (longest random pause
    after a split vote, default 0.02 s), ``RESTART_DELAY`` (seconds a node
    seen to restart is not trusted with new leases, default: the TTL),
    ``FENCE_RETENTION`` (seconds a lock's fencing counter is kept after it
    was started from the clock floor, default 3600) and
    ``CONNECTION_POOL_KWARGS`` (passed to redis-py's connections).
    """

    #: Tokens survive any minority of nodes losing their data; beyond that
    #: they rest on the nodes' clocks (see the docs page).
    durable_fencing = True

    OPTION_KEYS = {
        "NODE_TIMEOUT",
        "SOCKET_CONNECT_TIMEOUT",
        "DRIFT_FACTOR",
        "RETRY_JITTER",
        "RESTART_DELAY",
        "FENCE_RETENTION",
        "CONNECTION_POOL_KWARGS",
    }

    def __init__(self, alias: str, params: dict[str, Any]):
        super().__init__(alias, params)
        location = params.get("LOCATION") or []
        if isinstance(location, str):
            location = [location]
        self.locations: list[str] = list(location)
        self.nodes = [_Node(i, url) for i, url in enumerate(self.locations)]
        self.quorum = len(self.nodes) // 2 + 1
        opts = self.options
        self.node_timeout = float(opts.get("NODE_TIMEOUT", 0.1))
        self.connect_timeout = float(
            opts.get("SOCKET_CONNECT_TIMEOUT", self.node_timeout)
        )
        self.drift_factor = float(opts.get("DRIFT_FACTOR", 0.01))
        self.retry_jitter = float(opts.get("RETRY_JITTER", 0.02))
        self.restart_delay = float(opts.get("RESTART_DELAY", self.default_ttl))
        self.fence_retention_ms = _ms(float(opts.get("FENCE_RETENTION", 3600)))
        self._local = _Conns()
        self._all_conns: weakref.WeakSet = weakref.WeakSet()
        self._aconns: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._aloop_last: tuple[weakref.ref, list[list]] | None = None
        self._factories: list | None = None
        self._afactories: list | None = None
        self._prelude_len = len(_prelude())

    # -- checks -----------------------------------------------------------

    @classmethod
    def check(cls, alias: str, params: dict[str, Any]) -> list:
        """Return system check messages for this backend's LOCKS entry."""
        from django.core.checks import Error, Warning

        where = f"LOCKS[{alias!r}]"
        messages = []
        options = params.get("OPTIONS") or {}
        unknown = sorted(set(options) - cls.OPTION_KEYS)
        if unknown:
            messages.append(
                Error(
                    f"{where}['OPTIONS'] has unknown keys: {unknown}.",
                    hint=f"{cls.__name__} accepts {sorted(cls.OPTION_KEYS)}.",
                    obj="settings.LOCKS",
                    id="distlock.E009",
                )
            )
        for key in (
            "NODE_TIMEOUT",
            "SOCKET_CONNECT_TIMEOUT",
            "RETRY_JITTER",
            "RESTART_DELAY",
            "FENCE_RETENTION",
            "DRIFT_FACTOR",
        ):
            if key not in options:
                continue
            value = options[key]
            zero_ok = key in ("RETRY_JITTER", "RESTART_DELAY", "DRIFT_FACTOR")
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or value < 0
                or (value == 0 and not zero_ok)
            ):
                messages.append(
                    Error(
                        f"{where}['OPTIONS'][{key!r}] must be a "
                        f"{'non-negative' if zero_ok else 'positive'} number, "
                        f"not {value!r}.",
                        hint="Times are in seconds; DRIFT_FACTOR is a fraction "
                        "of the TTL (default 0.01).",
                        obj="settings.LOCKS",
                        id="distlock.E009",
                    )
                )
        location = params.get("LOCATION")
        if not isinstance(location, (list, tuple)) or not all(
            isinstance(url, str)
            and url.startswith(("redis://", "rediss://", "unix://"))
            for url in location
        ):
            messages.append(
                Error(
                    f"{where}['LOCATION'] must be a list of redis URLs, "
                    f"not {location!r}.",
                    hint="List one URL per independent Redis master, e.g. "
                    "['redis://10.0.0.1:6379', 'redis://10.0.0.2:6379', "
                    "'redis://10.0.0.3:6379'].",
                    obj="settings.LOCKS",
                    id="distlock.E004",
                )
            )
            return messages
        if len(location) < 3:
            messages.append(
                Error(
                    f"{where} lists {len(location)} Redis node(s); Redlock "
                    "needs at least 3.",
                    hint="With fewer than 3 independent masters a single "
                    "failure loses the quorum; use RedisLockBackend for one "
                    "server, or list 3 or 5 masters.",
                    obj="settings.LOCKS",
                    id="distlock.E011",
                )
            )
        elif len(location) % 2 == 0:
            messages.append(
                Warning(
                    f"{where} lists an even number of Redis nodes ({len(location)}).",
                    hint=f"{len(location)} nodes tolerate no more failures than "
                    f"{len(location) - 1}; use an odd number.",
                    obj="settings.LOCKS",
                    id="distlock.W001",
                )
            )
        if len(set(location)) != len(location):
            messages.append(
                Error(
                    f"{where}['LOCATION'] lists the same node twice.",
                    hint="Every URL must be a different, independent master.",
                    obj="settings.LOCKS",
                    id="distlock.E004",
                )
            )
        return messages

    # -- keys -------------------------------------------------------------

    def keys_for(self, name: str) -> tuple[str, str, str, str]:
        """Return (lease, counter, waiters, wake) keys of ``name`` on every node."""
        return _keys(self.key_prefix, name)

    def _wake_order(self, lease_key: str) -> list[int]:
        # Every waiter of a lock blocks on the same node (one wake-up per
        # release), and different locks spread over the nodes.
        start = sum(lease_key.encode()) % len(self.nodes)
        return [(start + i) % len(self.nodes) for i in range(len(self.nodes))]

    # -- connections ------------------------------------------------------

    def _conn_kwargs(self) -> dict[str, Any]:
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        kwargs = {
            "socket_timeout": self.node_timeout,
            "socket_connect_timeout": self.connect_timeout,
            # Scripts must never be resent by the driver behind our back.
            "retry": Retry(NoBackoff(), 0),
            "retry_on_timeout": False,
            # No CLIENT SETINFO round trip on connect (it would stall on a
            # stopped node, one node after the other).
            **_no_client_setinfo(),
        }
        kwargs.update(self.options.get("CONNECTION_POOL_KWARGS", {}))
        return kwargs

    def _factory_list(self, pool_cls, **overrides: Any) -> list:
        factories = []
        for url in self.locations:
            pool = pool_cls.from_url(url, **{**self._conn_kwargs(), **overrides})
            factories.append((pool.connection_class, dict(pool.connection_kwargs)))
        return factories

    def _thread_conns(self) -> dict[int, Any]:
        """Return this thread's connections, by node (none after a fork)."""
        local = self._local
        pid = current_pid()
        if local.pid != pid:  # forked: the parent's sockets are not ours
            local.pid, local.conns = pid, {}
        return local.conns

    def _new_conn(self, i: int, conns: dict[int, Any]):
        if self._factories is None:
            import redis

            self._factories = self._factory_list(redis.ConnectionPool)
        cls, kwargs = self._factories[i]
        conn = conns[i] = cls(**kwargs)
        self._all_conns.add(conn)
        return conn

    def _conn(self, i: int):
        conns = self._thread_conns()
        return conns.get(i) or self._new_conn(i, conns)

    def _drop(self, i: int, conn, timed_out: bool, error: object = None) -> None:
        # A connection that failed mid-step may still owe replies: never reuse it.
        try:
            conn.disconnect()
        except Exception:
            pass
        self.nodes[i].fail(timed_out, error)

    def close(self) -> None:
        for conn in list(self._all_conns):
            try:
                conn.disconnect()
            except Exception:
                pass
        self._local = _Conns()
        self._all_conns = weakref.WeakSet()
        self._aconns = weakref.WeakKeyDictionary()
        self._aloop_last = None

    # -- the synchronous executor ------------------------------------------

    def _targets(self, step: Fanout) -> tuple[list, list[int]]:
        """Return (results preset for skipped nodes, nodes to ask)."""
        now = time.monotonic()
        nodes = range(len(self.nodes)) if step.nodes is None else step.nodes
        results: list = [_Failed("not asked")] * len(self.nodes)
        targets = []
        for i in nodes:
            node = self.nodes[i]
            if node.down_until > now and not step.force:
                results[i] = _Failed(f"skipped after: {node.last_error}")
            elif step.skip_quarantined and node.quarantine_until > now:
                results[i] = _Failed("restarted recently (RESTART_DELAY)")
            else:
                targets.append(i)
        return results, targets

    def _fanout(self, step: Fanout) -> list:
        import redis

        results, targets = self._targets(step)
        conns = self._thread_conns()
        sent: list[tuple[int, Any, int]] = []  # (node, conn, prelude)
        packed = None
        for i in targets:
            conn = conns.get(i) or self._new_conn(i, conns)
            try:
                prelude = 0
                if conn._sock is None:
                    conn.connect()
                    conn._distlock_owed = 0
                    prelude = self._prelude_len
                if packed is None:
                    packed = wire.pack(conn, step.commands)
                sock = conn._sock
                if sock.gettimeout() is not None:
                    wire.kernel_timeouts(conn, self.node_timeout)
                if prelude:
                    sock.sendall(wire.pack(conn, _prelude()) + packed)
                else:
                    sock.sendall(packed)
                sent.append((i, conn, prelude))
            except (redis.exceptions.RedisError, OSError) as e:
                results[i] = _Failed(e)
                self._drop(i, conn, wire.timed_out(e), e)
        # Read in sending order, each read bounded by what is left of the one
        # deadline: the replies travel in parallel, so by the time the first
        # one is in the others usually are too, and a stopped node costs at
        # most one NODE_TIMEOUT in total, however many nodes are stopped.
        deadline = time.monotonic() + self.node_timeout
        count = len(step.commands)
        slack = self.node_timeout / 2
        decided = step.decided
        quorum = self.quorum
        k = 0
        while k < len(sent):
            i, conn, prelude = sent[k]
            k += 1
            # Replies owed from a step decided without this node come first.
            owed = conn.__dict__.get("_distlock_owed", 0)
            try:
                replies = wire.read_replies(
                    conn, owed + prelude + count, deadline, slack
                )
            except (redis.exceptions.RedisError, OSError) as e:
                self._drop(i, conn, wire.timed_out(e), e)
                results[i] = _Failed(e)
                continue
            conn._distlock_owed = 0
            results[i] = self._verdict(i, step, replies, owed, prelude)
            if _lost_scripts(results[i]):
                conn.disconnect()  # reconnecting reloads the scripts
            if decided is not None and quorum <= k < len(sent) and decided(results):
                decided = None
                due = []
                for j, later, later_prelude in sent[k:]:
                    owes = later.__dict__.get("_distlock_owed", 0)
                    owes += later_prelude + count
                    if _read_now(later_prelude, owes):
                        due.append((j, later, later_prelude))
                    else:
                        later._distlock_owed = owes
                        results[j] = _UNREAD
                sent = sent[:k] + due
        return results

    def _verdict(
        self, i: int, step: Fanout, replies: list, owed: int, prelude: int
    ) -> list | _Failed:
        """Return node ``i``'s answer to ``step`` from all it replied (both
        executors): the ``owed`` replies of an earlier step are dropped, a
        new connection's ``prelude`` records the node's identity, and an
        error reply or a node restarted too recently does not count."""
        node = self.nodes[i]
        if prelude:
            node.seen(replies[owed], self.restart_delay)
        if owed or prelude:
            replies = replies[owed + prelude :]
        for reply in replies:
            if isinstance(reply, Exception):  # an error reply (ResponseError)
                return _Failed(reply)
        # The restart may have been noticed by this very step (the INFO went
        # out with the command): its vote must not count either.
        if step.skip_quarantined and node.quarantine_until > time.monotonic():
            return _Failed("restarted recently (RESTART_DELAY)")
        return replies

    def _block(self, step: Block):
        import redis

        i = step.node
        conn = self._conn(i)
        try:
            if conn._sock is None:
                # Let a fan-out set this connection up (scripts, restart check).
                return False
            owed = conn.__dict__.get("_distlock_owed", 0)
            if owed:
                wire.read_replies(conn, owed, time.monotonic() + self.node_timeout)
                conn._distlock_owed = 0
            conn.send_command(
                "BLPOP", step.key, f"{step.seconds:.3f}", check_health=False
            )
            if not conn.can_read(step.seconds + self.node_timeout):
                self._drop(i, conn, True)
                return False
            return conn.read_response()
        except (redis.exceptions.RedisError, OSError) as e:
            self._drop(i, conn, wire.timed_out(e))
            return False

    def _execute(self, step: Fanout | Block | Sleep) -> Any:
        if isinstance(step, Fanout):
            return self._fanout(step)
        if isinstance(step, Block):
            return self._block(step)
        time.sleep(step.seconds)
        return None

    # -- the asyncio executor ----------------------------------------------
    #
    # The same steps as the synchronous executor, on this event loop's own
    # redis.asyncio connections. Once connected, a connection's replies are
    # read by a :class:`~.wire.Replies` put on its transport (bytes straight
    # into hiredis; a reader resumed in the loop iteration that got its
    # bytes), and a step stops reading at the quorum like the sync one.

    def _afree(self) -> list[list]:
        """This event loop's idle connections, by node."""
        loop = asyncio.get_running_loop()
        last = self._aloop_last  # read whole: threads with loops share it
        if last is not None and last[0]() is loop:
            return last[1]
        free = self._aconns.get(loop)
        if free is None:
            free = self._aconns[loop] = [[] for _ in self.nodes]
        self._aloop_last = (weakref.ref(loop), free)
        return free

    def _anew_conn(self, i: int):
        if self._afactories is None:
            import redis.asyncio as aredis

            # Deadlines are ours (one asyncio timeout per step): a driver
            # socket timeout would cost a task per send.
            self._afactories = self._factory_list(
                aredis.ConnectionPool, socket_timeout=None
            )
        cls, kwargs = self._afactories[i]
        return cls(**kwargs)

    @staticmethod
    def _aput(idle: list, conn) -> None:
        if len(idle) < 64:
            idle.append(conn)

    def _adrop(self, i: int, conn, error: BaseException | str | None) -> None:
        """Close ``conn`` (it may owe replies); mark node ``i`` failed if
        ``error`` is given (a cancelled step is no fault of the node)."""
        wire.close_now(conn)
        if error is not None:
            self.nodes[i].fail(wire.timed_out(error), error)

    async def _aconnect(self, conn) -> tuple[Any, int]:
        """Connect ``conn`` afresh; return its reader and how many prelude
        replies come first (a new connection sends the prelude with its
        first step)."""
        if conn.is_connected:
            wire.close_now(conn)
        async with async_timeout(self.connect_timeout):
            await conn.connect()
        replies = wire.Replies.take_over(conn)
        if replies is None:
            replies = conn._distlock_replies = _StreamReplies(conn)
        return replies, self._prelude_len

    def _asettle(
        self, i: int, idle: list, conn, reader, prelude: int, replies: list, step
    ):
        """Account for node ``i``'s replies to ``step``; return its result.

        The connection goes back to ``idle`` (unless a lost script cache
        means it must reconnect).
        """
        owed, reader.owed = reader.owed, 0
        result = self._verdict(i, step, replies, owed, prelude)
        if _lost_scripts(result):
            wire.close_now(conn)  # reconnecting reloads the scripts
        else:
            self._aput(idle, conn)
        return result

    async def _afanout(self, step: Fanout) -> list:
        import redis

        results, targets = self._targets(step)
        free = self._afree()
        count = len(step.commands)
        packed = None
        pending: list[tuple[int, Any, Any, int]] = []  # (node, conn, reader, prelude)
        try:
            for i in targets:
                conn = free[i].pop() if free[i] else self._anew_conn(i)
                reader, prelude = wire.ready_replies(conn), 0
                if reader is None:
                    try:
                        reader, prelude = await self._aconnect(conn)
                    except (
                        redis.exceptions.RedisError,
                        OSError,
                        asyncio.TimeoutError,  # not an OSError before 3.11
                    ) as e:
                        results[i] = _Failed(e)
                        self._adrop(i, conn, e)
                        continue
                if packed is None:
                    packed = wire.pack(conn, step.commands)
                if prelude:
                    reader.write(wire.pack(conn, _prelude()) + packed)
                else:
                    reader.write(packed)
                pending.append((i, conn, reader, prelude))
            # Read in sending order under one deadline for the whole step (a
            # stopped node costs one NODE_TIMEOUT, however many are stopped).
            decided = step.decided
            # Nodes that may answer before the step is decided (see Fanout).
            undecided = len(pending) - self.quorum
            try:
                async with async_timeout(self.node_timeout):
                    while pending:
                        i, conn, reader, prelude = pending[0]
                        try:
                            replies = await reader.read(reader.owed + prelude + count)
                        except (redis.exceptions.RedisError, OSError) as e:
                            del pending[0]
                            results[i] = _Failed(e)
                            self._adrop(i, conn, e)
                            continue
                        del pending[0]
                        results[i] = self._asettle(
                            i, free[i], conn, reader, prelude, replies, step
                        )
                        if (
                            decided is not None
                            and 0 < len(pending) <= undecided
                            and decided(results)
                        ):
                            decided = None
                            due = []
                            for entry in pending:
                                j, later, later_reader, later_prelude = entry
                                owes = later_reader.owed + later_prelude + count
                                if _read_now(later_prelude, owes):
                                    due.append(entry)
                                else:
                                    later_reader.owed = owes
                                    results[j] = _UNREAD
                                    self._aput(free[j], later)
                            pending[:] = due
            except asyncio.TimeoutError:  # TimeoutError from Python 3.11 on
                # Past the deadline, what is in already still counts.
                for i, conn, reader, prelude in pending:
                    replies = reader.take(reader.owed + prelude + count)
                    if replies is None:
                        results[i] = _Failed("timed out")
                        self._adrop(i, conn, TimeoutError("timed out"))
                    else:
                        results[i] = self._asettle(
                            i, free[i], conn, reader, prelude, replies, step
                        )
                pending.clear()
        except BaseException:
            # Cancelled mid-step: these connections may owe replies.
            for i, conn, _reader, _count in pending:
                self._adrop(i, conn, None)
            raise
        return results

    async def _ablock(self, step: Block):
        import redis

        i = step.node
        idle = self._afree()[i]
        conn = idle.pop() if idle else None
        reader = None if conn is None else wire.ready_replies(conn)
        if reader is None:
            # Let a fan-out set this node's connection up (scripts, restart
            # check).
            if conn is not None:
                wire.close_now(conn)
            return False
        reader.write(wire.pack(conn, [("BLPOP", step.key, f"{step.seconds:.3f}")]))
        try:
            async with async_timeout(step.seconds + self.node_timeout):
                replies = await reader.read(reader.owed + 1)
        except (redis.exceptions.RedisError, OSError, asyncio.TimeoutError) as e:
            self._adrop(i, conn, e)
            return False
        except BaseException:
            self._adrop(i, conn, None)
            raise
        reader.owed = 0
        reply = replies[-1]
        if isinstance(reply, redis.exceptions.ResponseError):
            self._adrop(i, conn, reply)
            return False
        self._aput(idle, conn)
        return reply

    async def _aexecute(self, step: Fanout | Block | Sleep) -> Any:
        if type(step) is Fanout:
            return await self._afanout(step)
        if isinstance(step, Block):
            return await self._ablock(step)
        await asyncio.sleep(step.seconds)
        return None

    # -- the algorithm, as step generators ---------------------------------

    def _no_quorum(self, name: str, results: list) -> LockBackendError:
        errors = "; ".join(
            f"{self.nodes[i].url}: {r.error}"
            for i, r in enumerate(results)
            if isinstance(r, _Failed)
        )
        return LockBackendError(
            f"Redlock backend {self.alias!r} could not reach a quorum of "
            f"{self.quorum} of {len(self.nodes)} nodes for lock {name!r} ({errors}).",
            name=name,
        )

    def _release_command(self, keys: tuple[str, str, str, str], token: str) -> tuple:
        lease, _counter, waiters, wake = keys
        return (
            "EVALSHA",
            RELEASE.sha,
            3,
            lease,
            waiters,
            wake,
            token,
        )

    def _acquire_steps(
        self, name: str, ttl: float, timeout: float | None
    ) -> Generator[Any, Any, Lease | None]:
        keys = self.keys_for(name)
        lease_key, counter_key, waiters_key, wake_key = keys
        token = new_token()
        meta = pack_meta(name, *holder_identity(), time.time())
        ttl_ms = _ms(ttl)
        drift = ttl * self.drift_factor + 0.002
        start = time.monotonic()
        deadline = math.inf if timeout is None else start + timeout
        blocking = timeout is None or timeout > 0
        quorum = self.quorum
        registered = False
        no_quorum_since = None
        first = True
        try:
            while True:
                sent = time.monotonic()
                live_ms = 0
                if first:
                    # The first attempt is two plain commands per node, no script:
                    # most acquisitions find the lock free, and a script costs a
                    # node several times what SET and INCR do. The lease carries
                    # no fencing token (the counter holds it; a commit below
                    # writes it in when the nodes disagree).
                    results = yield Fanout(
                        [
                            ("SET", lease_key, token.encode() + b"\n\n" + meta)
                            + ("NX", "PX", ttl_ms),
                            ("INCR", counter_key),
                        ],
                        skip_quarantined=True,
                        decided=self._set_by_quorum,
                    )
                else:
                    if blocking:
                        live_ms = (
                            _ms(min(MAX_WAIT_SLICE, deadline - sent)) + WAITER_GRACE_MS
                        )
                    results = yield Fanout(
                        [
                            (
                                "EVALSHA",
                                ACQUIRE.sha,
                                3,
                                lease_key,
                                counter_key,
                                waiters_key,
                                token,
                                ttl_ms,
                                meta,
                                live_ms,
                                int(time.time()) << FENCE_SHIFT,
                                self.fence_retention_ms,
                            )
                        ],
                        skip_quarantined=True,
                        decided=self._granted_by_quorum,
                    )
                granted: list[tuple[int, int]] = []
                busy: list[tuple[int, int]] = []
                failed = 0
                for i, r in enumerate(results):
                    if isinstance(r, _Failed):
                        failed += 1
                    elif first:
                        (granted if r[0] is not None else busy).append((i, r[1]))
                    elif r[0][0] == 1:
                        granted.append((i, int(r[0][1])))
                    else:
                        busy.append((i, int(r[0][1])))
                fast, first = first, False
                registered = registered or (bool(busy) and live_ms > 0)
                if len(granted) >= quorum:
                    fences = [f for _i, f in granted]
                    fence = max(fences)
                    if fence < FENCE_FLOOR_MIN:
                        # New counters (first use, a node that lost its data, a
                        # lock unused for FENCE_RETENTION): the clock floor.
                        fence = max(fence, int(time.time()) << FENCE_SHIFT)
                    # Stored on a quorum already, and no granting counter is new
                    # (a new one has no expiry yet: the commit gives it one).
                    ok = (
                        fences.count(fence) >= quorum and min(fences) >= FENCE_FLOOR_MIN
                    )
                    if not ok:
                        # The granting nodes disagree: make the token visible on
                        # a majority that holds the lease before anyone sees it.
                        commits = yield Fanout(
                            [
                                (
                                    "EVALSHA",
                                    COMMIT.sha,
                                    2,
                                    lease_key,
                                    counter_key,
                                    token,
                                    fence,
                                    self.fence_retention_ms,
                                )
                            ]
                        )
                        ok = (
                            sum(
                                1
                                for r in commits
                                if not isinstance(r, _Failed) and r[0] == 1
                            )
                            >= quorum
                        )
                    validity = ttl - (time.monotonic() - sent) - drift
                    if ok and validity > 0:
                        return Lease(
                            alias=self.alias,
                            name=name,
                            token=token,
                            fencing_token=fence,
                            ttl=ttl,
                            deadline=sent + ttl - drift,
                        )
                if granted or failed:
                    # Undo everywhere it may have been set: granted nodes, and
                    # failed ones (a late reply may hide a grant).
                    yield Fanout([self._release_command(keys, token)])
                now = time.monotonic()
                if len(granted) + len(busy) < quorum:
                    # Not enough nodes answered to decide anything.
                    no_quorum_since = no_quorum_since or now
                    if (
                        not blocking
                        or now >= deadline
                        or now - no_quorum_since >= NO_QUORUM_GRACE
                    ):
                        if registered:
                            yield Fanout([("ZREM", waiters_key, token)])
                        raise self._no_quorum(name, results)
                    yield Sleep(min(deadline - now, 0.05 + random.uniform(0, 0.05)))
                    continue
                no_quorum_since = None
                if not blocking or now >= deadline:
                    if fast:
                        yield from self._start_new_counters(keys, granted + busy)
                    break
                if fast and busy:
                    # Held: ask again at once with the script, which registers
                    # this caller as a waiter and tells how long the lease lasts.
                    continue
                if not busy:
                    # Granted by a quorum but too slowly (validity) or the
                    # commit failed: try again after a random moment.
                    yield Sleep(
                        min(deadline - now, random.uniform(0, self.retry_jitter))
                    )
                    continue
                # The lock is held elsewhere: sleep on the wake list of the first
                # busy node (a release there signals it), at most until enough
                # nodes' leases would have run out.
                free = len(granted)
                pttls = sorted(p for _i, p in busy)
                need = quorum - free
                expiry = pttls[need - 1] / 1000 if 0 < need <= len(pttls) else 0.0
                wait = min(
                    deadline - now,
                    MAX_WAIT_SLICE,
                    max(expiry, 0.0) + 0.002 + random.uniform(0, self.retry_jitter),
                )
                busy_nodes = {i for i, _p in busy}
                wake_node = next(
                    i for i in self._wake_order(lease_key) if i in busy_nodes
                )
                if wait >= 0.001:
                    popped = yield Block(wake_node, wake_key, wait)
                    if popped is False:  # the node could not block: do not spin
                        yield Sleep(min(wait, 0.005 + random.uniform(0, 0.01)))
                if granted:
                    # A split vote (or a holder with a bare quorum): the undo of
                    # the other side wakes us; back off a random moment so that
                    # contenders stop colliding.
                    now = time.monotonic()
                    yield Sleep(
                        max(
                            0.0,
                            min(deadline - now, random.uniform(0, self.retry_jitter)),
                        )
                    )
            if registered:
                yield Fanout([("ZREM", waiters_key, token)])
            return None
        except GeneratorExit:
            raise  # closed by the executor: no clean-up wanted (backend down)
        except LockBackendError:
            raise  # no quorum: a clean-up round trip would only wait again
        except BaseException:
            # Interrupted mid-attempt (a cancelled task, KeyboardInterrupt):
            # a node may hold a lease of ours that we never heard of, and a
            # waiter record of ours would be handed the lock by the next
            # release. Undo both (best effort; the executor re-raises).
            yield Fanout(
                [("ZREM", waiters_key, token), self._release_command(keys, token)]
            )
            raise

    def _start_new_counters(
        self, keys: tuple[str, str, str, str], answers: list[tuple[int, int]]
    ) -> Generator[Any, Any, None]:
        """Give counters that a failed first attempt created an expiry.

        ``INCR`` creates a missing counter without one; a grant (its commit)
        or a script attempt would raise it to the clock floor with an expiry,
        but an attempt that gives up here does neither. Rare: a counter is
        new only on a lock's first use, after data loss or past
        ``FENCE_RETENTION``.
        """
        new = [i for i, f in answers if f < FENCE_FLOOR_MIN]
        if new:
            yield Fanout(
                [
                    (
                        "EVALSHA",
                        COMMIT.sha,
                        2,
                        keys[0],
                        keys[1],
                        "",
                        int(time.time()) << FENCE_SHIFT,
                        self.fence_retention_ms,
                    )
                ],
                nodes=new,
            )

    # Step outcomes the executor may stop reading at (see Fanout.decided).

    def _set_by_quorum(self, results: list) -> bool:
        """A first attempt (SET NX PX, INCR) that a quorum granted."""
        ok = sum(1 for r in results if not isinstance(r, _Failed) and r[0] is not None)
        return ok >= self.quorum

    def _granted_by_quorum(self, results: list) -> bool:
        """A scripted attempt that a quorum granted."""
        ok = sum(1 for r in results if not isinstance(r, _Failed) and r[0][0] == 1)
        return ok >= self.quorum

    def _ones_by_quorum(self, results: list) -> bool:
        """A release or extend that a quorum confirmed."""
        return self._count(results)[0] >= self.quorum

    def _count(self, results: list, index: int = 0) -> tuple[int, int]:
        """Return (nodes that answered 1 at ``index``, nodes that failed)."""
        ok = failed = 0
        for r in results:
            if isinstance(r, _Failed):
                failed += 1
            elif r[index]:
                ok += 1
        return ok, failed

    def _quorum_steps(
        self, command: tuple, name: str
    ) -> Generator[Any, Any, tuple[int, int, list]]:
        """Send ``command`` everywhere; ask the failed nodes again if they decide.

        Return (nodes that answered 1, nodes that failed twice, last results).
        The second try reconnects to nodes whose connection broke (a restart)
        so that one dead socket does not leave the outcome unknown.
        """
        results = yield Fanout([command], decided=self._ones_by_quorum)
        ok, failed = self._count(results)
        if ok < self.quorum <= ok + failed:
            retry = [i for i, r in enumerate(results) if isinstance(r, _Failed)]
            again = yield Fanout([command], nodes=retry, force=True)
            ok2, failed = self._count([again[i] for i in retry])
            ok += ok2
            for i in retry:
                results[i] = again[i]
        return ok, failed, results

    def _release_steps(self, lease: Lease) -> Generator[Any, Any, bool]:
        ok, failed, results = yield from self._quorum_steps(
            self._release_command(self.keys_for(lease.name), lease.token),
            lease.name,
        )
        if ok >= self.quorum:
            return True
        if len(self.nodes) - failed < self.quorum:
            raise self._no_quorum(lease.name, results)
        # Not confirmed by a majority: the lease may have been lost (a node
        # restarted empty, an expiry), so it is reported, never assumed.
        return False

    def _extend_command(self, lease: Lease, ttl: float) -> tuple:
        lease_key = self.keys_for(lease.name)[0]
        return ("EVALSHA", EXTEND.sha, 1, lease_key, lease.token, _ms(ttl))

    def _settle_extend(
        self, lease: Lease, ttl: float, sent: float, ok: int, failed: int
    ) -> bool | None:
        if ok >= self.quorum:
            lease.deadline = sent + ttl - (ttl * self.drift_factor + 0.002)
            return True
        if ok + failed < self.quorum:
            return False
        return None

    def _extend_steps(self, lease: Lease, ttl: float) -> Generator[Any, Any, bool]:
        sent = time.monotonic()
        ok, failed, results = yield from self._quorum_steps(
            self._extend_command(lease, ttl), lease.name
        )
        outcome = self._settle_extend(lease, ttl, sent, ok, failed)
        if outcome is None:
            raise self._no_quorum(lease.name, results)
        return outcome

    def _renew_steps(self, leases: list[Lease]) -> Generator[Any, Any, list]:
        sent = time.monotonic()
        results = yield Fanout([self._extend_command(le, le.ttl) for le in leases])
        outcomes: list[bool | None] = []
        for k, lease in enumerate(leases):
            ok, failed = self._count(results, k)
            outcomes.append(self._settle_extend(lease, lease.ttl, sent, ok, failed))
        return outcomes

    def _is_held_steps(self, lease: Lease) -> Generator[Any, Any, bool]:
        results = yield Fanout([("GET", self.keys_for(lease.name)[0])])
        mine = lease.token.encode() + b"\n"
        held = sum(
            1
            for r in results
            if not isinstance(r, _Failed) and r[0] and r[0].startswith(mine)
        )
        if held >= self.quorum:
            return True
        failed = sum(1 for r in results if isinstance(r, _Failed))
        if held + failed >= self.quorum and time.monotonic() < lease.deadline:
            return True
        return False

    # -- the contract -----------------------------------------------------

    def renew(self, leases: Iterable[Lease]) -> list[bool | None]:
        """Renew every lease on every node in one pipelined round trip."""
        leases = list(leases)
        if not leases:
            return []
        return self._run(self._renew_steps(leases))

    async def arenew(self, leases: Iterable[Lease]) -> list[bool | None]:
        leases = list(leases)
        if not leases:
            return []
        return await self._arun(self._renew_steps(leases))

    # -- listing and clearing ----------------------------------------------

    def _node_client(self, i: int):
        import redis

        # Listing may scan many keys: a patient timeout, not NODE_TIMEOUT.
        kwargs = self._conn_kwargs()
        kwargs["socket_timeout"] = max(self.node_timeout, 5.0)
        return redis.Redis.from_url(self.locations[i], **kwargs)

    def _scan(self) -> dict[tuple[bytes, bytes], list]:
        """Return {(key, token): [(node, fence, holder, expires), ...]}.

        Raise LockBackendError if fewer than a quorum of nodes can be read.
        """
        import redis

        pattern = glob_escape(self.key_prefix) + ":{*}"
        seen: dict[tuple[bytes, bytes], list] = {}
        failed = 0
        for i in range(len(self.nodes)):
            client = self._node_client(i)
            try:
                keys = list(client.scan_iter(match=pattern, count=1000, _type="STRING"))
                for start in range(0, len(keys), 500):
                    batch = keys[start : start + 500]
                    pipe = client.pipeline(transaction=False)
                    for key in batch:
                        pipe.get(key)
                        pipe.pttl(key)
                        pipe.get(key + b":c")
                    replies = pipe.execute()
                    now = time.time()
                    for k, key in enumerate(batch):
                        value, pttl, counter = replies[3 * k : 3 * k + 3]
                        parts = (value or b"").split(b"\n", 2)
                        if len(parts) < 3 or pttl is None:
                            continue  # gone, or a reservation
                        expires = now + pttl / 1000 if pttl > 0 else None
                        # A lease granted by a first attempt carries no
                        # fencing token: it is the lock's counter, unless
                        # someone tried to take the lock since (each try
                        # counts), so the listing may show a larger one.
                        fence = int(parts[1] or counter or 0)
                        seen.setdefault((key, parts[0]), []).append(
                            (i, fence, parts[2], expires)
                        )
            except redis.exceptions.RedisError:
                failed += 1
            finally:
                client.close()
        if len(self.nodes) - failed < self.quorum:
            raise LockBackendError(
                f"Redlock backend {self.alias!r} could not reach a quorum of "
                "nodes to list locks."
            )
        return seen

    def holders(self, prefix: str = "") -> Iterator[Holder]:
        """Yield the locks that a quorum of nodes hold with the same token."""
        seen = self._scan()
        for (_key, token), copies in seen.items():
            if len(copies) < self.quorum:
                continue
            name, host, pid, thread, acquired = unpack_meta(copies[0][2])
            if not name.startswith(prefix):
                continue
            # Held until fewer than a quorum of nodes still hold it.
            expiries = sorted(
                (e for _n, _f, _m, e in copies if e is not None), reverse=True
            )
            expires = (
                expiries[self.quorum - 1] if len(expiries) >= self.quorum else None
            )
            fence = max(f for _n, f, _m, _e in copies)
            yield Holder(
                backend=self.alias,
                name=name,
                token=token.decode(),
                host=host,
                pid=pid,
                thread=thread,
                acquired_at=datetime.fromtimestamp(acquired, timezone.utc)
                if acquired
                else None,
                expires_at=datetime.fromtimestamp(expires, timezone.utc)
                if expires
                else None,
                fencing_token=fence,
            )

    def force_release(self, name: str, token: str) -> bool:
        """Delete the lease ``token`` of ``name`` on every node that has it.

        Return True if any node removed it: the lock is then no longer held
        by a quorum unless it was re-taken, which this never undoes.
        """
        results = self._run(
            _single(Fanout([self._release_command(self.keys_for(name), token)]))
        )
        ok, failed = self._count(results)
        if ok == 0 and len(self.nodes) - failed < self.quorum:
            raise self._no_quorum(name, results)
        return ok > 0

    def clear_stale(self) -> int:
        """Remove leases left on fewer than a quorum of nodes.

        Such leftovers (an acquisition whose undo missed a node, a holder
        whose nodes restarted) lock nobody out but keep their nodes busy
        until they expire. Only leases acquired more than ``STALE_AFTER``
        seconds ago are touched, so an acquisition in progress during the
        scan is never mistaken for one; each removal is a compare-and-delete
        of that token. Return how many leases were removed (per lock).
        """
        removed = 0
        now = time.time()
        for (key, token), copies in self._scan().items():
            if len(copies) >= self.quorum:
                continue
            acquired = unpack_meta(copies[0][2])[4]
            if acquired is None or now - acquired < STALE_AFTER:
                continue
            nodes = [node for node, _f, _m, _e in copies]
            keys = (key.decode(), "", key.decode() + ":z", key.decode() + ":w")
            results = self._run(
                _single(
                    Fanout([self._release_command(keys, token.decode())], nodes=nodes)
                )
            )
            if any(not isinstance(r, _Failed) and r[0] for r in results):
                removed += 1
        return removed


def _single(step: Fanout) -> Generator[Any, Any, Any]:
    return (yield step)
