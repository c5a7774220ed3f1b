"""Database faults: terminated backends, lock wait timeouts, SQLite processes."""

from __future__ import annotations

import time

import pytest
from django.db import connections, transaction

from .conftest import backends
from .harness import Run


@pytest.mark.parametrize("kind", backends("postgres"))
def test_postgres_backends_terminated(env, kind, tmp_path):
    """``pg_terminate_backend`` the lock connections (and then every other
    connection of the test database) again and again under load.

    A holder whose connection died must see a failed acquisition, a failed
    write or a LockLost, never a hang or a false success.
    """
    run = Run("pg_terminate_backend under load", env, tmp_path, hold=0.01).start()
    run.load(0.5)
    terminated = 0
    with run.fault():
        deadline = time.monotonic() + 2.0
        only_locks = True
        while time.monotonic() < deadline:
            with connections["postgres"].cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    + (
                        " AND application_name = 'django_distlock'"
                        if only_locks
                        else ""
                    )
                )
                terminated += len(cursor.fetchall())
            only_locks = not only_locks
            time.sleep(0.25)
    verdict = run.finish()
    verdict.notes.append(f"{terminated} backends terminated")
    assert terminated > 0


@pytest.mark.parametrize("kind", backends("mysql"))
def test_mariadb_lock_wait_timeout(env, kind, tmp_path):
    """Hold every lock row with ``SELECT ... FOR UPDATE`` for 4 s while the
    workers' sessions give up on a row lock after 1 s.

    Acquisitions and releases stuck behind the row lock must fail
    (LockBackendError, or LockLost at release), not hang and not succeed.
    """
    run = Run(
        "MariaDB lock wait timeout",
        env,
        tmp_path,
        hold=0.01,
        ttl=2.0,
        timeout=5.0,
        extra={"mysql_lock_wait_timeout": 1},
    ).start()
    run.load(0.5)
    with run.fault():
        with transaction.atomic(using="mysql"):
            with connections["mysql"].cursor() as cursor:
                cursor.execute("SELECT id FROM django_distlock_lockrecord FOR UPDATE")
                rows = cursor.fetchall()
                # Attempts that began before the rows were locked may succeed.
                locked_at = time.monotonic()
                time.sleep(4.0)
                held_until = time.monotonic()
    attempts = run.events("attempt")
    # Attempts made while the rows were locked (later ones may succeed).
    inside = [a for a in attempts if a["t0"] > locked_at and a["t1"] < held_until]
    # Attempts that failed while the rows were locked, including those begun
    # before: with two names and three workers, all three are often waiting
    # when the rows are locked, and a stuck statement is retried once, so
    # their next attempts may not end before the rows are let go.
    failed = [a for a in attempts if a["err"] and locked_at < a["t1"] < held_until]
    # Releases stuck behind the row lock fail too (READ COMMITTED lets a
    # busy acquisition skip the locked row, so it may just find it busy).
    stuck_releases = [
        s
        for s in run.events("cs")
        if s["rel"] != "ok" and run.fault_start < s["end"] < held_until
    ]
    verdict = run.finish()
    assert rows
    assert not [a for a in inside if a["ok"]], "acquired a locked row"
    errors = [a["err"] for a in failed] + [s["rel"] for s in stuck_releases]
    verdict.notes.append(f"{len(errors)} calls failed behind the row lock")
    assert errors, "nothing was stuck behind the row lock"
    assert set(errors) <= {"LockBackendError", "LockLost"}, errors


@pytest.mark.parametrize("kind", backends("database"))
def test_sqlite_several_processes_one_file(env, kind, tmp_path):
    """Four processes share one database file (SQLite in the default run)
    for locks and records; no fault beyond SQLite's own one-writer rule."""
    run = Run(
        "several processes on one database file",
        env,
        tmp_path,
        workers=4,
        records=("file", "fenced"),
    ).start()
    run.load(3.0)
    run.finish(recovery=0)
