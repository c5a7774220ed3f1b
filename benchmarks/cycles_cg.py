"""Count the CPU instructions of one cycle: ``python -m benchmarks.cycles_cg``.

Wall-clock time on a shared machine drifts by tens of percent; the number of
instructions the Python process executes per cycle does not. For each mode
this runs the cycle under ``valgrind --tool=callgrind`` twice, with N cycles
and with none (both after the same warm-up), and reports the difference
divided by N: the instructions of one cycle, start-up and warm-up removed.
The redis-server runs outside valgrind and is not counted, unless
``--server``: then each single-server mode also runs against a redis-server
under callgrind (the client outside it), N cycles and none, and the server's
instructions per cycle are reported beside the client's, with the ratios of
their sums. A lock whose scripts do more than the floor's commands pays for
it on the server, which the client's count does not show.

Modes: ``floor`` (SET NX PX + EVALSHA through redis-py), ``redispy`` (redis-py's
``Lock``), ``sync`` and ``sync-renew`` (``with lock(name, auto_renew=...)``),
``afloor`` (the floor on ``redis.asyncio``), ``async`` and ``async-renew``;
``shared`` and ``permit`` (``lock(name, shared=True)`` and ``semaphore(name,
3)``, auto_renew off: issue 22's shared lock and semaphore on Redis);
``fanout`` (the raw pipelined fan-out to five nodes through redis-py's
``Connection``) and ``redlock`` (``with lock(name, using="quorum")``), which
start five more redis-servers. The ratios printed are the ones issue 18 sets
targets for.

Needs ``valgrind`` and ``redis-server`` on PATH. A mode takes about half a
minute per thousand cycles.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile

MODES = [
    "floor",
    "redispy",
    "sync",
    "sync-renew",
    "afloor",
    "async",
    "async-renew",
    "shared",
    "permit",
    "fanout",
    "redlock",
]
REDLOCK_MODES = {"fanout", "redlock"}
#: (mode, reference, target): the ratios reported after the counts.
RATIOS = [
    ("sync", "floor", 1.15),
    ("sync-renew", "floor", 1.20),
    ("sync", "redispy", 1.0),
    ("async", "afloor", 1.10),
    ("async", "sync", 1.30),
    ("redlock", "fanout", 1.25),
    ("shared", "sync", 1.20),
    ("permit", "sync", 1.30),
]
WARMUP = 200


def _inner(mode: str, n: int) -> None:
    """Run the warm-up and ``n`` cycles of ``mode`` (under valgrind)."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    import django

    django.setup()
    import redis
    import redis.asyncio as aredis

    from django_distlock import lock, semaphore

    from .common import CAD_SCRIPT, TTL_MS, floor_cycle, token

    url = os.environ["DISTLOCK_BENCH_REDIS"]
    if mode == "floor":
        cycle = floor_cycle(redis.Redis.from_url(url), "cg:floor")
    elif mode == "redispy":
        client = redis.Redis.from_url(url)

        def cycle():
            with client.lock("cg:redispy", timeout=TTL_MS / 1000):
                pass

    elif mode == "fanout":
        from .redlock import fanout_cycle

        cycle = fanout_cycle(os.environ["DISTLOCK_BENCH_REDLOCK"].split(","), "cg:f")
    elif mode == "redlock":

        def cycle():
            with lock("cg:redlock", using="quorum", auto_renew=False):
                pass

    elif mode == "shared":

        def cycle():
            with lock("cg:shared", shared=True, auto_renew=False):
                pass

    elif mode == "permit":

        def cycle():
            with semaphore("cg:permit", 3, auto_renew=False):
                pass

    elif mode in ("sync", "sync-renew"):
        renew = mode == "sync-renew"

        def cycle():
            with lock("cg:sync", auto_renew=renew):
                pass

    else:
        if mode == "afloor":

            async def setup():
                client = aredis.Redis.from_url(url)
                sha = await client.script_load(CAD_SCRIPT)

                async def acycle():
                    tok = token()
                    if not await client.set("cg:afloor", tok, nx=True, px=TTL_MS):
                        raise RuntimeError("async floor: key unexpectedly held")
                    await client.evalsha(sha, 1, "cg:afloor", tok)

                return acycle

        else:
            renew = mode == "async-renew"

            async def setup():
                async def acycle():
                    async with lock("cg:async", auto_renew=renew):
                        pass

                return acycle

        async def main():
            acycle = await setup()
            for _ in range(WARMUP):
                await acycle()
            for _ in range(n):
                await acycle()

        asyncio.run(main())
        return
    for _ in range(WARMUP + n):
        cycle()


