"""asyncio tasks cancelled at random points of acquire, section and release."""

from __future__ import annotations

import threading
import time

import pytest

from ..procs import run_in_processes
from .async_workers import RECOVERY_GRACE, cancel_storm
from .conftest import backends
from .harness import (
    REDIS_OPTIONS,
    RELEASE_SECONDS,
    SCALE,
    pause_servers,
    report,
    wait_until,
)
from .history import check, read_events
from .workers import record_key


@pytest.mark.parametrize("kind", backends("redis", "reentrant", "redlock", "database"))
def test_tasks_cancelled_at_random_points(env, kind, tmp_path):
    """No cancellation leaves a lease that no owner knows about beyond its TTL.

    Two processes run six task lanes each; half the tasks are cancelled after
    0-4 ms. Afterwards every lock key must expire within its TTL (the
    keyspace, or the lock table, empties by itself) and the history must be
    clean; after the storm every lane acquires again (a lane that has not
    by the end of the calm goes on trying for a while: on a loaded host six
    lanes a name can each wait out a timeout more than once). Then each process
    cancels acquisitions of a free name and reports how soon another handle
    can take it.
    """
    _storm("asyncio tasks cancelled at random points", env, kind, tmp_path)


#: An asyncio command's deadline under the torture runs' socket timeouts.
DEADLINE = REDIS_OPTIONS["SOCKET_TIMEOUT"] + REDIS_OPTIONS["SOCKET_CONNECT_TIMEOUT"]


@pytest.mark.parametrize("kind", backends("redis", "redlock"))
def test_tasks_cancelled_while_the_server_is_paused(env, kind, tmp_path):
    """The same storm, with the server (of Redlock's five, one) SIGSTOPped
    for 1.5 s in its middle: longer than the TTL and than an asyncio
    command's deadline (0.8 s here), so the commands of twelve tasks in
    flight run out their deadlines on each process's shared timer, leases
    expire on the stopped server, and every lane must acquire again once it
    goes on."""

    def pause(logs) -> None:
        # Once the lanes run (their logs appear after the processes' barrier).
        wait_until(lambda: any(logs.glob("*.jsonl")), timeout=120, what="the lanes")
        time.sleep(0.5)
        pause_servers(env, 1.5)

    events = _storm(
        "asyncio tasks cancelled, server SIGSTOPped 1.5 s",
        env,
        kind,
        tmp_path,
        during=pause,
    )
    if kind == "redis":
        # The stopped server failed acquisitions at their deadline, not later.
        failed = [
            e["t1"] - e["t0"]
            for e in events
            if e.get("k") == "attempt" and e.get("err") == "LockBackendError"
        ]
        assert failed, "no acquisition ran into the stopped server's deadline"
        assert max(failed) < DEADLINE + 1.0, max(failed)


def _storm(scenario, env, kind, tmp_path, *, during=None) -> list[dict]:
    """Run the storm of two processes (``during(logs)`` in a thread of this
    one meanwhile) and check its history, leases and recovery."""
    logs = tmp_path / "logs"
    files = tmp_path / "files"
    logs.mkdir()
    files.mkdir()
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    names = ["torture:async:a", "torture:async:b"]
    ttl = 1.0
    # Release mode lengthens the storm and the calm to the run's share of time.
    storm = max(2.0 * SCALE, RELEASE_SECONDS / 2)
    calm = max(2.5 * SCALE, RELEASE_SECONDS / 2)
    failed: list[BaseException] = []

    def inject() -> None:
        try:
            during(logs)
        except BaseException as e:  # reported below, in the test's thread
            failed.append(e)

    fault = threading.Thread(target=inject) if during else None
    if fault:
        fault.start()
    results = run_in_processes(
        cancel_storm,
        [
            (names, str(logs), str(files), storm, calm, ttl, 6, seed, str(barrier), 2)
            for seed in (1, 2)
        ],
        timeout=180 + storm + calm + RECOVERY_GRACE,
    )
    if fault:
        fault.join()
        assert not failed, failed
    storm_end = max(r["storm_end"] for r in results)
    records = {
        "file": {
            n: (files / record_key(n)).read_text()
            if (files / record_key(n)).exists()
            else ""
            for n in names
        }
    }
    events = read_events(logs)
    verdict = check(
        scenario,
        kind,
        events,
        records,
        fault_end=storm_end,
        reentrant=env.reentrant,
    )
    verdict.notes.append(
        f"{sum(r['cancelled'] for r in results)} of "
        f"{sum(r['tasks'] for r in results)} tasks cancelled"
    )
    free = sorted(d for r in results for d in r["free_after"])
    if free:
        verdict.notes.append(
            f"name free again after a cancelled acquisition: "
            f"p50 {free[len(free) // 2] * 1000:.1f} ms, "
            f"max {free[-1] * 1000:.1f} ms ({len(free)} cancels)"
        )
    expired = sum(r["probe_expired"] for r in results)
    if expired:
        verdict.notes.append(
            f"{expired} probe lease(s) expired, a TTL after they were asked for, "
            "before their release"
        )
    report(verdict)
    assert verdict.violations == 0, (
        verdict.summary() + "\n" + "\n".join(verdict.notes[:20])
    )
    if env.servers:
        env.assert_no_phantom_leases(ttl)
    else:
        wait_until(
            lambda: env.live_rows() == 0,
            timeout=ttl + 5,
            what="every lock row to expire",
        )
    assert verdict.recovered_workers == verdict.workers == 12, verdict.summary()
    return events
