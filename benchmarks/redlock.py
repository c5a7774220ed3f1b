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
OWN_SCRIPTS = "raw fan-out of django_distlock's own commands (diagnostic)"
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


def own_scripts_cycle(urls: list[str], backend):
    """Return a raw fan-out replaying the backend's own commands, or None.

    A diagnostic that splits the backend's cost into what its commands (plain
    SET NX PX + INCR, then a Lua release script) cost the servers, five of
    them sharing the machine's cores with the client, and what its Python
    side adds. One real acquire + release is
    recorded (the steps its algorithm yields), then replayed with a fresh
    token per cycle through the same bare sockets as the fan-out floor. It
    leans on the backend's internals; if they change shape, the row is left
    out rather than guessed.
    """
    import redis

    try:
        steps: list[list[tuple]] = []

        def tap(gen):
            result = None
            try:
                while True:
                    step = gen.send(result)
                    steps.append(list(getattr(step, "commands", None) or []))
                    result = yield step
            except StopIteration as stop:
                return stop.value

        name = "bench:r:own-scripts"
        # A lock's first cycle sets its counters up (one more step): record
        # the steady state, as the replay repeats it.
        backend.release(backend.acquire(name, TTL_MS / 1000, 0))
        lease = backend._run(tap(backend._acquire_steps(name, TTL_MS / 1000, 0)))
        if lease is None or not backend._run(tap(backend._release_steps(lease))):
            raise RuntimeError("recording cycle failed")
        if len(steps) != 2 or not all(steps):
            raise RuntimeError(f"expected 2 fan-out steps, recorded {len(steps)}")
        conns = []
        for url in urls:
            kwargs = redis.connection.parse_url(url)
            conn = redis.Connection(host=kwargs["host"], port=kwargs["port"])
            conn.connect()
            conns.append(conn)
        recorded = lease.token

        def swap(arg, tok: str):
            # The token travels alone (scripts) or inside the lease value.
            if isinstance(arg, bytes):
                return arg.replace(recorded.encode(), tok.encode())
            return tok if arg == recorded else arg

        def cycle():
            tok = token()
            for commands in steps:
                packed = b"".join(
                    conns[0].pack_commands(
                        [[swap(a, tok) for a in command] for command in commands]
                    )
                )
                for conn in conns:
                    conn.send_packed_command([packed])
                for conn in conns:
                    for _ in commands:
                        conn.read_response()

        for _ in range(3):
            cycle()
        return cycle
    except Exception as e:  # the internals moved: leave the row out
        print(f"  (diagnostic row left out: {type(e).__name__}: {e})")
        return None


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
    from django_distlock import locks

    own = own_scripts_cycle(ctx.redlock_urls, locks["quorum"])
    if own is not None:
        runners = {
            SINGLE: runners[SINGLE],
            FANOUT: runners[FANOUT],
            OWN_SCRIPTS: cycles(own),
            DISTLOCK: runners[DISTLOCK],
            POTTERY: runners[POTTERY],
        }
    series = alternate(
        runners,
        rounds=ctx.size(full=12, quick=2),
        per_round=ctx.size(full=150, quick=20),
        warmup=ctx.size(full=50, quick=5),
        progress=ctx.progress,
    )
    return {"series": series, "targets": TARGETS, "floor": FANOUT}
