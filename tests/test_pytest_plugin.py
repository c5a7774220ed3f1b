"""The pytest plugin, run by pytest itself (``pytester``) on a small project.

The project's LOCKS point at a Redis port where nothing listens, so a test
that passes with ``distlock_locmem`` proves the swap; one alias is a real
redis-server, for ``distlock_held`` on a real (reentrant) backend.
"""

from __future__ import annotations

import textwrap

import pytest

pytest_plugins = ["pytester"]

pytestmark = pytest.mark.redis

SETTINGS = """
SECRET_KEY = "tests"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth",
                  "django_distlock"]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3",
                           "NAME": ":memory:"}}}}
LOCKS = {{
    "default": {{
        "BACKEND": "django_distlock.backends.redis.RedisLockBackend",
        "LOCATION": "redis://127.0.0.1:{dead_port}/0",
        "TTL": 12,
        "TIMEOUT": 3,
    }},
    "quorum": {{
        "BACKEND": "django_distlock.backends.redis.RedisLockBackend",
        "LOCATION": "redis://127.0.0.1:{dead_port}/0",
    }},
    "nested": {{
        "BACKEND": "django_distlock.backends.redis.ReentrantRedisLockBackend",
        "LOCATION": "{redis_url}",
    }},
}}
"""

SHOP = """
from django.http import HttpResponse

from django_distlock import LockNotAcquired, distributed_lock, lock


def nightly():
    try:
        with lock("nightly", timeout=0):
            return "ran"
    except LockNotAcquired:
        return "busy"


@distributed_lock("inventory:<sku>")
def buy(request, sku):
    return HttpResponse("sold")
"""

TESTS = """
import pytest

from django_distlock import LockNotAcquired, lock, locks

from shop import buy, nightly


def test_swapped(distlock_locmem):
    assert distlock_locmem is locks
    for alias in ("default", "quorum", "nested"):
        assert type(locks[alias]).__name__ == "LocMemLockBackend"
    assert locks["default"].default_ttl == 12
    assert locks["default"].default_timeout == 3
    assert nightly() == "ran"


def test_held(distlock_locmem, distlock_held):
    held = distlock_held("nightly")
    assert nightly() == "busy"
    (holder,) = locks["default"].holders("nightly")
    assert holder.thread == "distlock_held:nightly"
    assert held.fencing_token == holder.fencing_token
    held.release()
    assert nightly() == "ran"


def test_held_view(distlock_held, distlock_locmem, rf):
    distlock_held("inventory:abc")
    assert buy(rf.get("/"), sku="abc").status_code == 423
    assert buy(rf.get("/"), sku="xyz").status_code == 200


def test_held_on_another_alias(distlock_locmem, distlock_held):
    distlock_held("x", using="quorum")
    assert not lock("x", using="quorum", timeout=0).acquire()
    assert lock("x", timeout=0).acquire()


def test_already_held(distlock_locmem, distlock_held):
    distlock_held("n")
    with pytest.raises(LockNotAcquired):
        distlock_held("n")


def test_leaves_a_lock_held(distlock_locmem):
    assert lock("leak", timeout=0, auto_renew=False).acquire()


def test_next_test_starts_empty(distlock_locmem):
    assert list(locks["default"].holders()) == []
    assert lock("leak", timeout=0).acquire()


def test_held_on_real_reentrant_redis(distlock_held):
    distlock_held("r", using="nested")
    # Another owner: this thread does not nest into it.
    assert not lock("r", using="nested", timeout=0).acquire()
    (holder,) = locks["nested"].holders("r")
    assert holder.thread == "distlock_held:r"


def test_real_redis_released_after_the_test():
    assert lock("r", using="nested", timeout=0).acquire()
"""


@pytest.fixture
def project(pytester, redis_url):
    from .servers import free_port

    pytester.makeini(
        "[pytest]\npythonpath = .\ndjango_find_project = false\n"
        "addopts = -p no:cacheprovider\n"
    )
    pytester.makepyfile(
        settings=SETTINGS.format(dead_port=free_port(), redis_url=redis_url),
        shop=SHOP,
        test_shop=TESTS,
    )
    return pytester


def test_fixtures_with_pytest_django(project):
    result = project.runpytest_subprocess("--ds=settings", "-v")
    result.assert_outcomes(passed=9)


def test_inactive_without_pytest_django(project):
    project.makepyfile(
        test_plain=textwrap.dedent(
            """
            def test_plain():
                assert True

            def test_wants_fixture(distlock_locmem):
                pass
            """
        )
    )
    result = project.runpytest_subprocess("-p", "no:django", "test_plain.py")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*fixture 'distlock_locmem' not found*"])
