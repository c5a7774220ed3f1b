"""Models: the database backend's lock table, the admin anchor, FencedModel."""

from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.db import IntegrityError, connections, models, router, transaction
from django.utils.translation import gettext_lazy as _

from .exceptions import StaleFencingToken
from .fencing import (
    FENCING_FIELD,
    FencedManager,
    claim_rows,
    held_lease,
    stale,
    update_row,
)

if TYPE_CHECKING:
    from .backends.base import Lease
    from .locking import Lock as LockHandle

__all__ = ["FencedModel", "Lock", "LockRecord"]


class LockRecord(models.Model):
    """One row per lock name used with the database backend.

    The row outlives its leases: ``fence`` (the last fencing token handed
    out) must never go back, so a released lock keeps its row with ``token``
    cleared. ``locks clear --stale`` deletes free and expired rows, first
    raising the fence floor (the row whose ``digest`` is ``""``), from which
    a re-created row starts counting, so tokens survive that too.

    Times are written by the database's own clock, in UTC. ``name`` is the
    lock name with backslash, NUL and lone surrogates backslash-escaped
    (:func:`django_distlock.backends.database.decode_name` reverses it).
    The backend reads and writes this table with raw SQL on its own
    connections; treat it as read-only.
    """

    digest = models.CharField(max_length=64, unique=True)
    namespace = models.CharField(max_length=255, blank=True, default="")
    name = models.TextField()
    token = models.CharField(max_length=32, null=True, blank=True)  # noqa: DJ001 (NULL = free)
    fence = models.BigIntegerField(default=0)
    host = models.CharField(max_length=255, blank=True, default="")
    pid = models.IntegerField(null=True, blank=True)
    thread = models.CharField(max_length=255, blank=True, default="")
    acquired_at = models.DateTimeField(null=True, blank=True)
    # Not indexed on purpose: every acquisition and renewal rewrites it, and
    # an index would turn PostgreSQL's cheap HOT updates into index writes.
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "django_distlock_lockrecord"
        verbose_name = _("lock record")

    def __str__(self) -> str:
        return self.name


class Lock(models.Model):
    """Anchor for the admin ``Locks`` page: no table of its own.

    Active holders live in the backends (Redis keys, lock table rows); this
    unmanaged model gives the admin page its URL, its place in the app index
    and its permissions (``view_lock``, ``release_lock``).
    """

    name = models.TextField()

    class Meta:
        managed = False
        default_permissions = ("view",)
        permissions = [("release_lock", _("Can force-release a lock"))]
        verbose_name = _("lock")
        verbose_name_plural = _("locks")

    def __str__(self) -> str:
        return self.name


