"""Redis single-instance backend.

Each lock is one Redis hash ``<KEY_PREFIX>:{<digest>}`` holding the holder's
token, fencing token, name and metadata, with the lease as its expiry. Waiters
queue in ``...:q``/``...:r`` and each blocks on its own wake list
``...:w:<token>``: the release script hands the lease directly to the first
live waiter and wakes only that one, so a handoff costs no polling, no race
and no herd. Every key of one lock shares the ``{<digest>}`` hash tag, so one
lock lives in one Redis Cluster slot: on a cluster (``redis+cluster://`` or
``OPTIONS["CLUSTER"]``) every script runs on the one primary owning the
lock's slot, and listing walks every primary. Behind Sentinel
(``OPTIONS["SENTINELS"]`` and ``OPTIONS["SERVICE_NAME"]``) the client asks
the sentinels for the current primary.

The algorithm is written once, as generators that yield Redis commands
(:meth:`RedisLockBackend._acquire_steps`), and driven by a synchronous
(redis-py) or a native asyncio (``redis.asyncio``) executor.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
import weakref
from collections.abc import Generator, Iterator
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ..exceptions import LockBackendError
from ..keys import encode_name, glob_escape, name_digest
from . import wire
from .base import Holder, Lease, current_pid, holder_identity, new_token
from .scripts import LuaScript, load_script
from .steps import StepsBackend

__all__ = ["RedisLockBackend", "ReentrantRedisLockBackend"]

ACQUIRE = load_script("redis_acquire.lua")
RELEASE = load_script("redis_release.lua")
EXTEND = load_script("redis_extend.lua")
CANCEL = load_script("redis_cancel.lua")
LIST = load_script("redis_list.lua")

#: How long after its expected next call a waiter's queue record stays valid.
WAITER_GRACE_MS = 1000
#: Idle connections kept by a backend's own hot-path pool.
MAX_IDLE_CONNECTIONS = 64
#: Longest single blocking wait (it must stay below the socket timeout).
MAX_WAIT_SLICE = 5.0
#: LOCATION schemes of a Redis Cluster (the rest of the URL as for redis://).
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
#: Keys one listing step scans (and reads, in one script call).
LIST_SCAN_COUNT = 1000

# A command for an executor: ("eval", script, keys, args) or ("blpop", key, secs)
# or ("hget", key, field).
Command = tuple


class _LoopConnections:
    """A backend's ``redis.asyncio`` connections on one event loop.

    ``idle`` are ready for use. ``busy`` maps each connection in use to
    ``[task, deadline, expired, cancelling]``: one timer per loop (not one
    per command) wakes at the earliest deadline and cancels the task of a command that
    overran it, which then raises a timeout. Arming and cancelling a timer
    on every command costs more than the rest of the command's Python work,
    and ``asyncio.wait_for`` (redis-py's way) even starts a task.
    """

    __slots__ = ("idle", "busy", "timer", "timer_at", "__weakref__")

    def __init__(self) -> None:
        self.idle: list = []
        self.busy: dict = {}
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = math.inf

    def watch(self, loop, conn, timeout: float | None) -> list:
        """Start the clock on ``conn``'s command; return its entry."""
        task = asyncio.current_task(loop)
        if timeout is None or task is None:
            entry = self.busy[conn] = [task, math.inf, False, 0]
            return entry
        deadline = loop.time() + timeout
        # The task's pending cancellations now, as asyncio.timeout records
        # them: a cancellation from elsewhere must never pass for ours.
        entry = [task, deadline, False, task.cancelling() if _HAS_UNCANCEL else 0]
        self.busy[conn] = entry
        if deadline < self.timer_at:
            if self.timer is not None:
                self.timer.cancel()
            self.timer_at = deadline
            self.timer = loop.call_at(deadline, self.expire, loop)
        return entry

    def expire(self, loop) -> None:
        """Cancel the tasks whose command overran its deadline; re-arm."""
        now = loop.time()
        following = math.inf
        for entry in self.busy.values():
            if entry[2]:
                continue
            task, deadline = entry[0], entry[1]
            if deadline <= now:
                entry[2] = True
                task.cancel()
            elif deadline < following:
                following = deadline
        self.timer_at = following
        self.timer = (
            None
            if following == math.inf
            else loop.call_at(following, self.expire, loop)
        )


_HAS_UNCANCEL = sys.version_info >= (3, 11)


def _timed_out(entry: list, exc: BaseException) -> bool:
    """Whether ``exc`` is the cancellation by which our timer ended a command.

    Not when the task was also cancelled by someone else meanwhile: that
    cancellation must go on (the same rule as ``asyncio.timeout``).
    """
    if not entry[2]:
        return False
    if _HAS_UNCANCEL:
        # Ours is consumed, whatever the driver turned it into.
        return entry[0].uncancel() <= entry[3]
    return isinstance(exc, asyncio.CancelledError)


#: One lease's reads for a listing: HMGET of its fields, then PTTL (RESP,
#: the key twice).
_LIST_READ = (
    b"*9\r\n$5\r\nHMGET\r\n$%d\r\n%s\r\n$1\r\nt\r\n$1\r\nf\r\n$1\r\nn\r\n"
    b"$1\r\nh\r\n$1\r\np\r\n$2\r\nth\r\n$1\r\na\r\n*2\r\n$4\r\nPTTL\r\n$%d\r\n%s\r\n"
)


def _list_reads(keys: list[bytes]) -> bytes:
    """Return the packed reads of ``keys`` (see ``_LIST_READ``)."""
    read = _LIST_READ
    return b"".join([read % (len(k), k, len(k), k) for k in keys])


def _read_replies(conn, count: int) -> list:
    """Read ``count`` replies from ``conn``, errors as values."""
    parser = conn._parser
    reader = getattr(parser, "_reader", None)
    if reader is None:  # no hiredis: redis-py's parser, one reply at a time
        import redis

        replies = []
        for _ in range(count):
            try:
                replies.append(conn.read_response())
            except redis.exceptions.ResponseError as e:
                replies.append(e)
        return replies
    # hiredis: straight from its reader (it returns error replies as
    # values), the socket read through redis-py (timeouts, a closed
    # connection).
    from redis._parsers.hiredis import NOT_ENOUGH_DATA

    gets = reader.gets
    replies = []
    append = replies.append
    for _ in range(count):
        reply = gets()
        while reply is NOT_ENOUGH_DATA:
            parser.read_from_socket()
            reply = gets()
        append(reply)
    return replies


class LockKeys:
    """The Redis keys of one lock name (all in one cluster hash slot)."""

    __slots__ = ("lease", "queue", "records", "wake_prefix")

    def __init__(self, prefix: str, name: str):
        self.lease = f"{prefix}:{{{name_digest(name)}}}"
        self.queue = self.lease + ":q"
        self.records = self.lease + ":r"
        self.wake_prefix = self.lease + ":w:"

    @property
    def triple(self) -> tuple[str, str, str]:
        return (self.lease, self.queue, self.records)


def _ms(seconds: float) -> int:
    return max(1, int(math.ceil(seconds * 1000)))


class RedisLockBackend(StepsBackend):
    """Locks on one Redis server (or the server behind a django-redis cache).

    ``LOCATION`` is a redis URL; alternatively ``OPTIONS["CACHE"]`` names a
    django-redis cache whose connection pool is reused. Other OPTIONS:
    ``SOCKET_TIMEOUT`` (default 2 s), ``SOCKET_CONNECT_TIMEOUT`` (1 s) and
    ``CONNECTION_POOL_KWARGS`` (passed to redis-py).

    Scale-out: a ``redis+cluster://host:port[,host:port...]`` LOCATION (or a
    ``redis://`` one with ``OPTIONS["CLUSTER"] = True``) names startup nodes
    of a Redis Cluster (redis-py's ``RedisCluster`` finds the others);
    ``OPTIONS["SENTINELS"]`` (a list of ``(host, port)``) with
    ``OPTIONS["SERVICE_NAME"]`` reaches the primary that Redis Sentinel
    currently names, and no LOCATION is needed.
    ``OPTIONS["SENTINEL_KWARGS"]`` is passed to the connections to sentinels.
    """

    drivers = (("redis", "redis"),)

    def __init__(self, alias: str, params: dict[str, Any]):
        super().__init__(alias, params)
        self.location = params.get("LOCATION")
        self.socket_timeout = float(self.options.get("SOCKET_TIMEOUT", 2.0))
        self.connect_timeout = float(self.options.get("SOCKET_CONNECT_TIMEOUT", 1.0))
        self.max_wait_slice = min(MAX_WAIT_SLICE, max(0.05, self.socket_timeout * 0.6))
        self._aclients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._reset_async_pool()
        self._idle: list = []
        self._keys: dict[str, LockKeys] = {}
        self._shared_pool = bool(self.options.get("CACHE"))
        self._pid = current_pid()
        self.cluster = bool(self.options.get("CLUSTER")) or (
            isinstance(self.location, str) and self.location.startswith(CLUSTER_SCHEMES)
        )
        self.sentinels = [tuple(s) for s in self.options.get("SENTINELS") or ()]
        # Cluster and Sentinel clients route each command themselves (to the
        # slot's primary, to the current primary): no connections of our own.
        self._routed = self.cluster or bool(self.sentinels)

    OPTION_KEYS = {
        "CACHE",
        "SOCKET_TIMEOUT",
        "SOCKET_CONNECT_TIMEOUT",
        "CONNECTION_POOL_KWARGS",
        "CLUSTER",
        "SENTINELS",
        "SERVICE_NAME",
        "SENTINEL_KWARGS",
    }

    @classmethod
    def check(cls, alias: str, params: dict[str, Any]) -> list:
        """Return system check errors for this backend's LOCKS entry."""
        from django.core.checks import Error

        where = f"LOCKS[{alias!r}]"
        options = params.get("OPTIONS") or {}
        errors = []
        unknown = sorted(set(options) - cls.OPTION_KEYS)
        if unknown:
            errors.append(
                Error(
                    f"{where}['OPTIONS'] has unknown keys: {unknown}.",
                    hint=f"{cls.__name__} accepts {sorted(cls.OPTION_KEYS)}.",
                    obj="settings.LOCKS",
                    id="distlock.E009",
                )
            )
        for key in ("SOCKET_TIMEOUT", "SOCKET_CONNECT_TIMEOUT"):
            value = options.get(key, 1)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or value <= 0
            ):
                errors.append(
                    Error(
                        f"{where}['OPTIONS'][{key!r}] must be a positive number "
                        "of seconds.",
                        hint="Without socket timeouts a paused server hangs callers.",
                        obj="settings.LOCKS",
                        id="distlock.E009",
                    )
                )
        if not isinstance(options.get("CONNECTION_POOL_KWARGS", {}), dict):
            errors.append(
                Error(
                    f"{where}['OPTIONS']['CONNECTION_POOL_KWARGS'] must be a dict.",
                    hint="It is passed to redis-py as keyword arguments.",
                    obj="settings.LOCKS",
                    id="distlock.E009",
                )
            )
        cache = options.get("CACHE")
        if cache is not None:
            from django.conf import settings

            backend = (getattr(settings, "CACHES", {}).get(cache) or {}).get(
                "BACKEND", ""
            )
            if not backend.startswith("django_redis."):
                errors.append(
                    Error(
                        f"{where}['OPTIONS']['CACHE'] is {cache!r}, which is not a "
                        "django-redis cache in CACHES.",
                        hint="Name a CACHES alias whose BACKEND is "
                        "'django_redis.cache.RedisCache', or set LOCATION instead.",
                        obj="settings.LOCKS",
                        id="distlock.E010",
                    )
                )
            return errors
        location = params.get("LOCATION")
        scale_out = cls._check_scale_out(where, location, options)
        if scale_out is not None:
            return errors + scale_out
        if not location:
            errors.append(
                Error(
                    f"{where} has no LOCATION.",
                    hint="Set LOCATION to a redis URL such as "
                    "'redis://127.0.0.1:6379/0', "
                    "or OPTIONS={'CACHE': '<django-redis cache alias>'}.",
                    obj="settings.LOCKS",
                    id="distlock.E004",
                )
            )
        elif not isinstance(location, str) or not location.startswith(
            ("redis://", "rediss://", "unix://")
        ):
            errors.append(
                Error(
                    f"{where}['LOCATION'] must be one redis URL, not {location!r}.",
                    hint="Use redis://host:port/db, rediss:// for TLS or unix:///path.",
                    obj="settings.LOCKS",
                    id="distlock.E004",
                )
            )
        return errors

    @classmethod
    def _check_scale_out(cls, where: str, location: Any, options: dict):
        """Check the Cluster/Sentinel forms; None if the entry uses neither."""
        from django.core.checks import Error

        def error(msg: str, hint: str) -> Error:
            return Error(msg, hint=hint, obj="settings.LOCKS", id="distlock.E015")

        sentinels = options.get("SENTINELS")
        cluster_url = isinstance(location, str) and location.startswith(CLUSTER_SCHEMES)
        if sentinels is None and not cluster_url and "CLUSTER" not in options:
            if "SERVICE_NAME" in options or "SENTINEL_KWARGS" in options:
                return [
                    error(
                        f"{where}['OPTIONS'] has SERVICE_NAME/SENTINEL_KWARGS "
                        "but no SENTINELS.",
                        "Add OPTIONS['SENTINELS'] = [('host', 26379), ...].",
                    )
                ]
            return None
        errors = []
        if sentinels is not None:
            if options.get("CLUSTER") or cluster_url:
                errors.append(
                    error(
                        f"{where} names both a Redis Cluster and Sentinels.",
                        "Use either a cluster LOCATION or OPTIONS['SENTINELS'].",
                    )
                )
            if location:
                errors.append(
                    error(
                        f"{where} has a LOCATION and OPTIONS['SENTINELS'].",
                        "With Sentinel, remove LOCATION: the sentinels name "
                        "the primary.",
                    )
                )
            ok = isinstance(sentinels, (list, tuple)) and len(sentinels) > 0
            for entry in sentinels if ok else ():
                ok = ok and (
                    isinstance(entry, (list, tuple))
                    and len(entry) == 2
                    and isinstance(entry[0], str)
                    and isinstance(entry[1], int)
                    and not isinstance(entry[1], bool)
                    and 0 < entry[1] < 65536
                )
            if not ok:
                errors.append(
                    error(
                        f"{where}['OPTIONS']['SENTINELS'] must be a non-empty "
                        f"list of (host, port) pairs, not {sentinels!r}.",
                        "For example [('10.0.0.1', 26379), ('10.0.0.2', 26379)].",
                    )
                )
            name = options.get("SERVICE_NAME")
            if not isinstance(name, str) or not name:
                errors.append(
                    error(
                        f"{where}['OPTIONS']['SERVICE_NAME'] must name the "
                        "monitored primary.",
                        "Use the name of the `sentinel monitor <name> ...` line.",
                    )
                )
            if not isinstance(options.get("SENTINEL_KWARGS", {}), dict):
                errors.append(
                    error(
                        f"{where}['OPTIONS']['SENTINEL_KWARGS'] must be a dict.",
                        "It is passed to redis-py's Sentinel as sentinel_kwargs.",
                    )
                )
            return errors
        if "CLUSTER" in options and not isinstance(options["CLUSTER"], bool):
            errors.append(
                error(
                    f"{where}['OPTIONS']['CLUSTER'] must be True or False.",
                    "True treats LOCATION as one node of a Redis Cluster.",
                )
            )
        if not isinstance(location, str) or not location.startswith(
            ("redis://", "rediss://", *CLUSTER_SCHEMES)
        ):
            errors.append(
                error(
                    f"{where}['LOCATION'] must be one redis URL of a cluster "
                    f"node, not {location!r}.",
                    "Use redis+cluster://host:port (rediss+cluster:// for TLS).",
                )
            )
        elif "/" in location.split("://", 1)[1].rstrip("/"):
            errors.append(
                error(
                    f"{where}['LOCATION'] names a database; a Redis Cluster "
                    "has only database 0.",
                    "Remove the /<db> part of the URL.",
                )
            )
        return errors

    # -- clients ----------------------------------------------------------

    def _client_kwargs(self, for_asyncio: bool = False) -> dict[str, Any]:
        from redis.backoff import NoBackoff

        if for_asyncio:
            from redis.asyncio.retry import Retry
        else:
            from redis.retry import Retry

        kwargs = {
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": self.connect_timeout,
            # Our scripts are not all idempotent: never let the driver resend
            # a command whose reply was lost. Errors surface as LockBackendError.
            "retry": Retry(NoBackoff(), 0),
            "retry_on_timeout": False,
        }
        kwargs.update(self.options.get("CONNECTION_POOL_KWARGS", {}))
        return kwargs

    @cached_property
    def client(self):
        """The redis-py client (created on first use)."""
        import redis

        cache_alias = self.options.get("CACHE")
        if cache_alias:
            from django_redis import get_redis_connection

            return get_redis_connection(cache_alias)
        if self.cluster:
            from redis.cluster import ClusterNode, RedisCluster

            return self._cluster_client(
                RedisCluster, ClusterNode, self._client_kwargs()
            )
        if self.sentinels:
            from redis.sentinel import Sentinel

            return self._sentinel_primary(Sentinel, self._client_kwargs())
        return redis.Redis.from_url(self.location, **self._client_kwargs())

    def _cluster_client(self, cluster_class, node_class, kwargs: dict[str, Any]):
        """A RedisCluster client from LOCATION.

        ``redis+cluster://[user:pass@]h1:p1,h2:p2/?opts`` names several
        startup nodes, so that the client can start while one is down.
        """
        scheme, rest = self.location.split("://", 1)
        scheme = scheme.replace("+cluster", "")
        netloc, sep, tail = rest.partition("/")
        creds, at, hosts = netloc.rpartition("@")
        first, *others = hosts.split(",")
        url = f"{scheme}://{creds}{at}{first}{sep}{tail}"
        if others:
            nodes = []
            for other in others:
                host, _, port = other.rpartition(":")
                nodes.append(node_class(host.strip("[]"), int(port or 6379)))
            kwargs = {**kwargs, "startup_nodes": nodes}
        return cluster_class.from_url(url, **kwargs)

    def _sentinel_primary(self, sentinel_class, kwargs: dict[str, Any]):
        """The client of the primary that the sentinels currently name."""
        sentinel_kwargs = {
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": self.connect_timeout,
            **self.options.get("SENTINEL_KWARGS", {}),
        }
        sentinel = sentinel_class(self.sentinels, sentinel_kwargs=sentinel_kwargs)
        return sentinel.master_for(self.options["SERVICE_NAME"], **kwargs)

    def aclient(self):
        """The ``redis.asyncio`` client of the running event loop."""
        loop = asyncio.get_running_loop()
        client = self._aclients.get(loop)
        if client is None:
            import redis.asyncio as aredis

            if self.options.get("CACHE"):
                # The cache's connection settings, minus what only the sync
                # pool understands (its parser, driver-internal registries).
                import inspect

                accepted = inspect.signature(aredis.Redis).parameters
                kwargs = {
                    k: v
                    for k, v in self.client.connection_pool.connection_kwargs.items()
                    if k in accepted and k not in ("connection_class", "parser_class")
                }
                client = aredis.Redis(**kwargs)
            elif self.cluster:
                from redis.asyncio.cluster import ClusterNode, RedisCluster

                kwargs = self._client_kwargs(for_asyncio=True)
                kwargs.pop("retry_on_timeout")  # not an asyncio cluster option
                client = self._cluster_client(RedisCluster, ClusterNode, kwargs)
            elif self.sentinels:
                from redis.asyncio.sentinel import Sentinel

                client = self._sentinel_primary(
                    Sentinel, self._client_kwargs(for_asyncio=True)
                )
            else:
                client = aredis.Redis.from_url(
                    self.location, **self._client_kwargs(for_asyncio=True)
                )
            self._aclients[loop] = client
        return client

    def _reset_async_pool(self) -> None:
        # Connections per event loop (a connection belongs to the loop that
        # opened it), and the last loop's, found without hashing the loop on
        # every command.
        self._aloops: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # (loop, its connections) of the last call: one attribute, read and
        # written whole, since threads with loops of their own share it.
        self._aloop_last: tuple[weakref.ref, _LoopConnections] | None = None
        self._aloops_pid = current_pid()
        # (connection class, its kwargs, command timeout), from aclient().
        self._aspec: tuple | None = None

    def close(self) -> None:
        idle, self._idle = self._idle, []
        if self._pid == current_pid():
            for conn in idle:
                conn.disconnect()
        client = self.__dict__.pop("client", None)
        if client is not None and not self.options.get("CACHE"):
            client.close()
        self._aclients = weakref.WeakKeyDictionary()
        if self._aloops_pid == current_pid():
            for conns in list(self._aloops.values()):
                for conn in conns.idle:
                    wire.close_now(conn)
        self._reset_async_pool()

    # -- executors --------------------------------------------------------

    def _error(self, exc: Exception, what: str) -> LockBackendError:
        return LockBackendError(
            f"Redis lock backend {self.alias!r} failed to {what}: {exc}"
        )

    def _checkout(self):
        """Return an idle connection of this process (or a new one).

        With ``OPTIONS["CACHE"]`` the connection comes from the django-redis
        cache's pool, shared with the cache; otherwise from the backend's
        own list of idle connections (same settings, lighter bookkeeping).
        """
        if self._shared_pool:
            return self.client.connection_pool.get_connection()
        if self._pid != current_pid():
            # Forked: the parent's sockets are not ours to use or close.
            self._idle = []
            self._pid = current_pid()
        try:
            conn = self._idle.pop()  # atomic under the GIL: no lock needed
        except IndexError:
            pool = self.client.connection_pool
            return pool.connection_class(**pool.connection_kwargs)
        return conn

    def _call(self, *args: Any) -> Any:
        """Send one command on a connection of our own and return its reply.

        The hot path: acquire and release are one command each, so this
        skips redis-py's per-command machinery (retry wrapper, metrics,
        pool bookkeeping) and, on a plain socket with hiredis, its socket
        calls too (see :mod:`.wire`: one send and one receive per command),
        keeping what matters: a stale connection (server restarted, unread
        data) is reconnected before use, and a connection that failed
        mid-command is dropped, never reused. Server errors
        (``ResponseError``, e.g. NOSCRIPT) leave the connection usable.
        """
        import redis

        if self._routed:
            return self.client.execute_command(*args)
        if self._shared_pool:
            return self._call_pooled(*args)
        conn = self._checkout()
        try:
            sock = conn._sock
            if sock is not None and wire.readable(sock, 0):
                # Unread data (the stream is not ours) or closed by the
                # server since last use: start afresh.
                conn.disconnect()
                sock = None
            if sock is None:
                conn.connect()  # a refusal is raised once
                sock = conn._sock
            if sock.gettimeout() is not None and not wire.kernel_timeouts(
                conn, self.socket_timeout
            ):
                conn.send_command(*args, check_health=False)
                reply = conn._parser.read_response()
            else:
                sock.sendall(wire.pack(conn, [args]))
                [reply] = wire.read_replies(conn, 1)
        except OSError as e:
            conn.disconnect()
            error = (
                redis.exceptions.TimeoutError
                if wire.timed_out(e)
                else redis.exceptions.ConnectionError
            )
            raise error(f"Error talking to Redis: {e!r}") from e
        except BaseException:
            conn.disconnect()
            raise
        self._checkin(conn)
        if isinstance(reply, redis.exceptions.ResponseError):
            raise reply
        return reply

    def _call_pooled(self, *args: Any) -> Any:
        """:meth:`_call` on a connection of a django-redis cache's pool.

        The pool's connections are redis-py's to manage (timeouts included),
        so this goes through redis-py's socket calls.
        """
        import redis

        conn = self._checkout()
        try:
            conn.connect()  # no-op when connected; a refusal is raised once
            try:
                if conn.can_read():
                    conn.disconnect()  # unread data: the stream is not ours
            except (redis.exceptions.ConnectionError, OSError):
                conn.disconnect()  # closed by the server since last use
            conn.send_command(*args)
            reply = conn.read_response()
        except redis.exceptions.ResponseError:
            self._checkin(conn)
            raise
        except BaseException:
            conn.disconnect()
            self._checkin(conn)  # the pool reconnects it when next used
            raise
        self._checkin(conn)
        return reply

    def _checkin(self, conn) -> None:
        if self._shared_pool:
            self.client.connection_pool.release(conn)
        elif len(self._idle) < MAX_IDLE_CONNECTIONS and self._pid == current_pid():
            self._idle.append(conn)
        else:
            conn.disconnect()

    def _execute(self, command: Command) -> Any:
        import redis

        try:
            kind = command[0]
            if kind == "eval":
                script: LuaScript = command[1]
                keys, args = command[2], command[3]
                try:
                    return self._call("EVALSHA", script.sha, len(keys), *keys, *args)
                except redis.exceptions.NoScriptError:
                    return self._call("EVAL", script.source, len(keys), *keys, *args)
            if kind == "blpop":
                return self._call("BLPOP", command[1], command[2])
            if kind == "hget":
                return self._call("HGET", command[1], command[2])
            raise AssertionError(f"unknown command {kind!r}")
        except redis.exceptions.RedisError as e:
            raise self._error(e, command[0]) from e

    def _aloop(self) -> tuple[asyncio.AbstractEventLoop, _LoopConnections]:
        """The running event loop and this backend's connections on it."""
        loop = asyncio.get_running_loop()
        last = self._aloop_last
        if last is not None and last[0]() is loop:
            return loop, last[1]
        if self._aloops_pid != current_pid():
            # Forked: the parent's sockets are not ours to use or close.
            self._reset_async_pool()
        conns = self._aloops.get(loop)
        if conns is None:
            conns = self._aloops[loop] = _LoopConnections()
        self._aloop_last = (weakref.ref(loop), conns)
        return loop, conns

    def _anew_connection(self):
        """A new (unconnected) ``redis.asyncio`` connection of ours.

        Same class and settings as :meth:`aclient`'s pool (for a CACHE, the
        django-redis cache's), except that the connection itself has no
        socket timeout: each whole command has one deadline instead (see
        :class:`_LoopConnections`), not redis-py's ``wait_for`` per write.
        """
        spec = self._aspec
        if spec is None:
            pool = self.aclient().connection_pool
            kwargs = dict(pool.connection_kwargs)
            timeout = kwargs.get("socket_timeout")
            kwargs["socket_connect_timeout"] = (
                kwargs.get("socket_connect_timeout") or timeout
            )
            kwargs["socket_timeout"] = None
            spec = self._aspec = (pool.connection_class, kwargs, timeout)
        return spec[0](**spec[1])

    @cached_property
    def _apack(self):
        """Pack one command's arguments as the sync connections do.

        redis.asyncio packs in Python; redis-py's sync connections use
        hiredis when it is installed (same bytes, a fraction of the time).
        """
        from redis.utils import HIREDIS_AVAILABLE

        if HIREDIS_AVAILABLE:
            import hiredis

            return hiredis.pack_command
        from redis.asyncio.connection import Connection

        packer = Connection()  # never connected: only its encoder is used
        return lambda args: b"".join(packer.pack_command(*args))

    async def _aready(self, conn) -> wire.Replies | None:
        """Connect ``conn``, or reconnect it if it went stale while idle (for
        a connection :func:`.wire.ready_replies` did not answer for).

        Return the :class:`~.wire.Replies` that reads its replies, or None
        (no hiredis) when redis-py's parser does.
        """
        if conn.is_connected:
            if "_distlock_replies" not in conn.__dict__:
                # No hiredis: redis-py's parser reads, and says itself
                # whether the stream is still clean.
                if not await conn.can_read():
                    return None
            # Closed by the server since last use, or unread data: the
            # stream is not ours any more.
            await conn.disconnect(nowait=True)
        await conn.connect()  # a refusal is raised once: no retries
        return wire.Replies.take_over(conn)

    def _atimeout_for(self) -> float | None:
        """The deadline of a command that must connect first."""
        timeout = self._aspec[2]
        if timeout is not None:
            timeout += self.connect_timeout
        return timeout

    @staticmethod
    def _acheckin(conns: _LoopConnections, conn) -> None:
        if len(conns.idle) < MAX_IDLE_CONNECTIONS:
            conns.idle.append(conn)
        else:
            wire.close_now(conn)

    @staticmethod
    def _afailed(conn, entry: list, exc: BaseException):
        """Drop ``conn``; return the redis-py error to raise for ``exc``, if any."""
        import redis

        wire.close_now(conn)
        if _timed_out(entry, exc):
            return redis.exceptions.TimeoutError("Timeout waiting for Redis")
        if isinstance(exc, OSError):
            return redis.exceptions.ConnectionError(f"Error talking to Redis: {exc}")
        return None

    async def _acall(self, *args: Any) -> Any:
        """Async twin of :meth:`_call`, on this event loop's own connections.

        One command through :meth:`_apipeline`; an error reply
        (``ResponseError``, e.g. NOSCRIPT) is raised, and leaves the
        connection usable.
        """
        import redis

        if self._routed:
            return await self.aclient().execute_command(*args)
        [reply] = await self._apipeline([args])
        if isinstance(reply, redis.exceptions.ResponseError):
            raise reply
        return reply

    async def _apipeline(self, commands: list[tuple]) -> list:
        """Send ``commands`` in one write; return their replies in order.

        One deadline bounds the whole exchange (connecting included); no task
        is created. Error replies are returned as exceptions (like redis-py's
        ``execute(raise_on_error=False)``); anything else failing raises, and
        the connection, interrupted anywhere (timeout, error, the task's
        cancellation mid-reply), is closed, never reused.
        """
        import redis

        loop, conns = self._aloop()
        if conns.idle:  # connected (checked in after a command went well)
            conn = conns.idle.pop()
            reader = wire.ready_replies(conn)
        else:
            conn = self._anew_connection()
            reader = None
        # A connection to (re)connect first gets the connect timeout too.
        entry = conns.watch(
            loop, conn, self._aspec[2] if reader is not None else self._atimeout_for()
        )
        replies: list = []
        try:
            if reader is None:
                reader = await self._aready(conn)
            pack = self._apack
            if reader is not None:
                if len(commands) == 1:
                    reader.transport.write(pack(commands[0]))
                else:
                    reader.transport.write(b"".join(map(pack, commands)))
                replies = await reader.read(len(commands))
            else:
                packed = [pack(command) for command in commands]
                await conn.send_packed_command(packed, check_health=False)
                for _ in commands:
                    try:
                        replies.append(await conn.read_response())
                    except redis.exceptions.ResponseError as e:
                        replies.append(e)
        except BaseException as exc:
            del conns.busy[conn]
            error = self._afailed(conn, entry, exc)
            if error is None:
                raise
            raise error from exc
        del conns.busy[conn]
        self._acheckin(conns, conn)
        return replies

    async def _aexecute(self, command: Command) -> Any:
        import redis

        kind = command[0]
        if kind == "eval":
            script: LuaScript = command[1]
            keys, args = command[2], command[3]
            call = ("EVALSHA", script.sha, len(keys), *keys, *args)
        elif kind == "blpop" or kind == "hget":
            call = (kind.upper(), command[1], command[2])
        else:
            raise AssertionError(f"unknown command {kind!r}")
        try:
            if self._routed:
                return await self._acall(*call)
            # _acall(), inlined: one coroutine less per command.
            [reply] = await self._apipeline([call])
            if isinstance(reply, redis.exceptions.ResponseError):
                raise reply
            return reply
        except redis.exceptions.NoScriptError as e:
            if kind != "eval":
                raise self._error(e, kind) from e
            try:
                return await self._acall("EVAL", script.source, *call[2:])
            except redis.exceptions.RedisError as e:
                raise self._error(e, kind) from e
        except redis.exceptions.RedisError as e:
            raise self._error(e, kind) from e

    # -- the algorithm, as command generators -----------------------------

    def keys_for(self, name: str) -> LockKeys:
        """Return the keys that hold lock ``name``."""
        keys = self._keys.get(name)
        if keys is None:
            keys = LockKeys(self.key_prefix, name)
            # Hashing the name is the costliest local step of a cycle; remember
            # the keys of short names (bounded, so it cannot grow unchecked).
            if len(name) <= 256:
                if len(self._keys) >= 4096:
                    self._keys.clear()
                self._keys[name] = keys
        return keys

    def _acquire_steps(
        self, name: str, ttl: float, timeout: float | None, token: str | None = None
    ) -> Generator[Command, Any, Lease | None]:
        keys = self.keys_for(name)
        token = token or new_token()
        host, pid, thread = holder_identity()
        ttl_ms = _ms(ttl)
        start = time.monotonic()
        deadline = math.inf if timeout is None else start + timeout
        blocking = timeout is None or timeout > 0
        slice_len = min(self.max_wait_slice, deadline - start)
        args = [token, ttl_ms, encode_name(name), host, pid, thread]

        sent = start
        live_ms = _ms(slice_len) + WAITER_GRACE_MS if blocking else 0
        try:
            acquired, value = yield ("eval", ACQUIRE, keys.triple, [*args, live_ms])
            if not acquired:
                acquired, value, sent = yield from self._wait_steps(
                    keys, args, token, value, sent, deadline, blocking
                )
        except GeneratorExit:
            raise  # closed by the executor: no clean-up wanted (backend down)
        except BaseException:
            # Interrupted (a cancelled task, KeyboardInterrupt...) after the
            # request may have reached the server: leave the waiter queue, and
            # give back a lease taken or handed over meanwhile, so that nobody
            # waits a whole ttl for a caller that is gone.
            wake = keys.wake_prefix + token
            got, _ = yield ("eval", CANCEL, (*keys.triple, wake), [token])
            if got:
                yield ("eval", RELEASE, keys.triple, [token, keys.wake_prefix])
            raise
        if not acquired:
            return None
        return Lease(
            alias=self.alias,
            name=name,
            token=token,
            fencing_token=int(value),
            ttl=ttl,
            deadline=sent + ttl,
        )

    def _wait_steps(
        self, keys, args, token, value, sent, deadline, blocking
    ) -> Generator[Command, Any, tuple[Any, Any, float]]:
        """Wait for a busy lock: the loop of :meth:`_acquire_steps`."""
        acquired = 0
        wake = keys.wake_prefix + token
        while not acquired:
            now = time.monotonic()
            if now >= deadline or not blocking:
                if blocking:
                    acquired, value = yield (
                        "eval",
                        CANCEL,
                        (*keys.triple, wake),
                        [token],
                    )
                break
            # Sleep until woken by a handoff, or until the lease could have
            # expired (its holder may have died), or the slice ends.
            pttl = int(value) / 1000 if int(value) > 0 else 0.0
            wait = min(deadline - now, self.max_wait_slice, pttl + 0.002)
            if wait >= 0.001:
                popped = yield ("blpop", wake, round(wait, 3))
                if popped is not None:
                    acquired, value = 1, popped[1]
                    break
            sent = time.monotonic()
            slice_len = min(self.max_wait_slice, deadline - sent)
            live_ms = _ms(max(slice_len, 0.001)) + WAITER_GRACE_MS
            acquired, value = yield ("eval", ACQUIRE, keys.triple, [*args, live_ms])
        return acquired, value, sent

    def _release_steps(self, lease: Lease) -> Generator[Command, Any, bool]:
        keys = self.keys_for(lease.name)
        code = yield ("eval", RELEASE, keys.triple, [lease.token, keys.wake_prefix])
        return code != 0

    def _extend_steps(self, lease: Lease, ttl: float) -> Generator[Command, Any, bool]:
        sent = time.monotonic()
        ok = yield (
            "eval",
            EXTEND,
            (self.keys_for(lease.name).lease,),
            [lease.token, _ms(ttl)],
        )
        if ok:
            lease.deadline = sent + ttl
        return bool(ok)

    def _is_held_steps(self, lease: Lease) -> Generator[Command, Any, bool]:
        holder = yield ("hget", self.keys_for(lease.name).lease, "t")
        return holder is not None and holder.decode() == lease.token

    # -- the contract -----------------------------------------------------

    def renew(self, leases) -> list[bool | None]:
        """Renew every lease in one pipelined round trip."""
        import redis

        leases = list(leases)
        if not leases:
            return []
        sent = time.monotonic()
        try:
            pipe = self.client.pipeline(transaction=False)
            self._queue_renewals(pipe, leases)
            replies = pipe.execute(raise_on_error=False)
        except redis.exceptions.RedisError:
            return [None] * len(leases)
        if any(isinstance(r, redis.exceptions.NoScriptError) for r in replies):
            return super().renew(leases)
        return self._renewed(leases, replies, sent)

    async def arenew(self, leases) -> list[bool | None]:
        """Async twin of :meth:`renew`, on the event loop's own client.

        Native, not ``sync_to_async``: a renewal must not queue behind
        synchronous work (e.g. sync views sharing the thread-sensitive
        executor) while the lease runs out.
        """
        import redis

        if type(self).renew is not RedisLockBackend.renew:
            # A subclass renews its own way: keep its semantics.
            return await super().arenew(leases)
        leases = list(leases)
        if not leases:
            return []
        sent = time.monotonic()
        try:
            if self._routed:
                pipe = self.aclient().pipeline(transaction=False)
                self._queue_renewals(pipe, leases)
                replies = await pipe.execute(raise_on_error=False)
            else:
                replies = await self._apipeline(
                    [
                        (
                            "EVALSHA",
                            EXTEND.sha,
                            1,
                            self.keys_for(lease.name).lease,
                            lease.token,
                            _ms(lease.ttl),
                        )
                        for lease in leases
                    ]
                )
        except redis.exceptions.RedisError:
            return [None] * len(leases)
        if any(isinstance(r, redis.exceptions.NoScriptError) for r in replies):
            results: list[bool | None] = []
            for lease in leases:
                try:
                    results.append(await self.aextend(lease, lease.ttl))
                except Exception:
                    results.append(None)
            return results
        return self._renewed(leases, replies, sent)

    def _queue_renewals(self, pipe, leases: list[Lease]) -> None:
        for lease in leases:
            # execute_command: RedisCluster pipelines block .evalsha() (the
            # slot is found from the keys all the same).
            pipe.execute_command(
                "EVALSHA",
                EXTEND.sha,
                1,
                self.keys_for(lease.name).lease,
                lease.token,
                _ms(lease.ttl),
            )

    @staticmethod
    def _renewed(leases: list[Lease], replies, sent: float) -> list[bool | None]:
        results: list[bool | None] = []
        for lease, reply in zip(leases, replies):
            if isinstance(reply, Exception):
                results.append(None)
            elif reply:
                lease.deadline = sent + lease.ttl
                results.append(True)
            else:
                results.append(False)
        return results

    # -- listing and clearing ----------------------------------------------

    def holders(self, prefix: str = "") -> Iterator[Holder]:
        import redis

        # Exactly "<prefix>:{<43-char digest>}": a longer KEY_PREFIX that
        # starts with ours (another alias's) can never match.
        pattern = glob_escape(self.key_prefix) + ":{" + "?" * 43 + "}"
        alias = self.alias
        make = Holder.from_ms
        try:
            if self.cluster:
                batches = self._cluster_list_batches(pattern, encode_name(prefix))
            elif prefix or self._routed:
                # A str prefix of the name is a bytes prefix of its stored
                # form: the script filters on the server.
                batches = self._script_list_batches(pattern, encode_name(prefix))
            else:
                batches = self._pipelined_list_batches(pattern)
            for batch in batches:
                now_ms = time.time_ns() // 1_000_000
                replies = iter(batch)
                for fields, pttl in zip(replies, replies):
                    if type(fields) is not list or fields[0] is None:
                        continue  # gone since the scan (or not a lease at all)
                    token, fence, name, host, pid, thread, acquired = fields
                    yield make(
                        alias,
                        name.decode("utf-8", "surrogatepass") if name else "",
                        token.decode(),
                        host.decode(errors="replace") if host else "",
                        int(pid) if pid else None,
                        thread.decode(errors="replace") if thread else "",
                        int(acquired) if acquired else None,
                        now_ms + pttl if type(pttl) is int and pttl > 0 else None,
                        int(fence) if fence else None,
                    )
        except redis.exceptions.RedisError as e:
            raise self._error(e, "list locks") from e

    # The listing executors yield batches of replies, an HMGET of the lease
    # fields then the PTTL of each lease: [fields, pttl, fields, pttl, ...].

    def _pipelined_list_batches(self, pattern: str) -> Iterator[list]:
        """Scan and read every lease with pipelined HMGET and PTTL.

        Each step sends the reads of the keys just scanned together with the
        next SCAN, before the previous batch is handed on: the server reads
        while this process decodes. (The list script does the same work for
        about twice the server time, spent converting replies to Lua and
        back.)
        """
        import redis

        conn = self._checkout()

        def scan(cursor: bytes | int) -> list[bytes]:
            return conn.pack_command(
                *("SCAN", cursor, "MATCH", pattern),
                *("COUNT", LIST_SCAN_COUNT, "TYPE", "HASH"),
            )

        def send_reads(keys: list[bytes], cursor: bytes) -> None:
            # The reads of the keys just scanned, then the next scan step.
            then = scan(cursor) if cursor != b"0" else []
            conn.send_packed_command([_list_reads(keys), *then])

        try:
            conn.connect()
            try:
                if conn.can_read():
                    conn.disconnect()  # unread data: the stream is not ours
            except (redis.exceptions.ConnectionError, OSError):
                conn.disconnect()  # closed by the server since last use
            conn.send_packed_command(scan(0))
            cursor, keys = conn.read_response()
            send_reads(keys, cursor)
            while True:
                batch = _read_replies(conn, 2 * len(keys))
                if cursor == b"0":
                    yield batch
                    break
                cursor, keys = conn.read_response()
                send_reads(keys, cursor)  # the server reads them meanwhile
                yield batch
        except BaseException:
            # Also when the caller stopped early: replies may be in flight.
            conn.disconnect()
            if self._shared_pool:
                self._checkin(conn)  # the pool reconnects it when next used
            raise
        self._checkin(conn)

    def _script_list_batches(self, pattern: str, wanted: bytes) -> Iterator[list]:
        """Scan and read the leases named ``wanted...`` with the list script."""
        args = [wanted, 0, pattern, LIST_SCAN_COUNT]
        while True:
            reply = self._execute(("eval", LIST, [], args))
            yield reply[1:]
            if reply[0] == b"0":
                return
            args[1] = reply[0]

    def _cluster_list_batches(self, pattern: str, wanted: bytes) -> Iterator[list]:
        """Scan every primary of a cluster, then read with the list script."""
        # Keys of different locks are in different slots: one script call
        # per key, pipelined (one round trip per primary).
        batch: list[bytes] = []
        keys = self.client.scan_iter(match=pattern, count=1000, _type="HASH")
        for key in keys:
            batch.append(key)
            if len(batch) >= 1000:
                yield self._cluster_read(batch, wanted)
                batch = []
        if batch:
            yield self._cluster_read(batch, wanted)

    def _cluster_read(self, keys: list[bytes], wanted: bytes) -> list:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.execute_command("EVAL", LIST.source, 1, key, wanted)
        values: list = []
        for reply in pipe.execute():
            values += reply[1:]
        return values

    def force_release(self, name: str, token: str) -> bool:
        keys = self.keys_for(name)
        return (
            self._execute(("eval", RELEASE, keys.triple, [token, keys.wake_prefix]))
            != 0
        )

    def force_release_many(self, items) -> list[bool]:
        """Force-release many leases, pipelined in batches of 1,000."""
        import redis

        items = list(items)
        results: list[bool] = []
        for start in range(0, len(items), 1000):
            batch = items[start : start + 1000]
            try:
                pipe = self.client.pipeline(transaction=False)
                for name, token in batch:
                    keys = self.keys_for(name)
                    pipe.execute_command(
                        "EVALSHA", RELEASE.sha, 3, *keys.triple, token, keys.wake_prefix
                    )
                replies = pipe.execute(raise_on_error=False)
            except redis.exceptions.RedisError as e:
                raise self._error(e, "clear locks") from e
            for (name, token), reply in zip(batch, replies):
                if isinstance(reply, redis.exceptions.NoScriptError):
                    results.append(self.force_release(name, token))
                elif isinstance(reply, Exception):
                    raise self._error(reply, "clear locks")
                else:
                    results.append(reply != 0)
        return results


if TYPE_CHECKING:
    from .redis_reentrant import ReentrantRedisLockBackend


def __getattr__(name: str):
    # The reentrant variant lives in its own module (it has its own scripts)
    # and is importable from here, as the documented path says. Imported on
    # first use (PEP 562), so that either module can be imported first.
    if name == "ReentrantRedisLockBackend":
        from .redis_reentrant import ReentrantRedisLockBackend

        return ReentrantRedisLockBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
