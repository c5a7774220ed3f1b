"""Redlock backend: real redis-server processes, started, killed and paused here.

Every cross-process property is checked with spawned worker processes
(:mod:`tests.procs`); the workers are the module-level ``_worker_*``
functions below.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from pathlib import Path

import pytest
import redis
from django.core.checks import Error, Warning
from django.test import override_settings

from django_distlock import LockBackendError, LockLost, LockNotAcquired, lock, locks
from django_distlock.backends.redlock import (
    MAX_OWED_REPLIES,
    RedlockBackend,
    pack_meta,
    unpack_meta,
)
from django_distlock.checks import check_locks_setting

from .contract import LockBackendContract
from .procs import start_process
from .servers import RedisServer

BACKEND = "django_distlock.backends.redlock.RedlockBackend"


def redlock_locks(servers, **options) -> dict:
    """A LOCKS setting whose default alias is Redlock over ``servers``."""
    return {
        "default": {
            "BACKEND": BACKEND,
            "LOCATION": [s.url for s in servers],
            # The tests restart nodes on purpose; the restart quarantine has
            # tests of its own.
            "OPTIONS": {"RESTART_DELAY": 0, **options},
        }
    }


def backend_for(servers, ttl: float = 30, **options) -> RedlockBackend:
    params = redlock_locks(servers, **options)["default"]
    params["TTL"] = ttl
    return RedlockBackend("redlock", params)


@pytest.fixture
def nodes():
    """Five fresh redis-server processes of this test alone."""
    servers = [RedisServer().start() for _ in range(5)]
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def shared_nodes():
    servers = [RedisServer().start() for _ in range(5)]
    yield servers
    for server in servers:
        server.stop()


# -- the shared contract ---------------------------------------------------


class TestRedlockContract(LockBackendContract):
    """The backend contract, on 5 nodes."""

    @pytest.fixture
    def locks_setting(self, shared_nodes):
        for server in shared_nodes:
            server.client().flushall()
        return redlock_locks(shared_nodes)


# -- the algorithm on healthy nodes ---------------------------------------


def test_acquire_sets_the_lease_on_every_node_and_release_clears_it(nodes):
    backend = backend_for(nodes)
    lease = backend.acquire("a", 5, 0)
    assert lease is not None
    key = backend.keys_for("a")[0]
    for server in nodes:
        token, fence, _holder = server.client().get(key).split(b"\n", 2)
        assert token == lease.token.encode()
        assert int(fence) == lease.fencing_token
    assert backend.acquire("a", 5, 0) is None  # contention: None, not an error
    assert backend.release(lease) is True
    for server in nodes:
        assert not server.client().exists(key)
    assert backend.release(lease) is False


def test_validity_accounts_for_drift(nodes):
    backend = backend_for(nodes)
    before = time.monotonic()
    lease = backend.acquire("v", 10, 0)
    # deadline = start + ttl - (0.01 * ttl + 2 ms), measured from before sending
    assert lease.deadline <= before + 10 - 0.1 - 0.002 + 1
    assert lease.deadline <= time.monotonic() + 10 - 0.102
    backend.release(lease)


def test_partial_acquisition_is_undone_everywhere(nodes):
    backend = backend_for(nodes)
    key = backend.keys_for("p")[0]
    # Someone else holds the lock on 3 nodes: we can get only 2.
    for server in nodes[:3]:
        server.client().set(key, b"other\n1\n" + pack_meta("p", "h", 1, "t", 0))
        server.client().pexpire(key, 10_000)
    assert backend.acquire("p", 5, 0) is None
    for server in nodes[3:]:
        assert not server.client().exists(key)  # our 2 grants were undone


def test_a_first_attempt_is_plain_commands_and_listing_reads_the_counter(nodes):
    """Steady state: SET NX PX + INCR per node, no script; tokens still exact."""
    backend = backend_for(nodes)
    first = backend.acquire("plain", 5, 0)  # new counters: raised and committed
    assert backend.release(first) is True
    key, counter = backend.keys_for("plain")[:2]
    before = [server.client().info("commandstats") for server in nodes]
    lease = backend.acquire("plain", 5, 0)
    for server, stats in zip(nodes, before):
        after = server.client().info("commandstats")
        assert after.get("cmdstat_evalsha") == stats.get("cmdstat_evalsha")
        token, fence, _meta = server.client().get(key).split(b"\n", 2)
        assert (token, fence) == (lease.token.encode(), b"")
        assert int(server.client().get(counter)) == lease.fencing_token
        assert 0 < server.client().pttl(counter)  # a counter always expires
    assert lease.fencing_token > first.fencing_token
    [holder] = backend.holders()
    assert holder.fencing_token == lease.fencing_token
    assert backend.release(lease) is True


def test_a_busy_first_attempt_leaves_no_counter_without_expiry(nodes):
    """INCR creates a missing counter with no expiry: a failed try fixes that."""
    backend = backend_for(nodes)
    held = backend.acquire("busy", 5, 0)
    counter = backend.keys_for("busy")[1]
    for server in nodes:  # past FENCE_RETENTION (or lost) while held
        server.client().delete(counter)
    assert backend.acquire("busy", 5, 0) is None
    for server in nodes:
        assert 0 < server.client().pttl(counter)
        assert int(server.client().get(counter)) >= 1 << 20
    assert backend.release(held) is True
    later = backend.acquire("busy", 5, 0)
    assert later.fencing_token > held.fencing_token
    assert backend.release(later) is True


def test_a_step_stops_reading_once_a_quorum_decided_it(nodes):
    """The last nodes' replies are read (and dropped) with the next step."""
    backend = backend_for(nodes)
    backend.release(backend.acquire("early", 5, 0))  # counters set up
    lease = backend.acquire("early", 5, 0)
    links = backend._thread_links()
    owed = [links[i].owed for i in range(len(nodes))]
    # Unread on nodes 3 and 4: the release before (1 reply), then this
    # acquisition's SET NX PX + INCR (2).
    assert owed == [0, 0, 0, 3, 3]
    for server in nodes:  # they were sent everywhere all the same
        assert server.client().get(backend.keys_for("early")[0])
    assert backend.is_held(lease) is True  # reads every node: owed first
    assert [links[i].owed for i in range(len(nodes))] == [0] * 5
    assert backend.release(lease) is True
    # A waiter blocks (BLPOP) on a connection that may owe replies: they are
    # drained first, so the wake-up is not mistaken for an old reply.
    for _ in range(20):
        held = backend.acquire("early", 5, 0)
        assert backend.release(held) is True
    other = backend_for(nodes)
    held = other.acquire("early", 5, 0)
    waited = []
    thread = threading.Thread(
        target=lambda: waited.append(backend.acquire("early", 5, 3))
    )
    thread.start()
    time.sleep(0.2)
    assert other.release(held) is True
    thread.join(5)
    [got] = waited
    assert got is not None and got.fencing_token > held.fencing_token
    assert backend.release(got) is True
    for server in nodes:
        assert not server.client().exists(backend.keys_for("early")[0])


