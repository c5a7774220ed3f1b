"""The asyncio Wakeup: a task resumed inside the callback that sets it."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from django_distlock.backends.wakeup import Wakeup

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")


def test_set_from_a_callback_steps_the_task_inside_it():
    events = []

    async def waiter(wakeup):
        request_id.set("mine")
        await wakeup
        events.append(("resumed", request_id.get()))

    async def main():
        loop = asyncio.get_running_loop()
        wakeup = Wakeup(loop)
        task = asyncio.create_task(waiter(wakeup))
        await asyncio.sleep(0)  # the task waits now

        def callback():
            request_id.set("the callback's")
            wakeup.set()
            events.append(("set returned", request_id.get()))

        loop.call_soon(callback)
        await task

    asyncio.run(main())
    # The task ran before set() returned, in its own context.
    assert events == [("resumed", "mine"), ("set returned", "the callback's")]


def test_set_from_another_task_resumes_it_later_like_a_future():
    events = []

    async def waiter(wakeup):
        await wakeup
        events.append("resumed")

    async def main():
        wakeup = Wakeup(asyncio.get_running_loop())
        task = asyncio.create_task(waiter(wakeup))
        await asyncio.sleep(0)
        wakeup.set()
        events.append("set returned")
        await task

    asyncio.run(main())
    assert events == ["set returned", "resumed"]


def test_set_before_awaiting_does_not_suspend():
    async def main():
        wakeup = Wakeup(asyncio.get_running_loop())
        wakeup.set()
        assert wakeup.done() and not wakeup.cancelled()
        await wakeup
        wakeup.set()  # a second set is ignored

    asyncio.run(main())


def test_cancelling_the_task_raises_in_it_and_a_late_set_is_ignored():
    async def main():
        loop = asyncio.get_running_loop()

        async def waiter():
            await wakeup

        wakeup = Wakeup(loop)
        task = asyncio.create_task(waiter())
        await asyncio.sleep(0)
        assert task.cancel()
        assert wakeup.cancelled()
        loop.call_soon(wakeup.set)  # too late: nothing happens
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_a_timeout_around_the_wait_raises_timeout_error():
    async def main():
        wakeup = Wakeup(asyncio.get_running_loop())

        async def waiter():
            await wakeup

        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(waiter(), 0.05)
        assert wakeup.cancelled()

    asyncio.run(main())


def test_the_task_exception_stays_in_the_task():
    async def waiter(wakeup):
        await wakeup
        raise ValueError("from the task")

    async def main():
        loop = asyncio.get_running_loop()
        wakeup = Wakeup(loop)
        task = asyncio.create_task(waiter(wakeup))
        await asyncio.sleep(0)
        loop.call_soon(wakeup.set)  # must not raise out of the callback
        with pytest.raises(ValueError, match="from the task"):
            await task

    asyncio.run(main())
