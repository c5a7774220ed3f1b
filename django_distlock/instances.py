"""Locks for model instances: ``lock_for(obj)`` and the on-commit lock.

``lock_for`` names a lock after a model row (``"<app_label>.<model_name>:<pk>"``);
inside ``transaction.atomic`` it returns an :class:`OnCommitLock`, released
when the transaction ends rather than when the block does.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from .exceptions import LockNotHeld
from .locking import Lock, lock

__all__ = ["OnCommitLock", "lock_for", "lock_name_for"]

release_log = logging.getLogger("django_distlock.release")


def lock_name_for(model_or_instance, pk=None) -> str:
    """Return ``"<app_label>.<model_name>:<pk>"`` for a model row.

    Proxy models name their concrete model, so both lock the same row.
    """
    from django.db.models import Model

    if isinstance(model_or_instance, Model):
        if pk is not None:
            raise TypeError(
                "lock_for() takes either a model instance, or a model class and "
                f"pk=, not an instance and pk={pk!r}."
            )
        pk = model_or_instance.pk
        model = type(model_or_instance)
        if pk is None:
            raise ValueError(
                f"Cannot lock an unsaved {model.__name__} instance: its pk is None."
            )
    elif isinstance(model_or_instance, type) and issubclass(model_or_instance, Model):
        model = model_or_instance
        if pk is None:
            raise ValueError(
                f"lock_for({model.__name__}) needs the pk of the row to lock: "
                f"lock_for({model.__name__}, pk=...)."
            )
    else:
        raise TypeError(
            "lock_for() takes a model instance or a model class (and pk=), "
            f"not {model_or_instance!r} ({type(model_or_instance).__name__})."
        )
    meta = model._meta.concrete_model._meta
    return f"{meta.label_lower}:{pk}"


RELEASE_ON_EXIT = "on_exit"
RELEASE_ON_COMMIT = "on_commit"


def lock_for(
    model_or_instance,
    pk=None,
    *,
    release: str = RELEASE_ON_EXIT,
    database: str | None = None,
    **options: Any,
) -> Lock:
    """Return a :class:`Lock` for one model row, taking every option of :func:`lock`.

    ``lock_for(instance)`` or ``lock_for(Model, pk=42)``; the name is
    ``"<app_label>.<model_name>:<pk>"`` (a proxy model names its concrete
    model). An unsaved instance is a ValueError. ``shared=True`` takes a
    shared lease of the row, as with :func:`lock` (readers of the row side by
    side; a shared holder cannot make fenced writes).

    ``release="on_commit"`` keeps the lock, when the ``with`` block is left
    inside ``transaction.atomic()``, until that transaction ends: released
    right after it commits, and on rollback too (see
    :class:`OnCommitLock`). ``database`` is the database alias whose
    transaction counts (default: the router's write database for the model).
    """
    name = lock_name_for(model_or_instance, pk)
    if release == RELEASE_ON_EXIT:
        return lock(name, **options)
    if release != RELEASE_ON_COMMIT:
        raise ValueError(
            f"Lock {name!r}: release must be {RELEASE_ON_EXIT!r} or "
            f"{RELEASE_ON_COMMIT!r}, not {release!r}."
        )
    if database is None:
        from django.db import router
        from django.db.models import Model

        if isinstance(model_or_instance, Model):
            database = router.db_for_write(
                type(model_or_instance), instance=model_or_instance
            )
        else:
            database = router.db_for_write(model_or_instance)
    return OnCommitLock(name, database=database, **options)


class _Deferred:
    """The on_commit callback holding a lease past its ``with`` block.

    Django calls it after the commit. Django drops it unrun when the
    transaction, or a savepoint enclosing the block, rolls back; a
    :func:`weakref.finalize` on it notices that and releases the lease then.
    The lease itself sits in ``box`` (shared with the finalizer, which must
    not reference this object).
    """

    __slots__ = ("box", "__weakref__")

    def __init__(self, box: list):
        self.box = box

    def __call__(self) -> None:
        _release_deferred(self.box)


def _release_deferred(box: list) -> None:
    handle, key, pending = box
    box[0] = None
    if handle is None:
        return  # committed already, or adopted by another block
    if pending.get(key) is box:
        del pending[key]
    try:
        handle.release()
    except LockNotHeld:
        # LockLost included: it was signalled (lock_lost) and logged; raising
        # here would only break Django's commit or garbage collection.
        release_log.warning("Lock %r was lost before its commit", handle.name)
    except Exception:
        release_log.exception("Releasing lock %r after commit failed", handle.name)


class OnCommitLock(Lock):
    """A lock whose ``with`` block, inside ``atomic()``, releases at commit.

    Releasing a row's lock before the writes made under it are committed
    lets the next holder read the old row: the classic lost update. So when
    the block is left while ``transaction.atomic()`` is active on
    ``database``, the lease is kept (and auto-renewed) until the transaction
    ends: ``transaction.on_commit`` releases it right after the commit.

    Django has no on_rollback hook. On rollback, of the whole transaction or
    of a savepoint enclosing the block (which undoes the block's writes),
    Django discards the on_commit callbacks it registered; the callback
    object is then freed and a :func:`weakref.finalize` attached to it
    releases the lease at once. Closing the connection discards them too, so
    a connection dropped mid-transaction also releases the lock.

    Entering the lock again (through any handle for the same name) in the
    same transaction adopts the pending lease instead of waiting for itself.
    Outside ``atomic()`` the block releases on exit like a plain lock.
    Synchronous code only: Django's transactions are.
    """

    def __init__(self, name: str, *, database: str = "default", **options: Any):
        super().__init__(name, **options)
        self.database = database

    def _recreate_cm(self) -> OnCommitLock:
        return OnCommitLock(self.name, database=self.database, **self._options())

    def _connection(self):
        from django.db import connections

        return connections[self.database]

    def _pending(self, connection) -> dict:
        # Per database connection, hence per thread and transaction.
        try:
            return connection._distlock_pending
        except AttributeError:
            connection._distlock_pending = {}
            return connection._distlock_pending

    def __enter__(self) -> OnCommitLock:
        connection = self._connection()
        if connection.in_atomic_block:
            # Keyed by kind too: a pending shared lease is no exclusive one.
            key = (self.using, self.name, self.kind)
            box = self._pending(connection).pop(key, None)
            if box is not None and box[0] is not None:
                handle = box[0]
                box[0] = None
                self._leases.append(handle._leases.pop())
                return self
        super().__enter__()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        connection = self._connection()
        if not connection.in_atomic_block or not self._leases:
            return super().__exit__(exc_type, exc, tb)
        lease = self.lease
        if lease.lost:
            # Leaving the block must still report a loss, as a plain lock does.
            return super().__exit__(exc_type, exc, tb)
        holder = Lock(self.name, **self._options())
        holder._leases.append(self._leases.pop())
        key = (self.using, self.name, self.kind)
        pending = self._pending(connection)
        box = [holder, key, pending]
        pending[key] = box
        callback = _Deferred(box)
        weakref.finalize(callback, _release_deferred, box)
        connection.on_commit(callback)
        return None

    async def __aenter__(self):
        raise TypeError(
            "release='on_commit' works with synchronous transactions only; "
            "use 'with', or wrap the transaction in sync_to_async."
        )
