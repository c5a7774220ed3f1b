"""Shared (readers-writer) leases on Redlock, as step generators (a mixin).

Per node (``lua/*_shared.lua``), a reader is an entry of the lock's readers
zset (token -> expiry by the node's clock) and, while any reader lives, the
lock's lease key holds the marker ``*\\n``, so exclusive attempts (``SET NX``,
the acquire script) find the lock busy without a change to their path. A node
grants a shared lease only while no exclusive lease lives there and no
exclusive waiter is registered (writer preference; a registration lives a
second or two past its owner's last attempt, so a dead writer stops blocking
readers then).

A reader holds once a quorum granted it in time, as an exclusive holder does:
any two majorities share a node, so a reader and a writer never hold at once
(docs/backends/redlock.md, "Shared locks and semaphores"). Its fencing token
is the smallest counter among the granting nodes: at most the token of any
later exclusive holder, whose majority shares one of those nodes.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Generator
from typing import Any

from ...exceptions import LockBackendError
from ..base import Lease, holder_identity, new_token
from ..kinds import SHARED
from .steps import (
    ACQUIRE_SHARED,
    EXTEND_SHARED,
    MAX_WAIT_SLICE,
    NO_QUORUM_GRACE,
    RELEASE_SHARED,
    SHARED_MARK,
    WAITER_GRACE_MS,
    Failed,
    Fanout,
    Sleep,
    ms,
    pack_meta,
    reader_keys,
)

__all__ = ["RedlockShared"]


class RedlockShared:
    """The shared-lease steps of :class:`~.backend.RedlockBackend` (a mixin)."""

    def _shared_release_command(self, name: str, token: str) -> tuple:
        lease, _counter, waiters, wake = self.keys_for(name)
        readers, meta = reader_keys(lease)
        return (
            "EVALSHA",
            RELEASE_SHARED.sha,
            5,
            lease,
            readers,
            meta,
            waiters,
            wake,
        ) + (token,)

    def _shared_extend_command(self, lease: Lease, ttl: float) -> tuple:
        key = self.keys_for(lease.name)[0]
        readers, meta = reader_keys(key)
        return ("EVALSHA", EXTEND_SHARED.sha, 3, key, readers, meta, lease.token) + (
            ms(ttl),
        )

    def _shared_acquire_steps(
        self, name: str, ttl: float, timeout: float | None
    ) -> Generator[Any, Any, Lease | None]:
        keys = self.keys_for(name)
        lease_key, counter_key, waiters_key, wake_key = keys
        readers_key, meta_key = reader_keys(lease_key)
        token = SHARED_MARK + new_token()
        meta = pack_meta(name, *holder_identity(), time.time())
        start = time.monotonic()
        deadline = math.inf if timeout is None else start + timeout
        blocking = timeout is None or timeout > 0
        quorum = self.quorum
        registered = False
        no_quorum_since = None
        # Nodes that may hold a shared lease or a waiter record of this
        # attempt that nobody will release: asked, no answer, not undone.
        doubt: set[int] = set()
        try:
            while True:
                sent = time.monotonic()
                live_ms = 0
                if blocking:
                    live_ms = ms(min(MAX_WAIT_SLICE, deadline - sent)) + WAITER_GRACE_MS
                results = yield Fanout(
                    [
                        ("EVALSHA", ACQUIRE_SHARED.sha, 6, lease_key, counter_key)
                        + (waiters_key, readers_key, meta_key, wake_key)
                        + (token, ms(ttl), meta, live_ms)
                    ],
                    skip_quarantined=True,
                    decided=self._granted_by_quorum,
                )
                granted, busy, failed = self._tally(results, False)
                registered = registered or (bool(busy) and live_ms > 0)
                if len(granted) >= quorum:
                    drift = ttl * self.drift_factor + 0.002
                    if ttl - (time.monotonic() - sent) - drift > 0:
                        doubt = set()  # the lease's release frees them
                        return Lease(
                            alias=self.alias,
                            name=name,
                            token=token,
                            fencing_token=min(f for _i, f in granted),
                            ttl=ttl,
                            deadline=sent + ttl - drift,
                            kind=SHARED,
                        )
                if granted or failed:
                    # Undo everywhere it may have been set (a late reply may
                    # hide a grant).
                    undone = yield Fanout([self._shared_release_command(name, token)])
                    doubt |= {i for i, r in enumerate(results) if _asked(r)}
                    doubt |= {i for i, _f in granted}
                    doubt = {i for i in doubt if isinstance(undone[i], Failed)}
                now = time.monotonic()
                if len(granted) + len(busy) < quorum:
                    no_quorum_since = no_quorum_since or now
                    if (
                        not blocking
                        or now >= deadline
                        or now - no_quorum_since >= NO_QUORUM_GRACE
                    ):
                        if registered:
                            yield Fanout([("ZREM", waiters_key, token)])
                        raise self._no_quorum(name, results)
                    yield Sleep(min(deadline - now, 0.05 + random.uniform(0, 0.05)))
                    continue
                no_quorum_since = None
                if not blocking or now >= deadline:
                    break
                yield from self._wait_steps(keys, granted, busy, deadline)
            if registered:
                yield Fanout([("ZREM", waiters_key, token)])
            return None
        except GeneratorExit:
            raise  # closed by the executor: no clean-up wanted (backend down)
        except LockBackendError:
            raise
        except BaseException:
            undone = yield Fanout(
                [
                    ("ZREM", waiters_key, token),
                    self._shared_release_command(name, token),
                ]
            )
            doubt = {i for i, r in enumerate(undone) if isinstance(r, Failed)}
            raise
        finally:
            if doubt:
                # Cancelled in the background on each such node once it
                # answers again, as an exclusive attempt is.
                self._in_doubt(name, token, ttl, doubt)

    def _shared_is_held_steps(self, lease: Lease) -> Generator[Any, Any, bool]:
        key = self.keys_for(lease.name)[0]
        readers, _meta = reader_keys(key)
        results = yield Fanout(
            [("ZSCORE", readers, lease.token), ("TIME",), ("GET", key)]
        )
        held = failed = 0
        for r in results:
            if isinstance(r, Failed):
                failed += 1
                continue
            score, (seconds, micros), value = r
            now_ms = int(seconds) * 1000 + int(micros) // 1000
            if score is not None and float(score) > now_ms and value == b"*\n":
                held += 1
        if held >= self.quorum:
            return True
        return held + failed >= self.quorum and time.monotonic() < lease.deadline


def _asked(result: object) -> bool:
    """Whether a node's ``result`` leaves the step's outcome there unknown."""
    return isinstance(result, Failed) and result.asked
