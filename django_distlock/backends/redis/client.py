"""The redis-py clients of a Redis lock backend, sync and ``redis.asyncio``.

Every form of LOCATION goes through one client: a URL (``redis://``,
``rediss://`` for TLS, ``unix://``), a Redis Cluster (``redis+cluster://``
or ``OPTIONS["CLUSTER"]``: redis-py's ``RedisCluster`` routes each command
to its slot's primary), Sentinel (``OPTIONS["SENTINELS"]``: the client of the
primary the sentinels name) or a django-redis cache's pool
(``OPTIONS["CACHE"]``). Scripts are redis-py ``Script`` objects (EVALSHA,
loaded by redis-py on NOSCRIPT); batches are redis-py pipelines.

A lock's own commands (:meth:`RedisClients.command` and its kin) take a
connection of the client's pool and use redis-py's public ``Connection``
methods (``pack_command``, ``send_packed_command``, ``read_response``), as
the client's ``execute_command`` does inside; what they leave out is what a
lock client has no use for on every command: the retry wrapper (it retries
nothing: the scripts are not all idempotent), the event dispatch and the
observability recorder, about a fifth of the instructions a command costs
the client.
A cluster's commands go through its client, which finds each key's node.
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from functools import cached_property
from typing import Any

from ..base import current_pid
from ..scripts import LuaScript
from .deadlines import Watch, async_timeout

__all__ = [
    "CLUSTER_SCHEMES",
    "MAX_WAIT_SLICE",
    "RedisClients",
    "async_timeout",
    "is_noscript",
    "no_retry_kwargs",
]

#: LOCATION schemes of a Redis Cluster (the rest of the URL as for redis://).
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
#: Longest single blocking wait (seconds); shorter still under a short
#: socket timeout, which a blocking command must never outlast.
MAX_WAIT_SLICE = 5.0
#: The part of the socket timeout one blocking wait may use: the rest is
#: for the reply to travel.
WAIT_SHARE = 0.6


def _pool_checks_connections() -> dict[str, Any]:
    """Return the ``redis.asyncio.Redis`` keywords that keep its pool's check
    of an idle connection (closed by the server, unread data) on.

    From redis-py 7 the asyncio pool skips that check while "maintenance
    notifications" may be on, which they are by default ("auto"); a lock
    client has no use for them.
    """
    import redis.asyncio as aredis

    if "maint_notifications_config" not in inspect.signature(aredis.Redis).parameters:
        return {}
    from redis.maint_notifications import MaintNotificationsConfig

    return {"maint_notifications_config": MaintNotificationsConfig(enabled=False)}


def no_retry_kwargs(
    socket_timeout: float | None,
    connect_timeout: float | None,
    *,
    for_asyncio: bool = False,
) -> dict[str, Any]:
    """Return redis-py connection keywords with these timeouts and no retry.

    Our scripts are not all idempotent: the driver must never resend a
    command whose reply was lost. Errors surface as LockBackendError.
    """
    from redis.backoff import NoBackoff

    if for_asyncio:
        from redis.asyncio.retry import Retry
    else:
        from redis.retry import Retry

    return {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "retry": Retry(NoBackoff(), 0),
        "retry_on_timeout": False,
    }


def _async_packer():
    """Return a function packing one command for a ``redis.asyncio`` connection.

    redis.asyncio packs in Python, where the sync client packs with hiredis's
    ``pack_command`` when hiredis is installed (about a tenth of an asyncio
    cycle's client time); this packs as the sync client does.
    """
    try:
        from hiredis import pack_command
    except ImportError:
        return None
    return pack_command


_CONNECTION_ARGS: dict[type, tuple] = {}


def _connection_args(pool) -> tuple:
    """Return the arguments ``pool.get_connection`` needs: none from redis-py
    5.3 on (which warns about any), a command name before."""
    args = _CONNECTION_ARGS.get(type(pool))
    if args is None:
        signature = inspect.signature(pool.get_connection)
        parameter = signature.parameters.get("command_name")
        named = parameter is not None and parameter.default is inspect.Parameter.empty
        args = _CONNECTION_ARGS[type(pool)] = ("",) if named else ()
    return args


def _eval_and_pop(sha: str, keys, args, seconds: float) -> tuple[tuple, tuple]:
    """Return the commands of :meth:`RedisClients.eval_then_pop`."""
    return ("EVALSHA", sha, len(keys), *keys, *args), ("BLPOP", keys[-1], seconds)


def is_noscript(exc: BaseException) -> bool:
    """Return True if ``exc`` is redis-py's NOSCRIPT error (script not loaded)."""
    from redis.exceptions import NoScriptError

    return isinstance(exc, NoScriptError)


class RedisClients:
    """The sync client of one backend and its asyncio twins, one per event loop."""

    def __init__(self, location: Any, options: dict[str, Any]):
        self.location = location
        self.options = options
        self.cache = options.get("CACHE")
        self.socket_timeout = float(options.get("SOCKET_TIMEOUT", 2.0))
        self.connect_timeout = float(options.get("SOCKET_CONNECT_TIMEOUT", 1.0))
        self.cluster = bool(options.get("CLUSTER")) or (
            isinstance(location, str) and location.startswith(CLUSTER_SCHEMES)
        )
        self.sentinels = [tuple(s) for s in options.get("SENTINELS") or ()]
        self._scripts: dict[str, Any] = {}
        self._apack = _async_packer()
        self._reset_async()

    def _reset_async(self) -> None:
        # A redis.asyncio client belongs to the loop that opened its
        # connections: (client, its scripts, the deadlines of its commands)
        # per loop, and the last loop's found without hashing the loop on
        # every command.
        self._aclients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._alast: tuple[weakref.ref, Any, dict, Watch] | None = None
        self._apid = current_pid()

    # -- configuration ----------------------------------------------------

    def _kwargs(self, for_asyncio: bool = False) -> dict[str, Any]:
        kwargs = no_retry_kwargs(
            self.socket_timeout, self.connect_timeout, for_asyncio=for_asyncio
        )
        kwargs.update(self.options.get("CONNECTION_POOL_KWARGS", {}))
        return kwargs

    @cached_property
    def timeouts(self) -> tuple[float | None, float | None]:
        """Return the (socket, connect) timeouts the connections really have.

        With ``OPTIONS["CACHE"]`` those are the django-redis pool's, not
        this alias's.
        """
        if not self.cache:
            return self.socket_timeout, self.connect_timeout
        kwargs = self.client.connection_pool.connection_kwargs
        timeout = kwargs.get("socket_timeout")
        return timeout, kwargs.get("socket_connect_timeout") or timeout

    @cached_property
    def wait_slice(self) -> float:
        """Return the longest blocking wait that the socket timeout allows.

        With ``OPTIONS["CACHE"]`` that is the django-redis pool's timeout,
        not this alias's: a wait must never be cut by the pool's timeout.
        """
        timeout = self.timeouts[0]
        if timeout is None:
            return MAX_WAIT_SLICE
        return min(MAX_WAIT_SLICE, max(0.01, timeout * WAIT_SHARE))

    @cached_property
    def adeadline(self) -> float | None:
        """Return the seconds one asyncio command may take, connecting included.

        The asyncio connections have no socket timeout of their own (redis-py
        would start a task for every write under one): each command runs
        under this one deadline instead.
        """
        timeout, connect = self.timeouts
        if timeout is None:
            return None
        return timeout + (connect or 0.0)

    # -- the sync client --------------------------------------------------

    @cached_property
    def client(self):
        """Return the redis-py client (created on first use)."""
        import redis

        if self.cache:
            from django_redis import get_redis_connection

            return get_redis_connection(self.cache)
        if self.cluster:
            from redis.cluster import ClusterNode, RedisCluster

            return self._cluster(RedisCluster, ClusterNode, self._kwargs())
        if self.sentinels:
            from redis.sentinel import Sentinel

            return self._sentinel_primary(Sentinel, self._kwargs())
        return redis.Redis.from_url(self.location, **self._kwargs())

    def _cluster(self, cluster_class, node_class, kwargs: dict[str, Any]):
        """Return a RedisCluster client from LOCATION.

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
        """Return the client of the primary that the sentinels currently name."""
        sentinel_kwargs = {
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": self.connect_timeout,
            **self.options.get("SENTINEL_KWARGS", {}),
        }
        sentinel = sentinel_class(self.sentinels, sentinel_kwargs=sentinel_kwargs)
        return sentinel.master_for(self.options["SERVICE_NAME"], **kwargs)

    def script(self, lua: LuaScript):
        """Return the sync client's redis-py ``Script`` for ``lua``."""
        script = self._scripts.get(lua.name)
        if script is None:
            script = self._scripts[lua.name] = self.client.register_script(lua.source)
        return script

    @cached_property
    def pool(self):
        """Return the sync client's connection pool (None for a cluster)."""
        return None if self.cluster else self.client.connection_pool

    def command(self, *args: Any) -> Any:
        """Run one command; return its reply as the server sent it."""
        pool = self.pool
        if pool is None:
            return self.client.execute_command(*args)
        conn = pool.get_connection(*_connection_args(pool))
        try:
            # Both disconnect on a socket error or an interruption (a reply
            # left unread must never reach the pool's next user).
            conn.send_packed_command(conn.pack_command(*args))
            return conn.read_response()
        finally:
            pool.release(conn)

    def eval_then_pop(self, lua: LuaScript, keys, args, seconds: float):
        """Run ``lua``, then ``BLPOP keys[-1] seconds``, in one round trip.

        Return (the script's reply, BLPOP's), or None if the server forgot
        the script: the connection is dropped then, so that its BLPOP, which
        would wait the whole time, is not waited for.
        """
        from redis.exceptions import NoScriptError

        pool = self.pool
        sha = (self._scripts.get(lua.name) or self.script(lua)).sha
        conn = pool.get_connection(*_connection_args(pool))
        try:
            commands = _eval_and_pop(sha, keys, args, seconds)
            conn.send_packed_command(conn.pack_commands(commands))
            try:
                reply = conn.read_response()
            except NoScriptError:
                conn.disconnect()
                return None
            except BaseException:
                conn.disconnect()  # BLPOP's reply is still to come
                raise
            return reply, conn.read_response()
        finally:
            pool.release(conn)

    def evalsha(self, lua: LuaScript, keys, args) -> Any:
        """Run ``lua`` on the sync client: EVALSHA, and on NOSCRIPT (the
        server forgot it: restarted, flushed, a failover) redis-py's
        ``Script`` call, which loads it and runs it again.

        The direct EVALSHA (redis-py's public ``execute_command``, as its
        ``evalsha`` does after two calls more) spares every cycle the
        ``Script`` call's own work: an import, a type test, argument tuples.
        """
        script = self._scripts.get(lua.name) or self.script(lua)
        try:
            return self.command("EVALSHA", script.sha, len(keys), *keys, *args)
        except Exception as e:
            if not is_noscript(e):
                raise
        return script(keys=keys, args=args)

    # -- the asyncio clients ----------------------------------------------

    def aclient(self):
        """Return the ``redis.asyncio`` client of the running event loop."""
        return self._aloop()[0]

    def awatch(self) -> Watch:
        """Return the running loop's watch of command deadlines."""
        return self._aloop()[2]

    def ascript(self, lua: LuaScript):
        """Return the running loop's redis-py ``AsyncScript`` for ``lua``."""
        client, scripts, _ = self._aloop()
        script = scripts.get(lua.name)
        if script is None:
            script = scripts[lua.name] = client.register_script(lua.source)
        return script

    async def aevalsha(self, lua: LuaScript, keys, args) -> Any:
        """Async twin of :meth:`evalsha`, on the running loop's client."""
        client, scripts, _ = self._aloop()
        script = scripts.get(lua.name) or self.ascript(lua)
        try:
            return await self._acommand(
                client, ("EVALSHA", script.sha, len(keys), *keys, *args)
            )
        except Exception as e:
            if not is_noscript(e):
                raise
        return await script(keys=keys, args=args)

    async def acommand(self, *args: Any) -> Any:
        """Async twin of :meth:`command`, on the running loop's client."""
        return await self._acommand(self._aloop()[0], args)

    async def _acommand(self, client, args: tuple) -> Any:
        if self.cluster:
            return await client.execute_command(*args)
        pool = client.connection_pool
        conn = await pool.get_connection(*_connection_args(pool))
        try:
            # Both disconnect on a socket error or a cancellation.
            pack = self._apack
            await conn.send_packed_command(
                pack(args) if pack else conn.pack_command(*args)
            )
            return await conn.read_response()
        finally:
            await pool.release(conn)

    async def aeval_then_pop(self, lua: LuaScript, keys, args, seconds: float):
        """Async twin of :meth:`eval_then_pop`."""
        from redis.exceptions import NoScriptError

        client, scripts, _ = self._aloop()
        sha = (scripts.get(lua.name) or self.ascript(lua)).sha
        pool = client.connection_pool
        conn = await pool.get_connection(*_connection_args(pool))
        try:
            commands = _eval_and_pop(sha, keys, args, seconds)
            pack = self._apack
            await conn.send_packed_command(
                b"".join(map(pack, commands)) if pack else conn.pack_commands(commands)
            )
            try:
                reply = await conn.read_response()
            except NoScriptError:
                await conn.disconnect(nowait=True)
                return None
            except BaseException:
                await conn.disconnect(nowait=True)
                raise
            return reply, await conn.read_response()
        finally:
            await pool.release(conn)

    def _aloop(self) -> tuple[Any, dict, Watch]:
        loop = asyncio.get_running_loop()
        last = self._alast  # read whole: threads with loops of their own share it
        if last is not None and last[0]() is loop:
            return last[1], last[2], last[3]
        if self._apid != current_pid():
            self._reset_async()  # forked: the parent's sockets are not ours
        entry = self._aclients.get(loop)
        if entry is None:
            entry = self._aclients[loop] = (self._new_aclient(), {}, Watch())
        self._alast = (weakref.ref(loop), *entry)
        return entry

    def _new_aclient(self):
        import redis.asyncio as aredis

        if self.cluster:
            from redis.asyncio.cluster import ClusterNode, RedisCluster

            kwargs = self._kwargs(for_asyncio=True)
            kwargs.pop("retry_on_timeout")  # not an asyncio cluster option
            return self._cluster(RedisCluster, ClusterNode, kwargs)
        if self.cache:
            # The cache pool's settings, minus what only a sync pool takes.
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff

            accepted = inspect.signature(aredis.Redis).parameters
            kwargs = {
                k: v
                for k, v in self.client.connection_pool.connection_kwargs.items()
                if k in accepted
                and k not in ("connection_class", "parser_class", "retry")
            }
            kwargs.update(_pool_checks_connections(), retry=Retry(NoBackoff(), 0))
            kwargs["socket_timeout"] = None  # see adeadline
            return aredis.Redis(**kwargs)
        kwargs = {**self._kwargs(for_asyncio=True), **_pool_checks_connections()}
        kwargs["socket_timeout"] = None  # see adeadline
        if self.sentinels:
            from redis.asyncio.sentinel import Sentinel

            return self._sentinel_primary(Sentinel, kwargs)
        return aredis.Redis.from_url(self.location, **kwargs)

    def close(self) -> None:
        """Drop the clients; close the sync one unless it is a cache's."""
        client = self.__dict__.pop("client", None)
        for name in ("wait_slice", "timeouts", "adeadline", "pool"):
            self.__dict__.pop(name, None)
        self._scripts = {}
        if client is not None and not self.cache:
            client.close()
        self._reset_async()
