"""Hand a worker thread's result to the task awaiting it, or give it back.

Cancelling a task that awaits ``sync_to_async`` does not stop the thread: an
acquisition running there may obtain a lease after its task was cancelled,
and nobody would hold it. :class:`Handoff` makes exactly one side give it
back.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async

__all__ = ["MAX_WAITS", "Handoff"]

#: Threads for the waits that block until a release wakes them: a pool of
#: their own, never the event loop's default executor, where the holders'
#: releases run (waits filling it would hold those up until they time out).
MAX_WAITS = 32
_waits: ThreadPoolExecutor | None = None
_waits_lock = threading.Lock()


def _wait_pool() -> ThreadPoolExecutor:
    global _waits
    with _waits_lock:
        if _waits is None:
            _waits = ThreadPoolExecutor(MAX_WAITS, thread_name_prefix="distlock-wait")
        return _waits


def _forget_wait_pool() -> None:
    # A forked child has none of the parent's threads (nor a lock one of
    # them held): a pool of its own.
    global _waits, _waits_lock
    _waits, _waits_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_wait_pool)


class Handoff:
    """A worker thread's result, for its awaiting task or, if it left, ``undo``.

    Cancelling a task that awaits ``sync_to_async`` does not stop the thread:
    what an acquisition obtains after its task was cancelled must be given
    back. Exactly one side undoes it: the thread, if the task left before the
    result was ready, or the task, if the result was ready but never reached
    it.
    """

    def __init__(self, undo: Callable[[Any], None]):
        self._lock = threading.Lock()
        self._undo = undo
        self.abandoned = False
        self._delivered = False
        self._result: Any = None

    def run(self, func: Callable[..., Any], *args: Any) -> Any:
        """Return ``func(*args)``, undone at once if the task has left."""
        result = func(*args)
        with self._lock:
            if not self.abandoned:
                self._delivered = True
                self._result = result
                return result
        self._undo(result)
        return result

    def abandon(self) -> None:
        """Mark the task gone; undo a result that was ready, in a thread."""
        with self._lock:
            self.abandoned = True
            delivered, result = self._delivered, self._result
        if delivered:
            threading.Thread(
                target=self._undo, args=(result,), name="distlock-undo"
            ).start()

    async def arun(self, func: Callable[..., Any], *args: Any) -> Any:
        """Await :meth:`run` in a worker thread; abandon it if cancelled."""
        try:
            return await _run_in_thread(self, func, *args)
        except asyncio.CancelledError:
            self.abandon()
            raise

    async def await_wait(self, func: Callable[..., Any], *args: Any) -> Any:
        """:meth:`arun` for a wait: in a thread of the waits' own pool."""
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        try:
            return await loop.run_in_executor(
                _wait_pool(), context.run, self.run, func, *args
            )
        except asyncio.CancelledError:
            self.abandon()
            raise


# Made once: a SyncToAsync costs more to build than the rest of an attempt's
# bookkeeping.
_run_in_thread = sync_to_async(Handoff.run, thread_sensitive=False)
