"""How a holder learns that its lease was lost: ``held.lost`` and ``on_lost``.

:class:`LossEvent` is the read-only event behind ``held.lost``;
:class:`_Canceller` cancels the asyncio task of an ``on_lost="cancel"``
block. Both are called by the watchdog's loss callbacks.
"""

from __future__ import annotations

import asyncio
import threading
from weakref import WeakKeyDictionary

from .backends.base import Lease, running_task
from .watchdog import on_loss

__all__ = ["LossEvent"]


class LossEvent:
    """Set once the lease it watches is known lost: ``held.lost``.

    A read-only :class:`threading.Event`: check it with :meth:`is_set` between
    steps of long work, or block on it with :meth:`wait`. It is set when the
    loss is known (the watchdog's renewal finds the lease gone, the backend
    stayed unreachable until the lease expired, or a call of the handle
    found it gone), never cleared.
    """

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = threading.Event()

    def is_set(self) -> bool:
        """Return True once the lease is known lost."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the lease is known lost or ``timeout`` passes.

        Return :meth:`is_set`, like :meth:`threading.Event.wait`.
        """
        return self._event.wait(timeout)

    def __repr__(self) -> str:
        return f"<LossEvent {'set' if self.is_set() else 'unset'}>"


#: Lease -> its LossEvent, made the first time ``held.lost`` is read.
_loss_events: WeakKeyDictionary = WeakKeyDictionary()
_loss_events_lock = threading.Lock()


def _loss_event(lease: Lease) -> LossEvent:
    with _loss_events_lock:
        event = _loss_events.get(lease)
        if event is None:
            event = _loss_events[lease] = LossEvent()
            on_loss(lease, event._event.set)
    return event


class _Canceller:
    """Cancel the task holding a lease when the lease is reported lost
    (``on_lost="cancel"``), unless the task has left the block since."""

    __slots__ = ("task", "loop", "active", "fired", "__weakref__")

    def __init__(self, task: asyncio.Task) -> None:
        self.task = task
        self.loop = task.get_loop()
        self.active = True
        self.fired = False

    def __call__(self) -> None:
        if not self.active or running_task() is self.task:
            # The task itself found the loss (extend, release): it gets LockLost.
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            self.cancel()
        else:
            try:
                self.loop.call_soon_threadsafe(self.cancel)
            except RuntimeError:  # the loop is closed: no task left to stop
                pass

    def cancel(self) -> None:
        # Run on the task's loop: ``active`` is cleared there, before the
        # first await of leaving the block, so the cancellation can only
        # land inside the block.
        if self.active and not self.task.done():
            self.fired = True
            self.task.cancel()


#: Lease -> the _Canceller of its task, for handles with on_lost="cancel".
_cancellers: WeakKeyDictionary = WeakKeyDictionary()
