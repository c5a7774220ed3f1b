"""The Redis backends on a real Redis Cluster (3 primaries, 3 replicas).

The cluster is started once for this module from ``redis-server`` on free
loopback ports (:class:`tests.cluster_servers.RedisCluster`). The failover
tests kill a primary and restart it afterwards (it rejoins as a replica),
so they run last.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_distlock import lock, locks
from django_distlock.backends.redis import LockKeys
from django_distlock.checks import check_locks_setting
from django_distlock.exceptions import StaleFencingToken
from tests.cluster_servers import (
    RedisCluster,
    failover_load,
    read_log,
    wait_until,
)
from tests.conftest import redis_locks
from tests.contract import LockBackendContract
from tests.testapp.models import Account

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def redis_cluster():
    cluster = RedisCluster().start()
    yield cluster
    cluster.stop()


@pytest.fixture
def cluster_locks(redis_cluster):
    with override_settings(LOCKS=redis_locks(redis_cluster.url)):
        yield
    locks.reset()


class TestClusterContract(LockBackendContract):
    """The shared backend contract on a Redis Cluster."""

    @pytest.fixture
    def locks_setting(self, redis_cluster):
        return redis_locks(redis_cluster.url)


def _slot(key: str) -> int:
    from redis.crc import key_slot

    return key_slot(key.encode())


class TestClusterLayout:
    """One lock lives in one slot; many locks spread over every primary."""

    def test_every_key_of_a_lock_in_one_slot(self):
        for name in ["a", "shop.product:42", "x" * 10_000, "*?[]\n\0"]:
            keys = LockKeys("distlock", name)
            slots = {_slot(k) for k in (*keys.triple, keys.wake_prefix + "sometoken")}
            assert len(slots) == 1, name

    def test_listing_and_clearing_walk_every_primary(
        self, redis_cluster, cluster_locks
    ):
        prefix = f"spread:{uuid.uuid4().hex[:6]}:"
        names = [f"{prefix}{i}" for i in range(30)]
        held = [lock(n, ttl=30) for n in names]
        for h in held:
            assert h.acquire()
        primaries = {
            redis_cluster.primary_of(LockKeys("distlock", n).lease).port for n in names
        }
        assert len(primaries) == 3  # 30 random slots: all three shards
        listed = sorted(h.name for h in locks["default"].holders(prefix))
        assert listed == sorted(names)
        call_command("locks", "clear", "--prefix", prefix, "--noinput")
        assert list(locks["default"].holders(prefix)) == []
        for h in held:
            assert not h.locked()

    def test_renewal_pipeline_spans_slots(self, cluster_locks):
        names = [f"renew:{uuid.uuid4().hex}:{i}" for i in range(12)]
        held = [lock(n, ttl=30, auto_renew=False) for n in names]
        for h in held:
            assert h.acquire()
        try:
            results = locks["default"].renew([h.lease for h in held])
            assert results == [True] * len(held)
        finally:
            for h in held:
                h.release()

    def test_reentrant_backend_on_a_cluster(self, redis_cluster):
        entry = {
            "BACKEND": "django_distlock.backends.redis.ReentrantRedisLockBackend",
            "LOCATION": redis_cluster.url,
        }
        name = f"nested:{uuid.uuid4().hex}"
        with override_settings(LOCKS={"default": entry}):
            try:
                with lock(name) as outer:
                    with lock(name) as inner:
                        assert inner.fencing_token == outer.fencing_token
                    got = []
                    t = threading.Thread(
                        target=lambda: got.append(lock(name, timeout=0).acquire())
                    )
                    t.start()
                    t.join(30)
                    assert got == [False]
                assert lock(name, timeout=0).acquire()
            finally:
                locks.reset()

    def test_options_cluster_with_a_redis_url(self, redis_cluster):
        url = f"redis://127.0.0.1:{redis_cluster.nodes[1].port}"
        with override_settings(LOCKS=redis_locks(url, OPTIONS={"CLUSTER": True})):
            try:
                backend = locks["default"]
                assert backend.cluster
                with lock(f"opt:{uuid.uuid4().hex}") as held:
                    assert held.locked()
            finally:
                locks.reset()


class TestClusterChecks:
    """The system checks accept the cluster forms and reject malformed ones."""

    def _ids(self, entry):
        with override_settings(LOCKS={"default": entry}):
            return [m.id for m in check_locks_setting(None)]

    def _entry(self, **kw):
        return {"BACKEND": "django_distlock.backends.redis.RedisLockBackend", **kw}

    def test_valid(self):
        assert self._ids(self._entry(LOCATION="redis+cluster://10.0.0.1:7000")) == []
        assert self._ids(self._entry(LOCATION="rediss+cluster://h:7000/")) == []
        assert (
            self._ids(self._entry(LOCATION="redis://h:7000", OPTIONS={"CLUSTER": True}))
            == []
        )

    def test_invalid(self):
        assert "distlock.E015" in self._ids(
            self._entry(LOCATION="redis+cluster://h:7000/3")
        )
        assert "distlock.E015" in self._ids(
            self._entry(LOCATION="unix:///tmp/r.sock", OPTIONS={"CLUSTER": True})
        )
        assert "distlock.E015" in self._ids(
            self._entry(LOCATION="redis://h:7000", OPTIONS={"CLUSTER": "yes"})
        )
        assert "distlock.E015" in self._ids(
            self._entry(
                LOCATION="redis+cluster://h:7000",
                OPTIONS={"SENTINELS": [("h", 26379)], "SERVICE_NAME": "m"},
            )
        )


def _client(port: int):
    import redis

    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)


class TestClusterFailover:
    """Kill the primary of a lock's slot; its replica takes over.

    Runs last: the killed node is restarted afterwards and rejoins as a
    replica, and the cluster is healthy again before the test ends.
    """

    def _fail_over(self, cluster: RedisCluster, key: str):
        primary = cluster.primary_of(key)
        replica = cluster.replica_of(primary)
        primary.kill()
        wait_until(lambda: cluster.is_primary(replica), 90, "the replica promotion")
        wait_until(cluster.healthy, 90, "the cluster to heal")
        return primary, replica

    def _rejoin(self, cluster: RedisCluster, node) -> None:
        node.start()  # its nodes.conf survives: it rejoins as a replica
        wait_until(
            lambda: cluster.is_synced_replica(node) and cluster.healthy(),
            90,
            "the restarted node to rejoin as a replica",
        )

    def test_failover_under_load(self, redis_cluster, cluster_locks, tmp_path):
        name = f"failover:{uuid.uuid4().hex}"
        log = tmp_path / "log"
        with failover_load(name, log) as results:
            killed_at = time.monotonic()
            key = LockKeys("distlock", name).lease
            primary, _ = self._fail_over(redis_cluster, key)
            healed_at = time.monotonic()
            wait_until(
                lambda: sum(r[0] > healed_at for r in read_log(log)) >= 20,
                120,
                "load after the failover",
            )
        self._rejoin(redis_cluster, primary)
        rows = read_log(log)
        before = [r for r in rows if r[1] < killed_at]
        after = [r for r in rows if r[0] > healed_at]
        assert before and after
        assert len({r[2] for r in rows}) == len(rows)  # every grant is distinct
        # The promoted replica's tokens (its clock, in microseconds) are above
        # every token the dead primary handed out: fencing keeps working.
        assert min(r[2] for r in after) > max(r[2] for r in before)
        assert len(results) == 3
        assert sum(r["ok"] for r in results) == len(rows)

    @pytest.mark.django_db
    def test_lost_write_window_and_fencing(self, redis_cluster, cluster_locks):
        """A grant not yet replicated is lost by the failover; fencing catches it.

        The replica is paused and its link cut, so the grant on the primary
        cannot reach it;
        then the primary dies and the (resumed) replica is promoted without
        the lease: a second client gets the same lock while the first still
        believes it holds it. Its token is newer, so the first holder's
        fenced save is refused once the second has saved.
        """
        name = f"window:{uuid.uuid4().hex}"
        key = LockKeys("distlock", name).lease
        primary = redis_cluster.primary_of(key)
        replica = redis_cluster.replica_of(primary)
        account = Account.objects.create(owner="a", balance=0)
        replica.pause()
        # Cut the replication link from the primary's side too, or the grant
        # would wait in the paused replica's socket buffer and arrive anyway.
        _client(primary.port).execute_command("CLIENT", "KILL", "TYPE", "replica")
        try:
            old = lock(name, ttl=60, auto_renew=False)
            assert old.acquire()
        finally:
            primary.kill()
            replica.resume()
        wait_until(lambda: redis_cluster.is_primary(replica), 90, "the promotion")
        wait_until(redis_cluster.healthy, 90, "the cluster to heal")
        locks.reset()  # a fresh client learns the new slot map at once
        try:
            new = lock(name, ttl=60, timeout=30, auto_renew=False)
            assert new.acquire()  # the lease died with the primary
            assert new.fencing_token > old.fencing_token
            fresh = Account.objects.get(pk=account.pk)
            fresh.balance = 2
            fresh.save(fence=new)
            stale = Account.objects.get(pk=account.pk)
            stale.balance = 1
            with pytest.raises(StaleFencingToken):
                stale.save(fence=old)
            assert Account.objects.get(pk=account.pk).balance == 2
            new.release()
        finally:
            self._rejoin(redis_cluster, primary)