def test_the_nodes_read_last_owe_a_bounded_number_of_replies(nodes):
    """Steps stop at the quorum, so the same nodes go unread step after step:
    their replies must still be read before they pile up."""
    backend = backend_for(nodes)
    for _ in range(100):
        assert backend.release(backend.acquire("debt", 5, 0)) is True
    links = backend._thread_links()
    owed = [links[i].owed for i in range(len(nodes))]
    assert max(owed) <= MAX_OWED_REPLIES, owed
    assert owed[-1] > 0  # the steps still stop at the quorum

    async def cycles():
        for _ in range(100):
            lease = await backend.aacquire("debt", 5, 0)
            assert await backend.arelease(lease) is True
        return [link.owed for idle in backend._afree() for link in idle]

    owed = asyncio.run(cycles())
    assert len(owed) == len(nodes)
    assert max(owed) <= MAX_OWED_REPLIES, owed


def test_a_new_connection_is_checked_for_a_restart_even_if_read_last(nodes):
    """The node's identity comes with the first replies of a new connection:
    they are read even when the quorum decided without that node, or a
    restart would go unnoticed (and the node's next votes count)."""
    backend = backend_for(nodes, RESTART_DELAY=600)
    assert backend.release(backend.acquire("x", 5, 0)) is True
    backend._thread_links()[4].conn.disconnect()
    backend.nodes[4].run_id = "the identity before a restart"
    lease = backend.acquire("x", 5, 0)
    assert lease is not None
    assert backend.nodes[4].quarantine_until > time.monotonic()
    assert backend.release(lease) is True


