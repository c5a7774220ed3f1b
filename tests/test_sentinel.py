"""The Redis backend behind Redis Sentinel (1 primary, 1 replica, 3 sentinels).

The set-up is started once for this module on free loopback ports
(:class:`tests.cluster_servers.SentinelSetup`). The failover test kills the
primary for good, so it runs last (no test here uses the database, so
pytest-django does not reorder them).
"""

from __future__ import annotations

import time
import uuid

import pytest
from django.test import override_settings

from django_distlock import lock, locks
from django_distlock.checks import check_locks_setting
from tests.cluster_servers import (
    SentinelSetup,
    failover_load,
    read_log,
    wait_until,
)
from tests.contract import LockBackendContract

pytestmark = pytest.mark.redis

BACKEND = "django_distlock.backends.redis.RedisLockBackend"


def sentinel_locks(setup: SentinelSetup) -> dict:
    """A LOCKS setting reaching the primary through the sentinels."""
    return {
        "default": {
            "BACKEND": BACKEND,
            "OPTIONS": {
                "SENTINELS": setup.sentinels,
                "SERVICE_NAME": setup.SERVICE,
            },
        }
    }


class TestSentinelContract(LockBackendContract):
    """The shared backend contract through Sentinel."""

    @pytest.fixture
    def locks_setting(self, sentinel_setup):
        return sentinel_locks(sentinel_setup)


class TestSentinelChecks:
    def _ids(self, **entry):
        with override_settings(LOCKS={"default": {"BACKEND": BACKEND, **entry}}):
            return [m.id for m in check_locks_setting(None)]

    def test_valid(self):
        options = {"SENTINELS": [("10.0.0.1", 26379)], "SERVICE_NAME": "main"}
        assert self._ids(OPTIONS=options) == []
        options["SENTINEL_KWARGS"] = {"password": "x"}
        assert self._ids(OPTIONS=options) == []

    def test_invalid(self):
        assert "distlock.E015" in self._ids(OPTIONS={"SENTINELS": [("h", 26379)]})
        assert "distlock.E015" in self._ids(
            OPTIONS={"SENTINELS": [], "SERVICE_NAME": "m"}
        )
        assert "distlock.E015" in self._ids(
            OPTIONS={"SENTINELS": ["h:26379"], "SERVICE_NAME": "m"}
        )
        assert "distlock.E015" in self._ids(
            LOCATION="redis://h:6379/0",
            OPTIONS={"SENTINELS": [("h", 26379)], "SERVICE_NAME": "m"},
        )
        assert "distlock.E015" in self._ids(
            LOCATION="redis://h:6379/0", OPTIONS={"SERVICE_NAME": "m"}
        )


class TestSentinelFailover:
    """Kill the primary under load: the sentinels promote the replica."""

    def test_failover_under_load(self, sentinel_setup, tmp_path):
        name = f"sentinel-failover:{uuid.uuid4().hex}"
        log = tmp_path / "log"
        with override_settings(LOCKS=sentinel_locks(sentinel_setup)):
            try:
                with failover_load(name, log) as results:
                    old_port = sentinel_setup.current_primary_port()
                    assert old_port == sentinel_setup.primary.port
                    killed_at = time.monotonic()
                    sentinel_setup.primary.kill()
                    wait_until(
                        lambda: sentinel_setup.current_primary_port() != old_port,
                        120,
                        "the sentinels to promote the replica",
                    )
                    promoted_at = time.monotonic()
                    wait_until(
                        lambda: sum(r[0] > promoted_at for r in read_log(log)) >= 20,
                        120,
                        "load after the failover",
                    )
                    # A client made now reaches the new primary directly.
                    locks.reset()
                    with lock(name, timeout=30) as held:
                        assert held.locked()
            finally:
                locks.reset()
        assert sentinel_setup.current_primary_port() == sentinel_setup.replica.port
        rows = read_log(log)
        before = [r for r in rows if r[1] < killed_at]
        after = [r for r in rows if r[0] > promoted_at]
        assert before and after
        assert len({r[2] for r in rows}) == len(rows)
        assert min(r[2] for r in after) > max(r[2] for r in before)
        assert len(results) == 3
        assert sum(r["ok"] for r in results) == len(rows)
