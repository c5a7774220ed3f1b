"""The reentrant Redis backend against a real redis-server.

Owners are threads (or asyncio tasks) of a process; nesting is checked
against other threads, other tasks and other processes at every depth.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

import pytest
from django.test import RequestFactory, override_settings
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from django_distlock import (
    LockLost,
    LockNotAcquired,
    LockNotHeld,
    lock,
    lock_for,
    locks,
)
from django_distlock.backends.base import Lease
from django_distlock.backends.redis import (
    ReentrantLease,
    ReentrantRedisLockBackend,
    current_owner,
)
from django_distlock.backends.redis import reentrant as redis_reentrant
from django_distlock.instances import lock_name_for

from . import workers
from .conftest import redis_locks
from .contract import LockBackendContract, Recorder
from .procs import context, run_in_processes, start_process

pytestmark = pytest.mark.redis

REENTRANT = "django_distlock.backends.redis.ReentrantRedisLockBackend"
PLAIN = "django_distlock.backends.redis.RedisLockBackend"


def reentrant_locks(url: str, **extra) -> dict:
    """LOCKS with the reentrant backend as default and a plain one as "plain".

    Both use the same server and KEY_PREFIX, so they share lock names.
    """
    setting = redis_locks(url, **extra)
    setting["default"]["BACKEND"] = REENTRANT
    setting["plain"] = {"BACKEND": PLAIN, "LOCATION": url}
    return setting


@pytest.fixture
def reentrant(redis_url):
    with override_settings(LOCKS=reentrant_locks(redis_url)):
        yield locks["default"]
    locks.reset()


@pytest.fixture
def name(request):
    return f"reentrant:{request.node.name} {uuid.uuid4().hex[:8]}"


def test_cancelled_tasks_storm_leaves_no_lock_held(reentrant, name):
    """Tasks cancelled anywhere in acquire, nesting or release leave no
    level behind: every lock is free after the storm."""

    async def cycle(i):
        async with lock(f"{name}:{i % 3}", timeout=5):
            async with lock(f"{name}:{i % 3}", timeout=5):
                await asyncio.sleep(0)

    async def scenario():
        for round_ in range(20):
            tasks = [asyncio.create_task(cycle(i)) for i in range(6)]
            await asyncio.sleep(0.0005 * (round_ % 4))
            for task in tasks[::2]:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            assert not [r for r in results if isinstance(r, LockNotAcquired)]

    asyncio.run(scenario())
    assert [h.name for h in reentrant.holders(prefix=name)] == []


# -- helpers and process workers (module level: spawned processes import them)


def in_thread(func, *args):
    """Run ``func(*args)`` in another thread (another owner) and return its result."""
    result: list = []

    def target():
        try:
            result.append(func(*args))
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            result.append(e)

    t = threading.Thread(target=target)
    t.start()
    t.join(60)
    assert result, "the thread did not finish"
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def try_once(name: str, using: str = "default") -> bool:
    """Try ``name`` once; release it again if taken. Return whether it was free."""
    held = lock(name, timeout=0, auto_renew=False, using=using)
    got = held.acquire()
    if got:
        held.release()
    return got


def probe_worker(requests, replies) -> int:
    """Answer each lock name from ``requests`` with whether it was free."""
    while True:
        name = requests.get()
        if name is None:
            return 0
        replies.put(try_once(name))


class Prober:
    """Another process that tries a lock once on request."""

    def __init__(self):
        ctx = context()
        self.requests, self.replies = ctx.Queue(), ctx.Queue()
        self.proc = start_process(probe_worker, self.requests, self.replies)

    def free(self, name: str) -> bool:
        self.requests.put(name)
        return self.replies.get(timeout=120)

    def stop(self):
        self.requests.put(None)
        self.proc.join(30)


def hold_nested(
    name: str, depth: int, pause: float, ready: str, go: str, log: str
) -> int:
    """Take ``name`` ``depth`` times, then release one level per ``pause``.

    Write the fencing token to ``ready`` once held, start releasing when
    ``go`` exists, and write to ``log`` the monotonic instant just before
    the last release. Return the token.
    """
    handles = [lock(name, timeout=30, ttl=10) for _ in range(depth)]
    for h in handles:
        assert h.acquire()
    tokens = {h.fencing_token for h in handles}
    assert len(tokens) == 1
    workers.write_whole(ready, str(handles[0].fencing_token))
    deadline = time.monotonic() + 60
    while not Path(go).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    for h in reversed(handles[1:]):
        time.sleep(pause)
        h.release()
    time.sleep(pause)
    Path(log).write_text(repr(time.monotonic()))
    handles[0].release()
    return tokens.pop()


def restock(product, times: int) -> int:
    """A recursive "model method": each level takes the row's lock again."""
    with lock_for(product, timeout=1) as held:
        product.stock += 1
        product.save(update_fields=["stock"])
        if times > 1:
            inner = restock(product, times - 1)
            assert inner == held.fencing_token
        return held.fencing_token