def test_holders_need_a_quorum_and_force_release(nodes):
    backend = backend_for(nodes)
    name = "listed \n*?[ ünïcode"
    lease = backend.acquire(name, 5, 0)
    [holder] = list(backend.holders())
    assert holder.name == name
    assert holder.token == lease.token
    assert holder.fencing_token == lease.fencing_token
    assert holder.pid == os.getpid()
    assert holder.expires_at is not None
    assert [h.token for h in backend.holders(prefix="listed \n*")] == [lease.token]
    assert list(backend.holders(prefix="listed *")) == []
    # A lease on a minority of nodes is not a holder.
    key = backend.keys_for("minority")[0]
    for server in nodes[:2]:
        server.client().set(key, b"x\n1\n" + pack_meta("m", "h", 1, "t", 0))
        server.client().pexpire(key, 10_000)
    assert [h.name for h in backend.holders()] == [name]
    assert backend.force_release(name, "not-the-token") is False
    assert backend.force_release(name, lease.token) is True
    assert list(backend.holders()) == []
    # The evicted holder learns it at its next renewal.
    assert backend.renew([lease]) == [False]


def test_holder_of_one_name_in_one_fanout(nodes, monkeypatch):
    backend = backend_for(nodes)
    name = "looked up \n*?[ ünïcode"
    lease = backend.acquire(name, 5, 0)
    steps = []
    real = backend._fanout
    monkeypatch.setattr(
        backend, "_fanout", lambda step: steps.append(step) or real(step)
    )
    monkeypatch.setattr(backend, "_scan", lambda: pytest.fail("listing scanned"))
    holder = backend.holder_of(name)
    assert len(steps) == 1  # one round trip to the nodes
    assert holder.name == name and holder.token == lease.token
    assert holder.fencing_token == lease.fencing_token
    assert holder.pid == os.getpid() and holder.expires_at is not None
    again = asyncio.run(backend.aholder_of(name))
    assert (again.name, again.token, again.fencing_token) == (
        holder.name,
        holder.token,
        holder.fencing_token,
    )
    assert backend.holder_of(name[:-1]) is None  # a prefix is another name
    # A lease on a minority of nodes is no holder.
    key = backend.keys_for("minority")[0]
    for server in nodes[:2]:
        server.client().set(key, b"x\n1\n" + pack_meta("minority", "h", 1, "t", 0))
        server.client().pexpire(key, 10_000)
    assert backend.holder_of("minority") is None
    assert backend.release(lease) is True
    assert backend.holder_of(name) is None


def test_meta_round_trips_any_name():
    for name in ["", "x", "a\nb", "\x00\ud800", "ü" * 1000]:
        assert unpack_meta(pack_meta(name, "host", 12, "T/t\n", 1.5)) == (
            name,
            "host",
            12,
            "T/t\n",
            1.5,
        )


def test_renew_batches_and_reports_lost(nodes):
    backend = backend_for(nodes)
    leases = [backend.acquire(f"r{i}", 1, 0) for i in range(3)]
    old = [le.deadline for le in leases]
    time.sleep(0.05)
    # One of them is taken away on a majority of the nodes.
    key = backend.keys_for("r1")[0]
    for server in nodes[:3]:
        server.client().delete(key)
    assert backend.renew(leases) == [True, False, True]
    assert leases[0].deadline > old[0] and leases[2].deadline > old[2]


def test_extend_needs_a_quorum(nodes):
    backend = backend_for(nodes)
    lease = backend.acquire("e", 1, 0)
    assert backend.extend(lease, 5) is True
    for server in nodes:
        assert server.client().pttl(backend.keys_for("e")[0]) > 2000
    for server in nodes[:3]:
        server.client().delete(backend.keys_for("e")[0])
    assert backend.extend(lease, 5) is False


