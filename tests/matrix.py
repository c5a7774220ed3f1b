"""What one cell of the version matrix runs (``tox.ini``, ``scripts/matrix``).

A cell is a tox environment named ``py<X>-dj<Y>-redis<Z>[-nohiredis]``. The
whole suite runs once, on the main combination (``scripts/test``); a cell runs
what can differ between versions:

- in every cell, the slice: a few tests of each part the versions touch (the
  backend contract on Redis, Redlock, the reentrant lock, the database on
  SQLite and PostgreSQL; fenced saves and querysets; asyncio; the view
  decorator; the ``locks`` command; the admin), among them a test across
  processes for each backend, so every combination that ``pyproject.toml``
  accepts has run against real servers;
- the whole Django suite (ORM fencing, the database backend on SQLite,
  PostgreSQL with and without ``WAIT = "notify"`` and MariaDB, the
  decorator, the command, the admin, checks) on each Django with the newest
  Python it supports, and on the oldest of everything (``DJANGO_CELLS``),
  whose cells also run the oldest drivers (``tox.ini``);
- the whole Redis suite (the Redis, Redlock and reentrant contracts,
  ``OPTIONS["CACHE"]`` with django-redis, asyncio) on each redis-py with the
  newest Python and Django, on the oldest of everything, and without hiredis
  (``REDIS_CELLS``);
- the integrations suite (the ZooKeeper backend with kazoo, Celery's
  ``locked_task`` on real workers, the Prometheus metrics, the OpenTelemetry
  spans) on the oldest of everything (``INTEGRATIONS_CELLS``), with the
  floors of their extras pinned (``tox.ini``): the newest releases run in
  the main suite. Only that cell installs them; no other cell collects
  these tests.

Usage: ``python -m tests.matrix CELL [pytest args]``. The exit status is
pytest's, except that "no tests ran" (5) is a failure, and so is a part of
the slice that selected no test (a renamed test must not empty it
silently). ``python -m tests.matrix --report DIR`` prints the table of cells
from their JUnit files.
"""

from __future__ import annotations

import os
import sys

import pytest

#: The cells of the whole Django suite (with the newest redis-py): each Django
#: on the newest Python it supports, and Django 4.2 on the oldest Python too.
#: (Python 3.11 with Django 5.2 and redis-py 8 is the main suite's own.)
DJANGO_CELLS = {
    "py310-dj42-redis8",
    "py312-dj42-redis8",
    "py313-dj52-redis8",
    "py313-dj60-redis8",
    "py313-dj61-redis8",
}
#: The cells of the whole Redis suite: each redis-py on the newest Python and
#: Django, the oldest of everything, and Python 3.12 without hiredis.
REDIS_CELLS = {
    "py313-dj61-redis5",
    "py313-dj61-redis6",
    "py313-dj61-redis7",
    "py313-dj61-redis8",
    "py310-dj42-redis5",
    "py312-dj61-redis8-nohiredis",
}

#: The cells of the integrations suite: the oldest of everything, with the
#: oldest kazoo, Celery, prometheus_client and OpenTelemetry that
#: pyproject.toml accepts (tox.ini pins them there alone).
INTEGRATIONS_CELLS = {
    "py310-dj42-redis8",
}

DJANGO_SUITE = [
    "tests/test_database_backend.py::TestSQLiteContract",
    "tests/test_database_backend.py::TestPostgresContract",
    "tests/test_database_backend.py::TestPostgresNotifyContract",
    "tests/test_database_backend.py::TestMySQLContract",
    "tests/test_fencing.py",
    "tests/test_decorators.py",
    "tests/test_command.py",
    "tests/test_admin.py",
    "tests/test_checks.py",
    "tests/test_drivers.py",
    "tests/test_handler.py",
    "tests/test_lock_for.py",
]
#: Slow tests of the Django suite that measure the algorithm, not a version:
#: they run in the main suite only.
DJANGO_DESELECT = [
    "tests/test_fencing.py::TestPause",
    "tests/test_command.py::test_list_100k_holders_on_redis",
    "tests/test_admin.py::test_pages_stay_fast_with_100k_holders",
]
REDIS_SUITE = [
    "tests/test_redis_backend.py::TestRedisContract",
    "tests/test_redis_backend.py::TestCacheOption",
    "tests/test_redlock.py::TestRedlockContract",
    "tests/test_reentrant.py::TestReentrantContract",
    "tests/test_async.py",
    "tests/test_redis_pipelined_wait.py",
    # The asyncio deadlines: asyncio.timeout from 3.11, async_timeout on 3.10.
    "tests/test_redis_deadlines.py",
]
#: Each test of kazoo, Celery, prometheus_client or OpenTelemetry: a real
#: ZooKeeper (started by the tests, Debian's package: scripts/bootstrap) and
#: the machine's RabbitMQ; none takes 10 s, so nothing is deselected.
INTEGRATIONS_SUITE = [
    "tests/test_zookeeper.py",
    "tests/test_zookeeper_kinds.py",
    "tests/test_kinds_contract.py::TestZooKeeperKinds",
    "tests/test_celery.py",
    "tests/test_prometheus.py",
    "tests/test_otel.py",
    "tests/test_kinds.py::test_prometheus_counts_by_kind",
    "tests/test_kinds.py::test_otel_spans_carry_the_kind",
]
CONTRACT_SLICE = (
    "test_acquire_release",
    "test_fencing_tokens_strictly_increase",
    "test_expiry_and_takeover",
    "test_release_by_non_owner_refused",
    "test_async_twins",
    "test_other_process_excluded_while_held",
)
#: The slice: each part, and the tests (by function name) that stand for it.
SLICE = {
    "tests/test_redis_backend.py::TestRedisContract": CONTRACT_SLICE,
    "tests/test_redlock.py::TestRedlockContract": CONTRACT_SLICE,
    "tests/test_reentrant.py::TestReentrantContract": CONTRACT_SLICE,
    "tests/test_database_backend.py::TestSQLiteContract": CONTRACT_SLICE,
    "tests/test_database_backend.py::TestPostgresContract": CONTRACT_SLICE,
    "tests/test_fencing.py::TestFencedSave": (
        "test_older_holder_is_refused_and_writes_nothing",
        "test_statements",
    ),
    "tests/test_fencing.py::TestFencedQuerySet": (),  # all of it: a few ms
    "tests/test_async.py": (
        "test_tasks_are_distinct_holders",
        "test_async_contention_raises",
        "test_async_waiter_woken_by_release_from_another_task",
    ),
    "tests/test_decorators.py": (
        "test_free_lock_runs_the_view",
        "test_async_views_run",
        "test_busy_from_another_process_is_423",
    ),
    "tests/test_command.py": (
        "test_list_shows_holders_of_another_process",
        "test_clear_names_only_those",
    ),
    "tests/test_admin.py": (
        "test_changelist_shows_a_holder_of_another_process",
        "test_release_is_logged_and_the_holder_finds_out",
    ),
}


