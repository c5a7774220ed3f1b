"""OPTIONS["WAIT_REPLICAS"]: a grant counts once that many replicas have it.

On the Sentinel set-up (a primary, a replica, three sentinels) and the Redis
Cluster (three primaries, a replica each) that the suite starts: a grant
survives a failover right after the acquisition, and a grant that no
replica confirmed (the replica is paused, its link cut) counts as not
acquired and is given back at once.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from django.core.checks import Error
from django.test import override_settings

from django_distlock import lock, locks
from django_distlock.backends.redis import RedisLockBackend
from django_distlock.backends.redis.keys import LockKeys

from .cluster_servers import RedisCluster, SentinelSetup, _redis_client, wait_until

PLAIN = "django_distlock.backends.redis.RedisLockBackend"
REENTRANT = "django_distlock.backends.redis.ReentrantRedisLockBackend"
# A synced replica confirms within milliseconds, but on a loaded two-core CI
# machine 0.2 s was seen to pass without its acknowledgement (the grant given
# back, as it should be, and the test failed). 0.6 s is three times that and
# within what E029 allows beside the default 2 s SOCKET_TIMEOUT (under
# 0.8 s); only the tests whose replica is cut off wait for all of it.
WAIT = {"WAIT_REPLICAS": 1, "WAIT_REPLICAS_TIMEOUT": 0.6}


def cut_off(primary_port: int, replica) -> None:
    """Pause ``replica`` and cut its replication link at the primary, so a
    write cannot reach it (not even later, from a socket buffer)."""
    replica.pause()
    _redis_client(primary_port).execute_command("CLIENT", "KILL", "TYPE", "replica")


# -- checks ------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"WAIT_REPLICAS": -1},
        {"WAIT_REPLICAS": "1"},
        {"WAIT_REPLICAS": True},
        {"WAIT_REPLICAS": 1, "WAIT_REPLICAS_TIMEOUT": 0},
        {"WAIT_REPLICAS": 1, "WAIT_REPLICAS_TIMEOUT": "0.1"},
        {"WAIT_REPLICAS": 1, "WAIT_REPLICAS_TIMEOUT": 1.0, "SOCKET_TIMEOUT": 2},
    ],
)
def test_bad_wait_replicas_is_e029(options):
    params = {"LOCATION": "redis://127.0.0.1:6379/0", "OPTIONS": options}
    messages = RedisLockBackend.check("default", params)
    assert [m.id for m in messages] == ["distlock.E029"]
    assert all(isinstance(m, Error) and m.hint for m in messages)


def test_good_wait_replicas_passes_checks():
    for options in (
        {"WAIT_REPLICAS": 0},
        {"WAIT_REPLICAS": 2, "WAIT_REPLICAS_TIMEOUT": 0.5},
        {"WAIT_REPLICAS": 1, "CACHE": "x"},  # not a connection option
    ):
        params = {"LOCATION": "redis://127.0.0.1:6379/0", "OPTIONS": options}
        ids = [m.id for m in RedisLockBackend.check("default", params)]
        assert "distlock.E029" not in ids and "distlock.E025" not in ids


# -- Sentinel ----------------------------------------------------------------


def sentinel_setting(setup: SentinelSetup, backend: str = PLAIN) -> dict:
    options = {"SENTINELS": setup.sentinels, "SERVICE_NAME": setup.SERVICE, **WAIT}
    return {"default": {"BACKEND": backend, "OPTIONS": options}}


def _primary_and_replica(setup: SentinelSetup):
    port = setup.current_primary_port()
    if setup.primary.port == port:
        return setup.primary, setup.replica
    return setup.replica, setup.primary


@pytest.mark.parametrize("backend", [PLAIN, REENTRANT])
def test_sentinel_grant_reaches_the_replica_before_acquire_returns(
    sentinel_setup, backend
):
    primary, replica = _primary_and_replica(sentinel_setup)
    name = f"wait:{uuid.uuid4().hex}"
    with override_settings(LOCKS=sentinel_setting(sentinel_setup, backend)):
        try:
            held = lock(name, ttl=30, auto_renew=False)
            assert held.acquire(timeout=0)
            # No sleep: WAIT answered only once the replica had it.
            assert _redis_client(replica.port).exists(LockKeys("distlock", name).lease)
            held.release()
        finally:
            locks.reset()


@pytest.mark.parametrize("backend", [PLAIN, REENTRANT])
def test_sentinel_grant_no_replica_confirmed_is_not_acquired(sentinel_setup, backend):
    primary, replica = _primary_and_replica(sentinel_setup)
    name = f"unconfirmed:{uuid.uuid4().hex}"
    with override_settings(LOCKS=sentinel_setting(sentinel_setup, backend)):
        try:
            cut_off(primary.port, replica)
            try:
                assert not lock(name, ttl=30, auto_renew=False).acquire(timeout=0)
                # Given back: nothing left on the primary.
                lease = LockKeys("distlock", name).lease
                assert not _redis_client(primary.port).exists(lease)
            finally:
                replica.resume()
            wait_until(
                lambda: (
                    _redis_client(replica.port)
                    .info("replication")
                    .get("master_link_status")
                    == "up"
                ),
                60,
                "the replica to sync again",
            )
            held = lock(name, ttl=30, auto_renew=False)
            assert held.acquire(timeout=5)
            held.release()
        finally:
            locks.reset()


def test_sentinel_async_grant_waits_for_the_replica(sentinel_setup):
    """aacquire() pipelines WAIT on the event loop's own client."""
    primary, replica = _primary_and_replica(sentinel_setup)
    name = f"async:{uuid.uuid4().hex}"
    lease = LockKeys("distlock", name).lease

    async def confirmed() -> None:
        held = lock(name, ttl=30, auto_renew=False)
        assert await held.aacquire(timeout=0)
        assert _redis_client(replica.port).exists(lease)
        await held.arelease()

    async def unconfirmed() -> bool:
        return await lock(name, ttl=30, auto_renew=False).aacquire(timeout=0)

    with override_settings(LOCKS=sentinel_setting(sentinel_setup)):
        try:
            asyncio.run(confirmed())
            cut_off(primary.port, replica)
            try:
                assert not asyncio.run(unconfirmed())
                assert not _redis_client(primary.port).exists(lease)
            finally:
                replica.resume()
            wait_until(
                lambda: (
                    _redis_client(replica.port)
                    .info("replication")
                    .get("master_link_status")
                    == "up"
                ),
                60,
                "the replica to sync again",
            )
        finally:
            locks.reset()