def test_release_wakes_a_waiter_promptly(nodes):
    """A waiter blocks on a wake list; a release is noticed well before the TTL."""
    backend = backend_for(nodes)
    gaps = []
    for _ in range(5):
        lease = backend.acquire("w", 30, 0)
        got = []

        def wait(got=got):
            got.append((backend.acquire("w", 30, 10), time.monotonic()))

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.15)  # the waiter is blocked now
        released = time.monotonic()
        backend.release(lease)
        waiter.join(15)
        assert got and got[0][0] is not None
        gaps.append(got[0][1] - released)
        backend.release(got[0][0])
    gaps.sort()
    # Without the wake-up it would take the 1 s wait slice at best; generous
    # bound for a loaded machine.
    assert gaps[len(gaps) // 2] < 0.5, gaps


def test_a_releaser_that_loops_does_not_starve_a_waiter(nodes):
    backend = backend_for(nodes)
    stop = threading.Event()
    got = []

    def waiter():
        lease = backend.acquire("fair", 30, 20)
        got.append(lease)
        if lease is not None:
            backend.release(lease)

    lease = backend.acquire("fair", 30, 0)
    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.1)
    deadline = time.monotonic() + 15
    while thread.is_alive() and time.monotonic() < deadline and not stop.is_set():
        backend.release(lease)
        lease = backend.acquire("fair", 30, 5)  # re-take at once, in a loop
        assert lease is not None
    thread.join(10)
    backend.release(lease)
    assert got and got[0] is not None


def test_async_api(nodes):
    async def main():
        with override_settings(LOCKS=redlock_locks(nodes)):
            async with lock("async", timeout=0) as held:
                assert isinstance(held.fencing_token, int)
                assert await held.alocked()
                assert not await lock("async", timeout=0).aacquire()
                await held.aextend(10)
            # Tasks contending: strictly one at a time.
            inside = 0
            peak = 0

            async def task():
                nonlocal inside, peak
                async with lock("async-c", timeout=20, ttl=5):
                    inside += 1
                    peak = max(peak, inside)
                    await asyncio.sleep(0.005)
                    inside -= 1

            await asyncio.gather(*(task() for _ in range(8)))
            locks.reset()
            return peak

    assert asyncio.run(main()) == 1


def test_cancelled_async_acquisitions_leave_nothing_behind(nodes):
    """A task cancelled while it waits leaves the waiters' queue (the next
    release hands the lock to a live waiter at once), and one cancelled
    mid-step leaves no lease; the nodes are not marked down for it."""
    backend = backend_for(nodes)
    keys = backend.keys_for("cancelled")
    clients = [redis.Redis.from_url(s.url) for s in nodes]

    async def main():
        holder = await backend.aacquire("cancelled", 30, 0)
        assert holder is not None
        waiter = asyncio.create_task(backend.aacquire("cancelled", 30, 20))
        await asyncio.sleep(0.3)  # registered and blocking by now
        assert all(c.zcard(keys[2]) == 1 for c in clients)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert all(c.zcard(keys[2]) == 0 for c in clients)
        live = asyncio.create_task(backend.aacquire("cancelled", 30, 20))
        await asyncio.sleep(0.3)
        started = time.monotonic()
        assert await backend.arelease(holder)
        lease = await live
        assert lease is not None and time.monotonic() - started < 0.5
        assert await backend.arelease(lease)
        # Cancelled at every point of a free lock's first attempt: whatever
        # the nodes granted is undone, and the nodes stay usable.
        for delay in (0, 0.0001, 0.0003, 0.0006, 0.001):
            task = asyncio.create_task(backend.aacquire("mid-step", 30, 0))
            await asyncio.sleep(delay)
            task.cancel()
            try:
                lease = await task
            except asyncio.CancelledError:
                pass
            else:
                assert await backend.arelease(lease)
            assert not any(c.exists(backend.keys_for("mid-step")[0]) for c in clients)
            assert all(node.down_until < time.monotonic() for node in backend.nodes)

    asyncio.run(main())


# -- failures --------------------------------------------------------------


def test_majority_down_is_a_backend_error_then_recovers(nodes):
    with override_settings(LOCKS=redlock_locks(nodes)):
        with lock("m", timeout=0):
            pass
        for server in nodes[:3]:
            server.kill()
        started = time.monotonic()
        with pytest.raises(LockBackendError):
            with lock("m", timeout=2):
                pass
        assert time.monotonic() - started < 2 + 1 + 1  # timeout + 1 s (+ slack)
        started = time.monotonic()
        with pytest.raises(LockBackendError):
            lock("m", timeout=0).acquire()
        assert time.monotonic() - started < 2
        for server in nodes[:3]:
            server.start()
        # Same process, same backend object: no client restart needed.
        with lock("m", timeout=5) as held:
            assert held.locked()
        locks.reset()


def test_minority_down_still_works(nodes):
    backend = backend_for(nodes)
    nodes[0].kill()
    nodes[1].kill()
    lease = backend.acquire("min", 5, 0)
    assert lease is not None
    assert backend.acquire("min", 5, 0) is None  # contention, not an error
    assert backend.renew([lease]) == [True]
    assert backend.release(lease) is True


