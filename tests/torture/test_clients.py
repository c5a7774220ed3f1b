"""Faults of the clients: paused workers, killed connections, forks."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest
import redis

from ..procs import run_in_processes
from .conftest import backends
from .harness import Run, report, wait_until
from .history import Verdict


def _state(pid: int) -> str:
    """Return the process state letter of ``pid`` (``T`` when stopped)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text.rsplit(")", 1)[1].split()[0]


@pytest.mark.parametrize(
    "kind",
    backends("redis", "redlock", "database", "postgres", long=("reentrant", "mysql")),
)
def test_worker_paused_longer_than_ttl(env, kind, tmp_path):
    """A worker stops itself (SIGSTOP) mid-section for 3 x TTL and resumes.

    Its lease runs out, another worker takes the lock and writes; the late
    write of the paused worker must be refused by the fenced record, and its
    release must report the loss.
    """
    run = Run(
        "worker SIGSTOPped 3 x TTL mid-section",
        env,
        tmp_path,
        names=["torture:one"],
        per_worker={0: {"stop_self_in_cs": 3}},
    ).start()
    victim = run.pids()[0]
    with run.fault():
        wait_until(lambda: _state(victim) == "T", timeout=60, what="the pause")
        time.sleep(3.0)
        os.kill(victim, signal.SIGCONT)
    verdict = run.finish()
    paused = [s for s in run.events("cs") if s["id"] == "w0.3"]
    assert paused and paused[0]["rel"] != "ok", paused
    assert paused[0]["write"]["fenced"] in ("stale", "lost"), paused
    assert verdict.fenced_off >= 1


@pytest.mark.parametrize("kind", backends("redis", "reentrant", "redlock"))
def test_client_kill_mid_acquire_and_release(env, kind, tmp_path):
    """``CLIENT KILL`` every client connection at random moments under load.

    Waiters blocked in an acquisition and holders mid-release lose their
    connection; they must see an error or a loss, never a lease they do not
    have, and the locks must keep working afterwards.
    """
    run = Run("CLIENT KILL mid-acquire/mid-release", env, tmp_path, hold=0.01).start()
    run.load(0.5)
    rng = random.Random(7)
    clients = [s.client() for s in env.servers]
    kills = own_dropped = 0
    with run.fault():
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.005, 0.05))
            for client in clients:
                try:
                    kills += client.execute_command(
                        "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"
                    )
                except redis.ConnectionError:
                    # This connection is a normal client too: when it has
                    # to be opened again, a kill may catch its handshake.
                    own_dropped += 1
    for client in clients:
        client.close()
    verdict = run.finish()
    verdict.notes.append(f"{kills} connections killed ({own_dropped} of our own)")
    assert kills > 0
    env.assert_no_phantom_leases(1.0)


def fork_worker(name: str) -> dict:
    """Hold ``name`` and fork; while another thread acquires, fork again.

    Return what the children and the parent saw.
    """
    import threading

    from django_distlock import lock
    from django_distlock.exceptions import LockNotHeld

    def in_child(held) -> str:
        outcome = []
        for call in (held.release, held.extend):
            try:
                call()
                outcome.append("succeeded")
            except LockNotHeld:
                outcome.append("LockNotHeld")
            except Exception as e:
                outcome.append(type(e).__name__)
        other = lock(name, timeout=0)
        outcome.append("busy" if not other.acquire() else "acquired!")
        fresh = lock(name + ":child", timeout=1)
        if fresh.acquire():
            fresh.release()
            outcome.append("fresh ok")
        else:
            outcome.append("fresh busy")
        return ",".join(outcome)

    def fork_and_report(held) -> str:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.write(write, in_child(held).encode())
            finally:
                os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        with os.fdopen(read) as f:
            return f.read()

    results = {}
    held = lock(name, ttl=1.0, timeout=5)
    assert held.acquire()
    results["holding"] = fork_and_report(held)
    time.sleep(2.2)  # over two TTLs: only the parent's renewals keep it
    results["parent still holds"] = held.locked()

    # Fork while a thread of the parent waits for the lock we hold.
    def wait_then_hold():
        # The owner of a reentrant lease is the thread: it releases it too.
        waiter = lock(name, ttl=1.0, timeout=10)
        results["waiter acquired after release"] = waiter.acquire()
        time.sleep(1.2)
        results["waiter still holds"] = waiter.locked()
        waiter.release()

    thread = threading.Thread(target=wait_then_hold)
    thread.start()
    time.sleep(0.2)
    results["acquiring"] = fork_and_report(held)
    held.release()
    thread.join(30)
    return results


@pytest.mark.parametrize(
    "kind", backends("redis", "reentrant", "database", long=("redlock",))
)
def test_fork_while_holding_and_while_acquiring(env, kind, tmp_path):
    """A forked child can neither release nor renew its parent's lease."""
    (results,) = run_in_processes(fork_worker, [("torture:fork",)], timeout=120)
    child = "LockNotHeld,LockNotHeld,busy,fresh ok"
    assert results == {
        "holding": child,
        "parent still holds": True,
        "acquiring": child,
        "waiter acquired after release": True,
        "waiter still holds": True,
    }
    report(
        Verdict(
            "fork while holding / acquiring",
            kind,
            critical_sections=2,
            confirmed=2,
            attempts=4,
            acquired=4,
            workers=1,
            recovered_workers=1,
        )
    )
