"""Uncontended acquire + release on one Redis: django_distlock vs the peers.

Every contender does the whole cycle a user writes (``with <lock>: pass``),
including creating its lock object; the floor does the two commands a safe
Redis lock needs and nothing else.
"""

from __future__ import annotations

import asyncio
import time

from .common import CAD_SCRIPT, TTL_MS, floor_cycle, token
from .core import alternate, cycles

FLOOR = "raw floor: SET NX PX + EVALSHA"
BARE = "reference: same commands, bare socket + hiredis"
DISTLOCK = "django_distlock lock(), auto_renew off"
DISTLOCK_RENEW = "django_distlock lock(), auto_renew on"
REDISPY = "redis-py Lock"
DJANGO_REDIS = "django-redis cache.lock()"
PRL = "python-redis-lock"
PRL_RENEW = "python-redis-lock, auto_renewal"
POTTERY = "pottery Redlock, 1 master"
AFLOOR = "async raw floor (redis.asyncio)"
AFLOOR_DEADLINE = "reference: async raw floor, each command under asyncio.timeout"
APROTO = "reference: async, bare asyncio protocol + hiredis"
ADISTLOCK = "django_distlock async with lock(), auto_renew off"
ADISTLOCK_RENEW = "django_distlock async with lock(), auto_renew on"
#: Tasks that cycle at once on one event loop, each on a name of its own.
TASKS = 16
AFLOOR_TASKS = f"reference: async raw floor, {TASKS} tasks on one loop (wall ÷ cycles)"
ADISTLOCK_TASKS = (
    f"reference: django_distlock async, {TASKS} tasks on one loop (wall ÷ cycles)"
)

#: Targets from issue 7: contender -> (reference contender, highest ratio).
TARGETS = {
    DISTLOCK: (FLOOR, 1.10),
    DISTLOCK_RENEW: (FLOOR, 1.15),
    ADISTLOCK: (DISTLOCK, 1.20),
    ADISTLOCK_RENEW: (DISTLOCK_RENEW, 1.20),
}


def _bare_cycle(url: str, key: str):
    """The floor's two commands with no client library at all.

    A blocking socket, hiredis to pack and parse, no timeouts, pool or
    reconnects: not a usable client, but it shows how much of the floor is
    redis-py's own Python work rather than the round trips.
    """
    import socket

    import hiredis
    import redis

    where = redis.connection.parse_url(url)
    sock = socket.create_connection((where["host"], where["port"]))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = hiredis.Reader()

    def call(*args):
        sock.sendall(hiredis.pack_command(args))
        while (reply := reader.gets()) is False:
            reader.feed(sock.recv(65536))
        return reply

    sha = call("SCRIPT", "LOAD", CAD_SCRIPT)

    def cycle():
        tok = token()
        if call("SET", key, tok, "NX", "PX", TTL_MS) != b"OK":
            raise RuntimeError("bare floor: key unexpectedly held")
        call("EVALSHA", sha, 1, key, tok)

    return cycle


class _RespProtocol(asyncio.Protocol):
    """The least an asyncio Redis client can do: write, then await one reply.

    No pool, no retries, no timeouts: it shows what asyncio itself costs, so
    the redis.asyncio floor above it shows what the client library adds.
    """

    def __init__(self) -> None:
        import hiredis

        self.reader = hiredis.Reader()
        self.waiting: list[asyncio.Future] = []
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            self.waiting.pop(0).set_result(reply)

    def call(self, *args) -> asyncio.Future:
        import hiredis

        future = asyncio.get_running_loop().create_future()
        self.waiting.append(future)
        self.transport.write(hiredis.pack_command(args))
        return future