def test_paused_node_does_not_stall(nodes):
    backend = backend_for(nodes, NODE_TIMEOUT=0.1)
    backend.release(backend.acquire("warm", 5, 0))
    nodes[2].pause()
    try:
        worst = 0.0
        for i in range(20):
            started = time.monotonic()
            lease = backend.acquire(f"s{i}", 5, 0)
            assert lease is not None
            assert backend.release(lease) is True
            worst = max(worst, time.monotonic() - started)
        # One NODE_TIMEOUT for the first call, then the node is skipped;
        # never the socket's default or a sum over calls (generous bound).
        assert worst < 1.5
    finally:
        nodes[2].resume()
    lease = backend.acquire("after", 5, 0)
    assert lease is not None


def test_two_paused_nodes_cost_one_timeout_not_two(nodes):
    backend = backend_for(nodes, NODE_TIMEOUT=0.5)
    backend.release(backend.acquire("warm", 5, 0))
    nodes[0].pause()
    nodes[1].pause()
    try:
        started = time.monotonic()
        lease = backend.acquire("two", 5, 0)
        elapsed = time.monotonic() - started
        assert lease is not None
        # Both nodes share one deadline: about 0.5 s, not 1 s.
        assert elapsed < 0.95
    finally:
        nodes[0].resume()
        nodes[1].resume()


def test_fencing_tokens_increase_while_nodes_die_and_return(nodes):
    backend = backend_for(nodes, ttl=5)
    rng = random.Random(7)
    tokens = []
    down: list[RedisServer] = []
    for i in range(50):
        lease = backend.acquire("fence", 5, 5)
        assert lease is not None, i
        tokens.append(lease.fencing_token)
        backend.release(lease)
        # Change which nodes answer: kill one (at most 2 down) or bring
        # one back empty.
        if down and (len(down) == 2 or rng.random() < 0.5):
            down.pop(rng.randrange(len(down))).start()
        else:
            victim = rng.choice([s for s in nodes if s not in down])
            victim.kill()
            down.append(victim)
    assert all(b > a for a, b in zip(tokens, tokens[1:])), tokens


def test_fencing_tokens_survive_a_majority_wipe_by_the_clock(nodes):
    """Beyond the guarantee: every node loses its data; the clock still wins."""
    backend = backend_for(nodes)
    first = backend.acquire("wipe", 5, 0)
    backend.release(first)
    time.sleep(1.05)  # tokens are (server seconds << 20) + count
    for server in nodes:
        server.restart()
    second = backend.acquire("wipe", 5, 5)
    assert second.fencing_token > first.fencing_token


def test_disagreeing_nodes_commit_the_token_to_a_majority(nodes):
    backend = backend_for(nodes)
    counter = backend.keys_for("c")[1]
    # Node 0 is far ahead (its counter was raised by a lost acquisition).
    nodes[0].client().set(counter, 2**52)
    lease = backend.acquire("c", 5, 0)
    assert lease.fencing_token == 2**52 + 1
    # Made visible on every node that holds the lease, before returning.
    for server in nodes:
        assert int(server.client().get(counter)) == 2**52 + 1
        value = server.client().get(backend.keys_for("c")[0])
        assert int(value.split(b"\n")[1]) == 2**52 + 1
    backend.release(lease)
    nodes[0].restart()  # the node that had it loses everything
    again = backend.acquire("c", 5, 5)
    assert again.fencing_token > lease.fencing_token


def test_node_restarted_empty_while_held_full_grant(nodes):
    """The holder has all 5 nodes: one node losing its data changes nothing."""
    holder = backend_for(nodes)
    other = backend_for(nodes)
    lease = holder.acquire("held", 30, 0)
    nodes[0].restart()
    assert other.acquire("held", 30, 0.3) is None
    assert holder.renew([lease]) == [True]


def _bare_quorum(nodes, holder):
    """Take ``held`` on exactly 3 nodes (2 down), then bring the 2 back."""
    nodes[3].kill()
    nodes[4].kill()
    lease = holder.acquire("held", 30, 5)
    assert lease is not None
    nodes[3].start()
    nodes[4].start()
    return lease