def suites(cell: str) -> list[str]:
    """Return the names of the suites ``cell`` runs, the slice first."""
    chosen = ["slice"]
    if cell in DJANGO_CELLS:
        chosen.append("django")
    if cell in REDIS_CELLS:
        chosen.append("redis")
    if cell in INTEGRATIONS_CELLS:
        chosen.append("integrations")
    return chosen


def pytest_args(cell: str) -> list[str]:
    """Return the pytest arguments (node ids, deselections) of ``cell``."""
    chosen = suites(cell)
    args = list(SLICE)
    if "django" in chosen:
        args += DJANGO_SUITE
        for nodeid in DJANGO_DESELECT:
            args += ["--deselect", nodeid]
    if "redis" in chosen:
        args += REDIS_SUITE
    if "integrations" in chosen:
        args += INTEGRATIONS_SUITE
    return args


class SlicePlugin:
    """Keep, of the slice's parts, only their chosen tests (unless a whole
    suite of the cell holds them), and fail if a part selected nothing."""

    def __init__(self, whole: list[str]):
        self.whole = whole

    def _part(self, nodeid: str) -> str | None:
        for part in SLICE:
            if nodeid == part or nodeid.startswith(part + "::"):
                return part
        return None

    def _in_whole(self, nodeid: str) -> bool:
        return any(nodeid == w or nodeid.startswith(w + "::") for w in self.whole)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        keep, drop, seen = [], [], set()
        for item in items:
            part = self._part(item.nodeid)
            function = getattr(item, "originalname", item.name)
            if self._in_whole(item.nodeid) or part is None:
                keep.append(item)
            elif not SLICE[part] or function in SLICE[part]:
                keep.append(item)
            else:
                drop.append(item)
                continue
            if part is not None:
                seen.add(part)
        empty = sorted(set(SLICE) - seen)
        if empty:
            raise pytest.UsageError(f"the slice selected no test of {empty}")
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep


def report(results: str) -> int:
    """Print one line per cell from the JUnit files in ``results``.

    Return 1 if a cell has failures or errors, or ran no test.
    """
    from xml.etree import ElementTree

    worst = 0
    print(
        f"{'cell':<30} {'suites':<25} {'passed':>6} {'skipped':>7} "
        f"{'failed':>6} {'seconds':>7}"
    )
    for name in sorted(os.listdir(results)):
        if not name.endswith(".xml"):
            continue
        cell = name[: -len(".xml")]
        root = ElementTree.parse(os.path.join(results, name)).getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        total, skipped = int(suite.get("tests")), int(suite.get("skipped"))
        failed = int(suite.get("failures")) + int(suite.get("errors"))
        passed = total - skipped - failed
        if failed or not passed:
            worst = 1
        print(
            f"{cell:<30} {'+'.join(suites(cell)):<25} {passed:>6} {skipped:>7} "
            f"{failed:>6} {float(suite.get('time')):>7.0f}"
        )
    return worst


def main(argv: list[str]) -> int:
    if argv[0] == "--report":
        return report(argv[1])
    cell, extra = argv[0], argv[1:]
    results = os.environ.get("MATRIX_RESULTS")
    args = ["-q", "-p", "no:cacheprovider", *pytest_args(cell), *extra]
    if results:
        os.makedirs(results, exist_ok=True)
        args.append(f"--junitxml={os.path.join(results, cell + '.xml')}")
    print(f"{cell}: suites {', '.join(suites(cell))}", flush=True)
    whole = [a for a in pytest_args(cell)[len(SLICE) :] if a.startswith("tests/")]
    status = pytest.main(args, plugins=[SlicePlugin(whole)])
    if status == pytest.ExitCode.NO_TESTS_COLLECTED:
        print(f"{cell}: no tests ran: that is a failure", file=sys.stderr)
        return 1
    return int(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
