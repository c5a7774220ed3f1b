"""Shared and permit acquisitions whose outcome is unknown leave nothing behind.

The scenarios of :mod:`tests.test_in_doubt_redis`, for the other kinds: a
frozen server (SIGSTOP while a shared or permit attempt waits for its reply)
and a dropped reply (:class:`~tests.faultproxy.DropReplyProxy`), on one
redis-server, on a Redis Cluster's primary and on Redlock nodes; and a
Redlock release whose reply one node lost. Afterwards the readers' slot (an
exclusive attempt gets in) or the permit is free within a round trip of the
server answering again, not after the grant's TTL (30 s here).

The backend is called directly: ``backend.acquire(name, ttl, timeout, kind)``.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from django.test import override_settings

from django_distlock import LockBackendError, locks
from django_distlock.backends.base import EXCLUSIVE, SHARED, permit
from django_distlock.backends.redis.sharing import SemaphoreKeys
from django_distlock.backends.redlock.steps import reader_keys

from .faultproxy import DropReplyProxy
from .servers import RedisServer

pytestmark = pytest.mark.redis

PLAIN = "django_distlock.backends.redis.RedisLockBackend"
REDLOCK = "django_distlock.backends.redlock.RedlockBackend"
TTL = 30.0
#: Generous against the TTL the grant would otherwise block the name for.
PROMPTLY = 2.0
FROZEN = 2.5

KINDS = [pytest.param(SHARED, id="shared"), pytest.param(permit(1), id="permit")]


def is_free(name: str, kind, using: str) -> bool:
    """Return True if nothing is left of ``kind`` on ``name``: an exclusive
    lease can be taken after shared ones, the one permit after a permit
    (each given back at once)."""
    backend = locks[using]
    probe = EXCLUSIVE if kind is SHARED else kind
    try:
        lease = backend.acquire(name, 1.0, 0, probe)
    except LockBackendError:
        return False
    if lease is None:
        return False
    backend.release(lease)
    return True


def free_after(name: str, kind, using: str, limit: float) -> float | None:
    """Return the seconds until ``name`` is free (None: not within ``limit``)."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if is_free(name, kind, using):
            return time.monotonic() - started
        time.sleep(0.005)
    return None


def settled(in_doubt) -> bool:
    """Return True once ``in_doubt`` (a canceller) has nothing pending: it
    counts a cancel done after reading the reply, just after the server
    carried it out."""
    deadline = time.monotonic() + PROMPTLY
    while in_doubt.pending() and time.monotonic() < deadline:
        time.sleep(0.005)
    return in_doubt.pending() == 0


def report(what: str, seconds: float) -> None:
    print(f"{what}: free {seconds * 1000:.1f} ms after the server answered again")


@pytest.fixture
def server():
    """A redis-server of this test alone (it is stopped and resumed)."""
    server = RedisServer().start()
    yield server
    server.stop()


def frozen_scenario(name: str, kind, pause, resume, frozen_for: float = FROZEN):
    """Hold ``name`` 1 s, freeze for ``frozen_for`` s while a ``kind`` attempt
    with ``timeout=1`` waits for its reply; return the seconds until the name
    is free after resuming."""
    backend = locks["default"]
    # The kind's scripts loaded: a frozen EVALSHA must not end as NOSCRIPT.
    backend.release(backend.acquire(name, 1.0, 0, kind))
    holder = backend.acquire(name, 1.0, 0, EXCLUSIVE if kind is SHARED else kind)
    assert holder is not None
    pause()
    frozen = time.monotonic()
    try:
        with pytest.raises(LockBackendError):
            backend.acquire(name, TTL, 1, kind)
        time.sleep(max(0.0, frozen_for - (time.monotonic() - frozen)))
    finally:
        resume()
    seconds = free_after(name, kind, "direct", TTL)
    assert seconds is not None, "the grant was never cancelled"
    return seconds


@pytest.mark.parametrize("kind", KINDS)
def test_frozen_server_leaves_no_grant(server, kind):
    setting = {
        "default": {"BACKEND": PLAIN, "LOCATION": server.url},
        "direct": {"BACKEND": PLAIN, "LOCATION": server.url},
    }
    with override_settings(LOCKS=setting):
        try:
            seconds = frozen_scenario("frozen", kind, server.pause, server.resume)
            report(f"plain, frozen, {kind}", seconds)
            assert seconds < PROMPTLY, "the grant was left to expire"
            assert settled(locks["default"].kinds_in_doubt)
        finally:
            locks.reset()