def test_node_restarted_empty_bare_quorum_fencing_catches_it(nodes):
    """Without the delayed-restart rule, a node that restarts empty lets a
    second holder in (Redlock's documented limit); its larger fencing token
    is what keeps the data safe."""
    holder = backend_for(nodes, ttl=30)
    other = backend_for(nodes, ttl=30)
    lease = _bare_quorum(nodes, holder)
    time.sleep(1.05)  # the restart happens in a later second than the grant
    nodes[0].restart()  # one of the holder's 3 nodes loses the lease
    second = other.acquire("held", 30, 5)
    assert second is not None  # the overlap Redlock cannot prevent here ...
    assert second.fencing_token > lease.fencing_token  # ... fencing rejects it
    # and the first holder learns at its next renewal that it lost the lock.
    assert holder.renew([lease]) in ([False], [None])


def test_node_restarted_empty_bare_quorum_delayed_restart_rule(nodes):
    """With RESTART_DELAY (default: the TTL) a client that sees a node come
    back with a new run id does not count its votes until then."""
    holder = backend_for(nodes, ttl=30, RESTART_DELAY=2)
    other = backend_for(nodes, ttl=30, RESTART_DELAY=2)
    lease = _bare_quorum(nodes, holder)
    # The contender knows every node before node 0 restarts.
    other.release(other.acquire("warm", 5, 0))
    nodes[0].restart()
    assert other.acquire("held", 30, 0.5) is None  # no overlap
    holder.release(lease)
    time.sleep(2.1)
    later = other.acquire("held", 30, 5)
    assert later is not None
    assert later.fencing_token > lease.fencing_token


# -- mutual exclusion across processes while nodes die ---------------------


def _worker_mutex(log_path: str, counter_path: str, stop_path: str) -> int:
    """Loop: take the lock, read-modify-write a file, log the critical section."""
    done = 0
    deadline = time.monotonic() + 90
    with open(log_path, "a", buffering=1) as log:
        while not os.path.exists(stop_path) and time.monotonic() < deadline:
            try:
                held = lock("mutex", ttl=2, timeout=5)
                if not held.acquire():
                    continue
            except LockBackendError:
                time.sleep(0.05)
                continue
            try:
                start = time.monotonic()
                value = int(Path(counter_path).read_text() or 0)
                time.sleep(0.002)
                Path(counter_path).write_text(str(value + 1))
                end = time.monotonic()
                token = held.fencing_token
            finally:
                try:
                    held.release()
                except LockLost:
                    pass
            log.write(f"{os.getpid()} {start!r} {end!r} {token}\n")
            done += 1
    return done


def _lines(path: Path) -> list[tuple[int, float, float, int]]:
    out = []
    for line in path.read_text().splitlines():
        pid, start, end, token = line.split()
        out.append((int(pid), float(start), float(end), int(token)))
    return out


def _wait_lines(path: Path, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"workers made no progress: {path.read_text()!r}")


def _wait_pids(path: Path, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len({pid for pid, *_ in _lines(path)}) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"fewer than {count} workers took the lock")
        time.sleep(0.05)


def test_mutual_exclusion_across_processes_while_two_nodes_die(nodes, tmp_path):
    log_path = tmp_path / "log"
    counter = tmp_path / "counter"
    stop = tmp_path / "stop"
    counter.write_text("0")
    log_path.write_text("")
    with override_settings(LOCKS=redlock_locks(nodes)):
        procs = [
            start_process(_worker_mutex, str(log_path), str(counter), str(stop))
            for _ in range(4)
        ]
        try:
            _wait_lines(log_path, 30)
            # Spawning and setting Django up is slow on a loaded machine: the
            # first worker may take many turns before the others arrive.
            _wait_pids(log_path, 2)
            nodes[1].kill()
            nodes[3].kill()
            before = len(_lines(log_path))
            _wait_lines(log_path, before + 30)
        finally:
            stop.write_text("stop")
            for proc in procs:
                proc.join(60)
    entries = sorted(_lines(log_path), key=lambda e: e[1])
    assert all(proc.exitcode == 0 for proc in procs)
    assert len({pid for pid, *_ in entries}) >= 2
    overlaps = [(a, b) for a, b in zip(entries, entries[1:]) if b[1] < a[2]]
    assert overlaps == []
    assert int(counter.read_text()) == len(entries)  # no lost update
    tokens = [e[3] for e in entries]
    assert all(b > a for a, b in zip(tokens, tokens[1:]))


