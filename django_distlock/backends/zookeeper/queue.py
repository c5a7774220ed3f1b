"""The wait for a turn: one contender node, from queued to holding.

Every acquisition creates an ephemeral sequential node in the directory of
its lock (or semaphore) and holds once the nodes ahead of it allow:

- exclusive: no node ahead of it; it watches its immediate predecessor;
- shared: no exclusive node ahead of it (ZooKeeper's read-write lock
  recipe); it watches the nearest exclusive node ahead. A shared request
  behind a queued exclusive one therefore waits for it: writer preference;
- permit: fewer than ``limit`` nodes ahead of it, so permits are granted
  in FIFO order. It watches the directory's children: any node ahead may
  leave first, so every waiter of a semaphore wakes on every change (a
  herd, as in kazoo's own ``Semaphore``).

A node's data gives a window after its last write (``ttl`` for a holder, a
short one for a waiter, which rewrites its node while it waits). A waiter
that finds a node it waits for past its window deletes it, guarded by the
node's version so that a concurrent ``extend()`` wins: a dead holder or a
dead waiter cannot block the queue for longer than its window, even while
its session lives on.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from ...exceptions import LockBackendError
from ..base import Lease
from ..kinds import Kind, limit_mismatch
from .nodes import (
    SHARED_MARK,
    NodeInfo,
    ZkNode,
    ms,
    node_data,
    pack_name,
    read_info,
    seq,
)

if TYPE_CHECKING:
    from .backend import ZooKeeperLockBackend

__all__ = [
    "MAX_WAIT_SLICE",
    "WAITER_GRACE_MS",
    "create_node",
    "fetch_nodes",
    "take_turn",
]

#: How long past its expected next rewrite a waiter's node stays valid.
WAITER_GRACE_MS = 3000
#: Longest single wait before a waiter rewrites its node.
MAX_WAIT_SLICE = 2.0


def create_node(client, name: str, directory: str, token: str, data: bytes):
    """Create a contender node for ``token`` in ``directory``; return (path, stat)."""
    from kazoo.exceptions import NodeExistsError, NoNodeError

    for _ in range(5):
        try:
            return client.create(
                f"{directory}/{token}-",
                data,
                ephemeral=True,
                sequence=True,
                include_data=True,
            )
        except NoNodeError:
            # First use of this name, or its empty node was just cleared.
            if client.exists(directory) is None:
                try:
                    client.create(directory, pack_name(name), makepath=True)
                except NodeExistsError:
                    pass
    raise LockBackendError(f"Lock {name!r}: its ZooKeeper node keeps vanishing.")


def fetch_nodes(client, directory: str, children: list[str]):
    """Return ``[(child, NodeInfo, stat)]`` of the children still there."""
    from kazoo.exceptions import NoNodeError

    pending = [(c, client.get_async(f"{directory}/{c}")) for c in children]
    found = []
    for child, result in pending:
        try:
            data, stat = result.get()
        except NoNodeError:
            continue
        found.append((child, read_info(data), stat))
    return found


def take_turn(
    backend: ZooKeeperLockBackend,
    name: str,
    directory: str,
    token: str,
    ttl: float,
    timeout: float | None,
    kind: Kind,
) -> Lease | None:
    """Queue in ``directory`` and wait for a turn as ``kind``; the Lease or None."""
    from kazoo.exceptions import BadVersionError, KazooException, NoNodeError

    client = backend.client
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    waiter_ms = int(MAX_WAIT_SLICE * 1000) + WAITER_GRACE_MS
    limit = kind.limit if kind.mode == "permit" else None
    waiting = node_data("w", waiter_ms, limit=limit)
    path, stat = create_node(client, name, directory, token, waiting)
    mine = path.rsplit("/", 1)[1]
    server_now = stat.mtime
    # One watcher for the whole wait: kazoo keeps a set of watchers per
    # node, so re-arming the same function each turn does not pile them up.
    woken = threading.Event()

    def wake(_event) -> None:
        woken.set()

    try:
        while True:
            woken.clear()
            if limit is None:
                children = sorted(client.get_children(directory), key=seq)
            else:
                children = sorted(client.get_children(directory, watch=wake), key=seq)
            if mine not in children:
                # Deleted as dead while we starved: queue again.
                path, stat = create_node(client, name, directory, token, waiting)
                mine, server_now = path.rsplit("/", 1)[1], stat.mtime
                continue
            ahead = children[: children.index(mine)]
            if limit is not None:
                expires = _permit_wait(
                    client, name, directory, ahead, limit, server_now
                )
                if expires is _GONE:
                    continue
                if expires is None:
                    ahead = []
            else:
                if kind.mode == "shared":
                    ahead = [c for c in ahead if not c.startswith(SHARED_MARK)]
                if ahead:
                    previous = f"{directory}/{ahead[-1]}"
                    try:
                        data, pstat = client.get(previous, watch=wake)
                    except NoNodeError:
                        continue
                    expires = read_info(data).expires(pstat.mtime)
                    if expires < server_now:
                        try:  # dead: its version guards against a racing extend
                            client.delete(previous, version=pstat.version)
                        except (BadVersionError, NoNodeError):
                            pass
                        continue
            if not ahead:
                sent = time.monotonic()
                acquired_ms = int(time.time() * 1000)
                try:
                    stat = client.set(
                        path, node_data("h", ms(ttl), acquired_ms, limit=limit)
                    )
                except NoNodeError:
                    continue  # deleted as dead just now: queue again
                lease = Lease(
                    alias=backend.alias,
                    name=name,
                    token=token,
                    fencing_token=stat.czxid,
                    ttl=ttl,
                    deadline=sent + ttl,
                    state=ZkNode(path, stat.version, client.client_id[0], acquired_ms),
                    kind=kind,
                )
                backend.track(lease)
                path = None  # ours now: not deleted below
                return lease
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return None
            wait = MAX_WAIT_SLICE
            if deadline is not None:
                wait = min(wait, deadline - now)
            # Wake when what we wait for could have expired (+ a margin).
            wait = min(wait, max(0.0, (expires - server_now) / 1000) + 0.01)
            woken.wait(wait)
            try:
                stat = client.set(path, waiting)
                server_now = stat.mtime
            except NoNodeError:
                pass  # the next turn of the loop queues again
    except KazooException:
        if path is not None:
            # Not waited for: with the connection down it would hang until
            # kazoo reconnects. Sent once it has.
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


#: Returned by _permit_wait when it deleted a dead node: look again.
_GONE = object()


def _permit_wait(client, name, directory, ahead, limit, server_now):
    """Return None if a permit is ours, else when a node ahead may expire (ms).

    Return ``_GONE`` after deleting a node ahead that is past its window.
    Raise ValueError if the oldest live node ahead passed another ``limit``.
    """
    from kazoo.exceptions import BadVersionError, NoNodeError

    live: list[tuple[NodeInfo, int]] = []
    gone = False
    for child, info, stat in fetch_nodes(client, directory, ahead):
        if info.expires(stat.mtime) < server_now:
            try:  # dead: its version guards against a racing extend
                client.delete(f"{directory}/{child}", version=stat.version)
            except (BadVersionError, NoNodeError):
                pass
            gone = True
            continue
        live.append((info, stat.mtime))
    if live and live[0][0].limit != limit:
        raise limit_mismatch(name, live[0][0].limit, limit)
    if gone:
        return _GONE
    if len(live) < limit:
        return None
    return min(info.expires(mtime) for info, mtime in live)
