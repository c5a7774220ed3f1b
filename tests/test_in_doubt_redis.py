"""Redis and Redlock acquisitions whose outcome is unknown leave no grant behind.

Two ways to lose the reply of an acquire that the server carried out:

* the frozen server: a lease of 1 s is held, the redis-server is stopped
  (SIGSTOP, as a fork for a snapshot or a stopped VM does) for 2.5 s while
  another client tries the same name with ``timeout=1``; that client gives up
  (``LockBackendError``) but its request waits in the server's socket buffer
  and is granted when the server runs again, to nobody;
* the dropped reply: a proxy forwards the acquire, swallows the answer and
  cuts the connection (:class:`~tests.faultproxy.DropReplyProxy`).

In both, the name must be free within a round trip of the server answering
again, not after the grant's TTL (30 s here).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from django.test import override_settings

from django_distlock import LockBackendError, lock, locks, semaphore

from .faultproxy import DropReplyProxy
from .servers import RedisServer

PLAIN = "django_distlock.backends.redis.RedisLockBackend"
REENTRANT = "django_distlock.backends.redis.ReentrantRedisLockBackend"
REDLOCK = "django_distlock.backends.redlock.RedlockBackend"
TTL = 30.0
#: Generous against the TTL the grant would otherwise block the name for.
PROMPTLY = 2.0
FROZEN = 2.5

BACKENDS = [pytest.param(PLAIN, id="plain"), pytest.param(REENTRANT, id="reentrant")]


def can_take(probe) -> bool:
    """Return True if ``probe`` (a lock or semaphore handle with
    ``timeout=0``) can be acquired right now (and give it back)."""
    try:
        if not probe.acquire():
            return False
    except LockBackendError:
        return False
    probe.release()
    return True


def is_free(name: str, using: str) -> bool:
    """Return True if ``name`` can be taken right now (and give it back)."""
    return can_take(lock(name, using=using, timeout=0, auto_renew=False))


def is_free_permit(name: str, using: str) -> bool:
    """Return True if a permit of the limit-1 semaphore ``name`` can be
    taken right now (and give it back)."""
    return can_take(semaphore(name, 1, using=using, timeout=0, auto_renew=False))


def free_after(name: str, using: str, limit: float, free=is_free) -> float | None:
    """Return the seconds until ``name`` is free on ``using`` (None: not
    within ``limit``)."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if free(name, using):
            return time.monotonic() - started
        time.sleep(0.005)
    return None


@pytest.fixture
def server():
    """A redis-server of this test alone (it is stopped and resumed)."""
    server = RedisServer().start()
    yield server
    server.stop()


def frozen_server_scenario(
    name: str, pause, resume, *, using: str = "default", probe: str = "direct"
) -> float:
    """Hold 1 s, freeze for FROZEN s while another caller tries with
    ``timeout=1``; return the seconds until the name is free after resuming."""
    holder = lock(name, using=using, ttl=1, auto_renew=False)
    assert holder.acquire(timeout=0)
    pause()
    frozen = time.monotonic()
    try:
        with pytest.raises(LockBackendError):
            lock(name, using=using, ttl=TTL, timeout=1).acquire()
        time.sleep(max(0.0, FROZEN - (time.monotonic() - frozen)))
    finally:
        resume()
    seconds = free_after(name, probe, TTL)
    assert seconds is not None, "the grant was never cancelled"
    return seconds


@pytest.mark.parametrize("backend", BACKENDS)
def test_frozen_server_leaves_no_grant(server, backend):
    setting = {
        "default": {"BACKEND": backend, "LOCATION": server.url},
        "direct": {"BACKEND": PLAIN, "LOCATION": server.url},
    }
    with override_settings(LOCKS=setting):
        try:
            seconds = frozen_server_scenario("frozen", server.pause, server.resume)
            print(f"free {seconds * 1000:.1f} ms after the server ran again")
            assert seconds < PROMPTLY, "the grant was left to expire"
            assert locks["default"].in_doubt.pending() == 0
        finally:
            locks.reset()


