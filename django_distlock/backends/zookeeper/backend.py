"""ZooKeeper backend: the ephemeral-sequential-node lock recipe, with kazoo.

Layout, under ``/<KEY_PREFIX>`` (percent-encoded)::

    /distlock/<digest of the name>            data: the full lock name
    /distlock/<digest>/<token>-0000000042     ephemeral, sequential: one
                                              contender (holder or waiter)

The contender with the lowest sequence number holds the lock; every other
one watches only its immediate predecessor (no herd), so the lock is fair:
first come, first served.

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
restarts and leader changes.

**Lock lost.** A SUSPENDED (connection lost) or LOST (session expired)
session marks every lease of the process lost at once: with the link gone
nobody can tell whether the nodes survive, and ZooKeeper's own advice is to
assume the worst.
"""

from __future__ import annotations

import json
import os
import threading
import time
import weakref
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

from ...exceptions import LockBackendError
from ...keys import decode_name, encode_name, name_digest
from ..base import BaseLockBackend, Holder, Lease, holder_identity, new_token
from ..options import Dict, Seconds
from .checks import check_location

__all__ = ["ZooKeeperLockBackend"]

#: How long past its expected next rewrite a waiter's node stays valid.
WAITER_GRACE_MS = 3000
#: Longest single wait before a waiter rewrites its node.
MAX_WAIT_SLICE = 2.0
#: Names longer than this (compressed) are stored truncated.
MAX_STORED_NAME = 512 * 1024


@dataclass
class _Node:
    """Where a lease lives: its node, last known version and session."""

    path: str
    version: int
    session: int
    acquired_ms: int = 0


def _seq(child: str) -> int:
    return int(child.rsplit("-", 1)[1])


def _pack_name(name: str) -> bytes:
    raw = encode_name(name)
    if len(raw) < 1024:
        return b"r" + raw
    packed = zlib.compress(raw)
    if len(packed) > MAX_STORED_NAME:
        # Keep a readable prefix: the lock itself is keyed by the digest.
        return b"t" + raw[:MAX_STORED_NAME]
    return b"z" + packed


def _unpack_name(data: bytes) -> str:
    kind, body = data[:1], data[1:]
    if kind == b"z":
        body = zlib.decompress(body)
    return decode_name(body)