def _runners(url: str, loop: asyncio.AbstractEventLoop) -> dict:
    import redis
    import redis.asyncio as aredis
    import redis_lock
    from django.core.cache import cache
    from pottery import Redlock

    from django_distlock import lock
    from django_distlock.backends.redis.client import async_timeout

    client = redis.Redis.from_url(url)
    aclient = aredis.Redis.from_url(url)
    runners = {}
    runners[FLOOR] = cycles(floor_cycle(client, "bench:u:floor"))
    runners[BARE] = cycles(_bare_cycle(url, "bench:u:bare"))

    def distlock():
        with lock("bench:u:distlock", auto_renew=False):
            pass

    def distlock_renew():
        with lock("bench:u:distlock-renew", auto_renew=True):
            pass

    def redispy():
        with client.lock("bench:u:redispy", timeout=TTL_MS / 1000):
            pass

    def django_redis():
        with cache.lock("bench:u:django-redis", timeout=TTL_MS / 1000):
            pass

    def prl():
        with redis_lock.Lock(client, "bench:u:prl", expire=TTL_MS // 1000):
            pass

    def prl_renew():
        with redis_lock.Lock(
            client, "bench:u:prl-renew", expire=TTL_MS // 1000, auto_renewal=True
        ):
            pass

    def pottery():
        with Redlock(
            key="bench:u:pottery", masters={client}, auto_release_time=TTL_MS / 1000
        ):
            pass

    runners[DISTLOCK] = cycles(distlock)
    runners[DISTLOCK_RENEW] = cycles(distlock_renew)
    runners[REDISPY] = cycles(redispy)
    runners[DJANGO_REDIS] = cycles(django_redis)
    runners[PRL] = cycles(prl)
    runners[PRL_RENEW] = cycles(prl_renew)
    runners[POTTERY] = cycles(pottery)

    clock = time.perf_counter_ns
    sha = loop.run_until_complete(aclient.script_load(CAD_SCRIPT))

    async def afloor(n):
        out = []
        for _ in range(n):
            t0 = clock()
            tok = token()
            if not await aclient.set("bench:u:afloor", tok, nx=True, px=TTL_MS):
                raise RuntimeError("async floor: key unexpectedly held")
            await aclient.evalsha(sha, 1, "bench:u:afloor", tok)
            out.append(clock() - t0)
        return out

    async def afloor_deadline(n):
        # The floor with the deadline our async commands run under (a paused
        # server must not hang a call): what scheduling and cancelling one
        # timer per command costs on the event loop.
        out = []
        for _ in range(n):
            t0 = clock()
            tok = token()
            async with async_timeout(3.0):
                if not await aclient.set(
                    "bench:u:afloor-deadline", tok, nx=True, px=TTL_MS
                ):
                    raise RuntimeError("async floor: key unexpectedly held")
            async with async_timeout(3.0):
                await aclient.evalsha(sha, 1, "bench:u:afloor-deadline", tok)
            out.append(clock() - t0)
        return out

    import redis as _redis

    where = _redis.connection.parse_url(url)
    _, proto = loop.run_until_complete(
        loop.create_connection(_RespProtocol, where["host"], where["port"])
    )

    async def aproto(n):
        out = []
        for _ in range(n):
            t0 = clock()
            tok = token()
            ok = await proto.call("SET", "bench:u:aproto", tok, "NX", "PX", TTL_MS)
            if ok != b"OK":
                raise RuntimeError("async protocol floor: key unexpectedly held")
            await proto.call("EVALSHA", sha, 1, "bench:u:aproto", tok)
            out.append(clock() - t0)
        return out

    def alock(name, renew):
        async def batch(n):
            out = []
            for _ in range(n):
                t0 = clock()
                async with lock(name, auto_renew=renew):
                    pass
                out.append(clock() - t0)
            return out

        return batch

    def on_loop(batch):
        return lambda n: loop.run_until_complete(batch(n))

    # A loop with one task waits idle for each reply, and a client that does
    # less work after sending waits longer in the kernel for it. With many
    # tasks the loop is never idle and what counts is each cycle's work: the
    # cost per cycle is the wall time divided by the cycles (every cycle of
    # a round gets that one figure: the p99 is the slowest rounds').
    async def afloor_one(i, n):
        key = f"bench:u:afloor-tasks:{i}"
        for _ in range(n):
            tok = token()
            if not await aclient.set(key, tok, nx=True, px=TTL_MS):
                raise RuntimeError("async floor: key unexpectedly held")
            await aclient.evalsha(sha, 1, key, tok)

    async def alock_one(i, n):
        name = f"bench:u:adistlock-tasks:{i}"
        for _ in range(n):
            async with lock(name, auto_renew=False):
                pass

    def tasks(one):
        async def batch(n):
            each = max(1, n // TASKS)
            t0 = clock()
            await asyncio.gather(*(one(i, each) for i in range(TASKS)))
            return [(clock() - t0) / (each * TASKS)] * (each * TASKS)

        return batch

    runners[AFLOOR] = on_loop(afloor)
    runners[AFLOOR_DEADLINE] = on_loop(afloor_deadline)
    runners[APROTO] = on_loop(aproto)
    runners[ADISTLOCK] = on_loop(alock("bench:u:adistlock", False))
    runners[ADISTLOCK_RENEW] = on_loop(alock("bench:u:adistlock-renew", True))
    runners[AFLOOR_TASKS] = on_loop(tasks(afloor_one))
    runners[ADISTLOCK_TASKS] = on_loop(tasks(alock_one))
    return runners


def run(ctx) -> dict:
    """Return {"series": {name: Series}, "targets": TARGETS}."""
    loop = asyncio.new_event_loop()
    try:
        runners = _runners(ctx.redis_url, loop)
        series = alternate(
            runners,
            rounds=ctx.size(full=20, quick=3),
            per_round=ctx.size(full=200, quick=40),
            warmup=ctx.size(full=200, quick=20),
            progress=ctx.progress,
        )
    finally:
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()
    return {"series": series, "targets": TARGETS, "floor": FLOOR}