def is_script(data: bytes) -> bool:
    """Match a request running a script (not a connection's set-up)."""
    return b"EVALSHA" in data.upper()


def dropped_reply_scenario(
    proxy: DropReplyProxy, name: str, attempt, *, cut_off: bool = True
) -> float:
    """Lose the reply of ``attempt()``'s acquire; return the seconds until
    ``name`` is free once the proxy lets connections through again.

    ``cut_off``: the backend has no other connection open through the proxy
    (an asyncio attempt leaves the sync client's, which the canceller uses at
    once: then nothing is left to see before the proxy lets through).
    """
    assert is_free(name, "default")  # the scripts are loaded
    proxy.drop_next_reply(is_script)
    with pytest.raises(LockBackendError):
        attempt()
    assert proxy.dropped.is_set()
    if cut_off:
        # The server granted it to nobody; while it cannot be reached, the
        # grant stays (and nothing else releases it).
        assert not is_free(name, "direct")
        time.sleep(0.3)
        assert not is_free(name, "direct")
    proxy.accept()
    seconds = free_after(name, "direct", TTL)
    assert seconds is not None, "the grant was never cancelled"
    return seconds


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_dropped_reply_leaves_no_grant(server, backend, mode):
    proxy = DropReplyProxy("127.0.0.1", server.port)
    setting = {
        "default": {"BACKEND": backend, "LOCATION": f"redis://127.0.0.1:{proxy.port}"},
        "direct": {"BACKEND": PLAIN, "LOCATION": server.url},
    }

    def attempt() -> None:
        if mode == "sync":
            lock("dropped", ttl=TTL, timeout=0).acquire()
        else:
            asyncio.run(lock("dropped", ttl=TTL, timeout=0).aacquire())

    try:
        with override_settings(LOCKS=setting):
            try:
                seconds = dropped_reply_scenario(
                    proxy, "dropped", attempt, cut_off=mode == "sync"
                )
                print(f"free {seconds * 1000:.1f} ms after the proxy let through")
                assert seconds < PROMPTLY, "the grant was left to expire"
            finally:
                locks.reset()
    finally:
        proxy.close()


def test_dropped_reply_of_a_waiter_leaves_no_record(server):
    """A waiter whose queued attempt's reply was lost is not handed the lock
    by the next release (its record is cancelled too)."""
    proxy = DropReplyProxy("127.0.0.1", server.port)
    setting = {
        "default": {"BACKEND": PLAIN, "LOCATION": f"redis://127.0.0.1:{proxy.port}"},
        "direct": {"BACKEND": PLAIN, "LOCATION": server.url},
    }
    try:
        with override_settings(LOCKS=setting):
            try:
                holder = lock("queued", using="direct", ttl=TTL, auto_renew=False)
                assert holder.acquire(timeout=0)
                assert not is_free("queued", "default")  # connected
                proxy.drop_next_reply()
                with pytest.raises(LockBackendError):
                    lock("queued", ttl=TTL, timeout=5).acquire()
                proxy.accept()
                client = server.client()
                records = locks["direct"].keys_for("queued").records
                deadline = time.monotonic() + PROMPTLY
                while client.hlen(records) and time.monotonic() < deadline:
                    time.sleep(0.005)
                assert client.hlen(records) == 0, "the waiter record stayed"
                holder.release()
                assert is_free("queued", "direct"), "handed to a waiter gone"
            finally:
                locks.reset()
    finally:
        proxy.close()


# -- Sentinel ------------------------------------------------------------------