# -- system checks ---------------------------------------------------------


def _ids(messages):
    return [m.id for m in messages]


def test_checks():
    urls = [f"redis://127.0.0.1:{6400 + i}/0" for i in range(5)]
    ok = {"BACKEND": BACKEND, "LOCATION": urls}
    assert RedlockBackend.check("q", ok) == []
    few = RedlockBackend.check("q", {**ok, "LOCATION": urls[:2]})
    assert _ids(few) == ["distlock.E011"] and isinstance(few[0], Error)
    even = RedlockBackend.check("q", {**ok, "LOCATION": urls[:4]})
    assert _ids(even) == ["distlock.W001"] and isinstance(even[0], Warning)
    assert _ids(RedlockBackend.check("q", {**ok, "LOCATION": urls[0]})) == [
        "distlock.E004"
    ]
    bad = RedlockBackend.check("q", {**ok, "LOCATION": [*urls[:2], "http://x"]})
    assert _ids(bad) == ["distlock.E004"]
    twice = RedlockBackend.check("q", {**ok, "LOCATION": [urls[0]] * 3})
    assert _ids(twice) == ["distlock.E004"]
    opts = RedlockBackend.check("q", {**ok, "OPTIONS": {"NODE_TIMEOUT": 0, "X": 1}})
    assert _ids(opts) == ["distlock.E009", "distlock.E009"]
    with override_settings(LOCKS={"default": {**ok, "LOCATION": urls[:2]}}):
        assert "distlock.E011" in _ids(check_locks_setting())
    with override_settings(LOCKS={"default": {**ok, "LOCATION": urls[:4]}}):
        assert _ids(check_locks_setting()) == ["distlock.W001"]


def test_lock_not_acquired_under_contention(nodes):
    with override_settings(LOCKS=redlock_locks(nodes)):
        with lock("busy"):
            with pytest.raises(LockNotAcquired):
                with lock("busy", timeout=0.2):
                    pass
        locks.reset()


def test_waiting_behind_a_bare_quorum_holder_does_not_poll(nodes, monkeypatch):
    """The waiter gets 2 of 5 nodes every attempt; it must still block, not spin."""
    holder = backend_for(nodes)
    waiter = backend_for(nodes)
    lease = _bare_quorum(nodes, holder)
    steps = []
    real = waiter._fanout
    monkeypatch.setattr(
        waiter, "_fanout", lambda step: steps.append(step) or real(step)
    )
    assert waiter.acquire("held", 30, 1.0) is None
    # About one attempt per MAX_WAIT_SLICE (plus undo and cleanup), not one
    # every few milliseconds.
    assert len(steps) < 12, len(steps)
    holder.release(lease)


def test_no_quorum_never_hangs_even_when_waiting_forever(nodes):
    backend = backend_for(nodes)
    for server in nodes[:3]:
        server.kill()
    started = time.monotonic()
    with pytest.raises(LockBackendError):
        backend.acquire("forever", 5, None)
    assert time.monotonic() - started < 5


def test_async_paused_node_and_majority_down(nodes):
    async def main():
        backend = backend_for(nodes, NODE_TIMEOUT=0.3)
        lease = await backend.aacquire("ap", 5, 0)
        await backend.arelease(lease)
        nodes[0].pause()
        nodes[1].pause()
        try:
            started = time.monotonic()
            lease = await backend.aacquire("ap", 5, 0)
            assert lease is not None
            # One shared deadline for both stopped nodes.
            assert time.monotonic() - started < 0.6 + 0.5
            assert await backend.arenew([lease]) == [True]
            assert await backend.arelease(lease) is True
        finally:
            nodes[0].resume()
            nodes[1].resume()
        for server in nodes[2:]:
            server.kill()
        started = time.monotonic()
        with pytest.raises(LockBackendError):
            await backend.aacquire("ap", 5, 1)
        assert time.monotonic() - started < 1 + 1 + 1
        for server in nodes[2:]:
            server.start()
        lease = await backend.aacquire("ap", 5, 5)
        assert lease is not None
        # A waiter in another task is woken by the release.
        waiter = asyncio.ensure_future(backend.aacquire("ap", 5, 10))
        await asyncio.sleep(0.1)
        released = time.monotonic()
        await backend.arelease(lease)
        second = await waiter
        assert second is not None
        assert time.monotonic() - released < 0.9  # below the 1 s wait slice

    asyncio.run(main())


