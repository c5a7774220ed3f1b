"""Worker functions for tests/test_fencing.py (run in spawned processes).

They must be importable module-level functions: ``tests/procs.py`` pickles
them by name into a fresh interpreter that sets Django up on its own.
"""

from __future__ import annotations

import os

from django_distlock.backends.locmem import LocMemLockBackend


class NonDurableLocMemBackend(LocMemLockBackend):
    """A backend that admits its tokens are not durable: fence= must refuse it."""

    durable_fencing = False


def stale_writer(op, db, pks, lock_name, ttl, auto_renew, out, go):
    """Take ``lock_name``, load the rows, report, wait for ``go``, then write.

    The test SIGSTOPs this process after the report, lets another process take
    the lock and write, puts on the ``go`` queue and SIGCONTs it. ``op`` is the write
    attempted with the (by then stale) lease: ``save``, ``update`` (fenced
    queryset update of every row in ``pks``), ``delete`` (instance) or
    ``qs_delete``. Put ``(outcome, release_outcome)`` on ``out``.
    """
    from django_distlock import lock
    from django_distlock.exceptions import LockLost, LockNotHeld, StaleFencingToken
    from tests.testapp.models import Account

    handle = lock(lock_name, ttl=ttl, auto_renew=auto_renew, timeout=30)
    if not handle.acquire():
        out.put(("not acquired", None, os.getpid()))
        return
    rows = list(Account.objects.using(db).filter(pk__in=pks).order_by("pk"))
    out.put(("held", handle.fencing_token, os.getpid()))
    go.get(timeout=120)  # a Queue: a stopped waiter cannot upset it
    try:
        if op == "save":
            row = rows[0]
            row.owner = "A"
            row.balance = -1
            row.save(fence=handle)
        elif op == "update":
            Account.objects.using(db).filter(pk__in=pks).fenced(handle).update(
                owner="A", balance=-1
            )
        elif op == "delete":
            rows[0].delete(fence=handle)
        elif op == "qs_delete":
            Account.objects.using(db).filter(pk__in=pks).fenced(handle).delete()
        else:
            raise ValueError(op)
        outcome = "written"
    except StaleFencingToken:
        outcome = "stale"
    except LockLost:
        outcome = "lost"
    except Exception as e:  # reported to the test, which fails on it
        outcome = f"error: {e!r}"
    try:
        handle.release()
        released = "released"
    except LockNotHeld as e:
        released = type(e).__name__
    except Exception as e:
        released = f"error: {e!r}"
    out.put((outcome, released))