def test_frozen_primary_behind_sentinel_leaves_no_grant(sentinel_setup):
    """The frozen-server scenario through Sentinel (frozen for less than the
    sentinels' down-after time: no failover, the same primary answers)."""
    options = {
        "SENTINELS": sentinel_setup.sentinels,
        "SERVICE_NAME": sentinel_setup.SERVICE,
    }
    port = sentinel_setup.current_primary_port()
    primary = next(
        s for s in (sentinel_setup.primary, sentinel_setup.replica) if s.port == port
    )
    setting = {
        "default": {"BACKEND": PLAIN, "OPTIONS": options},
        "direct": {"BACKEND": PLAIN, "LOCATION": primary.url},
    }
    with override_settings(LOCKS=setting):
        try:
            seconds = frozen_server_scenario(
                "sentinel-frozen", primary.pause, primary.resume
            )
            print(f"free {seconds * 1000:.1f} ms after the primary ran again")
            assert seconds < PROMPTLY, "the grant was left to expire"
        finally:
            locks.reset()


# -- Redlock: each node --------------------------------------------------------


@pytest.fixture
def redlock_nodes():
    nodes = [RedisServer().start() for _ in range(3)]
    yield nodes
    for node in nodes:
        node.stop()


def node_free_after(node: RedisServer, key: str, limit: float) -> float | None:
    """Return the seconds until ``node`` holds no lease ``key`` (None: not
    within ``limit``)."""
    client = node.client()
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if not client.exists(key):
            return time.monotonic() - started
        time.sleep(0.005)
    return None


def test_redlock_frozen_nodes_keep_no_grant(redlock_nodes):
    """Every node frozen: no quorum, LockBackendError. Each node carries out
    the queued attempt when it runs again; each must be cancelled there."""
    urls = [n.url for n in redlock_nodes]
    setting = {
        "default": {"BACKEND": REDLOCK, "LOCATION": urls},
        "direct": {"BACKEND": REDLOCK, "LOCATION": urls},
    }
    with override_settings(LOCKS=setting):
        try:
            holder = lock("rl-frozen", ttl=1, auto_renew=False)
            assert holder.acquire(timeout=0)
            key = locks["default"].keys_for("rl-frozen")[0]
            for node in redlock_nodes:
                node.pause()
            frozen = time.monotonic()
            try:
                with pytest.raises(LockBackendError):
                    lock("rl-frozen", ttl=TTL, timeout=1).acquire()
                time.sleep(max(0.0, FROZEN - (time.monotonic() - frozen)))
            finally:
                for node in redlock_nodes:
                    node.resume()
            for node in redlock_nodes:
                seconds = node_free_after(node, key, TTL)
                assert seconds is not None, "a node kept the grant"
                print(f"node {node.port} free {seconds * 1000:.1f} ms after it ran")
                assert seconds < PROMPTLY, "a node's grant was left to expire"
            assert free_after("rl-frozen", "direct", PROMPTLY) is not None
        finally:
            locks.reset()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_redlock_dropped_reply_on_one_node_is_cancelled_there(redlock_nodes, mode):
    """The quorum granted; one node's reply was lost and it refuses new
    connections for a while: its grant is cancelled there once it answers."""
    proxy = DropReplyProxy("127.0.0.1", redlock_nodes[0].port)
    urls = [f"redis://127.0.0.1:{proxy.port}"] + [n.url for n in redlock_nodes[1:]]
    setting = {"default": {"BACKEND": REDLOCK, "LOCATION": urls}}
    try:
        with override_settings(LOCKS=setting):
            try:
                # Held elsewhere on two nodes: the attempt cannot win.
                key = locks["default"].keys_for("rl-dropped")[0]
                for node in redlock_nodes[1:]:
                    node.client().set(key, b"other\n1\n", px=int(TTL * 1000))
                assert not is_free("rl-dropped", "default")  # all connected
                # The attempt's SET NX (an asyncio connection is new: its
                # set-up goes in the same write).
                proxy.drop_next_reply(lambda data: b"\r\nNX\r\n" in data)
                attempt = lock("rl-dropped", ttl=TTL, timeout=0)
                if mode == "sync":
                    assert not attempt.acquire()
                else:
                    assert not asyncio.run(attempt.aacquire())
                assert proxy.dropped.is_set()
                first = redlock_nodes[0].client()
                assert first.exists(key), "the lost grant should be there"
                time.sleep(0.3)
                proxy.accept()
                seconds = node_free_after(redlock_nodes[0], key, TTL)
                assert seconds is not None, "the node kept the grant"
                print(f"node free {seconds * 1000:.1f} ms after the proxy let through")
                assert seconds < PROMPTLY
            finally:
                locks.reset()
    finally:
        proxy.close()


