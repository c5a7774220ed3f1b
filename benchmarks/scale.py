"""100,000 held locks: Redis memory per lock, ``locks list`` and admin page time."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from .common import token
from .core import pct

BARE_BYTES_TARGET_FACTOR = 3
LIST_TARGET_S = 2.0
ADMIN_TARGET_MS = 300.0


def _used_memory(client) -> int:
    # Let lazy frees and the allocator settle before reading.
    time.sleep(0.2)
    return int(client.info("memory")["used_memory"])


def _names(count: int) -> list[str]:
    return [f"bench:scale:{i:07d}" for i in range(count)]


def run(ctx) -> dict:
    import redis

    from django_distlock import lock

    count = ctx.size(full=100_000, quick=2_000)
    client = redis.Redis.from_url(ctx.redis_url)
    client.flushall()
    out: dict = {"count": count}

    # A bare held lock: SET key token NX PX (26-byte key, 32-byte token).
    base = _used_memory(client)
    pipe = client.pipeline(transaction=False)
    for i in range(count):
        pipe.set(f"distlock:bare:{i:014d}", token(), nx=True, px=3_600_000)
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()
    out["bare_bytes"] = (_used_memory(client) - base) / count
    client.flushall()

    # The same number of django_distlock leases, through the public API.
    base = _used_memory(client)
    started = time.monotonic()

    def take(chunk):
        for name in chunk:
            if not lock(name, ttl=3600, timeout=0, auto_renew=False).acquire():
                raise RuntimeError(f"{name} was not free")

    names = _names(count)
    chunks = [names[i::8] for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(take, chunks))
    out["acquire_s"] = time.monotonic() - started
    out["distlock_bytes"] = (_used_memory(client) - base) / count
    out["ratio"] = out["distlock_bytes"] / out["bare_bytes"]
    ctx.progress(f"{count} leases held")

    # What listing costs the backend alone (no formatting, no process start).
    from django_distlock import locks

    started = time.monotonic()
    listed = sum(1 for _ in locks["default"].holders())
    out["holders_s"] = time.monotonic() - started
    if listed != count:
        raise RuntimeError(f"holders() listed {listed} locks, not {count}")
    if ctx.has_locks_command:
        out.update(_locks_list(ctx, count))
        ctx.progress("locks list timed")
    if ctx.has_admin:
        out.update(_admin_page(ctx))
        ctx.progress("admin page timed")
    client.flushall()
    return out


#: Runs of each whole-process timing; the median is reported (one run of a
#: two-second process on a shared VM is as noisy as a single cycle would be).
LIST_RUNS = 3


def _timed_runs(argv: list[str], env: dict, cwd, runs: int) -> tuple[float, bytes]:
    """Run ``argv`` ``runs`` times; return the median wall time and an output."""
    times = []
    for _ in range(runs):
        started = time.monotonic()
        proc = subprocess.run(argv, env=env, capture_output=True, timeout=300, cwd=cwd)
        times.append(time.monotonic() - started)
        if proc.returncode != 0:
            raise RuntimeError(f"{argv[3:]} failed: {proc.stderr.decode()[-2000:]}")
    return statistics.median(times), proc.stdout


def _locks_list(ctx, count: int) -> dict:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "benchmarks.settings"}
    argv = [sys.executable, "-m", "django", "locks", "list", "--using", "default"]
    runs = ctx.size(full=LIST_RUNS, quick=1)
    wall, out = _timed_runs([*argv, "--format", "json"], env, ctx.root, runs)
    listed = len(json.loads(out))
    if listed != count:
        raise RuntimeError(f"locks list showed {listed} locks, not {count}")
    wall_table, _ = _timed_runs([*argv, "--format", "table"], env, ctx.root, runs)
    # The same process start with nothing to do: Django's own share.
    startup, _ = _timed_runs(
        [sys.executable, "-c", "import django; django.setup()"], env, ctx.root, runs
    )
    return {
        "list_json_s": wall,
        "list_table_s": wall_table,
        "django_startup_s": startup,
        "list_runs": runs,
    }


def _admin_page(ctx) -> dict:
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.urls import reverse

    user_model = get_user_model()
    user, _ = user_model.objects.get_or_create(
        username="bench-admin",
        defaults={"is_staff": True, "is_superuser": True},
    )
    client = Client()
    client.force_login(user)
    url = reverse("admin:django_distlock_lock_changelist")
    times = []
    for _ in range(ctx.size(full=7, quick=2)):
        started = time.monotonic()
        response = client.get(url)
        times.append((time.monotonic() - started) * 1000)
        if response.status_code != 200:
            raise RuntimeError(f"admin changelist answered {response.status_code}")
    searched = time.monotonic()
    response = client.get(url, {"q": "bench:scale:0001"})
    search_ms = (time.monotonic() - searched) * 1000
    return {
        "admin_first_ms": times[0],
        "admin_p50_ms": pct(times[1:] or times, 50),
        "admin_max_ms": max(times),
        "admin_search_ms": search_ms,
    }