def test_sentinel_grant_survives_a_failover_right_after_it(sentinel_setup):
    """Runs last on this set-up: its primary is killed."""
    primary, replica = _primary_and_replica(sentinel_setup)
    name = f"failover:{uuid.uuid4().hex}"
    with override_settings(LOCKS=sentinel_setting(sentinel_setup)):
        try:
            held = lock(name, ttl=120, auto_renew=False)
            assert held.acquire(timeout=0)
            primary.kill()  # at once: nothing else was written meanwhile
            wait_until(
                lambda: sentinel_setup.current_primary_port() == replica.port,
                90,
                "the sentinels to promote the replica",
            )
            locks.reset()
            # The promoted replica has the grant: nobody else gets the lock.
            other = lock(name, ttl=30, auto_renew=False)
            deadline = time.monotonic() + 30
            while True:
                try:
                    assert not other.acquire(timeout=0)
                    break
                except Exception:  # the client finds the new primary
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            assert (
                locks["default"].client.hget(LockKeys("distlock", name).lease, "t")
                == held.lease.token.encode()
            )
        finally:
            locks.reset()


# -- Cluster -----------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_cluster():
    cluster = RedisCluster().start()
    yield cluster
    cluster.stop()


def replica_reader(port: int):
    """A client of a cluster replica that may read there (READONLY)."""
    import redis

    client = redis.Redis(
        host="127.0.0.1", port=port, socket_timeout=5, single_connection_client=True
    )
    client.execute_command("READONLY")
    return client


def cluster_setting(cluster: RedisCluster) -> dict:
    return {"default": {"BACKEND": PLAIN, "LOCATION": cluster.url, "OPTIONS": WAIT}}


def test_cluster_grant_no_replica_confirmed_is_not_acquired(redis_cluster):
    name = f"unconfirmed:{uuid.uuid4().hex}"
    lease = LockKeys("distlock", name).lease
    primary = redis_cluster.primary_of(lease)
    replica = redis_cluster.replica_of(primary)
    wait_until(lambda: redis_cluster.is_synced_replica(replica), 60, "the replica")
    with override_settings(LOCKS=cluster_setting(redis_cluster)):
        try:
            cut_off(primary.port, replica)
            try:
                assert not lock(name, ttl=30, auto_renew=False).acquire(timeout=0)
                assert not _redis_client(primary.port).exists(lease)
            finally:
                replica.resume()
            wait_until(
                lambda: redis_cluster.is_synced_replica(replica),
                60,
                "the replica to sync again",
            )
            held = lock(name, ttl=30, auto_renew=False)
            assert held.acquire(timeout=5)
            held.release()
        finally:
            locks.reset()


def test_cluster_async_grant_waits_for_the_replica(redis_cluster):
    name = f"async:{uuid.uuid4().hex}"
    lease = LockKeys("distlock", name).lease
    replica = redis_cluster.replica_of(redis_cluster.primary_of(lease))
    wait_until(lambda: redis_cluster.is_synced_replica(replica), 60, "the replica")

    async def confirmed() -> None:
        held = lock(name, ttl=30, auto_renew=False)
        assert await held.aacquire(timeout=0)
        assert replica_reader(replica.port).exists(lease)
        await held.arelease()

    with override_settings(LOCKS=cluster_setting(redis_cluster)):
        try:
            asyncio.run(confirmed())
        finally:
            locks.reset()


def test_cluster_grant_survives_a_failover_right_after_it(redis_cluster):
    """Runs last on this cluster: the killed primary rejoins as a replica."""
    name = f"failover:{uuid.uuid4().hex}"
    lease = LockKeys("distlock", name).lease
    primary = redis_cluster.primary_of(lease)
    replica = redis_cluster.replica_of(primary)
    wait_until(lambda: redis_cluster.is_synced_replica(replica), 60, "the replica")
    killed = False
    with override_settings(LOCKS=cluster_setting(redis_cluster)):
        try:
            held = lock(name, ttl=120, auto_renew=False)
            assert held.acquire(timeout=0)
            assert replica_reader(replica.port).exists(lease)  # confirmed: it has it
            primary.kill()
            killed = True
            wait_until(lambda: redis_cluster.is_primary(replica), 90, "the promotion")
            wait_until(redis_cluster.healthy, 90, "the cluster to heal")
            locks.reset()  # a fresh client learns the new slot map at once
            assert not lock(name, ttl=30, auto_renew=False).acquire(timeout=0)
            assert _redis_client(replica.port).hget(lease, "t") == (
                held.lease.token.encode()
            )
        finally:
            locks.reset()
            if killed:
                primary.start()  # its nodes.conf survives: it rejoins
                wait_until(
                    lambda: (
                        redis_cluster.is_synced_replica(primary)
                        and redis_cluster.healthy()
                    ),
                    90,
                    "the restarted node to rejoin as a replica",
                )