def is_script(data: bytes) -> bool:
    """Match a request running a script (not a connection's set-up)."""
    return b"EVALSHA" in data.upper()


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("kind", KINDS)
def test_dropped_reply_leaves_no_grant(server, kind, mode):
    proxy = DropReplyProxy("127.0.0.1", server.port)
    setting = {
        "default": {"BACKEND": PLAIN, "LOCATION": f"redis://127.0.0.1:{proxy.port}"},
        "direct": {"BACKEND": PLAIN, "LOCATION": server.url},
    }
    try:
        with override_settings(LOCKS=setting):
            try:
                backend = locks["default"]
                # Connected, the kind's scripts loaded.
                backend.release(backend.acquire("dropped", 1.0, 0, kind))
                assert is_free("dropped", kind, "default")
                proxy.drop_next_reply(is_script)
                with pytest.raises(LockBackendError):
                    if mode == "sync":
                        backend.acquire("dropped", TTL, 0, kind)
                    else:
                        asyncio.run(backend.aacquire("dropped", TTL, 0, kind))
                assert proxy.dropped.is_set()
                if mode == "sync":
                    # The server granted it to nobody; while it cannot be
                    # reached, the grant stays. (An asyncio attempt leaves
                    # the sync client's connection open: the canceller
                    # gets through at once.)
                    assert not is_free("dropped", kind, "direct")
                    time.sleep(0.3)
                    assert not is_free("dropped", kind, "direct")
                proxy.accept()
                seconds = free_after("dropped", kind, "direct", TTL)
                assert seconds is not None, "the grant was never cancelled"
                report(f"plain, dropped reply, {kind}, {mode}", seconds)
                assert seconds < PROMPTLY, "the grant was left to expire"
            finally:
                locks.reset()
    finally:
        proxy.close()


@pytest.mark.parametrize("kind", KINDS)
def test_dropped_reply_of_a_waiter_leaves_no_record(server, kind):
    """A shared or permit waiter whose queued attempt's reply was lost is not
    handed the lock or the permit by the next release."""
    proxy = DropReplyProxy("127.0.0.1", server.port)
    setting = {
        "default": {"BACKEND": PLAIN, "LOCATION": f"redis://127.0.0.1:{proxy.port}"},
        "direct": {"BACKEND": PLAIN, "LOCATION": server.url},
    }
    try:
        with override_settings(LOCKS=setting):
            try:
                direct, backend = locks["direct"], locks["default"]
                holder = direct.acquire(
                    "queued", TTL, 0, EXCLUSIVE if kind is SHARED else kind
                )
                assert holder is not None
                assert backend.acquire("queued", 1.0, 0, kind) is None  # connected
                keys = direct.keys_for("queued")
                records = SemaphoreKeys(keys).five[2] if kind.limit else keys.records
                proxy.drop_next_reply()
                with pytest.raises(LockBackendError):
                    backend.acquire("queued", TTL, 5, kind)
                proxy.accept()
                client = server.client()
                deadline = time.monotonic() + PROMPTLY
                while client.hlen(records) and time.monotonic() < deadline:
                    time.sleep(0.005)
                assert client.hlen(records) == 0, "the waiter record stayed"
                assert direct.release(holder)
                assert is_free("queued", kind, "direct"), "handed to a waiter gone"
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


def test_frozen_cluster_primary_leaves_no_permit(redis_cluster):
    """The frozen-server scenario for a permit on the primary of the
    semaphore's slot, frozen for less than the cluster's node timeout (no
    failover): a socket timeout of 1 s and 1.5 s frozen."""
    from django_distlock.backends.redis.keys import LockKeys

    primary = redis_cluster.primary_of(LockKeys("distlock", "cluster-frozen").lease)
    setting = {
        "default": {
            "BACKEND": PLAIN,
            "LOCATION": redis_cluster.url,
            "OPTIONS": {"SOCKET_TIMEOUT": 1.0},
        },
        "direct": {"BACKEND": PLAIN, "LOCATION": redis_cluster.url},
    }
    with override_settings(LOCKS=setting):
        try:
            seconds = frozen_scenario(
                "cluster-frozen", permit(1), primary.pause, primary.resume, 1.5
            )
            report("cluster primary, frozen, permit", seconds)
            assert seconds < PROMPTLY, "the grant was left to expire"
        finally:
            locks.reset()


# -- Sentinel ------------------------------------------------------------------