# -- nesting in one thread ---------------------------------------------------


@pytest.mark.parametrize("depth", [1, 2, 3, 4, 5])
def test_nesting_depth(reentrant, name, depth):
    with ExitStack() as stack:
        handles = [stack.enter_context(lock(name, timeout=0)) for _ in range(depth)]
        assert len({h.fencing_token for h in handles}) == 1
        assert len({h.lease.token for h in handles}) == 1
        raw = reentrant.client.hgetall(reentrant.keys_for(name).lease)
        assert int(raw[b"c"]) == depth
        assert not in_thread(try_once, name)
    assert reentrant.client.exists(reentrant.keys_for(name).lease) == 0
    assert in_thread(try_once, name)


def test_other_thread_and_process_excluded_at_every_depth(reentrant, name):
    prober = Prober()
    try:
        handles = []
        for depth in range(1, 6):
            handles.append(lock(name, timeout=0))
            assert handles[-1].acquire()
            assert not in_thread(try_once, name), depth
            assert not prober.free(name), depth
        while handles:
            handles.pop().release()
            if handles:
                assert not in_thread(try_once, name), len(handles)
                assert not prober.free(name), len(handles)
        assert prober.free(name)
        assert in_thread(try_once, name)
    finally:
        prober.stop()
    assert prober.proc.exitcode == 0


def test_one_handle_stacks_its_acquisitions(reentrant, name):
    held = lock(name, timeout=0)
    for _ in range(3):
        assert held.acquire()
    token = held.fencing_token
    for _ in range(2):
        held.release()
        assert held.fencing_token == token
        assert held.locked()
        assert not in_thread(try_once, name)
    held.release()
    assert not held.locked()
    assert in_thread(try_once, name)
    with pytest.raises(LockNotHeld):
        held.release()


def test_release_more_often_than_acquired(reentrant, name):
    outer, inner = lock(name), lock(name, timeout=0)
    outer.acquire()
    inner.acquire()
    inner.release()
    with pytest.raises(LockNotHeld):
        inner.release()
    assert outer.locked()
    assert not in_thread(try_once, name)
    outer.release()
    with pytest.raises(LockNotHeld):
        outer.release()
    # Through the backend: a released level cannot be released again, even
    # while the owner still holds the lock through another level.
    a = reentrant.acquire(name, 5, 0)
    b = reentrant.acquire(name, 5, 0)
    assert reentrant.release(b) is True
    assert reentrant.release(b) is False
    assert reentrant.is_held(a) and not reentrant.is_held(b)
    assert not in_thread(try_once, name)
    assert reentrant.release(a) is True
    assert in_thread(try_once, name)


def test_fencing_token_constant_while_nested_then_increases(reentrant, name):
    with lock(name) as outer:
        first = outer.fencing_token
        for _ in range(4):
            with lock(name, timeout=0) as inner:
                assert inner.fencing_token == first
            assert outer.fencing_token == first
        outer.extend(5)
        with lock(name, timeout=0) as inner:
            assert inner.fencing_token == first
    with lock(name, timeout=0) as again:
        assert again.fencing_token > first
        second = again.fencing_token

    def other_owner():
        with lock(name, timeout=0) as held, lock(name, timeout=0) as nested:
            return held.fencing_token, nested.fencing_token

    third, nested = in_thread(other_owner)
    assert third == nested > second


