"""Listing and clearing Redlock leases: what a quorum of nodes holds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timezone

from ...exceptions import LockBackendError
from ...keys import glob_escape
from ..base import Holder
from ..kinds import EXCLUSIVE, SHARED, Kind
from .algorithm import single
from .steps import STALE_AFTER, Failed, Fanout, reader_keys, unpack_meta

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

    def _scan_readers(self) -> dict[tuple[bytes, bytes], list]:
        """Return {(readers key, token): [(node, fence, holder, expires), ...]}
        of the live shared leases; ``fence`` is the node's counter.

        Raise LockBackendError if fewer than a quorum of nodes can be read.
        """
        import redis

        pattern = glob_escape(self.key_prefix) + ":{*}:r"
        seen: dict[tuple[bytes, bytes], list] = {}
        failed = 0
        for i in range(len(self.nodes)):
            client = self._node_client(i)
            try:
                for key in client.scan_iter(match=pattern, count=1000, _type="ZSET"):
                    lease = key[:-2]
                    pipe = client.pipeline(transaction=False)
                    pipe.zrange(key, 0, -1, withscores=True)
                    pipe.hgetall(lease + b":m")
                    pipe.get(lease + b":c")
                    pipe.time()
                    readers, metas, counter, (seconds, micros) = pipe.execute()
                    node_ms = seconds * 1000 + micros // 1000
                    now = time.time()
                    for token, score in readers:
                        if score <= node_ms or token not in metas:
                            continue  # expired
                        expires = now + (score - node_ms) / 1000
                        seen.setdefault((key, token), []).append(
                            (i, int(counter or 0), metas[token], expires)
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
        """Yield the leases that a quorum of nodes hold with the same token."""
        for (_key, token), copies in self._scan().items():
            holder = self._holder(token, copies)
            if holder is not None and holder.name.startswith(prefix):
                yield holder
        for (_key, token), copies in self._scan_readers().items():
            holder = self._holder(token, copies, SHARED)
            if holder is not None and holder.name.startswith(prefix):
                yield holder

    def _holder(
        self, token: bytes, copies: list, kind: Kind = EXCLUSIVE
    ) -> Holder | None:
        """Return the Holder of ``token``'s ``copies`` (node, fence, meta,
        expires), or None unless a quorum of nodes hold it.

        A shared holder's fence is the smallest counter of its nodes, as its
        acquisition reported."""
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
            fencing_token=(max if kind is EXCLUSIVE else min)(
                f for _n, f, _m, _e in copies
            ),
            kind=kind,
        )

    def _lookup(self, name: str, kind: Kind) -> Fanout:
        lease, counter, _waiters, _wake = self.keys_for(name)
        commands = [("GET", lease), ("PTTL", lease), ("GET", counter)]
        if kind.exclusive:
            # Shared holders keep an exclusive request out too.
            readers, meta = reader_keys(lease)
            commands += [
                ("ZRANGE", readers, 0, -1, "WITHSCORES"),
                ("HGETALL", meta),
                ("TIME",),
            ]
        return Fanout(commands)

    def _holder_of(self, results: list) -> Holder | None:
        holder = self._exclusive_holder_of(results)
        if holder is not None:
            return holder
        now = time.time()
        copies: dict[bytes, list] = {}
        for i, r in enumerate(results):
            if isinstance(r, Failed) or len(r) < 6:
                continue
            counter, readers, metas, (seconds, micros) = r[2:6]
            node_ms = int(seconds) * 1000 + int(micros) // 1000
            metas = _pairs(metas)
            for token, score in _pairs(readers).items():
                score = float(score)
                if score <= node_ms or token not in metas:
                    continue
                expires = now + (score - node_ms) / 1000
                copies.setdefault(token, []).append(
                    (i, int(counter or 0), metas[token], expires)
                )
        found = [self._holder(t, held, SHARED) for t, held in copies.items()]
        found = [h for h in found if h is not None]
        return min(found, key=lambda h: h.expires_ts or 0) if found else None

    def _exclusive_holder_of(self, results: list) -> Holder | None:
        now = time.time()
        copies: dict[bytes, list] = {}
        for i, r in enumerate(results):
            if isinstance(r, Failed):
                continue
            value, pttl, counter = r[:3]
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
        """Return what keeps ``kind`` of ``name`` out on a quorum, or None.

        One round trip. For an exclusive request: the exclusive holder, else
        the shared holder whose lease ends first; for a shared one: the
        exclusive holder. Semaphores do not exist here (:attr:`kinds`).
        """
        if kind.mode == "permit":
            return None
        return self._holder_of(self._run(single(self._lookup(name, kind))))

    async def aholder_of(self, name: str, kind: Kind = EXCLUSIVE) -> Holder | None:
        """Async twin of :meth:`holder_of`."""
        if kind.mode == "permit":
            return None
        return self._holder_of(await self._arun(single(self._lookup(name, kind))))

    def force_release(self, name: str, token: str, kind: Kind = EXCLUSIVE) -> bool:
        """Delete the lease ``token`` of ``name`` on every node that has it.

        Return True if any node removed it: the lock is then no longer held
        by a quorum unless it was re-taken, which this never undoes. A
        shared ``kind`` removes that one reader; a permit (none exists here)
        removes nothing.
        """
        if kind.mode == "permit":
            return False
        if kind.exclusive:
            command = self._release_command(self.keys_for(name), token)
        else:
            command = self._shared_release_command(name, token)
        results = self._run(single(Fanout([command])))
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


def _pairs(reply) -> dict:
    """Return a ZRANGE WITHSCORES or HGETALL reply as a dict, whichever
    shape the connection's parser gave it (flat, pairs, or a dict)."""
    if isinstance(reply, dict):
        return reply
    if reply and isinstance(reply[0], (list, tuple)):
        return dict(reply)
    return dict(zip(reply[::2], reply[1::2]))
