"""Faults of the servers themselves: Redis killed, restarted empty, paused;
a PostgreSQL server of the test's own killed and restarted on its data,
paused."""

from __future__ import annotations

import time

import pytest

from .conftest import backends
from .harness import FAULTS, Run, kill_servers, pause_servers


@pytest.mark.parametrize("kind", backends("redis", "redlock", long=("reentrant",)))
def test_node_killed_and_restarted_empty(env, kind, tmp_path):
    """SIGKILL a node under load and start it again empty (no persistence).

    A single Redis forgets its leases: holders must find out (LockLost or an
    error at release) and their late writes must be fenced off. Redlock loses
    two of five nodes, a minority: nothing may change for its holders.
    """
    run = Run("node SIGKILLed, restarted empty", env, tmp_path).start()
    run.load(1.0)
    with run.fault():
        kill_servers(env)
    run.finish()


@pytest.mark.parametrize("kind", backends("redis", "redlock", long=("reentrant",)))
def test_node_paused_longer_than_ttl(env, kind, tmp_path):
    """SIGSTOP a node for three TTLs, then SIGCONT it.

    Leases run out while the node is stopped; its clients time out (the
    socket timeout), and after the resume every lease taken before the pause
    is gone on that node. Redlock has one paused node of five.
    """
    run = Run("node SIGSTOPped 3 x TTL", env, tmp_path, ttl=1.0).start()
    run.load(1.0)
    with run.fault():
        pause_servers(env)
    run.finish()


@pytest.mark.parametrize("fault", ["killed", "paused"])
@pytest.mark.parametrize("kind", backends("pgserver", "mariadbserver"))
def test_database_server_killed_or_paused(env, kind, fault, tmp_path):
    """Every process of the PostgreSQL or MariaDB server SIGKILLed and the
    server started again on its data, or SIGSTOPped for three TTLs, under
    load.

    Killed: committed leases survive (the server recovers them from its
    WAL); a release in flight may be lost, which keeps that lock until its
    lease expires. Paused: the calls on it wait until it resumes (it has
    their statements), and the leases it holds run out meanwhile by its
    clock. Either way the holders whose leases went must find out, and every
    fencing token after the fault is above every one before it.
    """
    label, inject = FAULTS[fault]
    run = Run(f"database server {label}", env, tmp_path, ttl=1.0).start()
    run.load(1.0)
    with run.fault():
        inject(env)
    run.finish()


@pytest.mark.parametrize("kind", backends("redlock"))
def test_redlock_one_two_then_three_of_five_down(env, kind, tmp_path):
    """Kill Redlock nodes one at a time: 1 and 2 of 5 down keep the lock
    working; 3 of 5 down is no quorum (LockBackendError, never a lease);
    restarting them (empty) brings the locks back without restarting clients.
    """
    run = Run("redlock 1, 2, then 3 of 5 nodes down", env, tmp_path).start()
    run.load(0.5)
    with run.fault():
        env.servers[0].kill()
        run.wait_for_sections(10)
        env.servers[1].kill()
        run.wait_for_sections(10)
        env.servers[2].kill()
        no_quorum = time.monotonic()
        time.sleep(3.0)  # an acquisition retries for NO_QUORUM_GRACE (1 s)
        no_quorum_end = time.monotonic()
        for server in env.servers[:3]:
            server.start()
    # Attempts wholly inside the no-quorum window: none acquired, errors seen.
    inside = [
        a
        for a in run.events("attempt")
        if a["t0"] > no_quorum + 0.3 and a["t1"] < no_quorum_end
    ]
    run.finish(recovery=2.5)
    assert inside, "no attempt ran while 3 of 5 nodes were down"
    assert not [a for a in inside if a["ok"]], "acquired without a quorum"
    assert "LockBackendError" in {a["err"] for a in inside}
    env.assert_no_phantom_leases(1.0)


@pytest.mark.parametrize("kind", backends("cluster"))
def test_cluster_primary_killed_replica_promoted(env, kind, tmp_path):
    """SIGKILL the Redis Cluster primary of the workers' lock; its replica
    takes over.

    Replication is asynchronous: a grant the replica had not yet received is
    lost with the primary, and a second holder may then get the lock. Its
    holder must find out (LockLost, or an error at release), and fencing
    must refuse its late writes: tokens are the promoted replica's clock.
    """
    from django_distlock.backends.redis import LockKeys

    from .harness import wait_until

    run = Run("cluster primary SIGKILLed", env, tmp_path, names=["torture:a"])
    run.start()
    run.load(1.0)
    cluster = env.cluster
    primary = cluster.primary_of(LockKeys("distlock", "torture:a").lease)
    replica = cluster.replica_of(primary)
    with run.fault():
        primary.kill()
        wait_until(
            lambda: cluster.is_primary(replica) and cluster.healthy(),
            90,
            "the replica to be promoted",
        )
    run.finish()


@pytest.mark.parametrize("kind", backends("sentinel"))
def test_sentinel_primary_killed_replica_promoted(env, kind, tmp_path):
    """SIGKILL the primary behind Redis Sentinel; the sentinels promote the
    replica and the clients follow it without being restarted.

    As with a cluster, a grant not yet replicated is lost with the primary:
    its holder must find out, and fencing must refuse its late writes.
    """
    from .harness import wait_until

    setup = env.cluster
    run = Run("sentinel primary SIGKILLed", env, tmp_path, names=["torture:a"])
    run.start()
    run.load(1.0)
    old_port = setup.current_primary_port()
    with run.fault():
        setup.primary.kill()
        wait_until(
            lambda: setup.current_primary_port() != old_port,
            120,
            "the sentinels to promote the replica",
        )
    run.finish()
