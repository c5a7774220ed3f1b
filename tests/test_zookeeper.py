"""The ZooKeeper backend on a real single-node ZooKeeper (Debian's package).

The server is started once for this module on a free loopback port with
its own data directory (:class:`tests.cluster_servers.ZooKeeperServer`).
"""

from __future__ import annotations

import io
import json
import signal
import sys
import threading
import time
import uuid

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_distlock import lock, locks
from django_distlock.checks import check_locks_setting
from django_distlock.exceptions import LockBackendError, LockLost
from django_distlock.signals import lock_lost
from tests import workers
from tests.cluster_servers import ZooKeeperEnsemble, ZooKeeperServer, wait_until
from tests.contract import LockBackendContract, Recorder
from tests.procs import start_process

BACKEND = "django_distlock.backends.zookeeper.ZooKeeperLockBackend"


@pytest.fixture(scope="module")
def zookeeper():
    server = ZooKeeperServer().start()
    yield server
    server.stop()


def zk_locks(hosts: str, **options) -> dict:
    """A LOCKS setting with the ZooKeeper backend as default."""
    return {
        "default": {
            "BACKEND": BACKEND,
            "LOCATION": hosts,
            # Long enough that a CPU-starved test process keeps its session.
            "OPTIONS": {"SESSION_TIMEOUT": 10, **options},
        }
    }


@pytest.fixture
def zk_settings(zookeeper):
    with override_settings(LOCKS=zk_locks(zookeeper.hosts)):
        yield
    locks.reset()


class TestZooKeeperContract(LockBackendContract):
    """The shared backend contract on ZooKeeper."""

    @pytest.fixture
    def locks_setting(self, zookeeper):
        return zk_locks(zookeeper.hosts)