class FencedModel(models.Model):
    """Abstract model whose writes can be fenced by a lock's fencing token.

    ``fencing_token`` stores the token of the last fenced write to the row.
    ``save(fence=held)`` and ``delete(fence=held)`` (``held``: a held
    :class:`~django_distlock.locking.Lock` or its Lease) write only if that
    token is not newer than ``held.fencing_token``, and otherwise raise
    :class:`~django_distlock.exceptions.StaleFencingToken` and write nothing.
    Saves without ``fence`` are Django's ordinary saves, except that an
    UPDATE never changes ``fencing_token`` (an unfenced write must not move
    the fence back). ``objects`` is a :class:`~django_distlock.fencing.FencedManager`
    (``Model.objects.fenced(held).update(...)``). See ``docs/fencing.md``.
    """

    fencing_token = models.BigIntegerField(default=0, editable=False)

    objects = FencedManager()

    class Meta:
        abstract = True

    def save(
        self, *args: Any, fence: "LockHandle | Lease | None" = None, **kwargs: Any
    ) -> None:
        """Save the instance; with ``fence=held``, only if no newer holder wrote.

        A fenced save of an existing row is one conditional UPDATE that also
        stores ``held.fencing_token``; a new row is INSERTed with it. A row
        deleted since it was loaded is not re-created. ``pre_save`` is sent
        before the attempt, ``post_save`` only after a successful write.
        Raise StaleFencingToken (nothing written), LockNotHeld or LockLost.
        """
        if fence is None:
            return super().save(*args, **kwargs)
        if args:
            raise TypeError("save(fence=...) takes keyword arguments only.")
        lease = held_lease(fence)
        update_fields = kwargs.get("update_fields")
        if update_fields is not None:
            if not update_fields:
                return None  # Django's no-op save: nothing written, no signals.
            kwargs["update_fields"] = {*update_fields, FENCING_FIELD}
        using = kwargs.get("using") or router.db_for_write(type(self), instance=self)
        kwargs["using"] = using
        connection = connections[using]
        # Rows of several tables (multi-table inheritance) must all be written
        # or none: a refusal in one table rolls the others back.
        several_tables = bool(self._meta.concrete_model._meta.parents)
        in_atomic = connection.in_atomic_block
        rollback_before = connection.needs_rollback
        previous = self.fencing_token
        self.fencing_token = lease.fencing_token
        self._distlock_fence = lease
        self._distlock_force_insert = bool(kwargs.get("force_insert"))
        try:
            with transaction.atomic(using=using) if several_tables else nullcontext():
                super().save(**kwargs)
        except StaleFencingToken:
            self.fencing_token = previous
            if in_atomic and not several_tables and not rollback_before:
                # save_base() marked the enclosing atomic block for rollback,
                # but the refused write changed nothing: the transaction is
                # as good as before, so the caller may handle the refusal.
                transaction.set_rollback(False, using=using)
            raise
        except BaseException:
            self.fencing_token = previous
            raise
        finally:
            del self._distlock_fence, self._distlock_force_insert
        return None

    save.alters_data = True

    async def asave(
        self, *args: Any, fence: "LockHandle | Lease | None" = None, **kwargs: Any
    ) -> None:
        """Async twin of :meth:`save`."""
        if fence is None:
            return await super().asave(*args, **kwargs)
        return await sync_to_async(self.save)(*args, fence=fence, **kwargs)

    asave.alters_data = True

    def delete(
        self,
        using: str | None = None,
        keep_parents: bool = False,
        *,
        fence: "LockHandle | Lease | None" = None,
    ) -> tuple[int, dict[str, int]]:
        """Delete the instance; with ``fence=held``, only if no newer holder wrote.

        The fenced delete runs in a transaction that first stamps the row with
        ``held.fencing_token`` (locking it), then deletes it and what cascades
        from it. Raise StaleFencingToken (nothing deleted) if the row is newer
        or already gone.
        """
        if fence is None:
            return super().delete(using=using, keep_parents=keep_parents)
        lease = held_lease(fence)
        if self.pk is None:
            return super().delete(using=using, keep_parents=keep_parents)
        using = using or router.db_for_write(type(self), instance=self)
        token_model = self._meta.get_field(FENCING_FIELD).model
        pk = self._get_pk_val(token_model._meta)
        with transaction.atomic(using=using):
            row = token_model._base_manager.using(using).filter(pk=pk)
            if not claim_rows(row, lease):
                raise stale(lease, token_model, pk, None)
            return super().delete(using=using, keep_parents=keep_parents)

    delete.alters_data = True

    async def adelete(
        self,
        using: str | None = None,
        keep_parents: bool = False,
        *,
        fence: "LockHandle | Lease | None" = None,
    ) -> tuple[int, dict[str, int]]:
        """Async twin of :meth:`delete`."""
        return await sync_to_async(self.delete)(
            using=using, keep_parents=keep_parents, fence=fence
        )

    adelete.alters_data = True

    def _is_token_table(self, model: type[models.Model]) -> bool:
        token_model = self._meta.get_field(FENCING_FIELD).model
        return model._meta.concrete_model is token_model._meta.concrete_model

    def _do_update(self, base_qs, using, pk_val, values, update_fields, forced_update):
        if not self._is_token_table(base_qs.model):
            return super()._do_update(
                base_qs, using, pk_val, values, update_fields, forced_update
            )
        values = [v for v in values if v[0].attname != FENCING_FIELD]
        lease = getattr(self, "_distlock_fence", None)
        if lease is None:
            return super()._do_update(
                base_qs, using, pk_val, values, update_fields, forced_update
            )
        field = self._meta.get_field(FENCING_FIELD)
        values.append((field, None, lease.fencing_token))
        return update_row(self, base_qs, pk_val, values, lease)

    def _do_insert(self, manager, using, fields, returning_fields, raw):
        lease = getattr(self, "_distlock_fence", None)
        meta = manager.model._meta
        if (
            lease is None
            or not self._is_token_table(manager.model)
            or self._get_pk_val(meta) is None
            or getattr(self, "_distlock_force_insert", False)
        ):
            return super()._do_insert(manager, using, fields, returning_fields, raw)
        # A row with a chosen pk may be created concurrently by another holder:
        # then the INSERT fails and the write becomes a conditional UPDATE, so
        # a newer holder's row wins and an older one's is overwritten.
        if connections[using].in_atomic_block:
            guard = transaction.atomic(using=using)
        else:
            guard = nullcontext()
        try:
            with guard:
                return super()._do_insert(manager, using, fields, returning_fields, raw)
        except IntegrityError:
            values = [
                (f, None, f.pre_save(self, False)) for f in fields if not f.primary_key
            ]
            base_qs = manager.using(using)
            if update_row(self, base_qs, self._get_pk_val(meta), values, lease):
                return []
            raise
