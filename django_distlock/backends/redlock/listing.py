"""Listing and clearing Redlock leases: what a quorum of nodes holds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timezone

from ...exceptions import LockBackendError
from ...keys import glob_escape
from ..base import Holder
from ..kinds import EXCLUSIVE, Kind
from .algorithm import single
from .steps import STALE_AFTER, Failed, Fanout, unpack_meta

__all__ = ["RedlockListing"]


class RedlockListing:
    """The listing half of :class:`~.backend.RedlockBackend` (a mixin)."""

    def _node_client(self, i: int):
        import redis

        # Listing may scan many keys: a patient timeout, not NODE_TIMEOUT.
        kwargs = self._conn_kwargs()
        kwargs["socket_timeout"] = max(self.node_timeout, 5.0)
        return redis.Redis.from_url(self.locations[i], **kwargs)

    def _scan(self) -> dict[tuple[bytes, bytes], list]:
        """Return {(key, token): [(node, fence, holder, expires), ...]}.

        Raise LockBackendError if fewer than a quorum of nodes can be read.
        """
        import redis

        pattern = glob_escape(self.key_prefix) + ":{*}"
        seen: dict[tuple[bytes, bytes], list] = {}
        failed = 0
        for i in range(len(self.nodes)):
            client = self._node_client(i)
            try:
                keys = list(client.scan_iter(match=pattern, count=1000, _type="STRING"))
                for start in range(0, len(keys), 500):
                    batch = keys[start : start + 500]
                    pipe = client.pipeline(transaction=False)
                    for key in batch:
                        pipe.get(key)
                        pipe.pttl(key)
                        pipe.get(key + b":c")
                    replies = pipe.execute()
                    now = time.time()
                    for k, key in enumerate(batch):
                        value, pttl, counter = replies[3 * k : 3 * k + 3]
                        parts = (value or b"").split(b"\n", 2)
                        if len(parts) < 3 or pttl is None:
                            continue  # gone, or a reservation
                        expires = now + pttl / 1000 if pttl > 0 else None
                        # A lease granted by a first attempt carries no
                        # fencing token: it is the lock's counter, unless
                        # someone tried to take the lock since (each try
                        # counts), so the listing may show a larger one.
                        fence = int(parts[1] or counter or 0)
                        seen.setdefault((key, parts[0]), []).append(
                            (i, fence, parts[2], expires)
                        )
            except redis.exceptions.RedisError:
                failed += 1
            finally:
                client.close()
        if len(self.nodes) - failed < self.quorum:
            raise LockBackendError(
                f"Redlock backend {self.alias!r} could not reach a quorum of "
                "nodes to list locks."
            )
        return seen

    def holders(self, prefix: str = "") -> Iterator[Holder]:
        """Yield the locks that a quorum of nodes hold with the same token."""
        for (_key, token), copies in self._scan().items():
            holder = self._holder(token, copies)
            if holder is not None and holder.name.startswith(prefix):
                yield holder

    def _holder(self, token: bytes, copies: list) -> Holder | None:
        """Return the Holder of ``token``'s ``copies`` (node, fence, meta,
        expires), or None unless a quorum of nodes hold it."""
        if len(copies) < self.quorum:
            return None
        name, host, pid, thread, acquired = unpack_meta(copies[0][2])
        # Held until fewer than a quorum of nodes still hold it.
        expiries = sorted(
            (e for _n, _f, _m, e in copies if e is not None), reverse=True
        )
        expires = expiries[self.quorum - 1] if len(expiries) >= self.quorum else None
        return Holder(
            backend=self.alias,
            name=name,
            token=token.decode(),
            host=host,
            pid=pid,
            thread=thread,
            acquired_at=datetime.fromtimestamp(acquired, timezone.utc)
            if acquired
            else None,
            expires_at=datetime.fromtimestamp(expires, timezone.utc)
            if expires
            else None,
            fencing_token=max(f for _n, f, _m, _e in copies),
        )

    def _lookup(self, name: str) -> Fanout:
        lease, counter, _waiters, _wake = self.keys_for(name)
        return Fanout([("GET", lease), ("PTTL", lease), ("GET", counter)])

    def _holder_of(self, results: list) -> Holder | None:
        now = time.time()
        copies: dict[bytes, list] = {}
        for i, r in enumerate(results):
            if isinstance(r, Failed):
                continue
            value, pttl, counter = r
            parts = (value or b"").split(b"\n", 2)
            if len(parts) < 3 or not isinstance(pttl, int) or pttl == -2:
                continue  # free, or a reservation
            expires = now + pttl / 1000 if pttl > 0 else None
            fence = int(parts[1] or counter or 0)
            copies.setdefault(parts[0], []).append((i, fence, parts[2], expires))
        for token, held in copies.items():
            holder = self._holder(token, held)
            if holder is not None:
                return holder
        return None

    def holder_of(self, name: str, kind: Kind = EXCLUSIVE) -> Holder | None:
        """Return the holder of ``name`` on a quorum (one round trip), or None.

        Only exclusive leases exist here (:attr:`kinds`): any other ``kind``
        has no holder.
        """
        if not kind.exclusive:
            return None
        return self._holder_of(self._run(single(self._lookup(name))))

    async def aholder_of(self, name: str, kind: Kind = EXCLUSIVE) -> Holder | None:
        """Async twin of :meth:`holder_of`."""
        if not kind.exclusive:
            return None
        return self._holder_of(await self._arun(single(self._lookup(name))))

    def force_release(self, name: str, token: str, kind: Kind = EXCLUSIVE) -> bool:
        """Delete the lease ``token`` of ``name`` on every node that has it.

        Return True if any node removed it: the lock is then no longer held
        by a quorum unless it was re-taken, which this never undoes. A
        ``kind`` other than exclusive (none exists here) removes nothing.
        """
        if not kind.exclusive:
            return False
        results = self._run(
            single(Fanout([self._release_command(self.keys_for(name), token)]))
        )
        ok, failed = self._count(results)
        if ok == 0 and len(self.nodes) - failed < self.quorum:
            raise self._no_quorum(name, results)
        return ok > 0

    def clear_stale(self) -> int:
        """Remove leases left on fewer than a quorum of nodes.

        Such leftovers (an acquisition whose undo missed a node, a holder
        whose nodes restarted) lock nobody out but keep their nodes busy
        until they expire. Only leases acquired more than ``STALE_AFTER``
        seconds ago are touched, so an acquisition in progress during the
        scan is never mistaken for one; each removal is a compare-and-delete
        of that token. Return how many leases were removed (per lock).
        """
        removed = 0
        now = time.time()
        for (key, token), copies in self._scan().items():
            if len(copies) >= self.quorum:
                continue
            acquired = unpack_meta(copies[0][2])[4]
            if acquired is None or now - acquired < STALE_AFTER:
                continue
            nodes = [node for node, _f, _m, _e in copies]
            keys = (key.decode(), "", key.decode() + ":z", key.decode() + ":w")
            results = self._run(
                single(
                    Fanout([self._release_command(keys, token.decode())], nodes=nodes)
                )
            )
            if any(not isinstance(r, Failed) and r[0] for r in results):
                removed += 1
        return removed
