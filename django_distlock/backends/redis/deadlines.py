"""Deadlines of a lock's asyncio commands, without a timer per command.

The asyncio connections have no socket timeout (see
:attr:`.client.RedisClients.adeadline`), so each command runs under a
deadline of its own: a paused server must fail the call, not hang it.
``asyncio.timeout(seconds)`` schedules a timer on the loop for every command
and cancels it when the reply comes, about 5 µs a command: 4% of an
uncontended cycle, for a timer that almost never fires.

Here a command enters ``asyncio.timeout(None)``, which schedules nothing,
and is registered with its loop's :class:`Watch`. The watch keeps one timer,
due at the earliest deadline in flight; when it fires, it reschedules the
timeouts whose deadline has passed to now (``Timeout.reschedule``), and
the command fails with ``TimeoutError`` exactly as under
``asyncio.timeout(seconds)``. A command answered in time costs a dict
insert and delete; the timer is scheduled again only when the one due has
fired (about once per deadline while commands run) or a shorter deadline
comes in. On Python 3.10 (the ``async_timeout`` package) each command still
schedules a timer of its own.
"""

from __future__ import annotations

import asyncio
from typing import Any

try:
    from asyncio import timeout as async_timeout

    #: Whether a timeout can be rescheduled from outside its task.
    SHARED_TIMER = True
except ImportError:  # Python 3.10: redis-py depends on async-timeout there
    from async_timeout import timeout as async_timeout

    # The package's Timeout takes the task to cancel from the caller of its
    # update(), so only the command's own task could expire it: each command
    # keeps a timer of its own there.
    SHARED_TIMER = False

__all__ = ["SHARED_TIMER", "Watch", "async_timeout"]

_NEVER = float("inf")


class Watch:
    """The deadlines of one event loop's commands in flight (used on that loop only)."""

    # No reference to the loop itself: the clients keep a watch per loop in
    # a dict weakly keyed by the loop.
    __slots__ = ("_due", "_handle", "_inflight")

    def __init__(self) -> None:
        self._inflight: dict[Any, float] = {}
        self._handle: asyncio.TimerHandle | None = None
        self._due = _NEVER

    def start(self, seconds: float | None) -> Any:
        """Return a timeout to enter for one command of at most ``seconds``.

        The caller must :meth:`end` it once the command is over (in a
        ``finally``), without awaiting anything in between.
        """
        if not SHARED_TIMER:
            return async_timeout(seconds)
        timeout = async_timeout(None)
        if seconds is not None:
            when = asyncio.get_running_loop().time() + seconds
            self._inflight[timeout] = when
            if when < self._due:
                self._arm(when)
        return timeout

    def end(self, timeout: Any) -> None:
        """Forget ``timeout``: its command is over."""
        self._inflight.pop(timeout, None)

    def _arm(self, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._due = when
        self._handle = asyncio.get_running_loop().call_at(when, self._expire)

    def _expire(self) -> None:
        self._handle = None
        self._due = _NEVER
        now = asyncio.get_running_loop().time()
        nearest = _NEVER
        for timeout, when in list(self._inflight.items()):
            if when <= now:
                del self._inflight[timeout]
                try:
                    # Cancels the command's task, and its exit from the
                    # timeout turns the cancellation into TimeoutError.
                    timeout.reschedule(now)
                except RuntimeError:
                    # Never entered, or left without end(): nothing to
                    # cancel, and the other commands' deadlines still hold.
                    pass
            elif when < nearest:
                nearest = when
        if nearest < _NEVER:
            self._arm(nearest)
