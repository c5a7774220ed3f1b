"""Redis single-instance backend.

Each lock is one Redis hash ``<KEY_PREFIX>:{<digest>}`` holding the holder's
token, fencing token, name and metadata, with the lease as its expiry. Waiters
queue in ``...:q``/``...:r`` and each blocks on its own wake list
``...:w:<token>``: the release script hands the lease directly to the first
live waiter and wakes only that one, so a handoff costs no polling, no race
and no herd. Every key of one lock shares the ``{<digest>}`` hash tag, so one
lock lives in one Redis Cluster slot.

The algorithm is written once, as generators that yield Redis commands
(:meth:`RedisLockBackend._acquire_steps`), and carried out by redis-py's
sync client or its ``redis.asyncio`` twin (:mod:`.client`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Generator, Iterable
from functools import cached_property
from typing import Any

from ...exceptions import LockBackendError
from ..base import EXCLUSIVE, Lease, holder_identity, new_token
from ..indoubt import InDoubt
from ..options import Bool, CacheAlias, Dict, Integer, Seconds, Text
from ..steps import StepsBackend
from . import checks
from .client import RedisClients, async_timeout
from .keys import ACQUIRE, CANCEL, EXTEND, RELEASE, LockKeys, ms
from .kind_listing import RedisKindListing
from .listing import RedisListing
from .replicas import WAIT_REPLICAS_TIMEOUT, ReplicaWait, granted_by, popped_by
from .sharing import RedisKinds

__all__ = ["RedisLockBackend"]

release_log = logging.getLogger("django_distlock.release")

#: How long after its expected next call a waiter's queue record stays valid.
WAITER_GRACE_MS = 1000
#: What acquire.lua pushes to a pipelined wait that should look again at once.
LOOK_AGAIN = (b"0", "0")

# A command for the executors: ("eval", script, keys, args), ("blpop", key,
# seconds), ("hget", key, field), ("evalpop", script, keys, args, seconds)
# for an eval and the BLPOP of its last key in the same round trip
# (answered: (reply, popped), or None if the server forgot the script), or
# ("waited", command) for an eval or blpop followed by WAIT in the same round
# trip (answered: (reply, replicas)).
Command = tuple


def _longer(deadline: float | None, wait: float) -> float | None:
    """Return ``deadline`` with room for a blocking wait of ``wait`` seconds."""
    return None if deadline is None else deadline + wait


class RedisLockBackend(
    RedisKinds, RedisKindListing, RedisListing, ReplicaWait, StepsBackend
):
    """Locks on one Redis server (or the server behind a django-redis cache).

    ``LOCATION`` is a redis URL; alternatively ``OPTIONS["CACHE"]`` names a
    django-redis cache whose connection pool is reused (with its settings:
    no connection OPTIONS beside it). Other OPTIONS: ``SOCKET_TIMEOUT``
    (default 2 s), ``SOCKET_CONNECT_TIMEOUT`` (1 s) and
    ``CONNECTION_POOL_KWARGS`` (passed to redis-py).

    Scale-out: a ``redis+cluster://host:port[,host:port...]`` LOCATION (or a
    ``redis://`` one with ``OPTIONS["CLUSTER"] = True``) names startup nodes
    of a Redis Cluster (redis-py's ``RedisCluster`` finds the others);
    ``OPTIONS["SENTINELS"]`` (a list of ``(host, port)``) with
    ``OPTIONS["SERVICE_NAME"]`` reaches the primary that Redis Sentinel
    currently names, and no LOCATION is needed.
    ``OPTIONS["SENTINEL_KWARGS"]`` is passed to the connections to sentinels.

    Shared leases and semaphore permits: :mod:`.sharing`.
    """

    drivers = (("redis", "redis"),)

    options_schema = {
        "CACHE": CacheAlias(
            "Name a CACHES alias whose BACKEND is "
            "'django_redis.cache.RedisCache', or set LOCATION instead.",
            backend="django_redis.",
            what="django-redis cache",
        ),
        "SOCKET_TIMEOUT": Seconds(
            "Without socket timeouts a paused server hangs callers."
        ),
        "SOCKET_CONNECT_TIMEOUT": Seconds(
            "Without socket timeouts a paused server hangs callers."
        ),
        "CONNECTION_POOL_KWARGS": Dict(
            "It is passed to redis-py as keyword arguments."
        ),
        "CLUSTER": Bool(
            "True treats LOCATION as one node of a Redis Cluster.",
            id="distlock.E015",
        ),
        "SENTINELS": checks.Sentinels(
            "For example [('10.0.0.1', 26379), ('10.0.0.2', 26379)].",
            id="distlock.E015",
        ),
        "SERVICE_NAME": Text(
            "Use the name of the `sentinel monitor <name> ...` line.",
            id="distlock.E015",
            what="the monitored primary",
        ),
        "SENTINEL_KWARGS": Dict(
            "It is passed to redis-py's Sentinel as sentinel_kwargs.",
            id="distlock.E015",
        ),
        "WAIT_REPLICAS": Integer(
            "A grant counts once that many replicas confirmed it (WAIT); "
            "0 (the default) does not wait.",
            id="distlock.E029",
            minimum=0,
        ),
        "WAIT_REPLICAS_TIMEOUT": Seconds(checks.WAIT_REPLICAS_HELP, id="distlock.E029"),
    }

    def __init__(self, alias: str, params: dict[str, Any]):
        super().__init__(alias, params)
        self.location = params.get("LOCATION")
        self.redis = RedisClients(self.location, self.options)
        self.socket_timeout = self.redis.socket_timeout
        self.connect_timeout = self.redis.connect_timeout
        self.cluster = self.redis.cluster
        self._keys: dict[str, LockKeys] = {}
        # WAIT_REPLICAS: a grant counts once that many replicas confirmed it.
        self.wait_replicas = int(self.options.get("WAIT_REPLICAS") or 0)
        self.wait_replicas_ms = ms(
            float(self.options.get("WAIT_REPLICAS_TIMEOUT", WAIT_REPLICAS_TIMEOUT))
        )
        #: Whether a waiter's attempt and its wait may share a round trip
        #: (one connection, so not on a cluster; not when grants await WAIT).
        self.waits_pipelined = not self.cluster and not self.wait_replicas

    @classmethod
    def check_entry(cls, alias: str, params: dict[str, Any]) -> list:
        """Check the cache or LOCATION, and the Cluster and Sentinel forms."""
        return checks.check_redis(alias, params)

    # -- clients ----------------------------------------------------------

    @property
    def client(self):
        """Return the redis-py client (created on first use)."""
        return self.redis.client

    def aclient(self):
        """Return the ``redis.asyncio`` client of the running event loop."""
        return self.redis.aclient()

    @cached_property
    def max_wait_slice(self) -> float:
        """Return the longest single blocking wait (below the socket timeout)."""
        return self.redis.wait_slice

    @cached_property
    def slice_live_ms(self) -> int:
        """Return how long the queue record of a whole wait slice stays valid."""
        return ms(self.max_wait_slice) + WAITER_GRACE_MS

    def close(self) -> None:
        self.redis.close()
        self.__dict__.pop("max_wait_slice", None)
        self.__dict__.pop("slice_live_ms", None)

    def _error(self, exc: Exception, what: str) -> LockBackendError:
        return LockBackendError(
            f"Redis lock backend {self.alias!r} failed to {what}: {exc}"
        )

    # -- executors --------------------------------------------------------

    def _execute(self, command: Command) -> Any:
        kind = command[0]
        try:
            if kind == "eval":
                return self.redis.evalsha(command[1], command[2], command[3])
            if kind == "blpop":
                return self.redis.command("BLPOP", command[1], command[2])
            if kind == "hget":
                return self.redis.command("HGET", command[1], command[2])
            if kind == "evalpop":
                return self.redis.eval_then_pop(*command[1:])
            if kind == "waited":
                return self._waited(command[1])
        except Exception as e:
            # redis-py is imported here, off the path of a command that works.
            import redis

            if isinstance(e, redis.exceptions.RedisError):
                raise self._error(e, kind) from e
            raise
        raise AssertionError(f"unknown command {kind!r}")

    async def _aexecute(self, command: Command) -> Any:
        kind = command[0]
        redis_ = self.redis
        deadline = redis_.adeadline
        try:
            watch = redis_.awatch()  # first: every coroutine made below is awaited
            if kind == "eval":
                call = redis_.aevalsha(command[1], command[2], command[3])
            elif kind == "blpop":
                deadline = _longer(deadline, command[2])
                call = redis_.acommand("BLPOP", command[1], command[2])
            elif kind == "evalpop":
                deadline = _longer(deadline, command[4])
                call = redis_.aeval_then_pop(*command[1:])
            elif kind == "hget":
                call = redis_.acommand("HGET", command[1], command[2])
            elif kind == "waited" and self.cluster:
                # The node of a key, on the sync cluster client (see
                # _wait_client), in a worker thread.
                call = asyncio.to_thread(self._waited, command[1])
                deadline = None
            elif kind == "waited":
                if command[1][0] == "blpop":
                    deadline = _longer(deadline, command[1][2])
                call = self._awaited(command[1])
            else:
                raise AssertionError(f"unknown command {kind!r}")
            timeout = watch.start(deadline)
            try:
                async with timeout:
                    return await call
            finally:
                watch.end(timeout)
        except Exception as e:
            import redis

            if isinstance(e, redis.exceptions.RedisError):
                raise self._error(e, kind) from e
            if isinstance(e, asyncio.TimeoutError):  # TimeoutError from 3.11 on
                error = redis.exceptions.TimeoutError("Timeout")
                raise self._error(error, kind) from e
            raise

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
        keys = self._keys.get(name) or self.keys_for(name)
        # A token of our own making cannot be queued yet: the script skips the
        # look for its place in the queue (see acquire.lua's ARGV[8]).
        queued = 0 if token is None else 1
        token = token or new_token()
        host, pid, thread = holder_identity()
        start = time.monotonic()
        if timeout is None:
            deadline, blocking = math.inf, True
        else:
            deadline, blocking = start + timeout, timeout > 0
        args = [token, ms(ttl), keys.stored_name, host, pid, thread]

        sent = start
        if not blocking:
            live_ms = 0
        elif deadline - start >= self.max_wait_slice:
            live_ms = self.slice_live_ms
        else:
            live_ms = ms(deadline - start) + WAITER_GRACE_MS
        try:
            reply = None
            if keys.busy and blocking and self.waits_pipelined:
                # This name was taken at this process's last attempt: queue
                # and wait in one round trip (acquire.lua wakes the wait at
                # once if it grants, or if the lease may end before it does).
                wait = round(min(deadline - start, self.max_wait_slice), 3)
                if wait >= 0.001:
                    reply = yield (
                        "evalpop",
                        ACQUIRE,
                        (*keys.triple, keys.wake_prefix + token),
                        [*args, live_ms, queued, ms(wait)],
                        wait,
                    )
            waited = False
            if reply is not None:
                (acquired, value), popped = reply
                if acquired:
                    keys.busy = False
                elif popped is None:
                    waited = True  # the whole wait, and no handoff
                elif popped[1] not in LOOK_AGAIN:
                    acquired, value = 1, popped[1]
            else:
                acquire = ("eval", ACQUIRE, keys.triple, [*args, live_ms, queued])
                if self.wait_replicas:
                    reply = yield from self._replicated(
                        acquire, keys, token, granted_by
                    )
                    acquired, value = reply or (0, 0)
                else:
                    acquired, value = yield acquire
                if not acquired:
                    keys.busy = True
            if not acquired:
                acquired, value, sent = yield from self._wait_steps(
                    keys, args, token, value, sent, deadline, blocking, waited
                )
        except GeneratorExit:
            # Closed by the executor: the server did not answer, but it may
            # have granted or queued the attempt all the same. No round trip
            # here (a dead or paused server must fail fast): the attempt is
            # cancelled in the background once the server answers.
            self._in_doubt(name, token, ttl)
            raise
        except BaseException:
            # Interrupted (a cancelled task, KeyboardInterrupt...) after the
            # request may have reached the server: leave the waiter queue, and
            # give back a lease taken or handed over meanwhile, so that nobody
            # waits a whole ttl for a caller that is gone.
            try:
                yield from self._cancel_steps(keys, token)
            except GeneratorExit:
                self._in_doubt(name, token, ttl)
                raise
            raise
        if not acquired:
            return None
        # Lease(alias, name, token, fencing_token, ttl, deadline): positional,
        # which is the cheaper call, on the path of every cycle.
        lease = Lease(self.alias, name, token, int(value), ttl, sent + ttl)
        lease.state = keys  # for the release: no second lookup
        return lease

    def _cancel_steps(
        self, keys: LockKeys, token: str
    ) -> Generator[Command, Any, None]:
        """Leave the waiter queue; give back a lease taken under ``token``."""
        got, _ = yield (
            "eval",
            CANCEL,
            (*keys.triple, keys.wake_prefix + token),
            [token],
        )
        if got:
            yield self._give_back_command(keys, token)

    def _give_back_command(self, keys: LockKeys, token: str) -> Command:
        """Return the command releasing ``token``'s lease (nothing if not held)."""
        return ("eval", RELEASE, keys.triple, [token, keys.wake_prefix])

    # -- acquisitions whose outcome is unknown ----------------------------

    @cached_property
    def in_doubt(self) -> InDoubt:
        """Return the canceller of this backend's in-doubt acquisitions."""
        return InDoubt(f"redis-{self.alias}", self._cancel_in_doubt)

    def _in_doubt(self, name: str, token: str, ttl: float) -> None:
        # A grant lasts ttl; a waiter record may still be handed the lock
        # for one wait slice and its grace, and that grant lasts ttl too.
        lasts = ttl + self.max_wait_slice + WAITER_GRACE_MS / 1000
        self.in_doubt.add((name, token), lasts)

    def _cancel_in_doubt(self, items: list[tuple[str, str]]) -> list[bool]:
        """Cancel in-doubt attempts: one pipelined round trip for all of them.

        Per attempt, the cancel script (leave the queue; was it granted?)
        and a release of its token: a compare-and-delete, so a release of a
        token that holds nothing does nothing.
        """
        commands: list[Command] = []
        for name, token in items:
            keys = self.keys_for(name)
            wake = keys.wake_prefix + token
            commands.append(("eval", CANCEL, (*keys.triple, wake), [token]))
            commands.append(self._give_back_command(keys, token))
        replies = self._pipeline(commands)
        done = []
        for k, (name, _token) in enumerate(items):
            cancelled, released = replies[2 * k], replies[2 * k + 1]
            ok = not isinstance(cancelled, Exception) and not isinstance(
                released, Exception
            )
            if ok and (cancelled[0] or released):
                release_log.info(
                    "Gave back lock %r, taken or released by a request whose "
                    "reply was lost (Redis lock backend %r).",
                    name,
                    self.alias,
                )
            done.append(ok)
        return done

    def _wait_steps(
        self, keys, args, token, value, sent, deadline, blocking, waited=False
    ) -> Generator[Command, Any, tuple[Any, Any, float]]:
        """Wait for a busy lock: the loop of :meth:`_acquire_steps`."""
        acquired = 0
        wake = keys.wake_prefix + token
        while not acquired:
            now = time.monotonic()
            if now >= deadline or not blocking:
                if blocking:
                    cancel = ("eval", CANCEL, (*keys.triple, wake), [token])
                    if self.wait_replicas:
                        reply = yield from self._replicated(
                            cancel, keys, token, granted_by
                        )
                        acquired, value = reply or (0, 0)
                    else:
                        acquired, value = yield cancel
                break
            # Sleep until woken by a handoff, or until the lease could have
            # expired (its holder may have died), or the slice ends.
            pttl = int(value) / 1000 if int(value) > 0 else 0.0
            wait = min(deadline - now, self.max_wait_slice, pttl + 0.002)
            if waited:  # that sleep was pipelined with the first attempt
                waited = False
            elif wait >= 0.001:
                blpop = ("blpop", wake, round(wait, 3))
                if self.wait_replicas:
                    popped = yield from self._replicated(blpop, keys, token, popped_by)
                else:
                    popped = yield blpop
                if popped is not None:
                    acquired, value = 1, popped[1]
                    break
            sent = time.monotonic()
            slice_len = min(self.max_wait_slice, deadline - sent)
            live_ms = ms(max(slice_len, 0.001)) + WAITER_GRACE_MS
            acquire = ("eval", ACQUIRE, keys.triple, [*args, live_ms, 1])
            if self.wait_replicas:
                reply = yield from self._replicated(acquire, keys, token, granted_by)
                acquired, value = reply or (0, 0)
            else:
                acquired, value = yield acquire
        return acquired, value, sent

    def _release_steps(self, lease: Lease) -> Generator[Command, Any, bool]:
        keys = lease.state or self.keys_for(lease.name)
        release = ("eval", RELEASE, keys.triple, [lease.token, keys.wake_prefix])
        try:
            code = yield release
        except GeneratorExit:
            # Closed by the executor: the release may or may not have run (a
            # killed connection, a lost reply). Send it again in the
            # background until the server answers, or the lease has expired
            # anyway: the name is then free within a round trip of the
            # server answering, not after the rest of the TTL.
            if (left := lease.remaining()) > 0:
                self.in_doubt.add((lease.name, lease.token), left)
            raise
        except BaseException:
            # Interrupted (a cancelled task...) maybe before the release
            # reached the server (redis-py may wait for its pool first): send
            # it again. A compare-and-delete is harmless twice.
            yield release
            raise
        return code != 0

    def _extend_steps(self, lease: Lease, ttl: float) -> Generator[Command, Any, bool]:
        sent = time.monotonic()
        ok = yield (
            "eval",
            EXTEND,
            (self.keys_for(lease.name).lease,),
            [lease.token, ms(ttl)],
        )
        if ok:
            lease.deadline = sent + ttl
        return bool(ok)

    def _is_held_steps(self, lease: Lease) -> Generator[Command, Any, bool]:
        holder = yield ("hget", self.keys_for(lease.name).lease, "t")
        return holder is not None and holder.decode() == lease.token

    # -- renewal: one pipelined round trip --------------------------------

    def _renewals(self, leases: list[Lease]) -> list[Command]:
        return [
            ("eval", EXTEND, (self.keys_for(le.name).lease,), [le.token, ms(le.ttl)])
            if le.kind is EXCLUSIVE
            else self._kind_renewal(le)
            for le in leases
        ]

    def renew(self, leases: Iterable[Lease]) -> list[bool | None]:
        """Renew every lease in one pipelined round trip."""
        leases = list(leases)
        if not leases:
            return []
        sent = time.monotonic()
        replies = self._pipeline(self._renewals(leases))
        return self._renewed(leases, replies, sent)

    async def arenew(self, leases: Iterable[Lease]) -> list[bool | None]:
        """Async twin of :meth:`renew`, on the event loop's own client.

        Native, not ``sync_to_async``: a renewal must not queue behind
        synchronous work (e.g. sync views sharing the thread-sensitive
        executor) while the lease runs out.
        """
        leases = list(leases)
        if not leases:
            return []
        sent = time.monotonic()
        replies = await self._apipeline(self._renewals(leases))
        return self._renewed(leases, replies, sent)

    def _pipeline(self, commands: list[Command]) -> list:
        """Run script ``commands`` in one pipeline; errors come back as values.

        EVALSHA through ``execute_command`` (a cluster pipeline has no
        script support); when a server forgot a script, the calls are made
        one by one through redis-py's ``Script``, which loads it again.
        """
        import redis

        try:
            pipe = self.client.pipeline(transaction=False)
            for _, script, keys, args in commands:
                pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            replies = pipe.execute(raise_on_error=False)
        except redis.exceptions.RedisError as e:
            return [e] * len(commands)
        # Only the calls the server refused for want of their script are made
        # again: the others ran, and a script is not idempotent.
        for i, reply in enumerate(replies):
            if isinstance(reply, redis.exceptions.NoScriptError):
                try:
                    replies[i] = self._execute(commands[i])
                except LockBackendError as e:
                    replies[i] = e
        return replies

    async def _apipeline(self, commands: list[Command]) -> list:
        """Async twin of :meth:`_pipeline`."""
        import redis

        try:
            pipe = self.aclient().pipeline(transaction=False)
            for _, script, keys, args in commands:
                pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            async with async_timeout(self.redis.adeadline):
                replies = await pipe.execute(raise_on_error=False)
        except (redis.exceptions.RedisError, asyncio.TimeoutError) as e:
            return [e] * len(commands)
        for i, reply in enumerate(replies):
            if isinstance(reply, redis.exceptions.NoScriptError):
                try:
                    replies[i] = await self._aexecute(commands[i])
                except LockBackendError as e:
                    replies[i] = e
        return replies

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
