"""WAIT_REPLICAS: an acquiring command and WAIT in the same round trip.

With ``OPTIONS["WAIT_REPLICAS"] = n``, every command that may grant the lock
(the acquire script, a waiter's BLPOP of a handoff, the cancel script that
finds a handoff) is pipelined with ``WAIT n <timeout>`` on the same
connection: WAIT answers how many replicas received that connection's writes
so far, the grant included. A grant that fewer than ``n`` replicas confirmed
counts as not acquired, and is given back at once with its token.

This narrows the window in which a failover loses a grant (the new primary
never saw it, and grants the name again); it does not close it: WAIT is not
consensus (a replica that received the grant may still not be the one
promoted, and a grant confirmed by no replica within the timeout may still
reach them later). See ``docs/backends/redis.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import Any

from .keys import LockKeys

__all__ = ["WAIT_REPLICAS_TIMEOUT", "ReplicaWait", "granted_by", "popped_by"]

acquire_log = logging.getLogger("django_distlock.acquire")

#: Default of OPTIONS["WAIT_REPLICAS_TIMEOUT"] (seconds).
WAIT_REPLICAS_TIMEOUT = 0.1


def granted_by(reply) -> bool:
    """Whether an acquire or cancel script's ``reply`` grants the lock."""
    return reply[0] == 1


def popped_by(reply) -> bool:
    """Whether a waiter's BLPOP ``reply`` is a handoff of the lock."""
    return reply is not None


class ReplicaWait:
    """The WAIT_REPLICAS steps of :class:`~.plain.RedisLockBackend` (a mixin)."""

    def _wait_client(self, key: str):
        """Return the client whose connection carries the command on ``key``.

        WAIT counts the replicas that received this connection's writes, so
        it must follow the command on its connection: in a cluster, that of
        the key's primary (redis-py's cluster client sends a keyless WAIT to
        every primary).
        """
        client = self.client
        if not self.cluster:
            return client
        return client.get_redis_connection(client.get_node_from_key(key))

    def _queue_waited(self, pipe, command: tuple) -> None:
        if command[0] == "eval":
            _, lua, keys, args = command
            pipe.execute_command("EVALSHA", lua.sha, len(keys), *keys, *args)
        else:
            pipe.blpop([command[1]], command[2])
        pipe.execute_command("WAIT", self.wait_replicas, self.wait_replicas_ms)

    def _waited(self, command: tuple) -> tuple[Any, int]:
        """Run ``command`` and WAIT in one pipeline; return (reply, replicas)."""
        import redis

        key = command[2][0] if command[0] == "eval" else command[1]
        client = self._wait_client(key)
        try:
            for _ in range(2):
                pipe = client.pipeline(transaction=False)
                self._queue_waited(pipe, command)
                reply, replicas = pipe.execute(raise_on_error=False)
                if not isinstance(reply, redis.exceptions.NoScriptError):
                    break
                client.script_load(command[1].source)  # not run: send it again
            for value in (reply, replicas):
                if isinstance(value, Exception):
                    raise value
        except (
            redis.exceptions.ConnectionError,
            redis.exceptions.TimeoutError,
            redis.exceptions.MovedError,
            redis.exceptions.ReadOnlyError,
        ):
            if self.cluster:
                # A failover or a resharding: let redis-py find the slot's
                # primary again before the next attempt.
                try:
                    self.client.nodes_manager.initialize()
                except redis.exceptions.RedisError:
                    pass  # the next attempt tries again
            raise
        return reply, int(replicas)

    async def _awaited(self, command: tuple) -> tuple[Any, int]:
        """Async twin of :meth:`_waited` (not for a cluster)."""
        import redis

        client = self.redis.aclient()
        for _ in range(2):
            pipe = client.pipeline(transaction=False)
            self._queue_waited(pipe, command)
            reply, replicas = await pipe.execute(raise_on_error=False)
            if not isinstance(reply, redis.exceptions.NoScriptError):
                break
            await client.script_load(command[1].source)
        for value in (reply, replicas):
            if isinstance(value, Exception):
                raise value
        return reply, int(replicas)

    def _replicated(
        self, command: tuple, keys: LockKeys, token: str, granted
    ) -> Generator[tuple, Any, Any]:
        """Run ``command`` (an acquiring step) followed by WAIT; return its
        reply, or None if it granted the lock (``granted(reply)``) and fewer
        than WAIT_REPLICAS replicas confirmed: that grant is given back."""
        reply, replicas = yield ("waited", command)
        if granted(reply) and replicas < self.wait_replicas:
            yield self._give_back_command(keys, token)
            acquire_log.warning(
                "A grant of lock %r was confirmed by %d of the %d replicas "
                "WAIT_REPLICAS asks for; it was given back (Redis lock backend %r).",
                keys.lease,
                replicas,
                self.wait_replicas,
                self.alias,
            )
            return None
        return reply
