"""Listing and clearing the ZooKeeper backend's locks and semaphores.

A holder is a contender node whose data says "holding" and whose window has
not ended by the ZooKeeper leader's clock (read by touching the root node).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from ..base import Holder
from ..kinds import EXCLUSIVE, Kind, permit
from .nodes import child_kind, child_token, read_info, seq, unpack_name
from .queue import fetch_nodes

__all__ = ["SEMAPHORES", "ZooKeeperListing"]

#: The child of the root under which the semaphores live (a lock's node is
#: a 43-character digest, so it can never be named so).
SEMAPHORES = "semaphores"


class ZooKeeperListing:
    """Listing, lookup and clearing methods of :class:`.ZooKeeperLockBackend`."""

    def _server_now(self, client) -> int:
        """The ZooKeeper leader's clock, in ms (by touching the root node)."""
        from kazoo.exceptions import NoNodeError

        try:
            return client.set(self.root, b"").mtime
        except NoNodeError:
            client.ensure_path(self.root)
            return client.set(self.root, b"").mtime

    def _directories(self, client) -> Iterator[tuple[str, bool]]:
        """Yield ``(path, is_semaphore)`` of every lock and semaphore node."""
        from kazoo.exceptions import NoNodeError

        try:
            children = client.get_children(self.root)
        except NoNodeError:
            return
        for child in children:
            if child != SEMAPHORES:
                yield f"{self.root}/{child}", False
        try:
            semaphores = client.get_children(f"{self.root}/{SEMAPHORES}")
        except NoNodeError:
            return
        for child in semaphores:
            yield f"{self.root}/{SEMAPHORES}/{child}", True

    def _holders_in(
        self, client, directory: str, semaphore: bool, now: int, name: str | None
    ) -> list[Holder]:
        """Return the live holders in ``directory`` (``name``: None to read it)."""
        from kazoo.exceptions import NoNodeError

        try:
            if name is None:
                name = unpack_name(client.get(directory)[0])
            children = sorted(client.get_children(directory), key=seq)
        except NoNodeError:
            return []
        wall = int(time.time() * 1000)
        found = []
        for child, info, stat in fetch_nodes(client, directory, children):
            expires = info.expires(stat.mtime)
            if info.state != "h" or expires < now:
                continue  # waiting, or expired
            kind = permit(info.limit) if semaphore else child_kind(child)
            found.append(
                Holder.from_ms(
                    self.alias,
                    name,
                    child_token(child),
                    info.host,
                    info.pid,
                    info.thread,
                    info.acquired_ms or stat.ctime,
                    wall + (expires - now),
                    stat.czxid,
                    kind,
                )
            )
        return found

    def holders(self, prefix: str = "") -> Iterator[Holder]:
        with self._guard("list locks"):
            client = self.client
            now = self._server_now(client)
            for directory, semaphore in self._directories(client):
                for holder in self._holders_in(client, directory, semaphore, now, None):
                    if holder.name.startswith(prefix):
                        yield holder

    def holder_of(self, name: str, kind: Kind = EXCLUSIVE) -> Holder | None:
        semaphore = kind.mode == "permit"
        directory = self._sem_dir(name) if semaphore else self._dir(name)
        with self._guard("look up a lock"):
            client = self.client
            now = self._server_now(client)
            found = self._holders_in(client, directory, semaphore, now, name)
        if kind.mode == "shared":
            # Only an exclusive holder, or the shared holders a queued
            # exclusive request waits for, keep a shared request out.
            writers = [h for h in found if h.kind.exclusive]
            if writers:
                return writers[0]
            children = self._children(directory)
            if not any(child_kind(c).exclusive for c in children):
                return None
        if not found:
            return None
        return min(found, key=lambda h: h.expires_ts or 0)

    def _children(self, directory: str) -> list[str]:
        from kazoo.exceptions import NoNodeError

        with self._guard("look up a lock"):
            try:
                return self.client.get_children(directory)
            except NoNodeError:
                return []

    def force_release(self, name: str, token: str, kind: Kind = EXCLUSIVE) -> bool:
        from kazoo.exceptions import NoNodeError

        if kind.mode == "permit":
            directory = self._sem_dir(name)
        else:
            directory = self._dir(name)
        with self._guard("release a lock"):
            client = self.client
            for child in self._children(directory):
                if child_token(child) == token:
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
            for directory, _ in list(self._directories(client)):
                try:
                    children = client.get_children(directory)
                except NoNodeError:
                    continue
                for child in children:
                    path = f"{directory}/{child}"
                    try:
                        data, stat = client.get(path)
                        if read_info(data).expires(stat.mtime) < now:
                            client.delete(path, version=stat.version)
                            removed += 1
                    except (NoNodeError, BadVersionError):
                        continue
                try:
                    client.delete(directory)
                except (NoNodeError, NotEmptyError):
                    pass
        return removed
