"""Profile one django_distlock cycle: ``python -m benchmarks.profile MODE``.

MODE is ``sync``, ``sync-renew``, ``async``, ``async-renew`` (one Redis) or
``redlock`` (five). Starts its own redis-servers, runs a warm-up, times the
cycle without the profiler, then prints the functions that cost most under
cProfile. For finding where a slow row of the benchmark spends its time.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import sys
import tempfile
import time

from .servers import RedisServer

MODES = ["sync", "sync-renew", "async", "async-renew", "redlock"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile")
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("-n", type=int, default=3000, help="cycles (default 3000)")
    parser.add_argument("--sort", default="tottime", help="pstats sort key")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    servers = [RedisServer().start()]
    if args.mode == "redlock":
        servers += [RedisServer().start() for _ in range(5)]
    try:
        os.environ["DISTLOCK_BENCH_REDIS"] = servers[0].url
        os.environ["DISTLOCK_BENCH_REDLOCK"] = ",".join(s.url for s in servers[1:])
        os.environ["DISTLOCK_BENCH_SQLITE"] = os.path.join(
            tempfile.gettempdir(), f"distlock-profile-{os.getpid()}.sqlite3"
        )
        os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
        import django

        django.setup()
        from django_distlock import lock

        renew = args.mode.endswith("-renew")
        using = "quorum" if args.mode == "redlock" else "default"
        profiler = cProfile.Profile()

        if args.mode.startswith("async"):

            async def cycles(n, profile=False):
                if profile:
                    profiler.enable()
                for _ in range(n):
                    async with lock("profile", auto_renew=renew):
                        pass
                profiler.disable()

            async def all_in_one_loop():
                await cycles(300)
                started = time.perf_counter()
                await cycles(args.n)
                elapsed = time.perf_counter() - started
                await cycles(args.n, profile=True)
                return elapsed

            elapsed = asyncio.run(all_in_one_loop())
        else:

            def cycles(n):
                for _ in range(n):
                    with lock("profile", using=using, auto_renew=renew):
                        pass

            cycles(300)
            started = time.perf_counter()
            cycles(args.n)
            elapsed = time.perf_counter() - started
            profiler.enable()
            cycles(args.n)
            profiler.disable()
        print(
            f"{args.mode}: {elapsed / args.n * 1e6:.0f} µs per cycle (mean, "
            f"unprofiled, {args.n} cycles)"
        )
        pstats.Stats(profiler, stream=sys.stdout).sort_stats(args.sort).print_stats(
            args.top
        )
    finally:
        for server in servers:
            server.stop()
        path = os.environ.get("DISTLOCK_BENCH_SQLITE")
        if path and os.path.exists(path):
            os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