def test_ttl_refreshed_on_reentry_never_shortened(reentrant, name):
    key = reentrant.keys_for(name).lease
    with lock(name, ttl=1, auto_renew=False):
        with lock(name, ttl=30, auto_renew=False, timeout=0) as inner:
            assert reentrant.client.pttl(key) > 1000  # pushed out to 30 s
            assert inner.lease.remaining() > 1
            with lock(name, ttl=0.2, auto_renew=False, timeout=0):
                assert reentrant.client.pttl(key) > 1000  # not cut to 0.2 s


@hyp_settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(
        st.tuples(st.sampled_from("AB"), st.booleans(), st.integers(0, 5)),
        max_size=25,
    )
)
def test_scripts_match_an_rlock_model(reentrant, monkeypatch, ops):
    """Random acquire/release sequences by two owners behave like an RLock."""
    owner = {"id": "A"}
    monkeypatch.setattr(redis_reentrant, "current_owner", lambda: owner["id"])
    name = f"model:{uuid.uuid4().hex}"
    key = reentrant.keys_for(name).lease
    holder, levels, fences = None, {"A": [], "B": []}, []
    released = []
    for who, take, pick in ops:
        owner["id"] = who
        if take:
            lease = reentrant.acquire(name, 30, 0)
            if holder in (None, who):
                assert lease is not None
                if holder is None:
                    assert not fences or lease.fencing_token > fences[-1]
                    fences.append(lease.fencing_token)
                assert lease.fencing_token == fences[-1]
                holder = who
                levels[who].append(lease)
            else:
                assert lease is None
        elif levels[who]:
            lease = levels[who].pop(pick % len(levels[who]))  # any order
            assert reentrant.release(lease) is True
            released.append(lease)
            if not levels[who]:
                holder = None
        elif levels["B" if who == "A" else "A"] and pick % 2:
            # Another owner's live level: refused, nothing changes.
            other = levels["B" if who == "A" else "A"]
            with pytest.raises(LockNotHeld):
                reentrant.release(other[pick % len(other)])
        else:
            mine = [lease for lease in released if lease.owner == who]
            if mine:
                assert reentrant.release(mine[pick % len(mine)]) is False
        count = reentrant.client.hget(key, "c")
        expected = len(levels[holder]) if holder else 0
        assert int(count or 0) == expected
    for who in "AB":
        owner["id"] = who
        for lease in levels[who]:
            assert reentrant.release(lease)
    assert reentrant.client.exists(key) == 0


# -- owners: threads and tasks -----------------------------------------------


def test_owner_ids_unique_per_thread(reentrant):
    mine = current_owner()
    assert current_owner() == mine
    others = {in_thread(current_owner) for _ in range(3)}
    assert mine not in others and len(others) == 3


def test_handle_used_from_another_thread_is_another_owner(reentrant, name):
    held = lock(name, timeout=0)
    assert held.acquire()
    assert in_thread(held.acquire, False) is False  # waits like anyone else
    for op in (held.release, held.extend):
        with pytest.raises(LockNotHeld, match="another thread"):
            in_thread(op)
    assert held.locked()
    assert held.fencing_token is not None
    held.release()
    assert in_thread(try_once, name)


def test_asyncio_tasks_are_distinct_owners(reentrant, name):
    async def scenario():
        outer = lock(name, timeout=0)
        assert await outer.aacquire()
        async with lock(name, timeout=0) as inner:  # same task: re-enters
            assert inner.fencing_token == outer.fencing_token

        async def other_task():
            assert current_owner() != owner
            return await lock(name, timeout=0).aacquire()

        owner = current_owner()
        assert await asyncio.create_task(other_task()) is False

        async def foreign_release():
            await outer.arelease()

        with pytest.raises(LockNotHeld):
            await asyncio.create_task(foreign_release())
        assert await outer.alocked()

        async def waiter():
            async with lock(name, timeout=10) as got:
                return got.fencing_token

        waiting = asyncio.create_task(waiter())
        await asyncio.sleep(0.2)
        assert not waiting.done()
        token = outer.fencing_token
        await outer.arelease()
        assert await asyncio.wait_for(waiting, 10) > token

    asyncio.run(scenario())