class TestZooKeeperRecipe:
    """Fair queue, predecessor-only watches, czxid fencing, session loss."""

    def test_fair_and_no_herd(self, zookeeper, zk_settings):
        name = f"fair:{uuid.uuid4().hex}"
        holder = lock(name, ttl=30)
        assert holder.acquire()
        order: list[int] = []

        def wait(i: int) -> None:
            with lock(name, ttl=30, timeout=60):
                order.append(i)

        threads = []
        for i in range(4):
            t = threading.Thread(target=wait, args=(i,))
            t.start()
            threads.append(t)
            # Each waiter queues (creates its node) before the next starts.
            wait_until(
                lambda i=i: _queue_length(name) == i + 2, 30, "the waiter to queue"
            )
        # Every waiter watches its own predecessor: no node is watched twice.
        # Each waiter watches its own predecessor: the holder and the first
        # three waiters are watched, the last waiter is not. (With a herd,
        # every waiter would watch the holder.) A watch fires, and is set
        # again, whenever its node is rewritten: poll for a steady moment.
        backend = locks["default"]
        directory = backend._dir(name)
        queue = sorted(backend.client.get_children(directory), key=_seq)
        expected = {f"{directory}/{child}" for child in queue[:4]}

        def watched() -> set[str]:
            text = zookeeper.four_letter("wchp", timeout=5)
            return {line for line in text.splitlines() if line.startswith("/")}

        wait_until(lambda: watched() == expected, 30, "one watch per predecessor")
        holder.release()
        for t in threads:
            t.join(60)
        assert order == [0, 1, 2, 3]

    def test_held_while_a_renewal_is_in_flight(self, zk_settings):
        # A renewal on another thread rewrites the node before it records
        # the new version: a check in between still sees the lease held.
        backend = locks["default"]
        lease = backend.acquire(f"renewing:{uuid.uuid4().hex}", 30, 0)
        stop = threading.Event()

        def renew() -> None:
            while not stop.is_set():
                assert backend.extend(lease, 30)

        renewer = threading.Thread(target=renew)
        renewer.start()
        try:
            checks = [backend.is_held(lease) for _ in range(300)]
        finally:
            stop.set()
            renewer.join(30)
        assert all(checks)
        assert backend.release(lease)

    @pytest.mark.parametrize("call", ["release", "extend"])
    def test_a_call_during_a_renewal_keeps_the_lease(
        self, zk_settings, monkeypatch, call
    ):
        # The renewal's write lands on the server, and its answer is slow to
        # be read: a release or an extend() meanwhile must not send the
        # version that write made stale (and find the lease "gone").
        backend = locks["default"]
        lease = backend.acquire(f"renewing:{uuid.uuid4().hex}", 30, 0)
        client = backend.client
        landed = threading.Event()
        set_node = client.set

        def slow_set(*args, **kwargs):
            stat = set_node(*args, **kwargs)
            landed.set()
            time.sleep(0.3)
            return stat

        monkeypatch.setattr(client, "set", slow_set)
        renewal = threading.Thread(target=lambda: backend.renew([lease]))
        renewal.start()
        try:
            assert landed.wait(30)
            assert getattr(backend, call)(lease, *([30] if call == "extend" else []))
        finally:
            renewal.join(30)
        monkeypatch.undo()
        if call == "extend":
            assert backend.is_held(lease)
            assert backend.release(lease)
        assert client.exists(lease.state.path) is None

    def test_fencing_survives_lock_node_deletion(self, zk_settings):
        name = f"czxid:{uuid.uuid4().hex}"
        with lock(name) as first:
            token = first.fencing_token
        backend = locks["default"]
        backend.clear_stale()  # removes the now empty lock node as well
        assert backend.client.exists(backend._dir(name)) is None
        with lock(name) as second:
            assert second.fencing_token > token

    def test_any_name(self, zk_settings):
        for name in ["/", "..", "a/b/../c", "\0\n*?[", "é" * 300, "x" * 2_000_000]:
            with lock(name, timeout=0) as held:
                assert lock(name, timeout=0).acquire() is False
                listed = [h for h in locks["default"].holders(name) if h.name == name]
                assert [h.fencing_token for h in listed] == [held.fencing_token]

    def test_session_suspended_means_lost(self, zookeeper):
        name = f"session:{uuid.uuid4().hex}"
        setting = zk_locks(zookeeper.hosts, SESSION_TIMEOUT=1.5)
        with override_settings(LOCKS=setting), Recorder(lock_lost) as rec:
            try:
                held = lock(name, ttl=30)
                assert held.acquire()
                zookeeper.proc.send_signal(signal.SIGSTOP)
                try:
                    lost = rec.wait_for(lock_lost, timeout=30)
                finally:
                    zookeeper.proc.send_signal(signal.SIGCONT)
                assert [kw["name"] for kw in lost] == [name]
                assert held.lease.lost
                assert not held.locked()
                with pytest.raises(LockLost):
                    held.release()
                # The backend reconnects (a new session) and works again.
                with lock(name, timeout=30) as again:
                    assert again.fencing_token > 0
            finally:
                locks.reset()

    def test_dead_process_loses_its_locks_with_its_session(self, zookeeper, tmp_path):
        """A SIGKILLed holder with a long TTL: its session ends, the lock passes."""
        name = f"dead:{uuid.uuid4().hex}"
        ready = tmp_path / "ready"
        setting = zk_locks(zookeeper.hosts, SESSION_TIMEOUT=1.5)
        with override_settings(LOCKS=setting):
            proc = start_process(workers.hold_for, name, 300.0, str(ready), 300.0)
            try:
                wait_until(ready.exists, 60, "the worker to take the lock")
                theirs = int(ready.read_text())
                assert lock(name, timeout=0).acquire() is False
                proc.kill()
                proc.join(30)
                with lock(name, timeout=60) as mine:
                    assert mine.fencing_token > theirs
            finally:
                if proc.is_alive():
                    proc.kill()
                    proc.join(30)
                locks.reset()

    def test_suspension_survived_frees_the_lost_leases(self, zk_settings):
        """SUSPENDED then CONNECTED (same session): lost leases' nodes go."""
        from kazoo.protocol.states import KazooState

        name = f"resumed:{uuid.uuid4().hex}"
        backend = locks["default"]
        with Recorder(lock_lost) as rec:
            held = lock(name, ttl=60)
            assert held.acquire()
            backend._session_changed(KazooState.SUSPENDED)
            assert held.lease.lost
            assert [kw["name"] for kw in rec.wait_for(lock_lost)] == [name]
            backend._session_changed(KazooState.CONNECTED)
            with lock(name, timeout=30) as again:  # not 60 s: the node went
                assert again.fencing_token > held.fencing_token
            with pytest.raises(LockLost):
                held.release()

    def test_listed_by_the_command(self, zk_settings):
        name = f"listed:{uuid.uuid4().hex}"
        with pytest.raises(LockLost), lock(name) as held:
            out = io.StringIO()
            call_command("locks", "list", "--format", "json", stdout=out)
            rows = [r for r in json.loads(out.getvalue()) if r["name"] == name]
            assert len(rows) == 1
            assert rows[0]["fencing_token"] == held.fencing_token
            assert rows[0]["backend"] == "default"
            out = io.StringIO()
            call_command("locks", "clear", name, "--noinput", stdout=out)
            assert not held.locked()

    def test_unreachable(self):
        from tests.servers import free_port

        setting = zk_locks(f"127.0.0.1:{free_port()}", CONNECT_TIMEOUT=0.5)
        with override_settings(LOCKS=setting):
            try:
                started = time.monotonic()
                with pytest.raises(LockBackendError):
                    with lock("x"):
                        pass  # pragma: no cover
                assert time.monotonic() - started < 30
            finally:
                locks.reset()