class ZooKeeperLockBackend(BaseLockBackend):
    """Locks in a ZooKeeper ensemble (fair, fenced by ``czxid``).

    ``LOCATION`` is ``"host:port[,host:port...]"`` (an optional ``/chroot``
    at the end) or a list of ``"host:port"``. OPTIONS:
    ``SESSION_TIMEOUT`` (seconds, default 10: how long a dead process keeps
    its locks at most), ``CONNECT_TIMEOUT`` (seconds, default 5) and
    ``KAZOO_KWARGS`` (passed to ``kazoo.client.KazooClient``).
    """

    drivers = (("kazoo", "zookeeper"),)

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
        return f"{self.root}/{name_digest(name)}"

    @staticmethod
    def _data(state: str, window_ms: int, acquired_ms: int | None = None) -> bytes:
        host, pid, thread = holder_identity()
        return json.dumps(
            {
                "s": state,
                "x": window_ms,
                "h": host,
                "p": pid,
                "th": thread,
                "a": acquired_ms or int(time.time() * 1000),
            },
            separators=(",", ":"),
        ).encode()

    @staticmethod
    def _window(data: bytes) -> tuple[str, int]:
        try:
            info = json.loads(data)
            return info["s"], int(info["x"])
        except (ValueError, KeyError, TypeError):
            return "?", 0

    def _ensure_dir(self, client, name: str, path: str) -> None:
        from kazoo.exceptions import NodeExistsError

        if client.exists(path) is None:
            try:
                client.create(path, _pack_name(name), makepath=True)
            except NodeExistsError:
                pass

    def _create(self, client, name: str, token: str, window_ms: int):
        """Create our contender node; return (path, stat)."""
        from kazoo.exceptions import NoNodeError

        directory = self._dir(name)
        for _ in range(5):
            try:
                path, stat = client.create(
                    f"{directory}/{token}-",
                    self._data("w", window_ms),
                    ephemeral=True,
                    sequence=True,
                    include_data=True,
                )
                return path, stat
            except NoNodeError:
                # First use of this name, or its empty node was just cleared.
                self._ensure_dir(client, name, directory)
        raise LockBackendError(f"Lock {name!r}: its ZooKeeper node keeps vanishing.")

    # -- the lock -----------------------------------------------------------

    def acquire(self, name: str, ttl: float, timeout: float | None) -> Lease | None:
        from kazoo.exceptions import ConnectionLoss, OperationTimeoutError

        token = new_token()
        try:
            with self._guard("acquire"):
                return self._acquire(name, token, ttl, timeout)
        except LockBackendError as e:
            if isinstance(e.__cause__, (ConnectionLoss, OperationTimeoutError)):
                # A create (or the write making us the holder) may have gone
                # through unanswered: a node nobody will delete.
                self._remove_in_doubt(name, token, ttl)
            raise

    def _remove_in_doubt(self, name: str, token: str, ttl: float) -> None:
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
        directory = self._dir(name)
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

    def _acquire(
        self, name: str, token: str, ttl: float, timeout: float | None
    ) -> Lease | None:
        from kazoo.exceptions import BadVersionError, KazooException, NoNodeError

        client = self.client
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        waiter_ms = int(MAX_WAIT_SLICE * 1000) + WAITER_GRACE_MS
        path, stat = self._create(client, name, token, waiter_ms)
        directory, mine = path.rsplit("/", 1)
        server_now = stat.mtime
        try:
            while True:
                children = sorted(client.get_children(directory), key=_seq)
                if mine not in children:
                    # Deleted as dead while we starved: queue again.
                    path, stat = self._create(client, name, token, waiter_ms)
                    mine, server_now = path.rsplit("/", 1)[1], stat.mtime
                    continue
                index = children.index(mine)
                if index == 0:
                    sent = time.monotonic()
                    acquired_ms = int(time.time() * 1000)
                    stat = client.set(path, self._data("h", _ms(ttl), acquired_ms))
                    lease = Lease(
                        alias=self.alias,
                        name=name,
                        token=token,
                        fencing_token=stat.czxid,
                        ttl=ttl,
                        deadline=sent + ttl,
                        state=_Node(
                            path, stat.version, client.client_id[0], acquired_ms
                        ),
                    )
                    self._leases.add(lease)
                    path = None  # ours now: not deleted below
                    return lease
                previous = f"{directory}/{children[index - 1]}"
                woken = threading.Event()
                try:
                    data, pstat = client.get(
                        previous, watch=lambda _e, woken=woken: woken.set()
                    )
                except NoNodeError:
                    continue
                state, window = self._window(data)
                expires = pstat.mtime + window
                if expires < server_now:
                    try:  # dead: its version guards against a racing extend
                        client.delete(previous, version=pstat.version)
                    except (BadVersionError, NoNodeError):
                        pass
                    continue
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return None
                wait = MAX_WAIT_SLICE
                if deadline is not None:
                    wait = min(wait, deadline - now)
                # Wake when the predecessor could have expired (+ a margin).
                wait = min(wait, max(0.0, (expires - server_now) / 1000) + 0.01)
                woken.wait(wait)
                try:
                    stat = client.set(path, self._data("w", waiter_ms))
                    server_now = stat.mtime
                except NoNodeError:
                    pass  # the next turn of the loop queues again
        except KazooException:
            if path is not None:
                # Not waited for: with the connection down it would hang
                # until kazoo reconnects. Sent once it has.
                client.delete_async(path)
                path = None
            raise
        finally:
            if path is not None:
                # Leave the queue (best effort: a node left behind by a lost
                # connection is removed by its successor once its window ends).
                try:
                    client.delete(path)
                except KazooException:
                    pass

    def _node(self, lease: Lease) -> _Node:
        lease.check_owner_process()
        return lease.state

    def release(self, lease: Lease) -> bool:
        from kazoo.exceptions import BadVersionError, NoNodeError

        node = self._node(lease)
        self._leases.discard(lease)
        alive = lease.remaining() > 0 and not lease.lost
        with self._guard("release"):
            try:
                self.client.delete(node.path, version=node.version)
            except (NoNodeError, BadVersionError):
                return False
        return alive

    def extend(self, lease: Lease, ttl: float) -> bool:
        from kazoo.exceptions import BadVersionError, NoNodeError

        node = self._node(lease)
        client = self.client
        with self._guard("extend"):
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
                    self._data("h", _ms(ttl), node.acquired_ms),
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
        with self._guard("check a lock"):
            stat = self.client.exists(node.path)
        return (
            stat is not None
            and stat.version == node.version
            and stat.ephemeralOwner == node.session
        )

    # -- listing and clearing -----------------------------------------------

    def _server_now(self, client) -> int:
        """The ZooKeeper leader's clock, in ms (by touching the root node)."""
        from kazoo.exceptions import NoNodeError

        try:
            return client.set(self.root, b"").mtime
        except NoNodeError:
            client.ensure_path(self.root)
            return client.set(self.root, b"").mtime

    def _lock_dirs(self, client) -> list[str]:
        from kazoo.exceptions import NoNodeError

        try:
            return client.get_children(self.root)
        except NoNodeError:
            return []

    def holders(self, prefix: str = "") -> Iterator[Holder]:
        from kazoo.exceptions import NoNodeError

        with self._guard("list locks"):
            client = self.client
            now = self._server_now(client)
            for digest in self._lock_dirs(client):
                directory = f"{self.root}/{digest}"
                try:
                    raw_name, _ = client.get(directory)
                    children = sorted(client.get_children(directory), key=_seq)
                    if not children:
                        continue
                    data, stat = client.get(f"{directory}/{children[0]}")
                except NoNodeError:
                    continue
                name = _unpack_name(raw_name)
                if not name.startswith(prefix):
                    continue
                try:
                    info = json.loads(data)
                except ValueError:
                    continue
                expires = stat.mtime + int(info.get("x", 0))
                if info.get("s") != "h" or expires < now:
                    continue  # between holders, or expired
                utc = timezone.utc
                yield Holder(
                    backend=self.alias,
                    name=name,
                    token=children[0].rsplit("-", 1)[0],
                    host=str(info.get("h", "")),
                    pid=info.get("p"),
                    thread=str(info.get("th", "")),
                    acquired_at=datetime.fromtimestamp(
                        int(info.get("a") or stat.ctime) / 1000, utc
                    ),
                    expires_at=datetime.fromtimestamp(
                        time.time() + (expires - now) / 1000, utc
                    ),
                    fencing_token=stat.czxid,
                )

    def force_release(self, name: str, token: str) -> bool:
        from kazoo.exceptions import NoNodeError

        directory = self._dir(name)
        with self._guard("release a lock"):
            client = self.client
            try:
                children = client.get_children(directory)
            except NoNodeError:
                return False
            for child in children:
                if child.rsplit("-", 1)[0] == token:
                    try:
                        client.delete(f"{directory}/{child}")
                    except NoNodeError:
                        return False
                    return True
        return False

    def clear_stale(self) -> int:
        """Delete contender nodes past their window, and empty lock nodes."""
        from kazoo.exceptions import BadVersionError, NoNodeError, NotEmptyError

        removed = 0
        with self._guard("clear stale locks"):
            client = self.client
            now = self._server_now(client)
            for digest in self._lock_dirs(client):
                directory = f"{self.root}/{digest}"
                try:
                    children = client.get_children(directory)
                except NoNodeError:
                    continue
                for child in children:
                    path = f"{directory}/{child}"
                    try:
                        data, stat = client.get(path)
                        _, window = self._window(data)
                        if stat.mtime + window < now:
                            client.delete(path, version=stat.version)
                            removed += 1
                    except (NoNodeError, BadVersionError):
                        continue
                try:
                    client.delete(directory)
                except (NoNodeError, NotEmptyError):
                    pass
        return removed


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000 + 0.999))