# -- model rows and decorators ------------------------------------------------


@pytest.mark.django_db
def test_recursive_model_method_under_decorated_function(reentrant):
    from tests.testapp.models import Product

    product = Product.objects.create(sku=f"re-{uuid.uuid4().hex[:8]}")

    @lock(lock_name_for(Product, product.pk), timeout=1)
    def sell_and_restock():
        outer = reentrant.acquire(lock_name_for(product), 5, 0)
        reentrant.release(outer)  # re-entered: the decorator still holds it
        assert not in_thread(try_once, lock_name_for(product))
        return restock(product, 3)

    token = sell_and_restock()
    product.refresh_from_db()
    assert product.stock == 3
    assert isinstance(token, int)
    assert in_thread(try_once, lock_name_for(product))


@pytest.mark.django_db
def test_recursive_model_method_under_decorated_view(reentrant):
    decorators = pytest.importorskip("django_distlock.decorators")
    distributed_lock = decorators.distributed_lock
    from tests.testapp.models import Product

    product = Product.objects.create(sku=f"re-{uuid.uuid4().hex[:8]}")

    @distributed_lock("testapp.product:<pk>", timeout=1)
    def view(request, pk):
        from django.http import HttpResponse

        token = restock(Product.objects.get(pk=pk), 2)
        return HttpResponse(str(token))

    response = view(RequestFactory().post("/"), pk=product.pk)
    assert response.status_code == 200
    product.refresh_from_db()
    assert product.stock == 2


def test_nested_row_lock_under_decorated_async_view(reentrant):
    decorators = pytest.importorskip("django_distlock.decorators")
    from django.http import HttpResponse

    from tests.testapp.models import Product

    @decorators.distributed_lock("testapp.product:<pk>", timeout=1)
    async def view(request, pk):
        async with lock_for(Product, pk=pk, timeout=0) as inner:
            others = await asyncio.create_task(
                lock_for(Product, pk=pk, timeout=0).aacquire()
            )
            return HttpResponse(f"{inner.fencing_token} {others}")

    response = asyncio.run(view(RequestFactory().post("/"), pk=42))
    assert response.status_code == 200
    token, others = response.content.decode().split()
    assert int(token) > 0 and others == "False"
    assert in_thread(try_once, lock_name_for(Product, 42))


# -- renewal -----------------------------------------------------------------


def evalsha_calls(client) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def test_renewal_once_per_owner_not_per_level(reentrant, name):
    ttl = 0.6
    with ExitStack() as stack:
        handles = [stack.enter_context(lock(name, ttl=ttl, timeout=0, auto_renew=True))]
        time.sleep(0.1)  # levels acquired at different times
        handles += [
            stack.enter_context(lock(name, ttl=ttl, timeout=0)) for _ in range(4)
        ]
        reentrant.client.config_resetstat()
        held_for = ttl * 4
        time.sleep(held_for)
        calls = evalsha_calls(reentrant.client)
        assert all(h.locked() for h in handles)
        assert len({h.lease.deadline for h in handles}) == 1
    # One owner renews every ttl/3: about 12 round trips in 2.4 s; once per
    # level would be about 60. Under load renewals come late, never early.
    assert 2 <= calls <= held_for / (ttl / 3) + 4, calls


def test_renewal_after_script_flush(reentrant, name):
    with lock(name, ttl=0.6) as outer, lock(name, ttl=0.6, timeout=0) as inner:
        reentrant.client.script_flush()  # e.g. a Redis restart or failover
        time.sleep(1.8)
        assert outer.locked() and inner.locked()


