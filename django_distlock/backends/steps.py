"""Backends whose algorithm is written once, as generators of commands.

Each operation is a generator (``_acquire_steps``, ``_release_steps``,
``_extend_steps``, ``_is_held_steps``) that yields the commands it needs and
receives their replies; it knows nothing of sockets. A synchronous driver
(``_run``) and an asyncio driver (``_arun``) run the same generators, so the
sync and async paths cannot drift apart; a subclass carries out one step
(``_execute``, ``_aexecute``). An exception in a step (a cancelled task,
``KeyboardInterrupt``) is thrown into the generator, which may yield clean-up
steps before it goes on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Generator
from typing import Any

from asgiref.sync import markcoroutinefunction

from ..exceptions import LockBackendError
from .base import BaseLockBackend, Lease

__all__ = ["StepsBackend"]

Steps = Generator[Any, Any, Any]


class StepsBackend(BaseLockBackend):
    """A lock backend driven by command generators (see the module docstring)."""

    def _execute(self, step: Any) -> Any:
        """Carry out one step the algorithm yielded; return what it answers."""
        raise NotImplementedError("subclasses of StepsBackend must provide _execute()")

    async def _aexecute(self, step: Any) -> Any:
        """Async twin of :meth:`_execute`."""
        raise NotImplementedError("subclasses of StepsBackend must provide _aexecute()")

    def _run(self, steps: Steps) -> Any:
        """Drive ``steps`` to completion synchronously; return its result."""
        result = None
        while True:
            try:
                step = steps.send(result)
            except StopIteration as stop:
                return stop.value
            try:
                result = self._execute(step)
            except BaseException as exc:
                self._unwind(steps, exc)
                raise

    def _unwind(self, steps: Steps, exc: BaseException) -> None:
        """Let the algorithm clean up after ``exc`` (best effort), e.g. a waiter
        interrupted while queued leaves the queue, so the lock is never handed
        to a caller that is gone. Backend errors get no clean-up round trip: a
        dead or paused server must fail fast, and queue records expire anyway.
        """
        if isinstance(exc, LockBackendError):
            steps.close()
            return
        try:
            step = steps.throw(exc)
            while True:
                step = steps.send(self._execute(step))
        except BaseException:  # noqa: S110 - the original exception is raised
            pass
        finally:
            steps.close()

    async def _arun(self, steps: Steps) -> Any:
        """Drive ``steps`` to completion on the running event loop."""
        result = None
        while True:
            try:
                step = steps.send(result)
            except StopIteration as stop:
                return stop.value
            try:
                result = await self._aexecute(step)
            except BaseException as exc:
                await self._aunwind(steps, exc)
                raise

    async def _aunwind(self, steps: Steps, exc: BaseException) -> None:
        """Async twin of :meth:`_unwind` (runs after a task's cancellation too)."""
        if isinstance(exc, LockBackendError):
            steps.close()
            return
        try:
            step = steps.throw(exc)
            while True:
                step = steps.send(await self._aexecute(step))
        except BaseException:  # noqa: S110 - the original exception is raised
            pass
        finally:
            steps.close()

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