# -- Cluster -------------------------------------------------------------------


@pytest.fixture
def redis_cluster():
    from .cluster_servers import RedisCluster

    cluster = RedisCluster().start()
    yield cluster
    cluster.stop()


def test_frozen_cluster_primary_leaves_no_grant(redis_cluster):
    """The frozen-server scenario on the primary of the lock's slot, frozen
    for less than the cluster's node timeout (no failover): a socket timeout
    of 1 s and 1.5 s frozen instead of 2 s and 2.5 s."""
    global FROZEN
    from django_distlock.backends.redis.keys import LockKeys

    primary = redis_cluster.primary_of(LockKeys("distlock", "cluster-frozen").lease)
    options = {"SOCKET_TIMEOUT": 1.0}
    setting = {
        "default": {
            "BACKEND": PLAIN,
            "LOCATION": redis_cluster.url,
            "OPTIONS": options,
        },
        "direct": {"BACKEND": PLAIN, "LOCATION": redis_cluster.url},
    }
    saved, FROZEN = FROZEN, 1.5
    with override_settings(LOCKS=setting):
        try:
            seconds = frozen_server_scenario(
                "cluster-frozen", primary.pause, primary.resume
            )
            print(f"free {seconds * 1000:.1f} ms after the primary ran again")
            assert seconds < PROMPTLY, "the grant was left to expire"
        finally:
            FROZEN = saved
            locks.reset()


@pytest.mark.parametrize("kind", ["exclusive", "shared", "permit"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_release_that_never_arrived_is_sent_again(server, mode, kind):
    """A release cut off on its way (a killed connection under the request)
    is sent again once the server can be reached: the name does not stay
    blocked for the rest of the lease's TTL."""
    proxy = DropReplyProxy("127.0.0.1", server.port)
    setting = {
        "default": {"BACKEND": PLAIN, "LOCATION": f"redis://127.0.0.1:{proxy.port}"},
        "direct": {"BACKEND": PLAIN, "LOCATION": server.url},
    }

    async def arelease(holder) -> None:
        await holder.arelease()

    try:
        with override_settings(LOCKS=setting):
            try:
                # No renewal may take the trap meant for the release.
                if kind == "permit":
                    holder = semaphore("cut-release", 1, ttl=TTL, auto_renew=False)
                else:
                    shared = kind == "shared"
                    holder = lock(
                        "cut-release", ttl=TTL, auto_renew=False, shared=shared
                    )
                if mode == "sync":
                    assert holder.acquire(timeout=0)
                else:
                    assert asyncio.run(holder.aacquire(timeout=0))
                proxy.drop_next_request(is_script)
                with pytest.raises(LockBackendError):
                    if mode == "sync":
                        holder.release()
                    else:
                        asyncio.run(arelease(holder))
                assert proxy.dropped.is_set()
                # The server never saw the release: the lease is still there
                # (an exclusive probe is refused while a share or permit is
                # held: the semaphore has its own name space, so probe it).
                free = is_free_permit if kind == "permit" else is_free
                assert not free("cut-release", "direct")
                time.sleep(0.3)
                assert not free("cut-release", "direct")
                proxy.accept()
                seconds = free_after("cut-release", "direct", TTL, free)
                assert seconds is not None, "the release was never sent again"
                print(f"free {seconds * 1000:.1f} ms after the proxy let through")
                assert seconds < PROMPTLY, "the lease was left to expire"
            finally:
                locks.reset()
    finally:
        proxy.close()