def _worker_take_and_save(account_pk: int) -> int:
    """Take ``held`` (from another process) and save the account under it."""
    from tests.testapp.models import Account

    with lock("held", ttl=30, timeout=10, auto_renew=False) as held:
        account = Account.objects.get(pk=account_pk)
        account.balance = 2
        account.save(fence=held)
        return held.fencing_token


@pytest.mark.django_db(transaction=True)
def test_node_restarted_empty_fencing_across_processes(nodes):
    """The bare-quorum overlap again, with a second process and a real row:
    the newer holder's save stands, the older holder's late save is refused."""
    from django_distlock import StaleFencingToken
    from tests.testapp.models import Account

    from .procs import run_in_processes

    account = Account.objects.create(owner="o", balance=0)
    with override_settings(LOCKS=redlock_locks(nodes)):
        nodes[3].kill()
        nodes[4].kill()
        held = lock("held", ttl=30, timeout=5, auto_renew=False)
        assert held.acquire()  # on exactly 3 of 5 nodes
        nodes[3].start()
        nodes[4].start()
        time.sleep(1.05)
        nodes[0].restart()  # loses the lease: now only 2 of 5 hold it
        [token] = run_in_processes(_worker_take_and_save, [(account.pk,)])
        assert token > held.fencing_token
        account.balance = 1
        with pytest.raises(StaleFencingToken):
            account.save(fence=held)
        account.refresh_from_db()
        assert account.balance == 2
        with pytest.raises(LockLost):
            held.release()  # a majority says the lease is gone
        locks.reset()


def test_clear_stale_removes_only_old_minority_leftovers(nodes):
    backend = backend_for(nodes)
    live = backend.acquire("live", 30, 0)
    old_key = backend.keys_for("old")[0]
    new_key = backend.keys_for("new")[0]
    for server in nodes[:2]:
        client = server.client()
        client.set(old_key, b"t1\n1\n" + pack_meta("old", "h", 1, "t", 0), px=30_000)
        client.set(
            new_key, b"t2\n1\n" + pack_meta("new", "h", 1, "t", time.time()), px=30_000
        )
    assert backend.clear_stale() == 1
    for server in nodes[:2]:
        assert not server.client().exists(old_key)
        assert server.client().exists(new_key)  # maybe an acquisition under way
    assert [h.name for h in backend.holders()] == ["live"]
    assert backend.release(live) is True


def test_script_cache_flushed_on_every_node(nodes):
    backend = backend_for(nodes)
    backend.release(backend.acquire("flush", 5, 0))
    for server in nodes:
        server.client().script_flush()
    lease = backend.acquire("flush", 5, 2)  # reconnects, reloads the scripts
    assert lease is not None
    assert backend.release(lease) is True

    async def main():
        lease = await backend.aacquire("flush", 5, 0)
        await backend.arelease(lease)
        for server in nodes:
            server.client().script_flush()
        lease = await backend.aacquire("flush", 5, 2)
        assert lease is not None
        assert await backend.arelease(lease) is True

    asyncio.run(main())


def test_a_leftover_of_our_own_earlier_attempt_is_renewed(nodes, monkeypatch):
    """An attempt whose undo missed a node finds its own lease there later."""
    from django_distlock.backends.redlock import algorithm as redlock

    backend = backend_for(nodes)
    key = backend.keys_for("own")[0]
    monkeypatch.setattr(redlock, "new_token", lambda: "fixed-token")
    # An earlier attempt of this very acquisition left a short lease behind
    # (on node 0), and someone else holds nodes 1 and 2 for a moment: the
    # first attempt (plain SET NX) gets 2 of 5, the retry (the script) finds
    # its own lease on node 0 and counts it.
    nodes[0].client().set(
        key, b"fixed-token\n7\n" + pack_meta("own", "h", 1, "t", 0), px=800
    )
    for server in nodes[1:3]:
        server.client().set(
            key, b"other\n1\n" + pack_meta("own", "h", 1, "t", 0), px=5000
        )
    lease = backend.acquire("own", 5, 2)
    assert lease is not None and lease.fencing_token > 7
    assert nodes[0].client().pttl(key) > 1000  # restarted with the new TTL
    token, fence, _meta = nodes[0].client().get(key).split(b"\n", 2)
    assert token == b"fixed-token" and int(fence) > 7  # and it carries a token
