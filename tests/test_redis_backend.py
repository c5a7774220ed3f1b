"""The Redis single-instance backend against a real redis-server."""

from __future__ import annotations

import pytest

from .conftest import redis_locks
from .contract import LockBackendContract

pytestmark = pytest.mark.redis


class TestRedisContract(LockBackendContract):
    """The shared backend contract on Redis."""

    @pytest.fixture
    def locks_setting(self, redis_url):
        return redis_locks(redis_url)