def test_renewal_keeps_levels_alive_when_outer_released_first(reentrant, name):
    ttl = 0.6
    outer = lock(name, ttl=ttl)
    inner = lock(name, ttl=ttl, timeout=0)
    outer.acquire()
    inner.acquire()
    outer.release()  # out of order: the inner level keeps the lease
    time.sleep(ttl * 3)
    assert inner.locked()
    assert not in_thread(try_once, name)
    inner.release()
    assert in_thread(try_once, name)


def test_watchdog_loss_reaches_every_level(reentrant, name):
    with Recorder(__import__("django_distlock.signals").signals.lock_lost) as rec:
        outer = lock(name, ttl=0.6)
        inner = lock(name, ttl=0.6, timeout=0)
        outer.acquire()
        inner.acquire()
        assert reentrant.force_release(name, outer.lease.token)
        deadline = time.monotonic() + 10
        while not (outer.lease.lost and inner.lease.lost):
            assert time.monotonic() < deadline, "the loss was never noticed"
            time.sleep(0.05)
        with pytest.raises(LockLost):
            inner.release()
        with pytest.raises(LockLost):
            outer.release()
        assert len(rec.calls) >= 1


# -- across processes -------------------------------------------------------


def test_process_admitted_only_after_the_last_level(reentrant, name, tmp_path):
    ready, go, log = tmp_path / "ready", tmp_path / "go", tmp_path / "log"
    proc = start_process(hold_nested, name, 3, 0.2, str(ready), str(go), str(log))
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready.exists(), "the worker never took the lock"
        theirs = int(ready.read_text())
        assert not try_once(name)
        go.touch()
        with lock(name, timeout=30) as mine:
            got_at = time.monotonic()
            assert mine.fencing_token > theirs
        assert got_at >= float(log.read_text())
    finally:
        proc.join(30)
    assert proc.exitcode == 0


def test_expiry_takeover_and_lock_lost_while_nested(reentrant, name):
    outer = lock(name, ttl=0.3, auto_renew=False)
    inner = lock(name, ttl=0.3, auto_renew=False, timeout=0)
    assert outer.acquire() and inner.acquire()
    (token,) = run_in_processes(workers.try_acquire, [(name, 10.0)])
    assert token is not None and token > outer.fencing_token
    with pytest.raises(LockLost):
        inner.release()
    with pytest.raises(LockLost):
        outer.release()


def test_processes_exclude_each_other_with_nesting(reentrant, name, tmp_path):
    counter = tmp_path / "counter"
    counter.write_text("0")
    results = run_in_processes(
        nested_counter_worker, [(name, str(counter), 8) for _ in range(3)]
    )
    intervals = sorted(iv for r in results for iv in r)
    assert int(counter.read_text()) == 3 * 8 * 2
    overlaps = sum(1 for a, b in zip(intervals, intervals[1:]) if b[0] < a[1])
    assert overlaps == 0


def nested_counter_worker(name: str, path: str, iterations: int):
    """Increment the file counter twice per outer hold: once per nesting level."""
    counter = Path(path)
    intervals = []
    for _ in range(iterations):
        with lock(name, ttl=10, timeout=60):
            start = time.monotonic()
            for _ in range(2):
                with lock(name, timeout=0):
                    value = int(counter.read_text() or "0")
                    time.sleep(0.001)
                    counter.write_text(str(value + 1))
            end = time.monotonic()
        intervals.append((start, end, 0))
    return intervals


# -- non-reentrant backends and mixed aliases ---------------------------------


def test_plain_backend_nesting_times_out_with_a_hint(reentrant, name):
    with lock(name, using="plain"):
        started = time.monotonic()
        with pytest.raises(LockNotAcquired, match="ReentrantRedisLockBackend"):
            with lock(name, using="plain", timeout=0.3):
                pass  # pragma: no cover
        assert time.monotonic() - started >= 0.25

    def contended():
        try:
            with lock(name, using="plain", timeout=0.1):
                pass  # pragma: no cover
        except LockNotAcquired as e:
            return str(e)

    with lock(name, using="plain"):
        assert "Reentrant" not in in_thread(contended)  # another thread: no hint


