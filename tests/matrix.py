"""What one cell of the version matrix runs (``tox.ini``, ``scripts/matrix``).

A cell is a tox environment named ``py<X>-dj<Y>-redis<Z>[-nohiredis]``. The
whole suite runs once, on the main combination (``scripts/test``); a cell runs
only what can differ between versions:

- the Django suite (ORM fencing, the database backend on SQLite and
  PostgreSQL, the view decorator, the command, the admin, checks) in every
  cell that has the newest redis-py: once per Python x Django pair;
- the Redis suite (the Redis, Redlock and reentrant contracts, asyncio) in
  every cell that has the newest Django for its Python: once per Python x
  redis-py pair, and in the cell without hiredis;
- the smoke suite (Redis through Django: the decorator and the command on a
  Redis alias, a django-redis pool) in every cell, so every combination that
  ``pyproject.toml`` accepts has run against real servers.

Usage: ``python -m tests.matrix CELL [pytest args]``. The exit status is
pytest's, except that "no tests ran" (5) is a failure. ``python -m
tests.matrix --report DIR`` prints the table of cells from their JUnit files.
"""

from __future__ import annotations

import os
import sys

import pytest

#: The newest Django each Python runs (Django's own Python requirements).
NEWEST_DJANGO = {"py310": "dj52", "py311": "dj52", "py312": "dj61", "py313": "dj61"}
NEWEST_REDIS = "redis8"

DJANGO_SUITE = [
    "tests/test_database_backend.py::TestSQLiteContract",
    "tests/test_database_backend.py::TestPostgresContract",
    "tests/test_fencing.py",
    "tests/test_decorators.py",
    "tests/test_command.py",
    "tests/test_admin.py",
    "tests/test_checks.py",
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
    "tests/test_redlock.py::TestRedlockContract",
    "tests/test_reentrant.py::TestReentrantContract",
    "tests/test_async.py",
]
SMOKE_SUITE = [
    "tests/test_redis_backend.py::TestCacheOption",
    "tests/test_decorators.py",
    "tests/test_command.py",
]
SMOKE_KEYWORD = "redis"


def suites(cell: str) -> list[str]:
    """Return the names of the suites ``cell`` runs."""
    factors = cell.split("-")
    python, django, redis = factors[:3]
    chosen = []
    if redis == NEWEST_REDIS and "nohiredis" not in factors:
        chosen.append("django")
    if django == NEWEST_DJANGO[python] or "nohiredis" in factors:
        chosen.append("redis")
    if not chosen:
        chosen.append("smoke")
    return chosen


def pytest_args(cell: str) -> list[str]:
    """Return the pytest arguments that run ``cell``'s suites."""
    chosen = suites(cell)
    if chosen == ["smoke"]:
        return [*SMOKE_SUITE, "-k", SMOKE_KEYWORD]
    args: list[str] = []
    if "django" in chosen:
        args += DJANGO_SUITE
        for nodeid in DJANGO_DESELECT:
            args += ["--deselect", nodeid]
    if "redis" in chosen:
        args += REDIS_SUITE
    return args


def report(results: str) -> int:
    """Print one line per cell from the JUnit files in ``results``.

    Return 1 if a cell has failures or errors, or ran no test.
    """
    from xml.etree import ElementTree

    worst = 0
    print(
        f"{'cell':<30} {'suites':<14} {'passed':>6} {'skipped':>7} "
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
            f"{cell:<30} {'+'.join(suites(cell)):<14} {passed:>6} {skipped:>7} "
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
    status = pytest.main(args)
    if status == pytest.ExitCode.NO_TESTS_COLLECTED:
        print(f"{cell}: no tests ran: that is a failure", file=sys.stderr)
        return 1
    return int(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
