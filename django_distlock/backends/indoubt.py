"""Acquisitions whose outcome is unknown, cancelled in the background.

An acquire request that reached the server but whose reply never came back
(a socket timeout, a reset, a failover, a proxy that dropped it) may have
been granted: the server holds a lease, or a waiter record that the next
release would hand the lock to, for a caller that already gave up. Nobody
would ever release it, so the name would stay blocked for a whole TTL.

:class:`InDoubt` keeps such attempts (each with the token it used, so the
cancel is a compare-and-delete that can never touch another holder's lease)
and cancels them from one daemon thread per backend: at once, then again and
again until the server answers, or until the grant would have expired
anyway. While the server is frozen, the cancel waits on its socket like any
request, so it is carried out as soon as the server runs again, right after
the request it cancels (which was sent first).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable

from .base import current_pid

__all__ = ["InDoubt"]

logger = logging.getLogger("django_distlock.release")

#: First and longest pause between two cancel rounds that failed (seconds).
RETRY_PAUSE = (0.02, 0.1)
#: Attempts kept at most; beyond, the oldest are left to expire by their TTL.
MAX_PENDING = 10_000


class InDoubt:
    """Background cancels of acquisitions whose outcome is unknown.

    ``cancel(items)`` gets the pending items (whatever the backend queued
    with :meth:`add`: keys and token, a node...) and returns, for each, True
    if the server answered the cancel (done: cancelled, or there was nothing
    to cancel) or False to try it again later. It is called from the
    canceller's thread only.
    """

    def __init__(self, label: str, cancel: Callable[[list], list[bool]]):
        self.label = label
        self.cancel = cancel
        self._reset()

    def _reset(self) -> None:
        self._pid = current_pid()
        self._cond = threading.Condition()
        # item -> monotonic time after which the grant is gone anyway
        self._pending: dict[Hashable, float] = {}
        self._thread: threading.Thread | None = None

    def add(self, item: Hashable, lasts: float) -> None:
        """Cancel ``item`` in the background; give up after ``lasts`` seconds."""
        if self._pid != current_pid():
            self._reset()  # forked: the parent's thread is not running here
        with self._cond:
            if len(self._pending) >= MAX_PENDING:
                self._pending.pop(next(iter(self._pending)))
            self._pending[item] = time.monotonic() + lasts
            if self._thread is not None and self._thread.is_alive():
                self._cond.notify()
                return
            thread = threading.Thread(
                target=self._work, name=f"distlock-cancel-{self.label}", daemon=True
            )
            try:
                thread.start()
            except RuntimeError:  # interpreter shutdown: no new threads
                logger.warning(
                    "An acquisition whose reply was lost cannot be cancelled "
                    "(%s); it expires with its TTL.",
                    self.label,
                )
                return
            self._thread = thread

    def pending(self) -> int:
        """Return how many attempts are still to be cancelled."""
        with self._cond:
            return len(self._pending)

    def _work(self) -> None:
        pause = RETRY_PAUSE[0]
        while True:
            with self._cond:
                now = time.monotonic()
                for item in [i for i, end in self._pending.items() if end <= now]:
                    del self._pending[item]
                items = list(self._pending)
                if not items:
                    self._thread = None
                    return
            started = time.monotonic()
            try:
                done = self.cancel(items)
            except Exception:
                logger.warning(
                    "Cancelling acquisitions whose reply was lost failed (%s); "
                    "trying again.",
                    self.label,
                    exc_info=True,
                )
                done = [False] * len(items)
            with self._cond:
                for item, ok in zip(items, done):
                    if ok:
                        self._pending.pop(item, None)
                if all(done):
                    pause = RETRY_PAUSE[0]
                    continue
                # A round that waited out a timeout has paused already: the
                # next cancel must be waiting on the server when it resumes.
                left = pause - (time.monotonic() - started)
                if left > 0:
                    self._cond.wait(left)  # a new attempt wakes it early
            pause = min(pause * 2, RETRY_PAUSE[1])
