"""Models: the database backend's lock table, the admin anchor, FencedModel."""

from django.db import models
from django.utils.translation import gettext_lazy as _

__all__ = ["FencedModel", "Lock", "LockRecord"]


class LockRecord(models.Model):
    """One row per lock name used with the database backend.

    The row outlives its leases: ``fence`` (the last fencing token handed
    out) must never go back, so a released lock keeps its row with ``token``
    cleared.
    """

    digest = models.CharField(max_length=43, unique=True)
    name = models.TextField()
    token = models.CharField(max_length=32, null=True, blank=True)  # noqa: DJ001 (NULL = free)
    fence = models.BigIntegerField(default=0)
    host = models.CharField(max_length=255, blank=True, default="")
    pid = models.IntegerField(null=True, blank=True)
    thread = models.CharField(max_length=255, blank=True, default="")
    acquired_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True, db_index=True)

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
    """Abstract model whose writes can be fenced by a lock's fencing token."""

    fencing_token = models.BigIntegerField(default=0, editable=False)

    class Meta:
        abstract = True
