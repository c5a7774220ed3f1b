"""The Redlock executors: each step is one pipelined round trip to all nodes.

On redis-py's public ``Connection`` API (sync and ``redis.asyncio``): a step's
commands are packed once (``pack_commands``), written to every node
(``send_packed_command``), and only then are the replies read
(``read_response``: on redis-py 8 with its ``timeout``, on older releases
after ``can_read``) under one deadline shared by all nodes
(``NODE_TIMEOUT``). A node that does not answer by then counts as failed, its
connection is closed (it may still owe a reply) and the node is skipped for a
short while. Reading stops once a quorum decided the step
(:attr:`~.steps.Fanout.decided`); what the other nodes owe is read with the
connection's next use. A new connection sends a prelude in the same write as
its first step: ``INFO server`` (restart detection) and ``SCRIPT LOAD`` of
every script (a restarted node has an empty script cache).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
import weakref
from typing import Any

from ..base import current_pid
from ..redis.client import async_timeout, no_retry_kwargs
from .steps import (
    NOT_ASKED,
    SCRIPTS,
    UNREAD,
    Block,
    Failed,
    Fanout,
    Sleep,
    lost_scripts,
    read_now,
)

__all__ = ["FanoutExecutor", "Link"]

#: Idle asyncio connections kept per node and event loop.
MAX_IDLE = 64
#: How long a reply already on its way may take once a step's deadline
#: passed (it is read, not waited for).
LATE_READ = 0.001
#: An idle asyncio connection unused for this long is checked before use
#: (closed by the server, unread bytes): cheap, but not free on every step.
CHECK_IDLE_AFTER = 1.0


def _no_client_setinfo() -> dict[str, None]:
    """Return the connection keywords that turn CLIENT SETINFO off.

    Newer redis-py replaced ``lib_name``/``lib_version`` (deprecated since)
    by ``driver_info``; both spell "send nothing" as None.
    """
    from redis.connection import AbstractConnection

    if "driver_info" in inspect.signature(AbstractConnection.__init__).parameters:
        return {"driver_info": None}
    return {"lib_name": None, "lib_version": None}


def _prelude() -> list[tuple]:
    return [("INFO", "server")] + [("SCRIPT", "LOAD", s.source) for s in SCRIPTS]


def _timed_out(error: object) -> bool:
    import redis

    return isinstance(error, (redis.exceptions.TimeoutError, TimeoutError))


class Link:
    """One connection to one node, and the replies it owes.

    ``new`` is set by redis-py's connect callback whenever the connection
    (re)connects: its next write starts with the prelude. ``owed`` counts
    replies sent for and not read yet (a step decided without this node).
    """

    __slots__ = ("__weakref__", "conn", "new", "owed", "ready", "used")

    def __init__(self, conn):
        self.conn = conn
        self.new = False
        self.owed = 0
        # Sync: set up by a fan-out (prelude sent), not failed since.
        self.ready = False
        # Asyncio: when it was last put back idle.
        self.used = 0.0
        conn.register_connect_callback(self._connected)

    def _connected(self, conn) -> None:
        self.new = True
        self.owed = 0


def _redis_py_8() -> tuple[bool, bool]:
    """Return whether redis-py's sync ``Connection`` has a ``timeout`` for
    ``read_response`` and an ``is_connected`` property (redis-py 8 on)."""
    from redis.connection import Connection

    timeout = "timeout" in inspect.signature(Connection.read_response).parameters
    return timeout, isinstance(getattr(Connection, "is_connected", None), property)


READ_TIMEOUT, HAS_IS_CONNECTED = _redis_py_8()


def read_replies(conn, count: int, deadline: float) -> list:
    """Read ``count`` replies from a sync ``conn`` by ``deadline``; error
    replies as values. Raise redis-py's TimeoutError past the deadline."""
    import redis

    replies: list = []
    for _ in range(count):
        left = max(0.0, deadline - time.monotonic())
        try:
            if READ_TIMEOUT:  # waits on the socket only for a reply not buffered
                replies.append(conn.read_response(timeout=left))
            elif conn.can_read(left):
                replies.append(conn.read_response())
            else:
                raise redis.exceptions.TimeoutError("Timeout reading from the node")
        except redis.exceptions.ResponseError as e:
            replies.append(e)
    return replies


