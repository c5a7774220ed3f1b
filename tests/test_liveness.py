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


# -- bounded holds (max_hold / MAX_HOLD) ----------------------------------


def test_max_hold_is_validated():
    with pytest.raises(ValueError, match=r"Lock 'x': max_hold must be a positive"):
        lock("x", max_hold=0)
    with pytest.raises(TypeError, match=r"Lock 'x': max_hold must be a number"):
        lock("x", max_hold="60")
    assert lock("x", max_hold=None).max_hold is None


def test_max_hold_defaults_to_the_alias_setting(settings):
    assert lock("x").max_hold is None
    settings.LOCKS = {
        "default": {
            "BACKEND": "django_distlock.backends.locmem.LocMemLockBackend",
            "MAX_HOLD": 90,
        }
    }
    assert lock("x").max_hold == 90
    assert lock("x", max_hold=None).max_hold is None
    assert lock("x", max_hold=5).max_hold == 5


def bounded_hold(kind: str, name: str, *, max_hold=None, asynchronous=False):
    """Hold ``name`` past its bound; return (reason, seconds until the name
    could be taken by another holder, seconds until held.lost was set)."""
    from django_distlock.signals import lock_lost

    from .contract import Recorder
    from .workers import try_acquire

    options = {} if max_hold is None else {"max_hold": max_hold}

    def free_elsewhere() -> bool:
        if kind == "locmem":
            return try_acquire(name, 0) is not None
        (token,) = run_in_processes(try_acquire, [(name, 0)])
        return token is not None

    with Recorder(lock_lost) as rec:
        held = lock(name, ttl=TTL, **options)
        started = time.monotonic()
        with pytest.raises(LockLost):
            with held:
                assert held.lost.wait(PROMPTLY)
                lost_after = time.monotonic() - started
                assert free_elsewhere()
                free_after = time.monotonic() - started
        (event,) = rec.of(lock_lost)
    return event["reason"], free_after, lost_after


def test_max_hold_stops_renewal_and_reports_the_loss(backend_kind):
    reason, free_after, lost_after = bounded_hold(
        backend_kind, f"bounded-{backend_kind}", max_hold=1.5
    )
    assert "max_hold (1.5 s)" in reason
    # Renewed up to the bound (else it would be lost after one TTL), and
    # not much longer: it runs out within one TTL of the bound.
    assert 1.5 <= lost_after < 1.5 + TTL + PROMPTLY
    assert free_after >= lost_after


def test_max_hold_setting_applies_to_every_lock_of_the_alias(settings):
    settings.LOCKS = {
        "default": {
            "BACKEND": "django_distlock.backends.locmem.LocMemLockBackend",
            "LOCATION": "max-hold-setting",
            "MAX_HOLD": 1.2,
        }
    }
    reason, _, lost_after = bounded_hold("locmem", "bounded-setting")
    assert "max_hold (1.2 s)" in reason
    assert lost_after >= 1.2


def test_max_hold_cancels_an_on_lost_cancel_block():
    async def scenario():
        started = time.monotonic()
        with pytest.raises(LockLost):
            async with lock("bounded-async", ttl=TTL, max_hold=1, on_lost="cancel"):
                await asyncio.sleep(PROMPTLY * 2)
        return time.monotonic() - started

    assert 1 <= asyncio.run(scenario()) < PROMPTLY


def test_without_max_hold_renewal_goes_on():
    with lock("unbounded", ttl=0.5) as held:
        time.sleep(2.0)
        assert held.locked()
        assert not held.lost.is_set()


def test_decorated_coroutine_with_on_lost_cancel_raises_lock_lost():
    """Each call of a decorated coroutine function takes the lock afresh,
    with the same on_lost."""
    name = "lost-decorated"

    @lock(name, ttl=TTL, on_lost="cancel")
    async def job(ready: asyncio.Event):
        ready.set()
        await asyncio.sleep(PROMPTLY * 2)

    async def scenario():
        ready = asyncio.Event()
        task = asyncio.create_task(job(ready))
        await ready.wait()
        await asyncio.to_thread(take_over, "locmem", name)
        with pytest.raises(LockLost):
            await task

    asyncio.run(scenario())
