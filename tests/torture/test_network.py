"""Network faults through the TCP proxy in front of every Redis node."""

from __future__ import annotations

import pytest

from .conftest import backends
from .harness import Run


@pytest.mark.parametrize("kind", backends("redlock", long=("redis", "reentrant")))
def test_latency(env, kind, tmp_path):
    """Add 30 ms each way to every node: slower, never unsafe."""
    run = Run("proxy delays traffic 30 ms", env, tmp_path).start()
    run.load(0.5)
    with run.fault():
        for proxy in env.proxies:
            proxy.delay(0.03)
        run.load(1.5)
        for proxy in env.proxies:
            proxy.delay(0)
    run.finish()
    env.assert_no_phantom_leases(1.0)


@pytest.mark.parametrize("kind", backends("redis", "redlock", long=("reentrant",)))
def test_partition(env, kind, tmp_path):
    """Black-hole the link for 2.5 x TTL, then heal it.

    A single node cut off is an outage (errors, no lease); for Redlock two of
    five nodes are cut off, a minority, and the lock keeps working.
    """
    run = Run("proxy partition 2.5 x TTL", env, tmp_path).start()
    run.load(0.5)
    cut = env.proxies[:2] if kind == "redlock" else env.proxies
    with run.fault():
        for proxy in cut:
            proxy.partition()
        run.load(2.5)
        for proxy in cut:
            proxy.heal()
    run.finish()
    env.assert_no_phantom_leases(1.0)


@pytest.mark.parametrize("kind", backends("redis", "reentrant", "redlock"))
def test_lost_replies(env, kind, tmp_path):
    """Drop 5% of replies after the server ran the command.

    An acquisition whose reply was lost must not count as held (the worker
    sees an error, and the lease it may have left expires within its TTL);
    a release or extend whose reply was lost is reported as an error, never
    as a success. redis-py must not resend (our clients never retry).
    """
    run = Run("proxy drops 5% of replies", env, tmp_path, hold=0.01).start()
    run.load(0.5)
    with run.fault():
        for proxy in env.proxies:
            proxy.drop_replies(0.05)
        run.load(2.5)
        for proxy in env.proxies:
            proxy.drop_replies(0)
    dropped = sum(p.dropped_replies for p in env.proxies)
    verdict = run.finish()
    verdict.notes.append(f"{dropped} replies dropped")
    assert dropped > 0
    env.assert_no_phantom_leases(1.0)
