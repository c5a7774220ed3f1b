"""The soak: one long run per backend with rotating faults (long mode only).

``scripts/torture --long`` (30 minutes by default, ``--minutes N``) gives the
soak most of its time; each backend gets an equal share. The run ends by
checking that nothing leaked: the Redis keyspace holds no lock key any more
(only fencing counters, which are kept on purpose) and the lock table is
back to its starting size after ``locks clear --stale``.
"""

from __future__ import annotations

import io
import os
import random
import signal
import time

import pytest
from django.core.management import CommandError, call_command
from django.db import connections

from .conftest import backends
from .harness import LONG, LONG_MINUTES, Run

KINDS = ("redis", "redlock", "database", "postgres")
#: Seconds of soak per backend (the rest of the long run is the scenarios).
SOAK_SECONDS = float(
    os.environ.get("DISTLOCK_TORTURE_SOAK_SECONDS") or LONG_MINUTES * 60 * 0.6
) / len(KINDS)

pytestmark = pytest.mark.skipif(not LONG, reason="soak: long mode only")


def _faults(kind: str, env, run: Run, rng: random.Random):
    """Return the fault functions that apply to ``kind`` (each takes ~3 s)."""

    def kill_nodes():
        victims = env.servers[:2]
        for s in victims:
            s.kill()
        time.sleep(1.0)
        for s in victims:
            s.start()

    def pause_node():
        env.servers[0].pause()
        time.sleep(3.0)
        env.servers[0].resume()

    def partition():
        cut = env.proxies[:2] if kind == "redlock" else env.proxies
        for p in cut:
            p.partition()
        time.sleep(3.0)
        for p in cut:
            p.heal()

    def drop_replies():
        for p in env.proxies:
            p.drop_replies(0.05)
        time.sleep(3.0)
        for p in env.proxies:
            p.drop_replies(0)

    def client_kill():
        clients = [s.client() for s in env.servers]
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            time.sleep(rng.uniform(0.005, 0.05))
            for c in clients:
                c.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        for c in clients:
            c.close()

    def pause_worker():
        pid = rng.choice(run.pids())
        os.kill(pid, signal.SIGSTOP)
        time.sleep(3.0)
        os.kill(pid, signal.SIGCONT)

    def force_release():
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            try:
                call_command(
                    "locks",
                    "clear",
                    "--prefix",
                    "torture:",
                    "--noinput",
                    stdout=io.StringIO(),
                    stderr=io.StringIO(),
                )
            except CommandError:
                pass  # no quorum yet after the previous fault: reported, fine
            time.sleep(0.1)

    def terminate_backends():
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            with connections["postgres"].cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid()"
                )
            time.sleep(0.25)

    if kind in ("redis", "redlock"):
        return [
            kill_nodes,
            pause_node,
            partition,
            drop_replies,
            client_kill,
            pause_worker,
            force_release,
        ]
    if kind == "postgres":
        return [pause_worker, force_release, terminate_backends]
    return [pause_worker, force_release]


@pytest.mark.timeout(int(SOAK_SECONDS) + 600)
@pytest.mark.parametrize("kind", backends(*KINDS))
def test_soak(env, kind, tmp_path):
    """Rotate every fault that applies, for the backend's share of the soak."""
    from django_distlock.backends.database import FLOOR
    from django_distlock.models import LockRecord

    db = env.record_db
    rows_before = LockRecord.objects.using(db).exclude(digest=FLOOR).count()
    keys_before = env.lease_keys()
    run = Run(
        "soak: rotating faults",
        env,
        tmp_path,
        names=[f"torture:soak:{i}" for i in range(6)],
        extend=False,  # its length is the soak's own (SOAK_SECONDS)
    ).start()
    rng = random.Random(kind)
    faults = _faults(kind, env, run, rng)
    injected = []
    end = time.monotonic() + SOAK_SECONDS
    with run.fault():
        while time.monotonic() < end:
            fault = faults[len(injected) % len(faults)]
            fault()
            injected.append(fault.__name__)
            time.sleep(3.0)

    def nothing_leaked() -> str:
        # The keyspace and the lock table are back where they were.
        if env.servers:
            env.assert_no_phantom_leases(1.0)
            assert env.lease_keys() == keys_before
        else:
            time.sleep(1.5)  # the last leases' TTL
            call_command("locks", "clear", "--stale", "--noinput", stdout=io.StringIO())
            rows = LockRecord.objects.using(db).exclude(digest=FLOOR).count()
            assert rows == rows_before, f"{rows} lock rows, {rows_before} at the start"
        return (
            f"{len(injected)} faults injected over {SOAK_SECONDS:.0f} s; leak "
            "check: keyspace and lock table back to their starting size"
        )

    run.finish(recovery=3.0, after=nothing_leaked)
