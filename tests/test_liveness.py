"""A lost lease stops the work where it can: ``on_lost=`` and ``held.lost``.

The lease is taken over from outside the holder (``manage.py locks clear``
in another process; in this process for locmem, whose locks do not reach
other processes), and the holder's renewal finds it gone.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from django_distlock import LockLost, lock

from .procs import run_in_processes
from .workers import clear_lock

TTL = 1.0
#: Generous: the renewal that notices the loss runs a third of a TTL after
#: acquisition (or after the last renewal), and cross-process set-up is slow.
PROMPTLY = 15.0


def take_over(kind: str, name: str) -> None:
    """Clear ``name`` the way an operator would, from another process."""
    if kind == "locmem":
        clear_lock(name)
    else:
        run_in_processes(clear_lock, [(name,)])


def test_on_lost_is_validated():
    with pytest.raises(ValueError, match=r"Lock 'x': on_lost must be 'raise' or"):
        lock("x", on_lost="ignore")
    with pytest.raises(ValueError, match="on_lost"):
        lock("x", on_lost=None)


def test_on_lost_cancel_refuses_synchronous_code():
    held = lock("x", on_lost="cancel")
    with pytest.raises(TypeError, match="Lock 'x': on_lost='cancel'"):
        with held:
            pass
    assert held.lease is None  # nothing was acquired


def test_lost_is_unset_on_a_lease_kept():
    held = lock("kept", ttl=TTL)
    assert not held.lost.is_set()
    with held:
        assert not held.lost.wait(0.01)
    assert not held.lost.is_set()


def test_sync_holder_sees_lost_while_the_block_runs(backend_kind):
    name = f"lost-sync-{backend_kind}"
    with pytest.raises(LockLost):
        with lock(name, ttl=TTL) as held:
            assert not held.lost.is_set()
            started = time.monotonic()
            take_over(backend_kind, name)
            assert held.lost.wait(PROMPTLY)
            seen_after = time.monotonic() - started
    assert held.lost.is_set()
    assert seen_after < PROMPTLY


def test_async_block_is_cancelled_and_async_with_raises_lock_lost(backend_kind):
    name = f"lost-async-{backend_kind}"
    seen: list[str] = []

    async def holder(ready: asyncio.Event):
        async with lock(name, ttl=TTL, on_lost="cancel") as held:
            ready.set()
            try:
                await asyncio.sleep(PROMPTLY * 2)
            except asyncio.CancelledError:
                seen.append("cancelled")
                assert held.lost.is_set()
                raise
            seen.append("slept through")

    async def scenario():
        ready = asyncio.Event()
        task = asyncio.create_task(holder(ready))
        await ready.wait()
        started = time.monotonic()
        # Another process (or, for locmem, thread) clears the lock.
        await asyncio.to_thread(take_over, backend_kind, name)
        with pytest.raises(LockLost):
            await task
        return time.monotonic() - started

    elapsed = asyncio.run(scenario())
    assert seen == ["cancelled"]
    assert elapsed < PROMPTLY


def test_async_raise_keeps_running_the_block(backend_kind):
    """The default reports the loss when the block ends, as before."""
    name = f"lost-raise-{backend_kind}"
    steps: list[str] = []

    async def scenario():
        with pytest.raises(LockLost):
            async with lock(name, ttl=TTL) as held:
                await asyncio.to_thread(take_over, backend_kind, name)
                while not held.lost.is_set():
                    await asyncio.sleep(0.05)
                steps.append("ran to the end")

    asyncio.run(scenario())
    assert steps == ["ran to the end"]


def test_cancelling_the_task_for_another_reason_stays_a_cancellation():
    """A task cancelled by its owner, not by a loss, ends with CancelledError
    and releases the lock."""

    async def scenario():
        started = asyncio.Event()

        async def holder():
            async with lock("own-cancel", ttl=TTL, on_lost="cancel"):
                started.set()
                await asyncio.sleep(60)

        task = asyncio.create_task(holder())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await lock("own-cancel", timeout=0).aacquire()

    asyncio.run(scenario())


def test_cancel_is_not_delivered_after_the_block(backend_kind):
    """A loss found by the release itself raises LockLost, nothing more."""
    name = f"lost-at-exit-{backend_kind}"

    async def scenario():
        with pytest.raises(LockLost):
            async with lock(name, ttl=60, on_lost="cancel"):
                await asyncio.to_thread(take_over, backend_kind, name)
        await asyncio.sleep(0.05)  # would raise CancelledError if one were pending
        return threading.current_thread().name

    asyncio.run(scenario())