@pytest.fixture(scope="module")
def ensemble():
    servers = ZooKeeperEnsemble().start()
    yield servers
    servers.stop()


class TestZooKeeperEnsembleFailover:
    """Three servers; kill the leader while a lock is held."""

    def test_leader_failover(self, ensemble):
        name = f"leader:{uuid.uuid4().hex}"
        with (
            override_settings(LOCKS=zk_locks(ensemble.hosts)),
            Recorder(lock_lost) as rec,
        ):
            try:
                held = lock(name, ttl=60)
                assert held.acquire()
                before = held.fencing_token
                leader = ensemble.leader()
                leader.kill()
                wait_until(
                    lambda: ensemble.leader() not in (None, leader),
                    120,
                    "the survivors to elect a new leader",
                )
                # A follower that loses its leader drops its clients: the
                # connection is suspended, and the lease is reported lost.
                assert [kw["name"] for kw in rec.wait_for(lock_lost, 60)] == [name]
                with pytest.raises(LockLost):
                    held.release()
                # The lock is free again well before its 60 s ttl, and the
                # token (czxid) comes from the new leader's epoch: larger.
                with lock(name, timeout=45) as again:
                    assert again.fencing_token > before
                    assert again.fencing_token >> 32 > before >> 32
            finally:
                locks.reset()


def _seq(child: str) -> int:
    return int(child.rsplit("-", 1)[1])


def _queue_length(name: str) -> int:
    backend = locks["default"]
    return len(backend.client.get_children(backend._dir(name)))


class TestZooKeeperChecks:
    def _ids(self, location, **options):
        entry = {"BACKEND": BACKEND, "LOCATION": location}
        if options:
            entry["OPTIONS"] = options
        with override_settings(LOCKS={"default": entry}):
            return [m.id for m in check_locks_setting(None)]

    def test_valid(self):
        assert self._ids("127.0.0.1:2181") == []
        assert self._ids("a:2181,b:2181,c:2181/chroot") == []
        assert self._ids(["a:2181", "b:2181"], SESSION_TIMEOUT=5) == []

    def test_invalid(self):
        assert "distlock.E016" in self._ids("")
        assert "distlock.E016" in self._ids("a:notaport")
        assert "distlock.E016" in self._ids("a:2181", SESSION_TIMEOUT=0)
        assert "distlock.E016" in self._ids("a:2181", BOGUS=1)
        assert "distlock.E016" in self._ids(None)

    def test_kazoo_missing(self, monkeypatch):
        monkeypatch.setitem(sys.modules, "kazoo", None)
        # The generic missing-driver check, from the backend's declared drivers.
        assert self._ids("a:2181") == ["distlock.E019"]


def test_cancelled_async_waiter_leaves_nothing_held(zk_settings):
    # aacquire waits in a worker thread; the task awaiting it is cancelled,
    # then the holder releases: the thread's late grant is given back at once.
    from tests.test_locmem import assert_cancelled_waiter_leaves_nothing_held

    assert_cancelled_waiter_leaves_nothing_held("default")
