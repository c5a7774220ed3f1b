"""What the metrics and tracing integrations share: listening to the lock
signals under one ``dispatch_uid`` per instance."""

from __future__ import annotations

from ..signals import (
    lock_acquired,
    lock_contended,
    lock_error,
    lock_lost,
    lock_released,
)

__all__ = ["LockSignalReceiver"]


class LockSignalReceiver:
    """Receives ``lock_acquired``, ``lock_contended``, ``lock_error``,
    ``lock_released`` and ``lock_lost`` in the methods ``_acquired``,
    ``_contended``, ``_error``, ``_released`` and ``_lost`` of a subclass."""

    @property
    def _uid(self) -> str:
        return f"{type(self).__module__}:{id(self)}"

    def connect(self) -> None:
        """Start receiving the lock signals."""
        uid = self._uid
        lock_acquired.connect(self._acquired, weak=False, dispatch_uid=uid)
        lock_contended.connect(self._contended, weak=False, dispatch_uid=uid)
        lock_error.connect(self._error, weak=False, dispatch_uid=uid)
        lock_released.connect(self._released, weak=False, dispatch_uid=uid)
        lock_lost.connect(self._lost, weak=False, dispatch_uid=uid)

    def disconnect(self) -> None:
        """Stop receiving them."""
        uid = self._uid
        for signal in (lock_acquired, lock_contended, lock_error, lock_released):
            signal.disconnect(dispatch_uid=uid)
        lock_lost.disconnect(dispatch_uid=uid)