def _callgrind(out: str) -> list[str]:
    return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]


def _total(out: str) -> int:
    """Return the instruction total of the callgrind report ``out``."""
    with open(out) as f:
        text = f.read()
    match = re.search(r"^(?:summary|totals): (\d+)", text, re.MULTILINE)
    if match is None:
        raise RuntimeError("no instruction total in the callgrind output")
    return int(match.group(1))


def _run_inner(mode: str, n: int, env: dict, wrapper: list[str]) -> None:
    subprocess.run(
        [
            *wrapper,
            sys.executable,
            "-m",
            "benchmarks.cycles_cg",
            "--inner",
            mode,
            "-n",
            str(n),
        ],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _instructions(mode: str, n: int, env: dict) -> int:
    """Return the instructions callgrind counts for ``_inner(mode, n)``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        _run_inner(mode, n, env, _callgrind(out))
        return _total(out)


def _server_instructions(mode: str, n: int, env: dict) -> int:
    """Return the instructions of a redis-server under callgrind, from its
    start to its stop, that served ``_inner(mode, n)``."""
    from .servers import RedisServer

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        server = RedisServer(wrapper=_callgrind(out)).start()
        try:
            _run_inner(mode, n, {**env, "DISTLOCK_BENCH_REDIS": server.url}, [])
        finally:
            server.stop()
        return _total(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cycles_cg")
    parser.add_argument("modes", nargs="*", help=f"some of {', '.join(MODES)}")
    parser.add_argument("-n", type=int, default=1000, help="cycles (default 1000)")
    parser.add_argument(
        "--server",
        action="store_true",
        help="also count the redis-server's instructions (single-server modes)",
    )
    parser.add_argument("--inner", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inner:
        _inner(args.inner, args.n)
        return 0
    unknown = set(args.modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes: {', '.join(sorted(unknown))}")
    modes = args.modes or MODES
    from .servers import RedisServer

    server = RedisServer().start()
    nodes = [
        RedisServer().start() for _ in range(5 if REDLOCK_MODES & set(modes) else 0)
    ]
    try:
        env = {
            **os.environ,
            "DISTLOCK_BENCH_REDIS": server.url,
            "DISTLOCK_BENCH_REDLOCK": ",".join(node.url for node in nodes),
            "DISTLOCK_BENCH_SQLITE": os.path.join(
                tempfile.gettempdir(), f"distlock-cg-{os.getpid()}.sqlite3"
            ),
            "PYTHONHASHSEED": "0",
        }
        per_cycle, on_server = {}, {}
        for mode in modes:
            base = _instructions(mode, 0, env)
            total = _instructions(mode, args.n, env)
            per_cycle[mode] = (total - base) / args.n
            line = f"{mode:12} {per_cycle[mode]:>10,.0f} instructions per cycle"
            if args.server and mode not in REDLOCK_MODES:
                base = _server_instructions(mode, 0, env)
                total = _server_instructions(mode, args.n, env)
                on_server[mode] = (total - base) / args.n
                both = per_cycle[mode] + on_server[mode]
                line += f", {on_server[mode]:>8,.0f} on the server"
                line += f", {both:>10,.0f} in all"
            print(line)
        for mode, ref, target in RATIOS:
            if mode in per_cycle and ref in per_cycle:
                ratio = per_cycle[mode] / per_cycle[ref]
                line = f"{mode} / {ref}: {ratio:.3f} (target {target:.2f})"
                if mode in on_server and ref in on_server:
                    both = (per_cycle[mode] + on_server[mode]) / (
                        per_cycle[ref] + on_server[ref]
                    )
                    line += f"; with the server's: {both:.3f}"
                print(line)
    finally:
        for node in nodes:
            node.stop()
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
