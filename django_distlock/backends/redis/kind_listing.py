"""Listing and clearing shared holders and semaphore permits on Redis.

The holders ZSETs are found with SCAN (every primary of a cluster) and each
is read by one script call (:file:`lua/kinds_list.lua`), pipelined: one
round trip per batch. Exclusive leases are listed by :mod:`.listing`; a lease
hash that only marks a lock as shared is left out of that listing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator

from ...keys import decode_name, encode_name, glob_escape
from ..base import EXCLUSIVE, SHARED, Holder, Kind, permit
from .client import async_timeout
from .sharing import LIST_KIND, MARK, PURGE, SharedKeys, holder_keys

__all__ = ["RedisKindListing"]

#: Keys one SCAN step asks for, and the holders ZSETs one pipeline reads.
LIST_BATCH = 1000
#: Force-releases sent in one pipeline.
RELEASE_BATCH = 1000


def _text(raw) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


def _holders(alias: str, semaphore: bool, reply: list) -> Iterator[Holder]:
    """Yield the Holders that one ``kinds_list.lua`` reply describes."""
    if not reply:
        return
    name = decode_name(reply[0])
    if semaphore:
        kind = permit(int(reply[1]))
        lock_fence = None
    else:
        kind = SHARED
        lock_fence = int(reply[1]) if reply[1] else None
    for token, expires, host, pid, thread, acquired, fence in reply[2:]:
        yield Holder.from_ms(
            alias,
            name,
            _text(token),
            _text(host),
            int(pid) if pid else None,
            _text(thread),
            int(acquired) or None,
            int(float(expires)),
            int(fence) if fence else lock_fence,
            kind,
        )


class RedisKindListing:
    """The listing half of shared locks and semaphores (a backend mixin)."""

    def holders(self, prefix: str = "") -> Iterator[Holder]:
        """Yield every active holder (any kind) whose name starts with ``prefix``."""
        for holder in super().holders(prefix):
            if holder.token != MARK:
                yield holder
        yield from self._kind_holders(prefix)

    def _holder_zsets(self) -> Iterator[tuple[bytes, bool]]:
        """Yield ``(key, is_semaphore)`` of every holders ZSET: one SCAN."""
        pattern = glob_escape(self.key_prefix) + ":{" + "?" * 43 + "}:*"
        # Exactly "<prefix>:{<digest>}:s" or ":pz": the keys of an alias whose
        # KEY_PREFIX starts with ours plus a digest-like part never match.
        size = len(self.key_prefix.encode()) + 46
        for key in self.client.scan_iter(match=pattern, count=LIST_BATCH, _type="ZSET"):
            if len(key) == size + 2 and key.endswith(b":s"):
                yield key, False
            elif len(key) == size + 3 and key.endswith(b":pz"):
                yield key, True

    def _kind_holders(self, prefix: str) -> Iterator[Holder]:
        import redis

        wanted = encode_name(prefix)
        try:
            batch: list[tuple[bytes, bool]] = []
            for found in self._holder_zsets():
                batch.append(found)
                if len(batch) >= LIST_BATCH:
                    yield from self._read_kinds(batch, wanted)
                    batch = []
            if batch:
                yield from self._read_kinds(batch, wanted)
        except redis.exceptions.RedisError as e:
            raise self._error(e, "list locks") from e

    @staticmethod
    def _owner_of(zset_key: bytes, semaphore: bool) -> tuple[str, str, str, str]:
        """Return the holders ZSET, owner hash, metadata keys and the mark."""
        key = zset_key.decode()
        if semaphore:
            owner = key[: -len("z")]
            return (key, owner, owner + "m", "")
        owner = key[: -len(":s")]
        return (key, owner, owner + ":m", MARK)

    def _read_kinds(
        self, found: list[tuple[bytes, bool]], wanted: bytes
    ) -> Iterator[Holder]:
        pipe = self.client.pipeline(transaction=False)
        for key, semaphore in found:
            zset, owner, meta, mark = self._owner_of(key, semaphore)
            pipe.execute_command(
                "EVAL", LIST_KIND.source, 3, zset, owner, meta, wanted, mark
            )
        for (_, semaphore), reply in zip(found, pipe.execute()):
            yield from _holders(self.alias, semaphore, reply)

    def _holders_of(self, name: str, kind: Kind) -> list[Holder]:
        """Return the live shared holders (or permits) of ``name``: one call."""
        import redis

        keys = holder_keys(self.keys_for(name), kind)
        semaphore = kind.mode == "permit"
        try:
            reply = self.redis.script(LIST_KIND)(
                keys=keys.held, args=[encode_name(name), keys.mark]
            )
        except redis.exceptions.RedisError as e:
            raise self._error(e, "look up the holder") from e
        return list(_holders(self.alias, semaphore, reply))

    def holder_of(self, name: str, kind: Kind = EXCLUSIVE) -> Holder | None:
        """Return the holder that keeps ``kind`` of ``name`` busy, or None.

        For an exclusive request, a shared holder when shared holders hold
        the lock; for a shared one, the exclusive holder (None while only a
        queued exclusive waiter holds it up); for a permit, the permit that
        expires first.
        """
        if kind.mode == "permit":
            return self._first_expiring(self._holders_of(name, kind))
        holder = super().holder_of(name)
        if holder is None or holder.token != MARK:
            return holder
        if kind.mode == "shared":
            return None
        return self._first_expiring(self._holders_of(name, SHARED))

    async def aholder_of(self, name: str, kind: Kind = EXCLUSIVE) -> Holder | None:
        """Async twin of :meth:`holder_of`, on the event loop's own client."""
        if kind.mode == "permit":
            return self._first_expiring(await self._aholders_of(name, kind))
        holder = await super().aholder_of(name)
        if holder is None or holder.token != MARK:
            return holder
        if kind.mode == "shared":
            return None
        return self._first_expiring(await self._aholders_of(name, SHARED))

    async def _aholders_of(self, name: str, kind: Kind) -> list[Holder]:
        """Async twin of :meth:`_holders_of`."""
        import redis

        keys = holder_keys(self.keys_for(name), kind)
        script = self.redis.ascript(LIST_KIND)
        try:
            async with async_timeout(self.redis.adeadline):
                reply = await script(
                    keys=keys.held, args=[encode_name(name), keys.mark]
                )
        except redis.exceptions.RedisError as e:
            raise self._error(e, "look up the holder") from e
        except asyncio.TimeoutError as e:  # TimeoutError from Python 3.11 on
            error = redis.exceptions.TimeoutError("Timeout")
            raise self._error(error, "look up the holder") from e
        return list(_holders(self.alias, kind.mode == "permit", reply))

    @staticmethod
    def _first_expiring(holders: list[Holder]) -> Holder | None:
        return min(holders, key=lambda h: h.expires_ts or 0, default=None)

    def _kind_release_command(self, name: str, token: str, kind: Kind) -> tuple:
        keys: SharedKeys = holder_keys(self.keys_for(name), kind)
        return ("eval", keys.release, keys.five, [token, keys.wake])

    def force_release(self, name: str, token: str, kind: Kind = EXCLUSIVE) -> bool:
        """Remove the holder of ``name`` (of ``kind``) whose token is ``token``."""
        if kind is EXCLUSIVE or kind.exclusive:
            return super().force_release(name, token)
        return self._execute(self._kind_release_command(name, token, kind)) != 0

    def force_release_many(self, items: Iterable[tuple]) -> list[bool]:
        """Force-release ``(name, token[, kind])`` items, pipelined in batches."""
        items = list(items)
        results: list[bool | None] = [None] * len(items)
        plain = [i for i, it in enumerate(items) if len(it) < 3 or it[2].exclusive]
        if plain:
            done = super().force_release_many([items[i][:2] for i in plain])
            for i, ok in zip(plain, done):
                results[i] = ok
        others = [i for i in range(len(items)) if results[i] is None]
        for start in range(0, len(others), RELEASE_BATCH):
            batch = others[start : start + RELEASE_BATCH]
            commands = [self._kind_release_command(*items[i]) for i in batch]
            for i, reply in zip(batch, self._pipeline(commands)):
                if isinstance(reply, Exception):
                    raise self._error(reply, "clear locks")
                results[i] = reply != 0
        return results

    def clear_stale(self) -> int:
        """Remove expired shared holders and permits whose keys still live.

        Exclusive leases expire with their keys; nothing else is stale.
        """
        import redis

        removed = 0
        try:
            found = list(self._holder_zsets())
            for start in range(0, len(found), LIST_BATCH):
                pipe = self.client.pipeline(transaction=False)
                for key, semaphore in found[start : start + LIST_BATCH]:
                    zset, owner, meta, mark = self._owner_of(key, semaphore)
                    pipe.execute_command(
                        "EVAL", PURGE.source, 3, zset, owner, meta, mark
                    )
                removed += sum(int(r) for r in pipe.execute())
        except redis.exceptions.RedisError as e:
            raise self._error(e, "clear stale locks") from e
        return removed + super().clear_stale()