async def aread_replies(conn, count: int) -> list:
    """Async twin of :func:`read_replies` (the caller sets the deadline)."""
    import redis

    replies: list = []
    for _ in range(count):
        try:
            replies.append(await conn.read_response())
        except redis.exceptions.ResponseError as e:
            replies.append(e)
    return replies


class _Links(threading.local):
    def __init__(self) -> None:
        self.pid = current_pid()
        self.links: dict[int, Link] = {}


class FanoutExecutor:
    """The executors of :class:`~.backend.RedlockBackend` (a mixin)."""

    def _init_connections(self) -> None:
        self._local = _Links()
        self._all: weakref.WeakSet = weakref.WeakSet()
        self._aidle: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._alast: tuple[weakref.ref, list[list]] | None = None
        self._factories: list | None = None
        self._afactories: list | None = None
        self._prelude_len = len(_prelude())

    def _conn_kwargs(self, for_asyncio: bool = False) -> dict[str, Any]:
        kwargs = {
            **no_retry_kwargs(
                self.node_timeout, self.connect_timeout, for_asyncio=for_asyncio
            ),
            # No CLIENT SETINFO round trip on connect (it would stall on a
            # stopped node, one node after the other).
            **_no_client_setinfo(),
        }
        kwargs.update(self.options.get("CONNECTION_POOL_KWARGS", {}))
        return kwargs

    def _factory_list(self, pool_cls, for_asyncio: bool, **overrides: Any) -> list:
        factories = []
        for url in self.locations:
            kwargs = {**self._conn_kwargs(for_asyncio), **overrides}
            pool = pool_cls.from_url(url, **kwargs)
            factories.append((pool.connection_class, dict(pool.connection_kwargs)))
        return factories

    def close(self) -> None:
        """Close every connection of this process."""
        for link in list(self._all):
            try:
                link.conn.disconnect()
            except Exception:  # noqa: S110 - closing is best effort
                pass
        for loop, free in list(self._aidle.items()):
            # An asyncio connection is closed on its own loop.
            if loop.is_closed() or not loop.is_running():
                continue
            for idle in free:
                for link in idle:
                    asyncio.run_coroutine_threadsafe(
                        link.conn.disconnect(nowait=True), loop
                    )
        self._init_connections()

    def _targets(self, step: Fanout) -> tuple[list, list[int]]:
        """Return (results preset for skipped nodes, nodes to ask)."""
        now = time.monotonic()
        nodes = range(len(self.nodes)) if step.nodes is None else step.nodes
        results: list = [NOT_ASKED] * len(self.nodes)
        targets = []
        for i in nodes:
            node = self.nodes[i]
            if node.down_until > now and not step.force:
                results[i] = Failed(f"skipped after: {node.last_error}", asked=False)
            elif step.skip_quarantined and node.quarantine_until > now:
                results[i] = Failed("restarted recently (RESTART_DELAY)", asked=False)
            else:
                targets.append(i)
        return results, targets

    def _verdict(
        self, i: int, step: Fanout, replies: list, owed: int, prelude: int
    ) -> list | Failed:
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
                return Failed(reply)
        # The restart may have been noticed by this very step (the INFO went
        # out with the command): its vote must not count either.
        if step.skip_quarantined and node.quarantine_until > time.monotonic():
            return Failed("restarted recently (RESTART_DELAY)")
        return replies

    # -- the synchronous executor ------------------------------------------

    def _thread_links(self) -> dict[int, Link]:
        """Return this thread's links, by node (none after a fork)."""
        local = self._local
        pid = current_pid()
        if local.pid != pid:  # forked: the parent's sockets are not ours
            local.pid, local.links = pid, {}
        return local.links

    def _link(self, i: int, links: dict[int, Link] | None = None) -> Link:
        """Return this thread's link to node ``i`` (``links``: its links)."""
        if links is None:
            links = self._thread_links()
        link = links.get(i)
        if link is None:
            if self._factories is None:
                import redis

                self._factories = self._factory_list(redis.ConnectionPool, False)
            cls, kwargs = self._factories[i]
            link = links[i] = Link(cls(**kwargs))
            self._all.add(link)
        return link

    def _drop(self, i: int, link: Link, error: object = None) -> None:
        """Close ``link`` (it may owe replies); mark node ``i`` failed."""
        link.ready = False
        try:
            link.conn.disconnect()
        except Exception:  # noqa: S110 - closing is best effort
            pass
        if error is not None:
            self.nodes[i].fail(_timed_out(error), error)

    def _send(self, link: Link, packed: list[bytes]) -> int:
        """Connect if need be and write ``packed``; return the prelude length."""
        conn = link.conn
        # Connect first, so that a new connection is known before the write
        # (its callback sets link.new). redis-py 8 says whether a connection
        # is up; its connect() costs a retry wrapper even when it is.
        if not (HAS_IS_CONNECTED and conn.is_connected):
            conn.connect()  # no-op when connected; a refusal is raised once
        prelude = 0
        if link.new:
            link.new = False
            prelude = self._prelude_len
            packed = conn.pack_commands(_prelude()) + packed
        conn.send_packed_command(packed, check_health=False)
        link.ready = True
        return prelude

    def _fanout(self, step: Fanout) -> list:
        import redis

        results, targets = self._targets(step)
        sent: list[tuple[int, Link, int]] = []  # (node, link, prelude)
        packed = None
        links = self._thread_links()
        for i in targets:
            link = self._link(i, links)
            try:
                if packed is None:
                    packed = link.conn.pack_commands(step.commands)
                sent.append((i, link, self._send(link, packed)))
            except (redis.exceptions.RedisError, OSError) as e:
                results[i] = Failed(e)
                self._drop(i, link, e)
        # Read in sending order, each read bounded by what is left of the one
        # deadline: the replies travel in parallel, so a stopped node costs
        # at most one NODE_TIMEOUT in total, however many nodes are stopped.
        deadline = time.monotonic() + self.node_timeout
        count = len(step.commands)
        decided = step.decided
        quorum = self.quorum
        k = 0
        try:
            while k < len(sent):
                i, link, prelude = sent[k]
                k += 1
                # Replies owed from a step decided without this node come first.
                owed = link.owed
                try:
                    replies = read_replies(link.conn, owed + prelude + count, deadline)
                except (redis.exceptions.RedisError, OSError) as e:
                    self._drop(i, link, e)
                    results[i] = Failed(e)
                    continue
                link.owed = 0
                results[i] = self._verdict(i, step, replies, owed, prelude)
                if lost_scripts(results[i]):
                    link.conn.disconnect()  # reconnecting reloads the scripts
                if decided is not None and quorum <= k < len(sent) and decided(results):
                    decided = None
                    due = []
                    for j, later, later_prelude in sent[k:]:
                        owes = later.owed + later_prelude + count
                        if read_now(later_prelude, owes):
                            due.append((j, later, later_prelude))
                        else:
                            later.owed = owes
                            results[j] = UNREAD
                    sent = sent[:k] + due
        except BaseException:
            # Interrupted mid-step: these connections may owe replies.
            for i, link, _prelude in sent[k:]:
                self._drop(i, link)
            raise
        return results

    def _block(self, step: Block):
        import redis

        i = step.node
        link = self._link(i)
        conn = link.conn
        if not link.ready or link.new:
            # Let a fan-out set this connection up (scripts, restart check).
            return False
        try:
            if link.owed:
                read_replies(conn, link.owed, time.monotonic() + self.node_timeout)
                link.owed = 0
            conn.send_command(
                "BLPOP", step.key, f"{step.seconds:.3f}", check_health=False
            )
            if not conn.can_read(step.seconds + self.node_timeout):
                self._drop(i, link, redis.exceptions.TimeoutError("BLPOP"))
                return False
            return conn.read_response()
        except (redis.exceptions.RedisError, OSError) as e:
            self._drop(i, link, e)
            return False
        except BaseException:
            self._drop(i, link)
            raise

    def _execute(self, step: Fanout | Block | Sleep) -> Any:
        if isinstance(step, Fanout):
            return self._fanout(step)
        if isinstance(step, Block):
            return self._block(step)
        time.sleep(step.seconds)
        return None

    # -- the asyncio executor ----------------------------------------------
    #
    # The same steps on this event loop's own redis.asyncio connections (a
    # connection belongs to its loop): idle ones by node, taken by one task
    # for a step and given back after it.

    def _afree(self) -> list[list[Link]]:
        """Return this event loop's idle links, by node."""
        loop = asyncio.get_running_loop()
        last = self._alast  # read whole: threads with loops share it
        if last is not None and last[0]() is loop:
            return last[1]
        free = self._aidle.get(loop)
        if free is None:
            free = self._aidle[loop] = [[] for _ in self.nodes]
        self._alast = (weakref.ref(loop), free)
        return free

    def _anew_link(self, i: int) -> Link:
        if self._afactories is None:
            import redis.asyncio as aredis

            # Deadlines are ours (one asyncio timeout per step).
            self._afactories = self._factory_list(
                aredis.ConnectionPool, True, socket_timeout=None
            )
        cls, kwargs = self._afactories[i]
        return Link(cls(**kwargs))

    @staticmethod
    def _aput(idle: list, link: Link) -> None:
        if len(idle) < MAX_IDLE:
            link.used = time.monotonic()
            idle.append(link)

    async def _adrop(self, i: int, link: Link, error: object = None) -> None:
        """Close ``link`` (it may owe replies); mark node ``i`` failed if
        ``error`` is given (a cancelled step is no fault of the node)."""
        try:
            await link.conn.disconnect(nowait=True)
        except Exception:  # noqa: S110 - closing is best effort
            pass
        if error is not None:
            self.nodes[i].fail(_timed_out(error), error)

    async def _aready(self, link: Link) -> None:
        """Connect ``link``'s connection; reconnect one gone stale while idle
        (closed by the server, or holding bytes nobody asked for)."""
        conn = link.conn
        if conn.is_connected and time.monotonic() - link.used > CHECK_IDLE_AFTER:
            try:
                stale = await conn.can_read_destructive()
            except Exception:  # closed by the server: the check raises
                stale = True
            if stale:
                await conn.disconnect(nowait=True)
        if not conn.is_connected:
            async with async_timeout(self.connect_timeout):
                await conn.connect()

    async def _asend(self, link: Link, packed: list[bytes]) -> int:
        await self._aready(link)
        conn = link.conn
        prelude = 0
        if link.new:
            link.new = False
            prelude = self._prelude_len
            packed = conn.pack_commands(_prelude()) + packed
        await conn.send_packed_command(packed, check_health=False)
        return prelude

    async def _asettle(
        self, i: int, idle: list, link: Link, prelude: int, replies, step
    ):
        """Account for node ``i``'s replies to ``step``; return its result."""
        owed, link.owed = link.owed, 0
        result = self._verdict(i, step, replies, owed, prelude)
        if lost_scripts(result):
            # Reconnecting (on next use) reloads the scripts.
            await link.conn.disconnect(nowait=True)
        self._aput(idle, link)
        return result

    async def _afanout(self, step: Fanout) -> list:
        import redis

        results, targets = self._targets(step)
        free = self._afree()
        count = len(step.commands)
        packed = None
        pending: list[tuple[int, Link, int]] = []  # (node, link, prelude)
        try:
            for i in targets:
                link = free[i].pop() if free[i] else self._anew_link(i)
                try:
                    if packed is None:
                        packed = link.conn.pack_commands(step.commands)
                    pending.append((i, link, await self._asend(link, packed)))
                except (
                    redis.exceptions.RedisError,
                    OSError,
                    asyncio.TimeoutError,  # not an OSError before 3.11
                ) as e:
                    results[i] = Failed(e)
                    await self._adrop(i, link, e)
            # Read in sending order under one deadline for the whole step.
            decided = step.decided
            # Nodes that may answer before the step is decided (see Fanout).
            undecided = len(pending) - self.quorum
            try:
                async with async_timeout(self.node_timeout):
                    while pending:
                        i, link, prelude = pending[0]
                        try:
                            replies = await aread_replies(
                                link.conn, link.owed + prelude + count
                            )
                        except (redis.exceptions.RedisError, OSError) as e:
                            del pending[0]
                            results[i] = Failed(e)
                            await self._adrop(i, link, e)
                            continue
                        del pending[0]
                        results[i] = await self._asettle(
                            i, free[i], link, prelude, replies, step
                        )
                        if (
                            decided is not None
                            and 0 < len(pending) <= undecided
                            and decided(results)
                        ):
                            decided = None
                            due = []
                            for entry in pending:
                                j, later, later_prelude = entry
                                owes = later.owed + later_prelude + count
                                if read_now(later_prelude, owes):
                                    due.append(entry)
                                else:
                                    later.owed = owes
                                    results[j] = UNREAD
                                    self._aput(free[j], later)
                            pending[:] = due
            except asyncio.TimeoutError:  # TimeoutError from Python 3.11 on
                # Past the deadline, what is in already still counts: the
                # nodes read after a stopped one have usually answered.
                while pending:
                    i, link, prelude = pending.pop(0)
                    try:
                        async with async_timeout(LATE_READ):
                            replies = await aread_replies(
                                link.conn, link.owed + prelude + count
                            )
                    except (redis.exceptions.RedisError, OSError) as e:
                        results[i] = Failed(e)
                        await self._adrop(i, link, e)
                    except asyncio.TimeoutError:
                        results[i] = Failed("timed out")
                        await self._adrop(i, link, TimeoutError("timed out"))
                    else:
                        results[i] = await self._asettle(
                            i, free[i], link, prelude, replies, step
                        )
        except BaseException:
            # Cancelled mid-step: these connections may owe replies.
            for i, link, _prelude in pending:
                await self._adrop(i, link)
            raise
        return results

    async def _ablock(self, step: Block):
        import redis

        i = step.node
        idle = self._afree()[i]
        link = idle.pop() if idle else None
        if link is None or not link.conn.is_connected:
            # Let a fan-out set this node's connection up (scripts, restart
            # check).
            if link is not None:
                self._aput(idle, link)
            return False
        conn = link.conn
        try:
            await self._aready(link)
            if link.new:  # it had gone stale: a fan-out sets it up again
                self._aput(idle, link)
                return False
            await conn.send_packed_command(
                conn.pack_command("BLPOP", step.key, f"{step.seconds:.3f}"),
                check_health=False,
            )
            async with async_timeout(step.seconds + self.node_timeout):
                replies = await aread_replies(conn, link.owed + 1)
        except (redis.exceptions.RedisError, OSError, asyncio.TimeoutError) as e:
            await self._adrop(i, link, e)
            return False
        except BaseException:
            await self._adrop(i, link)
            raise
        link.owed = 0
        reply = replies[-1]
        if isinstance(reply, redis.exceptions.ResponseError):
            await self._adrop(i, link, reply)
            return False
        self._aput(idle, link)
        return reply

    async def _aexecute(self, step: Fanout | Block | Sleep) -> Any:
        if type(step) is Fanout:
            return await self._afanout(step)
        if isinstance(step, Block):
            return await self._ablock(step)
        await asyncio.sleep(step.seconds)
        return None
