"""Shared fixtures: real servers, LOCKS pointed at them."""

from __future__ import annotations

import os

import pytest
from django.test import override_settings

from .servers import RedisServer, port_open, unavailable


@pytest.fixture(scope="session")
def redis_server():
    """A redis-server of its own for the whole test session."""
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server):
    redis_server.client().flushall()
    return redis_server.url


def redis_locks(url: str, **extra) -> dict:
    """A LOCKS setting with the Redis backend on ``url`` as default."""
    entry = {
        "BACKEND": "django_distlock.backends.redis.RedisLockBackend",
        "LOCATION": url,
        **extra,
    }
    return {"default": entry}


def stalled_alias_locks(url: str, stalled_url: str) -> dict:
    """Redis on ``url`` as default, plus a "stalled" alias on ``stalled_url``
    (a server a test pauses) with a 2 s socket timeout."""
    settings = redis_locks(url)
    settings["stalled"] = {
        **redis_locks(stalled_url)["default"],
        "OPTIONS": {"SOCKET_TIMEOUT": 2.0},
    }
    return settings


@pytest.fixture
def redis_locks_settings(redis_url):
    with override_settings(LOCKS=redis_locks(redis_url)):
        yield


def require_tcp(host: str, port: int, what: str) -> None:
    if not port_open(host, port):
        unavailable(f"{what} is not reachable on {host}:{port}")


@pytest.fixture(scope="module")
def sentinel_setup():
    """A primary, a replica and three sentinels of a module's own (a failover
    test changes which server is the primary)."""
    from .cluster_servers import SentinelSetup

    setup = SentinelSetup().start()
    yield setup
    setup.stop()


@pytest.fixture(scope="session")
def postgres_available():
    require_tcp(
        os.environ.get("DISTLOCK_PG_HOST", "127.0.0.1"),
        int(os.environ.get("DISTLOCK_PG_PORT", "5432")),
        "PostgreSQL",
    )


@pytest.fixture(scope="session")
def mysql_available():
    require_tcp(
        os.environ.get("DISTLOCK_MYSQL_HOST", "127.0.0.1"),
        int(os.environ.get("DISTLOCK_MYSQL_PORT", "3306")),
        "MariaDB/MySQL",
    )


# The Django-surface tests (views, command, admin, lock_for) run once per backend.
SURFACE_BACKENDS = [
    pytest.param("redis", marks=pytest.mark.redis),
    "locmem",
    # Lock rows must be committed: other processes and connections read them.
    pytest.param("database", marks=pytest.mark.django_db(transaction=True)),
]


@pytest.fixture(params=SURFACE_BACKENDS)
def backend_kind(request):
    """Run the test once per surface backend, with LOCKS pointing at it."""
    from .surface import locks_setting

    with override_settings(LOCKS=locks_setting(request.param, request)):
        yield request.param


@pytest.fixture
def cross_process_kind(backend_kind):
    """Like ``backend_kind``, skipping locmem (its locks stay in one process)."""
    if backend_kind == "locmem":
        pytest.skip("locmem locks do not reach other processes")
    return backend_kind


@pytest.fixture(scope="session", autouse=True)
def _mariadb_version_read(django_db_blocker):
    """Read MariaDB's version once, with database access allowed.

    Django 6.1's model checks ask the ``mysql`` alias for the server's
    version (``mysql_is_mariadb``, a cached property): without this, a test
    that runs the system checks would need database access of its own.
    """
    from django.db import connections

    if "mysql" not in connections:
        return
    with django_db_blocker.unblock():
        try:
            connections["mysql"].mysql_server_info  # noqa: B018 (cached)
        except Exception:  # unreachable: the tests that need it say so
            pass


#: The name of the test-report property that carries a torture scenario's
#: verdict (``tests/torture/conftest.py``). The summary is made from the
#: reports: with pytest-xdist, they are all that reaches the main process.
TORTURE_VERDICT = "torture verdict"
_torture_summaries: list[str] = []


def pytest_runtest_logreport(report):
    # The teardown report carries every property the test added.
    if report.when == "teardown":
        _torture_summaries.extend(
            value for name, value in report.user_properties if name == TORTURE_VERDICT
        )


def pytest_terminal_summary(terminalreporter):
    if _torture_summaries:
        terminalreporter.section("torture report")
        for summary in _torture_summaries:
            terminalreporter.write_line(summary)
