"""Fixtures of the torture suite: a backend environment per scenario."""

from __future__ import annotations

import os

import pytest
from django.test import override_settings

from ..conftest import TORTURE_VERDICT, require_tcp
from .harness import LONG, VERDICTS, abort_runs, make_env, stop_servants

DB_ALIASES = ["default", "postgres", "mysql"]


def backends(*kinds: str, long: tuple[str, ...] = ()) -> list:
    """Return pytest params for backend kinds, each with the marks it needs.

    Lock rows and fenced records must be committed (other processes read
    them), so every scenario runs in a transactional test database. Kinds
    also named in ``long`` are heavier variants that run in long mode only
    (the short mode keeps one or two backends per scenario within CI time).
    """
    params = []
    for kind in (*kinds, *long):
        marks = [pytest.mark.django_db(transaction=True)]
        if kind in ("redis", "reentrant", "redlock", "cluster", "sentinel"):
            marks.append(pytest.mark.redis)
        if kind == "postgres":
            marks = [
                pytest.mark.django_db(transaction=True, databases=["default", kind]),
                pytest.mark.postgres,
            ]
        if kind == "pgserver":
            # A server of the test's own, whose alias mirrors ``postgres``
            # in the test databases' setup.
            marks = [
                pytest.mark.django_db(
                    transaction=True, databases=["default", "postgres", "crashable"]
                ),
                pytest.mark.postgres,
            ]
        if kind == "mariadbserver":
            marks = [
                pytest.mark.django_db(
                    transaction=True,
                    databases=["default", "mysql", "crashable_mysql"],
                ),
                pytest.mark.mysql,
            ]
        if kind == "mysql":
            marks = [
                pytest.mark.django_db(transaction=True, databases=["default", kind]),
                pytest.mark.mysql,
            ]
        if kind in long:
            marks.append(long_only())
        params.append(pytest.param(kind, marks=marks, id=kind))
    return params


def long_only(reason: str = "heavy variant: runs in long mode only"):
    """Skip a heavy variant unless the long mode is on."""
    return pytest.mark.skipif(not LONG, reason=reason)


@pytest.fixture
def env(request, kind):
    """Start the backend named by the test's ``kind`` parameter; LOCKS point at it."""
    if kind == "postgres":
        request.getfixturevalue("postgres_available")
    if kind == "mysql":
        request.getfixturevalue("mysql_available")
    environment = make_env(kind)
    try:
        with override_settings(LOCKS=environment.locks):
            yield environment
    finally:
        abort_runs()  # a failed scenario must not leave its workers running
        environment.stop()


@pytest.fixture(scope="session", autouse=True)
def _servants():
    """Stop the pool of worker processes at the end of the session."""
    yield
    stop_servants()


@pytest.fixture(autouse=True)
def _verdicts_on_the_report(request):
    """Carry the verdicts a scenario judged on its test report: the run's
    summary (``tests/conftest.py``) is printed from the reports, which reach
    it from pytest-xdist workers too."""
    before = len(VERDICTS)
    yield
    for verdict in VERDICTS[before:]:
        request.node.user_properties.append((TORTURE_VERDICT, verdict.summary()))


@pytest.fixture
def kind():
    raise AssertionError("parametrize 'kind' with backends(...)")


def pytest_collection_modifyitems(config, items):
    """Keep every N-th scenario when ``DISTLOCK_TORTURE_SHARD`` is ``i/N``.

    ``scripts/torture --shards N`` runs N pytest sessions side by side (each
    with its own servers, worker pool and test databases); the scenarios wait
    on sleeps and round trips more than on the CPU, so the machine checks more
    sections per second that way.
    """
    shard = os.environ.get("DISTLOCK_TORTURE_SHARD")
    if not shard:
        return
    index, count = (int(part) for part in shard.split("/"))
    keep, drop = [], []
    for position, item in enumerate(items):
        (keep if position % count == index else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


__all__ = ["backends", "long_only", "require_tcp", "DB_ALIASES"]