def test_hint_for_async_and_locmem_nesting(redis_url, name):
    setting = reentrant_locks(redis_url)
    setting["locmem"] = {"BACKEND": "django_distlock.backends.locmem.LocMemLockBackend"}
    with override_settings(LOCKS=setting):
        with lock(name, using="locmem"):
            with pytest.raises(LockNotAcquired, match="ReentrantRedisLockBackend"):
                with lock(name, using="locmem", timeout=0.1):
                    pass  # pragma: no cover

        async def scenario():
            async with lock(name, using="plain"):
                with pytest.raises(LockNotAcquired, match="Reentrant"):
                    async with lock(name, using="plain", timeout=0.1):
                        pass  # pragma: no cover

                async def other_task():
                    try:
                        async with lock(name, using="plain", timeout=0.1):
                            pass  # pragma: no cover
                    except LockNotAcquired as e:
                        return str(e)

                assert "Reentrant" not in await asyncio.create_task(other_task())

        asyncio.run(scenario())
    locks.reset()


def test_plain_and_reentrant_aliases_share_names(reentrant, name):
    # A reentrant waiter handed the lease by the plain release script adopts it.
    plain = lock(name, using="plain")
    plain.acquire()

    def reentrant_waiter():
        with lock(name, timeout=10) as held, lock(name, timeout=0) as nested:
            return held.fencing_token == nested.fencing_token

    t_result: list = []
    t = threading.Thread(target=lambda: t_result.append(reentrant_waiter()))
    t.start()
    time.sleep(0.2)
    plain.release()
    t.join(30)
    assert t_result == [True]
    # A plain waiter handed the lease by the reentrant release script: the
    # old reentrant owner cannot re-enter it.
    mine = lock(name)
    mine.acquire()
    got: list = []
    done = threading.Event()

    def plain_waiter():
        with lock(name, using="plain", timeout=10):
            got.append(True)
            done.wait(30)

    t = threading.Thread(target=plain_waiter)
    t.start()
    time.sleep(0.2)
    mine.release()
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    assert got
    assert lock(name, timeout=0).acquire() is False
    done.set()
    t.join(30)


def test_holders_list_a_nested_lock_once(reentrant, name):
    with lock(name) as outer, lock(name, timeout=0):
        (h,) = [h for h in reentrant.holders() if h.name == name]
        assert h.token == outer.lease.token
        assert h.fencing_token == outer.fencing_token
        assert threading.current_thread().name in h.thread
    assert [h for h in reentrant.holders() if h.name == name] == []


def test_waiter_that_gives_up_keeps_a_plain_handoff_and_can_nest(reentrant, name):
    # Drive the acquire steps by hand: queued, then the wait times out just
    # as the plain backend's release hands the lease over.
    plain = lock(name, using="plain")
    plain.acquire()
    steps = reentrant._acquire_steps(name, 5, 0.05)
    command = steps.send(None)
    assert command[1].name == "reentrant_acquire"
    reply = reentrant._execute(command)
    assert reply[0] == 0  # busy: queued
    plain.release()  # handed to the queued waiter (plain message, no owner)
    time.sleep(0.1)  # past the waiter's deadline
    command = steps.send(reply)
    assert command[1].name == "cancel"
    command = steps.send(reentrant._execute(command))
    assert command[1].name == "reentrant_adopt"
    try:
        steps.send(reentrant._execute(command))
    except StopIteration as stop:
        lease = stop.value
    assert isinstance(lease, ReentrantLease)
    nested = reentrant.acquire(name, 5, 0)
    assert nested is not None and nested.token == lease.token
    assert not in_thread(try_once, name)
    assert reentrant.release(nested) and reentrant.release(lease)
    assert in_thread(try_once, name)


