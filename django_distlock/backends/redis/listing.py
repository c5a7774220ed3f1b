"""Listing and clearing the leases of the Redis backends.

A listing walks the lease hashes with SCAN (every primary of a cluster) and
reads each batch on the server with :file:`lua/list.lua` (one call per SCAN
step; on a cluster, one pipelined call per key), the next batch while the
caller works through this one; one name is looked up with HMGET and PTTL in
one round trip.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Generator, Iterator
from typing import Any

from ...keys import encode_name, glob_escape
from ..base import Holder
from .client import async_timeout
from .keys import LEASE_FIELDS, LIST, RELEASE

__all__ = ["RedisListing"]

#: Keys one SCAN step asks for, and the leases one pipeline reads.
LIST_BATCH = 1000
#: Force-releases sent in one pipeline.
RELEASE_BATCH = 1000


def _holder(alias: str, fields: Any, pttl: Any, now_ms: int) -> Holder | None:
    """Return the Holder described by one lease's HMGET and PTTL replies."""
    if type(fields) is not list or fields[0] is None:
        return None  # gone since the scan (or not a lease at all)
    token, fence, name, host, pid, thread, acquired = fields
    return Holder.from_ms(
        alias,
        name.decode("utf-8", "surrogatepass") if name else "",
        token.decode(),
        host.decode(errors="replace") if host else "",
        int(pid) if pid else None,
        thread.decode(errors="replace") if thread else "",
        int(acquired) if acquired else None,
        now_ms + pttl if type(pttl) is int and pttl > 0 else None,
        int(fence) if fence else None,
    )


def _read_ahead(batches: Generator[list, None, None]) -> Generator[list, None, None]:
    """Yield the batches of ``batches``, read one step ahead in a thread.

    The server scans and reads the next batch while the caller turns this
    one into holders: at 100,000 leases each side takes about a second, one
    after the other without this. Errors reach the caller where the batch
    they stopped would have.
    """
    ready: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()
    end = object()

    def hand_over(item: tuple) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            for batch in batches:
                if not hand_over((batch, None)):
                    return
            hand_over((end, None))
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            hand_over((end, e))
        finally:
            batches.close()

    threading.Thread(target=read, name="distlock-list", daemon=True).start()
    try:
        while True:
            batch, error = ready.get()
            if batch is end:
                if error is not None:
                    raise error
                return
            yield batch
    finally:
        stop.set()


class RedisListing:
    """The listing half of the Redis backends (a mixin of the backend)."""

    def holders(self, prefix: str = "") -> Iterator[Holder]:
        """Yield every active holder whose lock name starts with ``prefix``."""
        import redis

        # Exactly "<prefix>:{<43-char digest>}": a longer KEY_PREFIX that
        # starts with ours (another alias's) can never match.
        pattern = glob_escape(self.key_prefix) + ":{" + "?" * 43 + "}"
        # A str prefix of the name is a bytes prefix of its stored form: the
        # list script filters on the server.
        wanted = encode_name(prefix)
        scan = self._cluster_batches if self.cluster else self._script_batches
        batches = _read_ahead(scan(pattern, wanted))
        alias = self.alias
        try:
            for batch in batches:
                now_ms = time.time_ns() // 1_000_000
                for k in range(0, len(batch), 2):
                    holder = _holder(alias, batch[k], batch[k + 1], now_ms)
                    if holder is not None:
                        yield holder
        except redis.exceptions.RedisError as e:
            raise self._error(e, "list locks") from e
        finally:
            batches.close()  # an abandoned listing stops the thread now

    # The listing batches are lists of replies, the HMGET of a lease's fields
    # then its PTTL: [fields, pttl, fields, pttl, ...].

    def _script_batches(self, pattern: str, wanted: bytes) -> Iterator[list]:
        """Scan and read one server's leases, one list script call per step."""
        script = self.redis.script(LIST)
        args = [wanted, 0, pattern, LIST_BATCH]
        while True:
            reply = script(keys=[], args=args)
            yield reply[1:]
            if reply[0] == b"0":
                return
            args[1] = reply[0]

    def _cluster_batches(self, pattern: str, wanted: bytes) -> Iterator[list]:
        """Scan every primary of a cluster; read each batch with the script.

        Keys of different locks are in different slots: one script call per
        key, pipelined (one round trip per primary).
        """
        batch: list[bytes] = []
        for key in self.client.scan_iter(match=pattern, count=LIST_BATCH, _type="HASH"):
            batch.append(key)
            if len(batch) >= LIST_BATCH:
                yield self._cluster_read(batch, wanted)
                batch = []
        if batch:
            yield self._cluster_read(batch, wanted)

    def _cluster_read(self, keys: list[bytes], wanted: bytes) -> list:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.execute_command("EVAL", LIST.source, 1, key, wanted)
        values: list = []
        for reply in pipe.execute():
            values += reply[1:]
        return values

    def holder_of(self, name: str) -> Holder | None:
        """Return the current holder of ``name`` (one round trip), or None."""
        import redis

        lease = self.keys_for(name).lease
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.hmget(lease, LEASE_FIELDS)
            pipe.pttl(lease)
            fields, pttl = pipe.execute()
        except redis.exceptions.RedisError as e:
            raise self._error(e, "look up the holder") from e
        return _holder(self.alias, fields, pttl, time.time_ns() // 1_000_000)

    async def aholder_of(self, name: str) -> Holder | None:
        """Async twin of :meth:`holder_of`."""
        import redis

        lease = self.keys_for(name).lease
        try:
            pipe = self.aclient().pipeline(transaction=False)
            pipe.hmget(lease, LEASE_FIELDS)
            pipe.pttl(lease)
            async with async_timeout(self.redis.adeadline):
                fields, pttl = await pipe.execute()
        except redis.exceptions.RedisError as e:
            raise self._error(e, "look up the holder") from e
        except asyncio.TimeoutError as e:  # TimeoutError from Python 3.11 on
            error = redis.exceptions.TimeoutError("Timeout")
            raise self._error(error, "look up the holder") from e
        return _holder(self.alias, fields, pttl, time.time_ns() // 1_000_000)

    def _force_release_command(self, name: str, token: str) -> tuple:
        keys = self.keys_for(name)
        return ("eval", RELEASE, keys.triple, [token, keys.wake_prefix])

    def force_release(self, name: str, token: str) -> bool:
        """Delete the lease of ``name`` if its token is still ``token``."""
        return self._execute(self._force_release_command(name, token)) != 0

    def force_release_many(self, items) -> list[bool]:
        """Force-release many leases, pipelined in batches."""
        items = list(items)
        results: list[bool] = []
        for start in range(0, len(items), RELEASE_BATCH):
            batch = items[start : start + RELEASE_BATCH]
            commands = [self._force_release_command(n, t) for n, t in batch]
            for reply in self._pipeline(commands):
                if isinstance(reply, Exception):
                    raise self._error(reply, "clear locks")
                results.append(reply != 0)
        return results
