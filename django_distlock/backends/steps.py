"""Backends whose algorithm is written once, as generators of commands.

Each operation is a generator (``_acquire_steps``, ``_release_steps``,
``_extend_steps``, ``_is_held_steps``) that yields the commands it needs and
receives their replies; it knows nothing of sockets. A synchronous executor
(``_run``) and an asyncio executor (``_arun``) drive the same generators, so
the sync and async paths cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Awaitable, Generator
from typing import Any

from asgiref.sync import markcoroutinefunction

from .base import BaseLockBackend, Lease

__all__ = ["StepsBackend"]

Steps = Generator[Any, Any, Any]


class StepsBackend(BaseLockBackend):
    """A lock backend driven by command generators (see the module docstring)."""

    def _run(self, steps: Steps) -> Any:
        """Drive ``steps`` to completion synchronously; return its result."""
        raise NotImplementedError("subclasses of StepsBackend must provide _run()")

    async def _arun(self, steps: Steps) -> Any:
        """Drive ``steps`` to completion on the running event loop."""
        raise NotImplementedError("subclasses of StepsBackend must provide _arun()")

    def acquire(self, name: str, ttl: float, timeout: float | None) -> Lease | None:
        return self._run(self._acquire_steps(name, ttl, timeout))

    def release(self, lease: Lease) -> bool:
        return self._run(self._release_steps(lease))

    def extend(self, lease: Lease, ttl: float) -> bool:
        return self._run(self._extend_steps(lease, ttl))

    def is_held(self, lease: Lease) -> bool:
        return self._run(self._is_held_steps(lease))

    # The async twins hand back the executor's coroutine instead of awaiting
    # it in one of their own: a coroutine level less on every resumption.
    # They are still coroutine functions to ``asgiref``'s (Django's) eyes.

    @markcoroutinefunction
    def aacquire(
        self, name: str, ttl: float, timeout: float | None
    ) -> Awaitable[Lease | None]:
        return self._arun(self._acquire_steps(name, ttl, timeout))

    @markcoroutinefunction
    def arelease(self, lease: Lease) -> Awaitable[bool]:
        return self._arun(self._release_steps(lease))

    @markcoroutinefunction
    def aextend(self, lease: Lease, ttl: float) -> Awaitable[bool]:
        return self._arun(self._extend_steps(lease, ttl))

    @markcoroutinefunction
    def ais_held(self, lease: Lease) -> Awaitable[bool]:
        return self._arun(self._is_held_steps(lease))
