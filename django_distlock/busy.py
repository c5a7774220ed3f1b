"""What a handle says when it cannot take its lock.

The :class:`~django_distlock.exceptions.LockNotAcquired` of a busy lock or a
full semaphore (naming the holder, and a handle's own earlier acquisition
when that is the reason), and the refusal of a kind of acquisition that the
alias's backend does not offer.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING

from .backends.base import SHARED, BaseLockBackend, Holder, Kind, running_task
from .exceptions import InvalidLockBackendError, LockNotAcquired

if TYPE_CHECKING:
    from .locking import Lock

__all__ = ["held_by", "caller", "not_acquired", "permits_taken", "refuse_kind"]


class HeldLeases(dict):
    """The leases of non-reentrant backends held right now in this process:
    ``id(lease)`` -> (weak reference to the lease, alias, name, thread and
    task of its acquirer). Read only to explain a LockNotAcquired.

    The reference is weak so that a handle dropped while holding frees its
    lease (whose renewal then stops: the watchdog's references are weak
    too); a plain reference per entry costs a cycle less than a
    WeakKeyDictionary's. A release removes its entry. The entries of leases
    collected without one are pruned when the dict reaches :attr:`limit`,
    which then doubles past what remains: O(1) per acquisition.
    """

    #: The size at which the next acquisition prunes.
    limit = 1024

    def prune(self) -> None:
        """Forget the entries whose lease was collected."""
        for key, entry in list(self.items()):
            if entry[0]() is None:
                self.pop(key, None)
        self.limit = max(HeldLeases.limit, 2 * len(self))


held_by = HeldLeases()


def caller() -> tuple[int, int]:
    """Return (thread ident, id of the running asyncio task or 0)."""
    if sys.get_asyncgen_hooks().firstiter is None:  # no loop runs here
        return threading.get_ident(), 0  # (running_task() says why)
    task = running_task()
    return threading.get_ident(), id(task) if task is not None else 0


def _since(holder: Holder) -> tuple[str, float | None]:
    """Return " since ..., its lease expiring in ... s" and the seconds left."""
    text, expires_in = "", None
    acquired = holder.acquired_at
    if acquired is not None:
        text += f" since {acquired.isoformat(timespec='seconds')}"
    expires = holder.expires_ts
    if expires is not None:
        expires_in = max(0.0, expires - time.time())
        text += f", its lease expiring in {expires_in:.1f} s"
    return text, expires_in


def not_acquired(handle: Lock, holder: Holder | None) -> LockNotAcquired:
    """Return the LockNotAcquired of a busy lock, naming ``holder`` if known."""
    message = f"Lock {handle.name!r} was not acquired within {handle.timeout} s"
    expires_in = None
    if holder is None:
        message += "."
    else:
        since, expires_in = _since(holder)
        message += f": it is held by {holder.holder}{since}."
    key = (handle.backend.alias, handle.name, *caller())
    try:
        held = list(held_by.values())
    except RuntimeError:  # another thread changed it while it was copied
        held = []
    # A permit of the semaphore of the same name is no hold on this lock.
    modes = {
        lease.kind.mode
        for entry in held
        if entry[1:] == key
        and (lease := entry[0]()) is not None
        and lease.kind.mode != "permit"
    }
    nested = bool(modes)
    if nested and not handle.kind.exclusive:
        message += (
            " This thread (or task) already holds it through another handle: "
            "shared locks do not nest with their holder's other acquisitions."
        )
    elif "shared" in modes:
        message += (
            " This thread (or task) already holds it shared through another "
            "handle: a reader cannot take it exclusively as well (there is no "
            "upgrade); release the shared lock first."
        )
    elif nested:
        message += (
            " This thread (or task) already holds it through another handle, "
            f"and the {handle.using!r} backend does not nest: use "
            "django_distlock.backends.redis.ReentrantRedisLockBackend for "
            "locks that their holder takes again."
        )
    exc = LockNotAcquired(
        message, name=handle.name, holder=holder, expires_in=expires_in
    )
    exc.kind = handle.kind  # what was asked for: 423 or 429 in a view
    return exc


def permits_taken(handle: Lock, holder: Holder | None) -> LockNotAcquired:
    """Return the LockNotAcquired of a full semaphore.

    ``holder`` is the permit that expires first, if known.
    """
    message = (
        f"Semaphore {handle.name!r} was not acquired within {handle.timeout} s: "
        f"all {handle.kind.limit} permits are held"
    )
    expires_in = None
    if holder is not None:
        since, expires_in = _since(holder)
        message += f"; the first to expire is held by {holder.holder}{since}"
    exc = LockNotAcquired(
        message + ".", name=handle.name, holder=holder, expires_in=expires_in
    )
    exc.kind = handle.kind
    return exc


def refuse_kind(name: str, kind: Kind, backend: BaseLockBackend) -> None:
    """Raise InvalidLockBackendError: ``backend`` does not offer ``kind``."""
    what = "shared locks" if kind is SHARED else "semaphores"
    noun = "Semaphore" if kind.mode == "permit" else "Lock"
    raise InvalidLockBackendError(
        f"{noun} {name!r}: LOCKS[{backend.alias!r}] uses "
        f"{type(backend).__name__}, which does not offer {what} "
        f"(it offers: {', '.join(sorted(backend.kinds))})."
    )
