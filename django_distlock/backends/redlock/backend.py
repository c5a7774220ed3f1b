"""Redlock: one lock over several independent Redis masters, held by a quorum.

The algorithm is the one of the Redis documentation ("Distributed Locks with
Redis"): the same lease is set on every node, the lock is held if a majority
(``N // 2 + 1``) granted it and time is left on it after subtracting the
elapsed time and a clock drift allowance; otherwise it is undone everywhere.
It is written once as step generators (:mod:`.algorithm`), carried out by a
sync or an asyncio executor on redis-py's public connection API
(:mod:`.fanout`: every step one pipelined round trip to all nodes at once).

Per node, a lock uses the single-instance key names
(:class:`~django_distlock.backends.redis.LockKeys`): the lease
``<prefix>:{<digest>}`` (a string ``<token>\n<fence>\n<holder>``, so a grant is
one ``SET NX PX``), plus ``:c`` (fencing counter), ``:z`` (registered
waiters) and ``:w`` (wake list), all under one hash tag.

Fencing tokens: see ``docs/backends/redlock.md``. In short, a node grants with
``counter + 1``; the token is the largest value among the granting nodes (the
clock floor ``caller_seconds * 2**20`` if the counters are new), and it is
stored on a majority of nodes that hold the lease *before* the acquisition
returns (a second round trip only when the nodes did not already agree), so
every later acquisition, whose majority meets that one, gets a larger token.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable
from typing import Any

from asgiref.sync import markcoroutinefunction

from ..base import Lease
from ..kinds import EXCLUSIVE, Kind
from ..options import Dict, Number, Seconds
from ..steps import StepsBackend
from .algorithm import RedlockAlgorithm
from .checks import check_location
from .fanout import FanoutExecutor
from .listing import RedlockListing
from .shared import RedlockShared
from .steps import Node, lock_keys, ms

__all__ = ["RedlockBackend"]


class RedlockBackend(
    RedlockListing, FanoutExecutor, RedlockShared, RedlockAlgorithm, StepsBackend
):
    """Locks held by a majority of independent Redis masters (Redlock).

    ``LOCATION`` is a list of at least 3 redis URLs (an odd count is best).
    OPTIONS: ``NODE_TIMEOUT`` (seconds a node may take to answer one step,
    default 0.1), ``SOCKET_CONNECT_TIMEOUT`` (default: NODE_TIMEOUT),
    ``DRIFT_FACTOR`` (default 0.01), ``RETRY_JITTER`` (longest random pause
    after a split vote, default 0.02 s), ``RESTART_DELAY`` (seconds a node
    seen to restart is not trusted with new leases, default: the TTL),
    ``FENCE_RETENTION`` (seconds a lock's fencing counter is kept after it
    was started from the clock floor, default 3600) and
    ``CONNECTION_POOL_KWARGS`` (passed to redis-py's connections).
    """

    drivers = (("redis", "redis"),)
    #: Shared locks carry the quorum argument over; semaphores do not
    #: (per-node counts admit more than the limit): see "Shared locks and
    #: semaphores" in docs/backends/redlock.md.
    kinds = frozenset({"exclusive", "shared"})

    #: Tokens survive any minority of nodes losing their data; beyond that
    #: they rest on the nodes' clocks (see the docs page).
    durable_fencing = True

    options_schema = {
        "NODE_TIMEOUT": Seconds("How long a node may take to answer one step."),
        "SOCKET_CONNECT_TIMEOUT": Seconds(
            "How long connecting to a node may take (default: NODE_TIMEOUT)."
        ),
        "DRIFT_FACTOR": Number(
            "A fraction of the TTL allowed for clock drift (default 0.01).",
            zero_ok=True,
        ),
        "RETRY_JITTER": Seconds(
            "The longest random pause after a split vote (default 0.02).",
            zero_ok=True,
        ),
        "RESTART_DELAY": Seconds(
            "How long a restarted node is not trusted (default: the TTL).",
            zero_ok=True,
        ),
        "FENCE_RETENTION": Seconds(
            "How long a fencing counter started from the clock is kept (default 3600)."
        ),
        "CONNECTION_POOL_KWARGS": Dict(
            "It is passed to redis-py's connections as keyword arguments."
        ),
    }

    def __init__(self, alias: str, params: dict[str, Any]):
        super().__init__(alias, params)
        location = params.get("LOCATION") or []
        if isinstance(location, str):
            location = [location]
        self.locations: list[str] = list(location)
        self.nodes = [Node(i, url) for i, url in enumerate(self.locations)]
        self.quorum = len(self.nodes) // 2 + 1
        opts = self.options
        self.node_timeout = float(opts.get("NODE_TIMEOUT", 0.1))
        self.connect_timeout = float(
            opts.get("SOCKET_CONNECT_TIMEOUT", self.node_timeout)
        )
        self.drift_factor = float(opts.get("DRIFT_FACTOR", 0.01))
        self.retry_jitter = float(opts.get("RETRY_JITTER", 0.02))
        self.restart_delay = float(opts.get("RESTART_DELAY", self.default_ttl))
        self.fence_retention_ms = ms(float(opts.get("FENCE_RETENTION", 3600)))
        self._init_connections()

    # -- checks -----------------------------------------------------------

    @classmethod
    def check_entry(cls, alias: str, params: dict[str, Any]) -> list:
        """Check LOCATION: distinct redis URLs, at least 3, best an odd count."""
        return check_location(alias, params)

    # -- keys -------------------------------------------------------------

    def keys_for(self, name: str) -> tuple[str, str, str, str]:
        """Return (lease, counter, waiters, wake) keys of ``name`` on every node."""
        return lock_keys(self.key_prefix, name)

    def _wake_order(self, lease_key: str) -> list[int]:
        # Every waiter of a lock blocks on the same node (one wake-up per
        # release), and different locks spread over the nodes.
        start = sum(lease_key.encode()) % len(self.nodes)
        return [(start + i) % len(self.nodes) for i in range(len(self.nodes))]

    # -- the contract -----------------------------------------------------

    def acquire(
        self, name: str, ttl: float, timeout: float | None, kind: Kind = EXCLUSIVE
    ) -> Lease | None:
        if kind is EXCLUSIVE:
            return self._run(self._acquire_steps(name, ttl, timeout))
        return self._run(self._other_acquire_steps(name, ttl, timeout, kind))

    @markcoroutinefunction
    def aacquire(
        self, name: str, ttl: float, timeout: float | None, kind: Kind = EXCLUSIVE
    ) -> Awaitable[Lease | None]:
        if kind is EXCLUSIVE:
            return self._arun(self._acquire_steps(name, ttl, timeout))
        return self._arun(self._other_acquire_steps(name, ttl, timeout, kind))

    def _other_acquire_steps(self, name, ttl, timeout, kind: Kind):
        """The steps of an acquisition of a ``kind`` other than EXCLUSIVE."""
        if kind.mode == "shared":
            return self._shared_acquire_steps(name, ttl, timeout)
        if kind.exclusive:
            return self._acquire_steps(name, ttl, timeout)
        raise ValueError(
            f"Redlock backend {self.alias!r} offers no semaphores (lock {name!r}): "
            "per-node permit counts cannot bound the permits held by a quorum."
        )

    def renew(self, leases: Iterable[Lease]) -> list[bool | None]:
        """Renew every lease on every node in one pipelined round trip."""
        leases = list(leases)
        if not leases:
            return []
        return self._run(self._renew_steps(leases))

    async def arenew(self, leases: Iterable[Lease]) -> list[bool | None]:
        leases = list(leases)
        if not leases:
            return []
        return await self._arun(self._renew_steps(leases))
