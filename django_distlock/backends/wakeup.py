"""A one-shot awaitable that resumes its task in the same loop iteration.

An ``asyncio.Future`` never runs its callbacks itself: ``set_result()``
schedules them with ``call_soon``, so a task waiting for a socket is resumed
one loop iteration after its bytes arrived, and that iteration costs a
``select`` and the loop's bookkeeping of its own. For a Redis command that
is a loop iteration in two, and on a fast network it is a good part of an
asyncio client's whole cost.

:class:`Wakeup` speaks the protocol a ``Task`` expects from what it awaits
(``_asyncio_future_blocking``, ``get_loop``, ``add_done_callback``,
``cancel``, ``result``) and, when set from a plain callback (a protocol's
``data_received``, where no task is running), steps the waiting task right
there, in the task's own context. Anywhere else (inside a task, or once
cancelled), it falls back to ``call_soon``, exactly like a future.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["Wakeup"]

_current_task = asyncio.current_task


class Wakeup:
    """A future-like object for one task to wait on, set at most once."""

    __slots__ = ("_asyncio_future_blocking", "_callback", "_context", "_loop", "_state")

    _PENDING, _SET, _CANCELLED = 0, 1, 2

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._state = self._PENDING
        self._callback = None
        self._context = None
        # Set by __await__ before yielding, cleared by the Task: how a Task
        # tells a future-like it must wait on from a bare ``yield``.
        self._asyncio_future_blocking = False

    def __await__(self):
        if self._state == self._PENDING:
            self._asyncio_future_blocking = True
            yield self
        if self._state == self._CANCELLED:
            raise asyncio.CancelledError
        return None

    def set(self) -> None:
        """Resume the waiting task: at once from a plain callback, else soon."""
        if self._state != self._PENDING:
            return
        self._state = self._SET
        callback, self._callback = self._callback, None
        if callback is None:
            return  # nobody awaits yet: __await__ will not yield
        loop = self._loop
        if self._context is not None and _current_task(loop) is None:
            try:
                self._context.run(callback, self)
                return
            except RuntimeError:
                # Refused before the task took a step (its context or
                # another task is running already): leave it to the loop.
                pass
        loop.call_soon(callback, self, context=self._context)

    # -- what a Task calls on the object it awaits --------------------------

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def add_done_callback(self, fn, *, context=None) -> None:
        if self._state != self._PENDING:
            self._loop.call_soon(fn, self, context=context)
            return
        self._callback = fn
        self._context = context

    def remove_done_callback(self, fn) -> int:
        if self._callback is fn:
            self._callback = None
            return 1
        return 0

    def cancel(self, msg: Any = None) -> bool:
        if self._state != self._PENDING:
            return False
        self._state = self._CANCELLED
        callback, self._callback = self._callback, None
        if callback is not None:
            self._loop.call_soon(callback, self, context=self._context)
        return True

    def cancelled(self) -> bool:
        return self._state == self._CANCELLED

    def done(self) -> bool:
        return self._state != self._PENDING

    def result(self) -> None:
        if self._state == self._CANCELLED:
            raise asyncio.CancelledError
        if self._state == self._PENDING:
            raise asyncio.InvalidStateError("Result is not set.")
        return None

    def exception(self) -> BaseException | None:
        if self._state == self._CANCELLED:
            raise asyncio.CancelledError
        return None
