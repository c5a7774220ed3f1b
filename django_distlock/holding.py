"""What a lock handle records around each acquisition and release.

:class:`Holding` is the part of :class:`~django_distlock.locking.Lock` that
keeps the leases a handle holds (each with the renewal lane renewing it, if
any), registers them with the watchdog, records who holds them (to explain
a ``LockNotAcquired``), sends the signals and reports losses. The handle's
public methods (``acquire``, ``release``, ``with``...) live in
:mod:`django_distlock.locking` and call these steps.

The uncontended cycle passes through here twice, so every step does only
what the lease at hand needs: no renewal objects when ``auto_renew`` is off,
no signal arguments built when nobody listens, no log formatting.
"""

from __future__ import annotations

import logging
import time
from typing import Any
from weakref import ref

from .backends.base import BaseLockBackend, Holder, Lease, running_task
from .busy import caller, held_by, not_acquired
from .exceptions import InvalidLockBackendError, LockLost, LockNotAcquired, LockNotHeld
from .handler import locks
from .losses import _Canceller, _cancellers
from .signals import lock_acquired, lock_contended, lock_error, lock_released
from .watchdog import (
    async_watchdog,
    discard_on_loss,
    get_watchdog,
    on_loss,
    report_lost,
)

__all__ = ["DEFAULT", "Holding"]

acquire_log = logging.getLogger("django_distlock.acquire")
release_log = logging.getLogger("django_distlock.release")


class _Default:
    def __repr__(self) -> str:
        return "<default>"


#: Stands for "the alias's configured value" (``None`` means "wait forever").
DEFAULT: Any = _Default()


class Holding:
    """The lease bookkeeping of a lock handle (a mixin of ``Lock``).

    ``_leases`` holds ``(lease, renewer, backend)`` triples, innermost
    last; the renewer is the watchdog lane renewing the lease, or None, and
    the backend the one that granted it (which releases it).
    """

    name: str
    using: str
    kind: Any
    _auto_renew: bool | None
    _max_hold: Any
    _cancel_on_lost: bool
    _leases: list[tuple[Lease, Any, BaseLockBackend]]
    _last_lease: Lease | None

    def _acquired(
        self, backend, lease, started, wait, *, asynchronous: bool = False
    ) -> bool:
        if lease is None:
            waited = time.monotonic() - started
            acquire_log.debug("Lock %r busy after %.3f s", self.name, waited)
            if lock_contended.receivers:
                lock_contended.send(
                    sender=type(backend),
                    alias=backend.alias,
                    name=self.name,
                    lease=None,
                    wait=waited,
                    timeout=wait,
                    kind=self.kind.mode,
                )
            return False
        renew = self._auto_renew
        if renew is None:
            renew = backend.auto_renew
        if renew:
            # The thread renews sync leases; the loop's task renews async ones
            # (looked up only when it will be used). The handle keeps the
            # alias's lane: the release goes straight to it.
            dog = async_watchdog() if asynchronous else get_watchdog()
            renewer = dog.lane(backend.alias)
            max_hold = self._max_hold
            if max_hold is DEFAULT:
                max_hold = backend.max_hold
            renewer.register(backend, lease, max_hold)
            self._leases.append((lease, renewer, backend))
        else:
            self._leases.append((lease, None, backend))
        if self._cancel_on_lost:
            task = running_task()
            if task is not None:
                canceller = _cancellers[lease] = _Canceller(task)
                on_loss(lease, canceller)
        if not backend.reentrant:
            thread, task = caller()
            held_by[id(lease)] = (ref(lease), backend.alias, self.name, thread, task)
            if len(held_by) >= held_by.limit:
                held_by.prune()
        if lock_acquired.receivers:  # skip building the call when nobody listens
            lock_acquired.send(
                sender=type(backend),
                alias=backend.alias,
                name=self.name,
                lease=lease,
                wait=time.monotonic() - started,
                kind=lease.kind.mode,
            )
        return True

    def _failed(self, backend, started, exc: Exception) -> None:
        if lock_error.receivers:
            lock_error.send(
                sender=type(backend),
                alias=backend.alias,
                name=self.name,
                lease=None,
                wait=time.monotonic() - started,
                error=exc,
                kind=self.kind.mode,
            )

    def _no_such_alias(self) -> None:
        """Raise a clearer error if ``using`` is no alias (else return)."""
        if self.using in locks.settings:
            return  # the alias's backend cannot load: that message is clear
        configured = ", ".join(map(repr, locks.settings))
        raise InvalidLockBackendError(
            f"Lock {self.name!r}: using={self.using!r} is not an alias of "
            f"settings.LOCKS (configured: {configured})."
        ) from None

    def _backend(self) -> BaseLockBackend:
        """Return the backend of the handle's alias (a clear error if none)."""
        try:
            return locks[self.using]
        except InvalidLockBackendError:
            self._no_such_alias()
            raise

    def _holder_unknown(self) -> None:
        # Naming the holder is a courtesy: its failure must not replace the
        # LockNotAcquired being raised.
        acquire_log.debug(
            "Could not look up the holder of %r", self.name, exc_info=True
        )
        return None

    def _not_acquired(self, holder: Holder | None) -> LockNotAcquired:
        """Return the LockNotAcquired to raise, naming ``holder`` if known."""
        return not_acquired(self, holder)

    def _not_held(self) -> LockNotHeld:
        return LockNotHeld(
            f"Lock {self.name!r} is not held by this handle.", name=self.name
        )

    def _current(self) -> tuple[BaseLockBackend, Lease]:
        if not self._leases:
            raise self._not_held()
        lease, _, backend = self._leases[-1]
        lease.check_owner_process()
        if lease.lost:
            self._lost(backend, lease, "the lease was lost earlier")
        return backend, lease

    def _pop(self) -> tuple[BaseLockBackend, Lease]:
        leases = self._leases
        if not leases:
            raise self._not_held()
        lease, renewer, backend = leases[-1]
        lease.check_owner_process()
        leases.pop()
        self._last_lease = lease
        held_by.pop(id(lease), None)
        if self._cancel_on_lost:
            canceller = _cancellers.pop(lease, None)
            if canceller is not None:
                canceller.active = False
                discard_on_loss(lease, canceller)
        if renewer is not None:
            renewer.unregister(lease)
        return backend, lease

    def _released(self, backend, lease, ok: bool) -> None:
        if not ok or lease.lost:
            self._lost(backend, lease, "the lease was gone at release")
        if lock_released.receivers:
            lock_released.send(
                sender=type(backend),
                alias=backend.alias,
                name=self.name,
                lease=lease,
                held=time.time() - lease.acquired_at,
                kind=lease.kind.mode,
            )

    def _lost(self, backend, lease, reason: str) -> None:
        report_lost(backend, lease, reason)
        raise LockLost(
            f"Lock {self.name!r} was lost before this call: {reason}.", name=self.name
        )