def test_frozen_primary_behind_sentinel_leaves_no_shared_grant(sentinel_setup):
    """The frozen-server scenario for a shared attempt through Sentinel
    (frozen for less than the sentinels' down-after time: no failover)."""
    port = sentinel_setup.current_primary_port()
    primary = next(
        s for s in (sentinel_setup.primary, sentinel_setup.replica) if s.port == port
    )
    options = {
        "SENTINELS": sentinel_setup.sentinels,
        "SERVICE_NAME": sentinel_setup.SERVICE,
    }
    setting = {
        "default": {"BACKEND": PLAIN, "OPTIONS": options},
        "direct": {"BACKEND": PLAIN, "LOCATION": primary.url},
    }
    with override_settings(LOCKS=setting):
        try:
            seconds = frozen_scenario(
                "sentinel-frozen", SHARED, primary.pause, primary.resume
            )
            report("sentinel primary, frozen, shared", seconds)
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


def node_free_after(node: RedisServer, keys: list[str], limit: float):
    """Return the seconds until ``node`` holds none of ``keys`` (None: not
    within ``limit``)."""
    client = node.client()
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if not client.exists(*keys):
            return time.monotonic() - started
        time.sleep(0.005)
    return None


def test_redlock_frozen_nodes_keep_no_shared_grant(redlock_nodes):
    """Every node frozen while a shared attempt waits: no quorum,
    LockBackendError. Each node grants the queued attempt when it runs again;
    each must cancel it there."""
    urls = [n.url for n in redlock_nodes]
    setting = {
        "default": {"BACKEND": REDLOCK, "LOCATION": urls},
        "direct": {"BACKEND": REDLOCK, "LOCATION": urls},
    }
    with override_settings(LOCKS=setting):
        try:
            backend = locks["default"]
            assert backend.acquire("rl-frozen", 1.0, 0, EXCLUSIVE) is not None
            lease_key = backend.keys_for("rl-frozen")[0]
            keys = [lease_key, *reader_keys(lease_key)]
            for node in redlock_nodes:
                node.pause()
            frozen = time.monotonic()
            try:
                with pytest.raises(LockBackendError):
                    backend.acquire("rl-frozen", TTL, 1, SHARED)
                time.sleep(max(0.0, FROZEN - (time.monotonic() - frozen)))
            finally:
                for node in redlock_nodes:
                    node.resume()
            for node in redlock_nodes:
                seconds = node_free_after(node, keys, TTL)
                assert seconds is not None, "a node kept the shared grant"
                report(f"redlock node {node.port}, frozen, shared", seconds)
                assert seconds < PROMPTLY, "a node's grant was left to expire"
            assert free_after("rl-frozen", SHARED, "direct", PROMPTLY) is not None
        finally:
            locks.reset()


@pytest.mark.parametrize("kind", [EXCLUSIVE, SHARED], ids=["exclusive", "shared"])
def test_redlock_release_one_node_did_not_answer(redlock_nodes, kind):
    """The quorum confirmed a release; the first node did not answer it (its
    connection was cut and it refuses new ones for a while): the lease is
    released there too once it answers, not left to its TTL."""
    proxy = DropReplyProxy("127.0.0.1", redlock_nodes[0].port)
    urls = [f"redis://127.0.0.1:{proxy.port}"] + [n.url for n in redlock_nodes[1:]]
    setting = {"default": {"BACKEND": REDLOCK, "LOCATION": urls}}
    try:
        with override_settings(LOCKS=setting):
            try:
                backend = locks["default"]
                lease = backend.acquire("rl-release", TTL, 0, kind)
                assert lease is not None
                lease_key = backend.keys_for("rl-release")[0]
                keys = [lease_key, *reader_keys(lease_key)]
                first = redlock_nodes[0].client()
                assert first.exists(lease_key)
                # Cut the first node off: the next request's reply is lost
                # (a read, harmless), then new connections are refused.
                proxy.drop_next_reply()
                assert backend.is_held(lease)
                assert proxy.dropped.is_set()
                assert backend.release(lease)  # a quorum confirmed it
                time.sleep(0.3)
                assert first.exists(lease_key), "the release reached the node"
                proxy.accept()
                seconds = node_free_after(redlock_nodes[0], keys, TTL)
                assert seconds is not None, "the node kept the lease"
                report(f"redlock release, node cut off, {kind}", seconds)
                assert seconds < PROMPTLY
                assert settled(backend.in_doubt)
            finally:
                locks.reset()
    finally:
        proxy.close()
