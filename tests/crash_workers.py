"""Worker functions of the crash and partition tests, run through
:mod:`tests.procs` against a server of the test's own (the LOCKS in force
point the default backend at its alias)."""

from __future__ import annotations

import threading
import time

#: The lease of every grant here: the holder's process exits without
#: renewing it, so it runs out this long after the grant (longer than the
#: server takes to be killed and come back).
TTL = 3.0


def migrate(database: str) -> None:
    """Worker: create the tables on ``database``."""
    from django.core.management import call_command

    call_command("migrate", database=database, verbosity=0)


def grant(name: str, how: str) -> tuple[int, float]:
    """Worker: be granted ``name`` (``how``); the process then exits holding
    it, and its lease runs out :data:`TTL` after the grant.

    Return the fencing token and a time (``time.time()``) before which the
    lease cannot have run out: the moment before the grant was asked for,
    plus the TTL.
    """
    from django_distlock import lock, locks, semaphore

    if how == "handed permit":
        # A release hands the permit to the waiter queued behind its holder.
        assert locks["default"].hands_over
        holder = semaphore(name, 1, ttl=5, auto_renew=False)
        holder.acquire()
        handed = holder.fencing_token + 1
        waiter = semaphore(name, 1, ttl=TTL, timeout=20, auto_renew=False)
        thread = threading.Thread(target=waiter.acquire)
        thread.start()
        _wait_queued(name)
        asked = time.time()
        holder.release()
        thread.join(20)
        assert waiter.fencing_token == handed, (waiter.fencing_token, handed)
        return waiter.fencing_token, asked + TTL
    if how == "permit":
        held = semaphore(name, 1, ttl=TTL, auto_renew=False)
    else:
        held = lock(name, ttl=TTL, auto_renew=False, shared=how == "shared")
    asked = time.time()
    held.acquire()
    return held.fencing_token, asked + TTL


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


def take_again(name: str, how: str) -> tuple[int, float]:
    """Worker: take ``name`` as the holder before did (exclusively after a
    shared holder), waiting for its lease to run out; return the fencing
    token and when it was granted (``time.time()`` once it was)."""
    from django_distlock import lock, semaphore

    if how in ("permit", "handed permit"):
        held = semaphore(name, 1, ttl=TTL, timeout=30, auto_renew=False)
    else:
        held = lock(name, ttl=TTL, timeout=30, auto_renew=False)
    with held:
        return held.fencing_token, time.time()


def take_within(name: str, timeout: float) -> float:
    """Worker: take ``name``, waiting up to ``timeout`` seconds; return how
    long it took."""
    from django_distlock import lock

    started = time.monotonic()
    with lock(name, ttl=TTL, timeout=timeout, auto_renew=False):
        return time.monotonic() - started


def across_partition(
    name: str, ready: str, go: str, call: str = "release"
) -> tuple[str, float]:
    """Worker: hold ``name``, then, once ``go`` exists (the parent has cut
    the server off), release it, or (``call="acquire"``) try for another
    name. Return what the call raised and how long it took."""
    from pathlib import Path

    from django_distlock import lock

    held = lock(name, ttl=30, auto_renew=False)
    held.acquire()
    Path(ready).touch()
    deadline = time.monotonic() + 30
    while not Path(go).exists():
        assert time.monotonic() < deadline, "the parent never cut the server off"
        time.sleep(0.01)
    started = time.monotonic()
    try:
        if call == "acquire":
            lock(name + ":another", ttl=30, timeout=0, auto_renew=False).acquire()
        else:
            held.release()
    except Exception as e:  # noqa: BLE001 - returned to the test
        return type(e).__name__, time.monotonic() - started
    return "nothing", time.monotonic() - started
