"""The in-doubt canceller's bookkeeping (pure logic: no server needed)."""

from __future__ import annotations

import threading
import time

from django_distlock.backends.indoubt import InDoubt


def wait_for(predicate, limit: float = 5.0) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return False


def test_retried_until_the_server_answers():
    answering = threading.Event()
    calls: list[list] = []

    def cancel(items):
        calls.append(list(items))
        return [answering.is_set()] * len(items)

    canceller = InDoubt("test", cancel)
    canceller.add(("a", "t1"), 30)
    assert wait_for(lambda: len(calls) >= 3)  # tried again and again
    assert canceller.pending() == 1
    answering.set()
    assert wait_for(lambda: canceller.pending() == 0)
    assert all(c == [("a", "t1")] for c in calls)


def test_batched_and_each_item_done_on_its_own():
    seen: list[list] = []
    release = threading.Event()

    def cancel(items):
        release.wait(5)  # the three are queued before the first round
        seen.append(sorted(items))
        return [item != "stuck" for item in items]

    canceller = InDoubt("test", cancel)
    for item in ("x", "y", "stuck"):
        canceller.add(item, 1.0)
    release.set()
    assert wait_for(lambda: canceller.pending() == 0)  # "stuck" gave up
    # The first round started with what was queued when it began ("x" alone,
    # or more); every later one carries only what is left.
    assert seen[0] in (["x"], ["x", "y"], ["stuck", "x", "y"])
    assert ["stuck"] in seen[1:]
    assert all(batch in (["stuck"], ["stuck", "y"]) for batch in seen[1:])


def test_given_up_once_the_grant_would_have_expired():
    canceller = InDoubt("test", lambda items: [False] * len(items))
    canceller.add("never", 0.2)
    assert wait_for(lambda: canceller.pending() == 0, 2.0)


def test_a_failing_cancel_is_retried_not_fatal():
    calls = []

    def cancel(items):
        calls.append(items)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return [True] * len(items)

    canceller = InDoubt("test", cancel)
    canceller.add("item", 30)
    assert wait_for(lambda: canceller.pending() == 0)
    assert len(calls) == 2


def test_the_thread_ends_when_nothing_is_left_and_restarts():
    done = []
    canceller = InDoubt("test", lambda items: done.extend(items) or [True] * len(items))
    canceller.add("one", 30)
    assert wait_for(lambda: done == ["one"])
    assert wait_for(
        lambda: not any(t.name == "distlock-cancel-test" for t in threading.enumerate())
    )
    canceller.add("two", 30)
    assert wait_for(lambda: done == ["one", "two"])