@pytest.mark.parametrize("handed_over", [False, True])
def test_interrupted_waiter_leaves_no_trace(reentrant, name, handed_over):
    holder = lock(name)
    holder.acquire()
    original = reentrant._execute
    queued, go_on = threading.Event(), threading.Event()
    waiter_thread: list = []

    def interrupt_blpop(command):
        if command[0] == "blpop" and threading.current_thread() in waiter_thread:
            queued.set()
            go_on.wait(30)  # meanwhile the holder may hand the lease over
            raise KeyboardInterrupt
        return original(command)

    def waiter():
        try:
            lock(name, timeout=10).acquire()
        except KeyboardInterrupt:
            return "interrupted"

    reentrant._execute = interrupt_blpop
    try:
        result: list = []
        t = threading.Thread(target=lambda: result.append(waiter()))
        waiter_thread.append(t)
        t.start()
        assert queued.wait(30)
        if handed_over:
            holder.release()  # hands the lease to the queued waiter
        go_on.set()
        t.join(30)
    finally:
        del reentrant._execute
    assert result == ["interrupted"]
    leftover = {k.decode() for k in reentrant.client.keys("*")}
    if handed_over:
        assert leftover == set()  # the handed lease was given back
    else:
        assert leftover == {reentrant.keys_for(name).lease}
        holder.release()
    assert in_thread(try_once, name)


def test_cancelled_async_waiter_leaves_no_trace(reentrant, name):
    async def scenario():
        holder = lock(name)
        await holder.aacquire()
        task = asyncio.create_task(lock(name, timeout=10).aacquire())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await holder.arelease()
        # The cancelled waiter must not have kept a lease handed to it.
        other = lock(name, timeout=5)
        got = await other.aacquire()
        if got:
            await other.arelease()
        return got

    assert asyncio.run(scenario()) is True
    assert reentrant.client.keys("*") == []


def test_forgotten_holds_are_swept(reentrant, name, monkeypatch):
    monkeypatch.setattr(redis_reentrant, "MAX_HOLDS", 4)
    for i in range(10):
        reentrant.acquire(f"{name}:{i}", 5, 0)  # dropped without a release
    assert len(reentrant._holds) <= 4
    kept = reentrant.acquire(name, 5, 0)
    for i in range(10):
        reentrant.acquire(f"{name}:more:{i}", 5, 0)
    assert reentrant._holds[(name, kept.token)] is kept.hold
    assert reentrant.release(kept)
    assert (name, kept.token) not in reentrant._holds


@pytest.mark.parametrize("flush_scripts", [False, True])
def test_async_nested_auto_renewal(reentrant, name, monkeypatch, flush_scripts):
    def not_in_a_thread(leases):
        raise AssertionError("the asyncio watchdog must renew natively")

    monkeypatch.setattr(reentrant, "renew", not_in_a_thread)
    if flush_scripts:
        reentrant.client.script_flush()

    async def scenario():
        async with lock(name, ttl=0.6) as outer:
            async with lock(name, ttl=0.6, timeout=0) as inner:
                await asyncio.sleep(2.0)
                assert await inner.alocked() and await outer.alocked()
                assert inner.lease.hold is outer.lease.hold

    asyncio.run(scenario())
    assert in_thread(try_once, name)


def test_leases_are_reentrant_leases(reentrant, name):
    assert isinstance(reentrant, ReentrantRedisLockBackend)
    assert reentrant.reentrant
    lease = reentrant.acquire(name, 5, 0)
    assert isinstance(lease, ReentrantLease)
    assert lease.owner == current_owner()
    assert reentrant.release(lease)


# -- the shared contract ----------------------------------------------------


class TestReentrantContract(LockBackendContract):
    """The shared backend contract on the reentrant backend, nesting aside.

    The contract checks contention from the test's own thread (a second
    handle must wait), which a reentrant lock rightly does not do. So here
    every acquisition in this process is its own owner: the reentrant
    scripts then have to behave exactly like a plain lock (exclusion,
    expiry, handoff, renewal, loss, listing, processes). Nesting itself is
    tested above, with real owners.
    """

    @pytest.fixture
    def locks_setting(self, redis_url, monkeypatch):
        monkeypatch.setattr(
            redis_reentrant, "current_owner", lambda: f"test:{uuid.uuid4().hex}"
        )
        monkeypatch.setattr(
            ReentrantLease, "check_owner_process", Lease.check_owner_process
        )
        return reentrant_locks(redis_url)
