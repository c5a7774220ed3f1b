"""Models: the database backend's lock table, the admin anchor, FencedModel."""

from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.db import IntegrityError, models, router, transaction
from django.utils.translation import gettext_lazy as _

from .fencing import (
    FENCING_FIELD,
    FencedManager,
    FencingTokenField,
    claim_row,
    claim_rows,
    held_lease,
    stale,
)

if TYPE_CHECKING:
    from .backends.base import Lease
    from .locking import Lock as LockHandle

__all__ = ["FencedModel", "Lock", "LockRecord", "LockShare"]


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


class LockShare(models.Model):
    """One shared holder, semaphore permit or queued waiter of the database backend.

    A shared lock or a semaphore keeps its :class:`LockRecord` row (the row
    the database locks while a holder is added or removed, and the fencing
    counter); each of its leases is a row here, keyed by ``token``, under the
    record's ``digest``. ``kind`` is ``"shared"`` or ``"permit"`` for a
    lease, ``"writer"`` for an exclusive waiter that new shared requests
    queue behind, ``"queued"`` for a permit waiter (granted in the order
    they queued: ``acquired_at``, then ``id``), ``"free"`` for a row that
    PostgreSQL keeps for the name's next holder or waiter (no token).
    ``permits`` is the semaphore's limit. Every row expires at
    ``expires_at`` (the database's clock, UTC) unless renewed. A permit
    waiter that listens for a handover (PostgreSQL) also stores the
    ``ttl`` of the permit it asks for and the ``channel`` its connection
    listens on (its connection holds an advisory lock on the channel's
    name while it lives): a release grants it the permit there, unless
    that connection has gone. The
    backend reads and writes this table with raw SQL; treat it as read-only.
    """

    digest = models.CharField(max_length=64)
    kind = models.CharField(max_length=8)
    permits = models.IntegerField(null=True, blank=True)
    token = models.CharField(max_length=32)
    fence = models.BigIntegerField(default=0)
    host = models.CharField(max_length=255, blank=True, default="")
    pid = models.IntegerField(null=True, blank=True)
    thread = models.CharField(max_length=255, blank=True, default="")
    acquired_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()
    ttl = models.FloatField(null=True, blank=True)
    # NULL, not "": the waiter listens for no handover (and the raw INSERTs
    # that leave the column out need no database default).
    channel = models.CharField(max_length=63, null=True, blank=True)  # noqa: DJ001

    class Meta:
        db_table = "django_distlock_lockshare"
        verbose_name = _("lock share")
        # One index serves every lookup of a holder or waiter: each names
        # the digest, which has a handful of rows. The token is left out so
        # that PostgreSQL reuses a free row by an update that touches no
        # index (migration 0007). (As a field option, an indexed digest
        # would cost every insert its LIKE copy too, which no query uses.)
        indexes = [models.Index(fields=["digest"], name="distlock_share_digest")]

    def __str__(self) -> str:
        return f"{self.kind} {self.token}"


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

    fencing_token = FencingTokenField(default=0, editable=False)

    objects = FencedManager()

    class Meta:
        abstract = True

    def save(
        self, *args: Any, fence: "LockHandle | Lease | None" = None, **kwargs: Any
    ) -> None:
        """Save the instance; with ``fence=held``, only if no newer holder wrote.

        A fenced save runs in one transaction (a savepoint inside an open
        one): a conditional UPDATE first stamps the row with
        ``held.fencing_token`` (and locks it), then Django's own ``save()``
        writes the instance. A new row is INSERTed with the token; a row
        deleted since it was loaded is not re-created. Raise
        StaleFencingToken (nothing written, no signal sent), LockNotHeld or
        LockLost.
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
        previous = self.fencing_token
        self.fencing_token = lease.fencing_token
        try:
            self._save_fenced(lease, kwargs)
        except BaseException:
            self.fencing_token = previous
            raise
        return None

    save.alters_data = True

    def _save_fenced(self, lease: "Lease", kwargs: dict[str, Any]) -> None:
        using = kwargs["using"]
        token_model = self._meta.get_field(FENCING_FIELD).model
        # Every table of a multi-table model shares the primary key's value.
        row = token_model._base_manager.using(using).filter(pk=self.pk)
        force_insert = kwargs.get("force_insert")
        while True:
            if self.pk is not None and not force_insert:
                # The claim locks the row until this block commits, so
                # Django's UPDATE after it cannot be overtaken.
                with transaction.atomic(using=using):
                    if claim_row(row, self.pk, lease, adding=self._state.adding):
                        super().save(**kwargs)
                        return
                if kwargs.get("update_fields") or kwargs.get("force_update"):
                    raise stale(lease, token_model, self.pk, None)
            try:
                # No row yet: INSERT only, so that a row another holder
                # creates meanwhile is never overwritten by an UPDATE.
                with transaction.atomic(using=using):
                    super().save(**{**kwargs, "force_insert": True})
                return
            except IntegrityError:
                if self.pk is None or force_insert:
                    raise
                # Created by another holder since the claim: claim it now,
                # so a newer holder's row wins and an older one's is not.

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
        with transaction.atomic(using=using):
            row = token_model._base_manager.using(using).filter(pk=self.pk)
            if not claim_rows(row, lease):
                raise stale(lease, token_model, self.pk, None)
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
