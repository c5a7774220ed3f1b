"""ZooKeeper backend: the ephemeral-sequential-node lock recipes, with kazoo.

Layout, under ``/<KEY_PREFIX>`` (percent-encoded)::

    /distlock/<digest of the name>              data: the full lock name
    /distlock/<digest>/<token>-0000000042       ephemeral, sequential: one
                                                contender (holder or waiter)
    /distlock/<digest>/r.<token>-0000000043     a shared contender
    /distlock/semaphores/<digest>/<token>-0000000007   a permit contender

The order of the sequence numbers is the queue (:mod:`.queue`): an
exclusive contender holds once no node is ahead of it and watches only its
immediate predecessor (no herd), so the lock is fair, first come first
served; a shared one holds once no exclusive node is ahead of it (readers
queued behind a waiting writer wait for it: writer preference); a permit
once fewer than ``limit`` nodes are ahead of it (FIFO). Semaphores have a
tree of their own, so a semaphore and a lock of the same name never meet.

**The lease.** The nodes are ephemeral: they live as long as the process's
ZooKeeper session, so a crashed or partitioned process loses its locks when
its session expires (``OPTIONS["SESSION_TIMEOUT"]``). On top of the session,
each lease honours its own ``ttl`` as the API promises: a node's data says
how long it stays valid after its last write (``ttl`` for the holder, a
short window for a waiter, which rewrites its node while it waits), and the
node's ``mtime`` (the ZooKeeper leader's clock) starts that window. A
successor that finds its predecessor past its window deletes it, guarded
by the node's version so a concurrent ``extend()`` wins. ``extend(ttl)``
therefore rewrites the node: a new ``mtime``, a new window.

**Fencing.** The token is the holder node's ``czxid``, the ZooKeeper
transaction id that created it: global, strictly increasing, and durable
(written by a quorum), so it keeps increasing across lock-node deletion,
restarts and leader changes. Every node created before an exclusive one is
gone before it holds, and every node created after it waits for it, so an
exclusive token exceeds the token of every acquisition before it; a shared
holder's token is its own node's ``czxid``, below that of the next
exclusive holder.

**Lock lost.** A SUSPENDED (connection lost) or LOST (session expired)
session marks every lease of the process lost at once: with the link gone
nobody can tell whether the nodes survive, and ZooKeeper's own advice is to
assume the worst.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Any
from urllib.parse import quote

from ...exceptions import LockBackendError
from ...keys import name_digest
from ..base import BaseLockBackend, Lease, new_token
from ..kinds import EXCLUSIVE, Kind
from ..options import Dict, Seconds
from .checks import check_location
from .listing import SEMAPHORES, ZooKeeperListing
from .nodes import SHARED_MARK, ZkNode, ms, node_data
from .queue import take_turn

__all__ = ["ZooKeeperLockBackend"]


class ZooKeeperLockBackend(ZooKeeperListing, BaseLockBackend):
    """Locks and semaphores in a ZooKeeper ensemble (fair, fenced by ``czxid``).

    ``LOCATION`` is ``"host:port[,host:port...]"`` (an optional ``/chroot``
    at the end) or a list of ``"host:port"``. OPTIONS:
    ``SESSION_TIMEOUT`` (seconds, default 10: how long a dead process keeps
    its locks at most), ``CONNECT_TIMEOUT`` (seconds, default 5) and
    ``KAZOO_KWARGS`` (passed to ``kazoo.client.KazooClient``).
    """

    drivers = (("kazoo", "zookeeper"),)
    kinds = frozenset({"exclusive", "shared", "permit"})

    options_schema = {
        "SESSION_TIMEOUT": Seconds(
            "SESSION_TIMEOUT bounds how long a dead process keeps its locks."
        ),
        "CONNECT_TIMEOUT": Seconds(
            "It bounds the wait for a connection to the ensemble."
        ),
        "KAZOO_KWARGS": Dict(
            "It is passed to kazoo's KazooClient as keyword arguments."
        ),
    }
    options_check_id = "distlock.E016"

    def __init__(self, alias: str, params: dict[str, Any]):
        super().__init__(alias, params)
        location = params.get("LOCATION") or ""
        if isinstance(location, (list, tuple)):
            location = ",".join(location)
        self.hosts = str(location)
        self.session_timeout = float(self.options.get("SESSION_TIMEOUT", 10.0))
        self.connect_timeout = float(self.options.get("CONNECT_TIMEOUT", 5.0))
        self.root = "/" + quote(self.key_prefix, safe="")
        self._client = None
        self._client_pid = None
        self._client_lock = threading.Lock()
        self._leases: weakref.WeakSet[Lease] = weakref.WeakSet()

    @classmethod
    def check_entry(cls, alias: str, params: dict[str, Any]) -> list:
        """Check the form of LOCATION (hosts and ports)."""
        return check_location(alias, params)

    # -- the session --------------------------------------------------------

    @property
    def client(self):
        """The started ``KazooClient`` of this process (created on first use)."""
        pid = os.getpid()
        if self._client is not None and self._client_pid == pid:
            return self._client
        with self._client_lock:
            if self._client is None or self._client_pid != pid:
                self._client = self._connect()
                self._client_pid = pid
        return self._client

    def _connect(self):
        from kazoo.client import KazooClient
        from kazoo.handlers.threading import KazooTimeoutError

        client = KazooClient(
            hosts=self.hosts,
            timeout=self.session_timeout,
            **self.options.get("KAZOO_KWARGS", {}),
        )
        client.add_listener(self._session_changed)
        try:
            client.start(timeout=self.connect_timeout)
        except KazooTimeoutError as e:
            client.stop()
            client.close()
            raise LockBackendError(
                f"ZooKeeper lock backend {self.alias!r} cannot reach {self.hosts}: {e}"
            ) from e
        return client

    def _session_changed(self, state) -> None:
        """Kazoo listener (its event thread, must not block): mark leases lost."""
        from kazoo.protocol.states import KazooState

        if state == KazooState.CONNECTED:
            # Back with the same session after a suspension: the nodes of the
            # leases reported lost meanwhile may still exist. Their holders
            # will not release them (a lost lease is dropped, not released),
            # so delete them now rather than make waiters wait out the ttl.
            stale = [lease for lease in list(self._leases) if lease.lost]
            if stale:
                threading.Thread(
                    target=self._drop,
                    args=(stale,),
                    name="distlock-zk-drop",
                    daemon=True,
                ).start()
            return
        leases = [lease for lease in list(self._leases) if not lease.lost]
        if not leases:
            return
        for lease in leases:
            lease.lost = True
        reason = f"ZooKeeper session {state.lower()}"

        def report() -> None:
            for lease in leases:
                self.report_loss(lease, reason)

        threading.Thread(target=report, name="distlock-zk-lost", daemon=True).start()

    def _drop(self, leases: list[Lease]) -> None:
        """Delete the nodes of lost leases, if this session still owns them."""
        from kazoo.exceptions import KazooException

        client = self._client
        if client is None or self._client_pid != os.getpid():
            return
        for lease in leases:
            self._leases.discard(lease)
            node = lease.state
            try:
                with node.writing:
                    if node.session == client.client_id[0]:
                        client.delete(node.path, version=node.version)
            except KazooException:
                pass  # gone already, or the link dropped again: ttl ends it

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None and self._client_pid == os.getpid():
            try:
                client.stop()
                client.close()
            except Exception:  # noqa: BLE001, S110 - closing anyway
                pass

    def _error(self, exc: Exception, what: str) -> LockBackendError:
        return LockBackendError(
            f"ZooKeeper lock backend {self.alias!r} failed to {what}: {exc!r}"
        )

    def _guard(self, what: str):
        """Context manager turning kazoo errors into LockBackendError."""
        backend = self

        class _Guard:
            def __enter__(self):
                return self

            def __exit__(self, exc_type, exc, tb):
                from kazoo.exceptions import KazooException

                if exc is not None and isinstance(exc, KazooException):
                    raise backend._error(exc, what) from exc
                return False

        return _Guard()

    # -- paths and data -----------------------------------------------------

    def _dir(self, name: str) -> str:
        """Return the path of the node of lock ``name``."""
        return f"{self.root}/{name_digest(name)}"

    def _sem_dir(self, name: str) -> str:
        """Return the path of the node of semaphore ``name``."""
        return f"{self.root}/{SEMAPHORES}/{name_digest(name)}"

    # -- the lock -----------------------------------------------------------

    def acquire(
        self, name: str, ttl: float, timeout: float | None, kind: Kind = EXCLUSIVE
    ) -> Lease | None:
        from kazoo.exceptions import ConnectionLoss, OperationTimeoutError

        if kind.mode == "permit":
            if not isinstance(kind.limit, int) or kind.limit < 1:
                raise ValueError(
                    f"Semaphore {name!r} needs a limit of at least 1, "
                    f"not {kind.limit!r}."
                )
            directory = self._sem_dir(name)
            token = new_token()
        else:
            directory = self._dir(name)
            token = new_token() if kind.exclusive else SHARED_MARK + new_token()
        try:
            with self._guard("acquire"):
                return take_turn(self, name, directory, token, ttl, timeout, kind)
        except LockBackendError as e:
            if isinstance(e.__cause__, (ConnectionLoss, OperationTimeoutError)):
                # A create (or the write making us the holder) may have gone
                # through unanswered: a node nobody will delete.
                self._remove_in_doubt(directory, token, ttl)
            raise

    def track(self, lease: Lease) -> None:
        """Watch ``lease`` for session loss (called when it is granted)."""
        self._leases.add(lease)

    def _remove_in_doubt(self, directory: str, token: str, ttl: float) -> None:
        """Delete, from a thread, the nodes this attempt's ``token`` names.

        As Curator's protection mode does: our node names start with the
        attempt's token, so they can be found after a connection loss hid
        the outcome of their ``create``. Tried until ZooKeeper answers, or
        until the session (and its ephemeral nodes) or the lease would have
        ended anyway.
        """
        from kazoo.exceptions import NoNodeError
        from kazoo.protocol.states import KazooState

        client = self._client
        prefix = f"{token}-"
        give_up = time.monotonic() + max(ttl, self.session_timeout)

        def remove() -> None:
            pause = 0.02
            while client.state != KazooState.LOST:
                left = give_up - time.monotonic()
                if left <= 0:
                    return
                try:
                    # Queued by kazoo until it is connected again; bounded,
                    # so that a client that gives up reconnecting ends this.
                    children = client.get_children_async(directory).get(timeout=left)
                    for child in children:
                        if child.startswith(prefix):
                            try:
                                client.delete_async(f"{directory}/{child}").get(
                                    timeout=left
                                )
                            except NoNodeError:
                                pass
                    return
                except NoNodeError:
                    return
                except Exception:  # noqa: BLE001 - connection trouble: again
                    time.sleep(pause)
                    pause = min(pause * 2, 0.2)

        if client is not None:
            threading.Thread(
                target=remove, name="distlock-zk-in-doubt", daemon=True
            ).start()

    def _node(self, lease: Lease) -> ZkNode:
        lease.check_owner_process()
        return lease.state

    def release(self, lease: Lease) -> bool:
        from kazoo.exceptions import BadVersionError, NoNodeError

        node = self._node(lease)
        self._leases.discard(lease)
        with node.writing, self._guard("release"):
            alive = lease.remaining() > 0 and not lease.lost
            try:
                self.client.delete(node.path, version=node.version)
            except (NoNodeError, BadVersionError):
                return False
        return alive

    def extend(self, lease: Lease, ttl: float) -> bool:
        from kazoo.exceptions import BadVersionError, NoNodeError

        node = self._node(lease)
        client = self.client
        with node.writing, self._guard("extend"):
            if lease.remaining() <= 0 or node.session != client.client_id[0]:
                # Expired (as seen from here, which errs early) or its
                # session is gone: let the next waiter in.
                try:
                    client.delete(node.path, version=node.version)
                except (NoNodeError, BadVersionError):
                    pass
                return False
            sent = time.monotonic()
            try:
                stat = client.set(
                    node.path,
                    node_data("h", ms(ttl), node.acquired_ms, lease.kind.limit),
                    version=node.version,
                )
            except (NoNodeError, BadVersionError):
                return False
            node.version = stat.version
            lease.deadline = sent + ttl
        return True

    def is_held(self, lease: Lease) -> bool:
        node = self._node(lease)
        if lease.remaining() <= 0:
            return False
        # Read before asking: a renewal on another thread may rewrite the
        # node meanwhile, and only the holder writes it, so a newer version
        # on the server is this lease's own renewal.
        version = node.version
        with self._guard("check a lock"):
            stat = self.client.exists(node.path)
        return (
            stat is not None
            and stat.version >= version
            and stat.ephemeralOwner == node.session
        )
