"""Worker functions of tests/test_database_crash.py, run through
:mod:`tests.procs` against the ``crashable`` alias (the LOCKS in force point
the default backend at it)."""

from __future__ import annotations

import threading
import time

#: The lease of every grant here: the name is free again this long after the
#: restart, once the holder (whose process has exited) does not renew it.
TTL = 2.0


def migrate(database: str) -> None:
    """Worker: create the tables on ``database``."""
    from django.core.management import call_command

    call_command("migrate", database=database, verbosity=0)


def grant(name: str, how: str) -> int:
    """Worker: be granted ``name`` (``how``) and return the fencing token;
    the process then exits holding it (its lease runs for :data:`TTL`)."""
    from django_distlock import lock, locks, semaphore

    if how == "exclusive":
        held = lock(name, ttl=TTL, auto_renew=False)
        held.acquire()
        return held.fencing_token
    if how == "permit":
        held = semaphore(name, 1, ttl=TTL, auto_renew=False)
        held.acquire()
        return held.fencing_token
    # A release hands the permit to the waiter queued behind its holder.
    assert locks["default"].hands_over
    holder = semaphore(name, 1, ttl=5, auto_renew=False)
    holder.acquire()
    handed = holder.fencing_token + 1
    waiter = semaphore(name, 1, ttl=TTL, timeout=20, auto_renew=False)
    thread = threading.Thread(target=waiter.acquire)
    thread.start()
    _wait_queued(name)
    holder.release()
    thread.join(20)
    assert waiter.fencing_token == handed, (waiter.fencing_token, handed)
    return waiter.fencing_token


def _wait_queued(name: str) -> None:
    """Wait until a waiter of ``name`` has its place in the queue."""
    from django.db import connections

    deadline = time.monotonic() + 10
    with connections["crashable"].cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM django_distlock_lockshare "
                "WHERE kind = 'queued' AND expires_at > clock_timestamp()"
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.02)
    raise AssertionError(f"no waiter of {name!r} queued within 10 s")


def take_again(name: str, how: str) -> int:
    """Worker: take ``name`` once the lease before has run out; return the
    fencing token."""
    from django_distlock import lock, semaphore

    if how == "exclusive":
        held = lock(name, ttl=TTL, timeout=30, auto_renew=False)
    else:
        held = semaphore(name, 1, ttl=TTL, timeout=30, auto_renew=False)
    with held:
        return held.fencing_token
