"""Shared locks and semaphores through the public API, on every backend.

Each class runs :class:`tests.kinds_contract.LockKindsContract` on one
backend against its real server (the fixtures are those of the backend's
own test module).
"""

from __future__ import annotations

import pytest

from tests import test_cluster, test_redlock, test_sentinel, test_zookeeper
from tests.conftest import redis_locks
from tests.kinds_contract import LockKindsContract
from tests.test_database_backend import _sqlite_default, db_locks

redis_cluster = test_cluster.redis_cluster
shared_nodes = test_redlock.shared_nodes
zookeeper = test_zookeeper.zookeeper


class TestLocMemKinds(LockKindsContract):
    cross_process = False

    @pytest.fixture
    def locks_setting(self, request):
        return {
            "default": {
                "BACKEND": "django_distlock.backends.locmem.LocMemLockBackend",
                "LOCATION": request.node.nodeid,
            }
        }


@pytest.mark.redis
class TestRedisKinds(LockKindsContract):
    @pytest.fixture
    def locks_setting(self, redis_url):
        return redis_locks(redis_url)


@pytest.mark.redis
class TestClusterKinds(LockKindsContract):
    @pytest.fixture
    def locks_setting(self, redis_cluster):
        return redis_locks(redis_cluster.url)


@pytest.mark.redis
class TestSentinelKinds(LockKindsContract):
    @pytest.fixture
    def locks_setting(self, sentinel_setup):
        return test_sentinel.sentinel_locks(sentinel_setup)


@pytest.mark.redis
class TestRedlockKinds(LockKindsContract):
    permits = False

    @pytest.fixture
    def locks_setting(self, shared_nodes):
        for server in shared_nodes:
            server.client().flushall()
        return test_redlock.redlock_locks(shared_nodes)


@pytest.mark.django_db(transaction=True)
class TestSQLiteKinds(LockKindsContract):
    @pytest.fixture
    def locks_setting(self):
        _sqlite_default()
        return db_locks("default")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
class TestPostgresKinds(LockKindsContract):
    @pytest.fixture
    def locks_setting(self, postgres_available):
        return db_locks("postgres")


@pytest.mark.mysql
@pytest.mark.django_db(transaction=True, databases=["default", "mysql"])
class TestMySQLKinds(LockKindsContract):
    @pytest.fixture
    def locks_setting(self, mysql_available):
        return db_locks("mysql")


class TestZooKeeperKinds(LockKindsContract):
    ttl = 2.0

    @pytest.fixture
    def locks_setting(self, zookeeper):
        return test_zookeeper.zk_locks(zookeeper.hosts)
