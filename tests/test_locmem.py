"""The in-process locmem backend: the contract, minus cross-process tests."""

from __future__ import annotations

import pytest

from django_distlock import lock

from .contract import LockBackendContract

LOCMEM = "django_distlock.backends.locmem.LocMemLockBackend"


class TestLocMemContract(LockBackendContract):
    """The shared backend contract on locmem (threads of one process)."""

    cross_process = False

    @pytest.fixture
    def locks_setting(self, request):
        return {
            "default": {
                "BACKEND": "django_distlock.backends.locmem.LocMemLockBackend",
                "LOCATION": request.node.nodeid,
            }
        }


class TestHandleArguments:
    """The Lock handle validates its arguments before any backend call."""

    @pytest.fixture(autouse=True)
    def _locmem(self):
        from django.test import override_settings

        setting = {"default": {"BACKEND": LOCMEM, "LOCATION": "arguments"}}
        with override_settings(LOCKS=setting):
            yield

    @pytest.mark.parametrize("ttl", [0, -1, float("nan"), float("inf")])
    def test_bad_ttl(self, ttl):
        with pytest.raises(ValueError, match="ttl"):
            lock("x", ttl=ttl)

    def test_bad_timeout(self):
        with pytest.raises(ValueError, match="timeout"):
            lock("x", timeout=-1)
        with pytest.raises(ValueError, match="timeout"):
            lock("x").acquire(timeout=-2)

    def test_name_must_be_str(self):
        with pytest.raises(TypeError):
            lock(b"x")

    @pytest.mark.parametrize("seconds", [0, -5, float("nan"), float("inf")])
    def test_bad_extend(self, seconds):
        with lock("x") as held:
            with pytest.raises(ValueError, match="seconds"):
                held.extend(seconds)
            assert held.locked()

    def test_timeout_none_and_minus_one_wait_forever(self):
        assert lock("x").acquire(timeout=None)
        assert lock("y").acquire(timeout=-1)


def assert_cancelled_waiter_leaves_nothing_held(alias: str) -> None:
    """Cancel an asyncio waiter whose backend waits in a worker thread, then
    release the lock it waited for: the name must be free at once."""
    import asyncio
    import time
    import uuid

    from django_distlock import lock

    name = f"cancelled:{uuid.uuid4().hex}"
    holder = lock(name, using=alias, ttl=30, auto_renew=False)
    holder.acquire()

    async def waiter() -> None:
        task = asyncio.create_task(
            lock(name, using=alias, ttl=30, timeout=10, auto_renew=False).aacquire()
        )
        await asyncio.sleep(0.2)  # the thread is waiting now
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        holder.release()  # the waiting thread gets the lock, for nobody
        await asyncio.sleep(0.3)  # let it, before the probe could win the race
        probe = lock(name, using=alias, ttl=30, auto_renew=False)
        deadline = time.monotonic() + 2.0
        while not probe.acquire(timeout=0):
            assert time.monotonic() < deadline, "the cancelled waiter's grant is held"
            await asyncio.sleep(0.01)
        probe.release()

    asyncio.run(waiter())


def test_cancelled_async_waiter_leaves_nothing_held(settings):
    settings.LOCKS = {
        "default": {"BACKEND": "django_distlock.backends.locmem.LocMemLockBackend"}
    }
    assert_cancelled_waiter_leaves_nothing_held("default")
