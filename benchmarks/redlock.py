"""Redlock on five redis-server processes: django_distlock vs the raw fan-out.

The raw fan-out is the floor for Redlock from Python: each step (SET NX PX,
then EVALSHA compare-and-delete) is written to all five sockets before any
reply is read, so a step costs one parallel round trip; a majority of OKs
is a lock.
"""

from __future__ import annotations

import time

from .common import CAD_SCRIPT, TTL_MS, floor_cycle, token
from .core import alternate, cycles

SINGLE = "single-node floor (1 Redis)"
FANOUT = "raw pipelined fan-out, 5 nodes"
DISTLOCK = "django_distlock Redlock backend, 5 nodes"
POTTERY = "pottery Redlock, 5 masters"

TARGETS = {DISTLOCK: (FANOUT, 1.20)}
#: pottery must be at least this many times slower than django_distlock.
POTTERY_FACTOR = 10


def fanout_cycle(urls: list[str], key: str):
    import redis

    conns = []
    for url in urls:
        kwargs = redis.connection.parse_url(url)
        conn = redis.Connection(host=kwargs["host"], port=kwargs["port"])
        conn.connect()
        conns.append(conn)
    conns[0].send_command("SCRIPT", "LOAD", CAD_SCRIPT)
    sha = conns[0].read_response()
    for conn in conns[1:]:
        conn.send_command("SCRIPT", "LOAD", CAD_SCRIPT)
        conn.read_response()
    quorum = len(conns) // 2 + 1

    def cycle():
        tok = token()
        started = time.monotonic()
        for conn in conns:
            conn.send_command("SET", key, tok, "NX", "PX", TTL_MS)
        ok = sum(1 for conn in conns if conn.read_response() is not None)
        if ok < quorum or time.monotonic() - started >= TTL_MS / 1000:
            raise RuntimeError("fan-out: no quorum")
        for conn in conns:
            conn.send_command("EVALSHA", sha, 1, key, tok)
        for conn in conns:
            conn.read_response()

    return cycle


def run(ctx) -> dict:
    import redis
    from pottery import Redlock

    from django_distlock import lock

    masters = {redis.Redis.from_url(u) for u in ctx.redlock_urls}

    def distlock():
        with lock("bench:r:distlock", using="quorum", auto_renew=False):
            pass

    def pottery():
        with Redlock(
            key="bench:r:pottery", masters=masters, auto_release_time=TTL_MS / 1000
        ):
            pass

    runners = {
        SINGLE: cycles(floor_cycle(redis.Redis.from_url(ctx.redis_url), "bench:r:1")),
        FANOUT: cycles(fanout_cycle(ctx.redlock_urls, "bench:r:fanout")),
        DISTLOCK: cycles(distlock),
        POTTERY: cycles(pottery),
    }
    series = alternate(
        runners,
        rounds=ctx.size(full=12, quick=2),
        per_round=ctx.size(full=150, quick=20),
        warmup=ctx.size(full=50, quick=5),
        progress=ctx.progress,
    )
    return {"series": series, "targets": TARGETS, "floor": FANOUT}
