"""Fencing tokens enforced by the ORM: the SQL behind ``save(fence=held)``.

A fenced write is a conditional write: it succeeds only if the row's stored
``fencing_token`` is not newer than the writer's, and it stores the writer's
token. Whatever the lock backend believes, the database then refuses writes
that arrive late from a holder whose lease lapsed and was taken over (a GC
pause, a stopped VM, a partition): they fail with
:class:`~django_distlock.exceptions.StaleFencingToken` and write nothing.

:class:`~django_distlock.models.FencedModel` uses the helpers below for
single rows; :class:`FencedQuerySet` adds ``.fenced(held)`` for bulk
``update()`` and ``delete()``. See ``docs/fencing.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.db import models, transaction

from .backends.base import Lease
from .exceptions import LockLost, StaleFencingToken
from .handler import locks

if TYPE_CHECKING:
    from .locking import Lock

__all__ = [
    "FENCING_FIELD",
    "FencedManager",
    "FencedQuerySet",
    "FencingTokenField",
    "claim_row",
    "held_lease",
]

#: Name of the column that stores the token of the last fenced write.
FENCING_FIELD = "fencing_token"


def held_lease(held: Lock | Lease) -> Lease:
    """Return the lease behind ``held`` (a held Lock handle or a Lease).

    Checked locally, without a round trip: raise LockNotHeld if it is not
    held (or was acquired in another process), LockLost if its loss is
    already known, TypeError for anything else, and ImproperlyConfigured if
    its backend does not promise durable fencing tokens (then a fenced write
    could not be trusted, so it is refused rather than pretended). A shared
    lease or a semaphore permit is a ValueError: only an exclusive holder
    may make fenced writes.
    """
    from .locking import Lock
    from .watchdog import report_lost

    if isinstance(held, Lock):
        backend, lease = held._current()
    elif isinstance(held, Lease):
        held.check_owner_process()
        backend = locks[held.alias]
        lease = held
        if lease.lost:
            report_lost(backend, lease, "the lease was lost earlier")
            raise LockLost(
                f"Lock {lease.name!r} was lost before this fenced write.",
                name=lease.name,
            )
    else:
        raise TypeError(
            f"fence= takes a held Lock (or its Lease), not {type(held).__name__}."
        )
    if not lease.kind.exclusive:
        # Readers do not write, and a permit excludes nobody: neither token
        # proves that no other holder writes at the same time.
        what = "is held shared" if lease.kind.mode == "shared" else "is a permit"
        raise ValueError(
            f"Lock {lease.name!r} {what}; fenced writes need an exclusive lock, "
            f"so nothing was written."
        )
    if not getattr(backend, "durable_fencing", True):
        raise ImproperlyConfigured(
            f"LOCKS[{backend.alias!r}] uses {type(backend).__name__}, whose "
            f"fencing tokens are not durable; fenced writes need a backend "
            f"with durable_fencing = True (see docs/fencing.md)."
        )
    return lease


def _label(model: type[models.Model]) -> str:
    return model._meta.concrete_model._meta.label


def stale(lease: Lease, model: type[models.Model], pk: Any, stored: Any):
    """Return the StaleFencingToken for a refused write to one row."""
    if stored is None:
        message = (
            f"Lock {lease.name!r}: {_label(model)} pk={pk!r} was deleted; a "
            f"fenced write does not re-create it (token {lease.fencing_token})."
        )
    else:
        message = (
            f"Lock {lease.name!r}: fencing token {lease.fencing_token} is older "
            f"than {stored} stored in {_label(model)} pk={pk!r}; nothing was "
            f"written."
        )
    exc = StaleFencingToken(message, name=lease.name)
    exc.fencing_token = lease.fencing_token
    exc.stored_token = stored
    return exc


def claim_row(row: models.QuerySet, pk: Any, lease: Lease, adding: bool) -> bool:
    """Stamp one row with ``lease``'s token if its stored token is not newer.

    ``row`` is the queryset of that row in the table holding the token.
    Inside a transaction the UPDATE locks the row until commit, so the write
    that follows cannot be overtaken. Return False if the row does not exist
    and the instance is being added (the caller INSERTs); raise
    StaleFencingToken if the row is newer, or gone for an instance that was
    loaded from the database.
    """
    token = lease.fencing_token
    while True:
        if row.filter(**{f"{FENCING_FIELD}__lte": token}).update(
            **{FENCING_FIELD: token}
        ):
            return True
        stored = row.values_list(FENCING_FIELD, flat=True).first()
        if stored is None:
            if adding:
                return False
            raise stale(lease, row.model, pk, None)
        if stored > token:
            raise stale(lease, row.model, pk, stored)
        # The row changed between the two statements (an older holder wrote
        # it, or it was just created): the condition may hold now.


def claim_rows(qs: models.QuerySet, lease: Lease) -> int:
    """Stamp every row of ``qs`` whose token is not newer; refuse if one is.

    Must run inside ``transaction.atomic``: the UPDATE takes the rows'
    write locks (the database's write lock on SQLite) until commit, so no
    newer holder can slip in before the caller's next statement, and the
    StaleFencingToken raised here rolls the whole write back. Return how
    many rows were stamped.
    """
    token = lease.fencing_token
    claimed = qs.filter(**{f"{FENCING_FIELD}__lte": token}).update(
        **{FENCING_FIELD: token}
    )
    raise_if_newer(qs, lease)
    return claimed


def raise_if_newer(qs: models.QuerySet, lease: Lease) -> None:
    """Raise StaleFencingToken if a row of ``qs`` has a newer token."""
    newer = (
        qs.filter(**{f"{FENCING_FIELD}__gt": lease.fencing_token})
        .order_by()
        .values_list("pk", FENCING_FIELD)[:1]
    )
    for pk, stored in newer:
        raise stale(lease, qs.model, pk, stored)


class FencingTokenField(models.BigIntegerField):
    """The ``fencing_token`` column: written by fenced writes only.

    An ordinary UPDATE (a ``save()`` without ``fence=``) writes the column to
    itself, so an unfenced write can never move the fence back; an INSERT
    stores the instance's value (0, or the token of a fenced save). Migrations
    see a plain ``BigIntegerField``.
    """

    def pre_save(self, model_instance: models.Model, add: bool) -> Any:
        if add:
            return super().pre_save(model_instance, add)
        return models.F(self.attname)

    def deconstruct(self):
        name, _path, args, kwargs = super().deconstruct()
        return name, "django.db.models.BigIntegerField", args, kwargs


def write_db(qs: models.QuerySet) -> str:
    """Return the database alias ``qs`` writes to (its ``using()`` or the router's)."""
    # select_for_update() marks the copy as a write without running it, so
    # .db answers with the alias an update() or delete() would use.
    return qs.select_for_update().db


class FencedQuerySet(models.QuerySet):
    """QuerySet with ``fenced(held)``: bulk writes guarded by a fencing token.

    ``qs.fenced(held).update(**kwargs)`` and ``qs.fenced(held).delete()`` are
    all-or-nothing: inside one transaction (a savepoint when one is already
    open) they write the rows whose stored token is not newer than
    ``held.fencing_token``, stamp them with it, and, if any row of ``qs``
    carries a newer token, roll everything back and raise
    :class:`~django_distlock.exceptions.StaleFencingToken`. Without
    ``fenced()`` the queryset behaves like any other and leaves the tokens
    alone.
    """

    #: The held lock (or Lease) that fences ``update()`` and ``delete()``.
    #: ``fenced()`` sets it on a subclass made for the purpose, so that every
    #: queryset chained from a fenced one (``.filter()``, ``.exclude()``, ...)
    #: is fenced too: Django copies a queryset by calling its class.
    fence: Lock | Lease | None = None

    def unfenced(self) -> FencedQuerySet:
        """Return a copy of this queryset whose writes are not fenced."""
        clone = self.all()
        cls = type(self)
        while cls.fence is not None:
            cls = cls.__bases__[0]
        clone.__class__ = cls
        return clone

    def fenced(self, held: Lock | Lease) -> FencedQuerySet:
        """Return a copy whose ``update()`` and ``delete()`` are fenced by ``held``.

        ``held`` is checked now and again at write time.
        """
        held_lease(held)
        clone = self.unfenced()
        base = type(clone)
        clone.__class__ = type(
            base.__name__,
            (base,),
            {"fence": held, "__module__": base.__module__},
        )
        return clone

    def update(self, **kwargs: Any) -> int:
        """Update the rows; when fenced, all of them or none (see the class)."""
        if self.fence is None:
            return super().update(**kwargs)
        if FENCING_FIELD in kwargs:
            raise TypeError(
                f"A fenced update() sets {FENCING_FIELD} itself; do not pass it."
            )
        lease = held_lease(self.fence)
        token = lease.fencing_token
        plain = self.unfenced()
        with transaction.atomic(using=write_db(plain)):
            updated = plain.filter(**{f"{FENCING_FIELD}__lte": token}).update(
                **kwargs, **{FENCING_FIELD: token}
            )
            raise_if_newer(plain, lease)
        return updated

    update.alters_data = True

    def delete(self) -> tuple[int, dict[str, int]]:
        """Delete the rows; when fenced, all of them or none (see the class)."""
        if self.fence is None:
            return super().delete()
        lease = held_lease(self.fence)
        plain = self.unfenced()
        with transaction.atomic(using=write_db(plain)):
            claim_rows(plain, lease)
            return plain.filter(
                **{f"{FENCING_FIELD}__lte": lease.fencing_token}
            ).delete()

    delete.alters_data = True
    delete.queryset_only = True


class FencedManager(models.Manager.from_queryset(FencedQuerySet)):
    """The default manager of FencedModel: ``Model.objects.fenced(held)``."""
