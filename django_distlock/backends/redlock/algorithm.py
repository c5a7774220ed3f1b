"""The Redlock algorithm, written once as generators of steps (:mod:`.steps`).

Acquire: a first attempt of plain ``SET NX PX`` + ``INCR`` per node, then
the acquire script, which also registers a waiter; a grant by a quorum in
time (validity) is a lease, anything less is undone everywhere. Release,
extend and renew are one script per node; a quorum decides.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Generator
from functools import cached_property
from typing import Any

from ...exceptions import LockBackendError
from ..base import Lease, holder_identity, new_token
from ..indoubt import InDoubt
from ..kinds import EXCLUSIVE
from .steps import (
    ACQUIRE,
    COMMIT,
    EXTEND,
    FENCE_FLOOR_MIN,
    FENCE_SHIFT,
    MAX_WAIT_SLICE,
    NO_QUORUM_GRACE,
    RELEASE,
    SHARED_MARK,
    UNREAD,
    WAITER_GRACE_MS,
    Block,
    Failed,
    Fanout,
    Sleep,
    ms,
    pack_meta,
)

__all__ = ["RedlockAlgorithm", "single"]

release_log = logging.getLogger("django_distlock.release")


class RedlockAlgorithm:
    """The step generators of :class:`~.backend.RedlockBackend` (a mixin)."""

    def _no_quorum(self, name: str, results: list) -> LockBackendError:
        errors = "; ".join(
            f"{self.nodes[i].url}: {r.error}"
            for i, r in enumerate(results)
            if isinstance(r, Failed)
        )
        return LockBackendError(
            f"Redlock backend {self.alias!r} could not reach a quorum of "
            f"{self.quorum} of {len(self.nodes)} nodes for lock {name!r} ({errors}).",
            name=name,
        )

    def _release_command(self, keys: tuple[str, str, str, str], token: str) -> tuple:
        lease, _counter, waiters, wake = keys
        return (
            "EVALSHA",
            RELEASE.sha,
            3,
            lease,
            waiters,
            wake,
            token,
        )

    # -- acquisitions whose outcome is unknown, per node -------------------

    @cached_property
    def in_doubt(self) -> InDoubt:
        """Return the canceller of this backend's in-doubt acquisitions."""
        return InDoubt(f"redlock-{self.alias}", self._cancel_in_doubt)

    def _in_doubt(self, name: str, token: str, ttl: float, nodes: set[int]) -> None:
        lasts = ttl + MAX_WAIT_SLICE + WAITER_GRACE_MS / 1000
        for i in nodes:
            self.in_doubt.add((i, name, token), lasts)

    def _release_in_doubt(self, lease: Lease, results: list) -> None:
        """Release ``lease`` in the background on the nodes that did not
        answer its release: their reply was lost, or they were skipped as
        down (the release never reached them). Nodes the step was decided
        without (:data:`UNREAD`) answer with the connection's next use."""
        for i, r in enumerate(results):
            if isinstance(r, Failed) and r is not UNREAD:
                # A node's lease lasts at most ttl after its last renewal,
                # which was sent before this release.
                self.in_doubt.add((i, lease.name, lease.token), lease.ttl)

    def _cancel_in_doubt(self, items: list[tuple[int, str, str]]) -> list[bool]:
        """Cancel in-doubt attempts and releases: one round trip per node, for
        all of its items (drop the waiter record, release the token's lease:
        the shared release for a reader's token)."""
        by_node: dict[int, list[int]] = {}
        for k, (i, _name, _token) in enumerate(items):
            by_node.setdefault(i, []).append(k)
        done = [False] * len(items)
        for i, ks in by_node.items():
            commands = []
            for k in ks:
                _i, name, token = items[k]
                keys = self.keys_for(name)
                commands.append(("ZREM", keys[2], token))
                if token.startswith(SHARED_MARK):
                    commands.append(self._shared_release_command(name, token))
                else:
                    commands.append(self._release_command(keys, token))
            replies = self._execute(Fanout(commands, nodes=[i], force=True))[i]
            if isinstance(replies, Failed):
                continue
            for n, k in enumerate(ks):
                done[k] = True
                if replies[2 * n + 1]:
                    release_log.info(
                        "Gave back a lease of lock %r on node %s whose reply "
                        "was lost (Redlock backend %r).",
                        items[k][1],
                        self.nodes[i].url,
                        self.alias,
                    )
        return done

    def _acquire_steps(
        self, name: str, ttl: float, timeout: float | None
    ) -> Generator[Any, Any, Lease | None]:
        keys = self.keys_for(name)
        token = new_token()
        meta = pack_meta(name, *holder_identity(), time.time())
        start = time.monotonic()
        deadline = math.inf if timeout is None else start + timeout
        blocking = timeout is None or timeout > 0
        quorum = self.quorum
        registered = False
        no_quorum_since = None
        first = True
        # Nodes that may hold a grant or a waiter record of this attempt
        # that nobody will release: asked, no answer, and not undone since.
        doubt: set[int] = set()
        try:
            while True:
                sent = time.monotonic()
                live_ms = 0
                if blocking and not first:
                    live_ms = ms(min(MAX_WAIT_SLICE, deadline - sent)) + WAITER_GRACE_MS
                results = yield self._attempt(first, keys, token, meta, ttl, live_ms)
                granted, busy, failed = self._tally(results, first)
                fast, first = first, False
                registered = registered or (bool(busy) and live_ms > 0)
                if len(granted) >= quorum:
                    lease = yield from self._grant_steps(
                        name, keys, token, [f for _i, f in granted], ttl, sent
                    )
                    if lease is not None:
                        # Held: what a node may still hold of an earlier
                        # attempt has this lease's token; its release frees it.
                        doubt = set()
                        return lease
                if granted or failed:
                    # Undo everywhere it may have been set: granted nodes, and
                    # failed ones (a late reply may hide a grant).
                    undone = yield Fanout([self._release_command(keys, token)])
                    doubt |= {i for i, r in enumerate(results) if _asked(r)}
                    doubt |= {i for i, _f in granted}
                    doubt = {i for i in doubt if isinstance(undone[i], Failed)}
                now = time.monotonic()
                if len(granted) + len(busy) < quorum:
                    # Not enough nodes answered to decide anything.
                    no_quorum_since = no_quorum_since or now
                    if (
                        not blocking
                        or now >= deadline
                        or now - no_quorum_since >= NO_QUORUM_GRACE
                    ):
                        if registered:
                            yield Fanout([("ZREM", keys[2], token)])
                        raise self._no_quorum(name, results)
                    yield Sleep(min(deadline - now, 0.05 + random.uniform(0, 0.05)))
                    continue
                no_quorum_since = None
                if not blocking or now >= deadline:
                    if fast:
                        yield from self._start_new_counters(keys, granted + busy)
                    break
                if fast and busy:
                    # Held: ask again at once with the script, which registers
                    # this caller as a waiter and tells how long the lease lasts.
                    continue
                yield from self._wait_steps(keys, granted, busy, deadline)
            if registered:
                yield Fanout([("ZREM", keys[2], token)])
            return None
        except GeneratorExit:
            raise  # closed by the executor: no clean-up wanted (backend down)
        except LockBackendError:
            raise  # no quorum: a clean-up round trip would only wait again
        except BaseException:
            # Interrupted mid-attempt (a cancelled task, KeyboardInterrupt):
            # a node may hold a lease of ours that we never heard of, and a
            # waiter record of ours would be handed the lock by the next
            # release. Undo both (best effort; the executor re-raises).
            undone = yield Fanout(
                [("ZREM", keys[2], token), self._release_command(keys, token)]
            )
            doubt = {i for i, r in enumerate(undone) if isinstance(r, Failed)}
            raise
        finally:
            if doubt:
                # Left with a node that did not answer: cancel there in the
                # background, once it answers again (each node, not only
                # the quorum, must not keep a grant that nobody holds).
                self._in_doubt(name, token, ttl, doubt)

    def _attempt(
        self, first: bool, keys: tuple, token: str, meta: bytes, ttl: float, live_ms
    ) -> Fanout:
        """Return the step of one attempt to take the lease on every node.

        The first attempt is two plain commands per node, no script: most
        acquisitions find the lock free, and a script costs a node several
        times what SET and INCR do. The lease then carries no fencing token
        (the counter holds it; a commit writes it in when the nodes
        disagree). Later attempts run the acquire script, which also
        registers the caller as a waiter for ``live_ms``.
        """
        lease_key, counter_key, waiters_key, _wake = keys
        if first:
            return Fanout(
                [
                    ("SET", lease_key, token.encode() + b"\n\n" + meta)
                    + ("NX", "PX", ms(ttl)),
                    ("INCR", counter_key),
                ],
                skip_quarantined=True,
                decided=self._set_by_quorum,
            )
        return Fanout(
            [
                ("EVALSHA", ACQUIRE.sha, 3, lease_key, counter_key, waiters_key)
                + (token, ms(ttl), meta, live_ms, int(time.time()) << FENCE_SHIFT)
                + (self.fence_retention_ms,)
            ],
            skip_quarantined=True,
            decided=self._granted_by_quorum,
        )

    @staticmethod
    def _tally(
        results: list, first: bool
    ) -> tuple[list[tuple[int, int]], list[tuple[int, int]], int]:
        """Return the nodes that granted (node, fence), the busy ones (node,
        lease ms left) and how many failed, from an attempt's results."""
        granted: list[tuple[int, int]] = []
        busy: list[tuple[int, int]] = []
        failed = 0
        for i, r in enumerate(results):
            if isinstance(r, Failed):
                failed += 1
            elif first:
                (granted if r[0] is not None else busy).append((i, r[1]))
            elif r[0][0] == 1:
                granted.append((i, int(r[0][1])))
            else:
                busy.append((i, int(r[0][1])))
        return granted, busy, failed

    def _grant_steps(
        self, name: str, keys: tuple, token: str, fences: list[int], ttl, sent
    ) -> Generator[Any, Any, Lease | None]:
        """Turn a quorum's grant into a Lease, or None if it came too late.

        The fencing token is the largest granting counter (the clock floor if
        the counters are new); unless a quorum already stores it, a commit
        makes it visible on a majority that holds the lease before anyone
        sees it.
        """
        quorum = self.quorum
        fence = max(fences)
        if fence < FENCE_FLOOR_MIN:
            # New counters (first use, a node that lost its data, a lock
            # unused for FENCE_RETENTION): the clock floor.
            fence = max(fence, int(time.time()) << FENCE_SHIFT)
        # Stored on a quorum already, and no granting counter is new (a new
        # one has no expiry yet: the commit gives it one).
        ok = fences.count(fence) >= quorum and min(fences) >= FENCE_FLOOR_MIN
        if not ok:
            lease_key, counter_key = keys[0], keys[1]
            commits = yield Fanout(
                [
                    ("EVALSHA", COMMIT.sha, 2, lease_key, counter_key, token)
                    + (fence, self.fence_retention_ms)
                ]
            )
            confirmed = sum(
                1 for r in commits if not isinstance(r, Failed) and r[0] == 1
            )
            ok = confirmed >= quorum
        drift = ttl * self.drift_factor + 0.002
        validity = ttl - (time.monotonic() - sent) - drift
        if not (ok and validity > 0):
            return None
        return Lease(
            alias=self.alias,
            name=name,
            token=token,
            fencing_token=fence,
            ttl=ttl,
            deadline=sent + ttl - drift,
        )

    def _wait_steps(
        self, keys: tuple, granted: list, busy: list, deadline: float
    ) -> Generator[Any, Any, None]:
        """Wait before the next attempt, after one that took no lease."""
        now = time.monotonic()
        if not busy:
            # Granted by a quorum but too slowly (validity) or the commit
            # failed: try again after a random moment.
            yield Sleep(min(deadline - now, random.uniform(0, self.retry_jitter)))
            return
        # The lock is held elsewhere: sleep on the wake list of the first busy
        # node (a release there signals it), at most until enough nodes'
        # leases would have run out.
        pttls = sorted(p for _i, p in busy)
        need = self.quorum - len(granted)
        expiry = pttls[need - 1] / 1000 if 0 < need <= len(pttls) else 0.0
        wait = min(
            deadline - now,
            MAX_WAIT_SLICE,
            max(expiry, 0.0) + 0.002 + random.uniform(0, self.retry_jitter),
        )
        busy_nodes = {i for i, _p in busy}
        wake_node = next(i for i in self._wake_order(keys[0]) if i in busy_nodes)
        if wait >= 0.001:
            popped = yield Block(wake_node, keys[3], wait)
            if popped is False:  # the node could not block: do not spin
                yield Sleep(min(wait, 0.005 + random.uniform(0, 0.01)))
        if granted:
            # A split vote (or a holder with a bare quorum): the undo of the
            # other side wakes us; back off a random moment so that
            # contenders stop colliding.
            now = time.monotonic()
            yield Sleep(
                max(0.0, min(deadline - now, random.uniform(0, self.retry_jitter)))
            )

    def _start_new_counters(
        self, keys: tuple[str, str, str, str], answers: list[tuple[int, int]]
    ) -> Generator[Any, Any, None]:
        """Give counters that a failed first attempt created an expiry.

        ``INCR`` creates a missing counter without one; a grant (its commit)
        or a script attempt would raise it to the clock floor with an expiry,
        but an attempt that gives up here does neither. Rare: a counter is
        new only on a lock's first use, after data loss or past
        ``FENCE_RETENTION``.
        """
        new = [i for i, f in answers if f < FENCE_FLOOR_MIN]
        if new:
            yield Fanout(
                [
                    (
                        "EVALSHA",
                        COMMIT.sha,
                        2,
                        keys[0],
                        keys[1],
                        "",
                        int(time.time()) << FENCE_SHIFT,
                        self.fence_retention_ms,
                    )
                ],
                nodes=new,
            )

    # Step outcomes the executor may stop reading at (see Fanout.decided).

    def _set_by_quorum(self, results: list) -> bool:
        """A first attempt (SET NX PX, INCR) that a quorum granted."""
        ok = sum(1 for r in results if not isinstance(r, Failed) and r[0] is not None)
        return ok >= self.quorum

    def _granted_by_quorum(self, results: list) -> bool:
        """A scripted attempt that a quorum granted."""
        ok = sum(1 for r in results if not isinstance(r, Failed) and r[0][0] == 1)
        return ok >= self.quorum

    def _ones_by_quorum(self, results: list) -> bool:
        """A release or extend that a quorum confirmed."""
        return self._count(results)[0] >= self.quorum

    def _count(self, results: list, index: int = 0) -> tuple[int, int]:
        """Return (nodes that answered 1 at ``index``, nodes that failed)."""
        ok = failed = 0
        for r in results:
            if isinstance(r, Failed):
                failed += 1
            elif r[index]:
                ok += 1
        return ok, failed

    def _quorum_steps(
        self, command: tuple, name: str
    ) -> Generator[Any, Any, tuple[int, int, list]]:
        """Send ``command`` everywhere; ask the failed nodes again if they decide.

        Return (nodes that answered 1, nodes that failed twice, last results).
        The second try reconnects to nodes whose connection broke (a restart)
        so that one dead socket does not leave the outcome unknown.
        """
        results = yield Fanout([command], decided=self._ones_by_quorum)
        ok, failed = self._count(results)
        if ok < self.quorum <= ok + failed:
            retry = [i for i, r in enumerate(results) if isinstance(r, Failed)]
            again = yield Fanout([command], nodes=retry, force=True)
            ok2, failed = self._count([again[i] for i in retry])
            ok += ok2
            for i in retry:
                results[i] = again[i]
        return ok, failed, results

    def _release_steps(self, lease: Lease) -> Generator[Any, Any, bool]:
        if lease.kind is EXCLUSIVE:
            command = self._release_command(self.keys_for(lease.name), lease.token)
        else:
            command = self._shared_release_command(lease.name, lease.token)
        ok, failed, results = yield from self._quorum_steps(command, lease.name)
        if failed:
            self._release_in_doubt(lease, results)
        if ok >= self.quorum:
            return True
        if len(self.nodes) - failed < self.quorum:
            raise self._no_quorum(lease.name, results)
        # Not confirmed by a majority: the lease may have been lost (a node
        # restarted empty, an expiry), so it is reported, never assumed.
        return False

    def _extend_command(self, lease: Lease, ttl: float) -> tuple:
        if lease.kind is not EXCLUSIVE:
            return self._shared_extend_command(lease, ttl)
        lease_key = self.keys_for(lease.name)[0]
        return ("EVALSHA", EXTEND.sha, 1, lease_key, lease.token, ms(ttl))

    def _settle_extend(
        self, lease: Lease, ttl: float, sent: float, ok: int, failed: int
    ) -> bool | None:
        if ok >= self.quorum:
            lease.deadline = sent + ttl - (ttl * self.drift_factor + 0.002)
            return True
        if ok + failed < self.quorum:
            return False
        return None

    def _extend_steps(self, lease: Lease, ttl: float) -> Generator[Any, Any, bool]:
        sent = time.monotonic()
        ok, failed, results = yield from self._quorum_steps(
            self._extend_command(lease, ttl), lease.name
        )
        outcome = self._settle_extend(lease, ttl, sent, ok, failed)
        if outcome is None:
            raise self._no_quorum(lease.name, results)
        return outcome

    def _renew_steps(self, leases: list[Lease]) -> Generator[Any, Any, list]:
        sent = time.monotonic()
        results = yield Fanout([self._extend_command(le, le.ttl) for le in leases])
        outcomes: list[bool | None] = []
        for k, lease in enumerate(leases):
            ok, failed = self._count(results, k)
            outcomes.append(self._settle_extend(lease, lease.ttl, sent, ok, failed))
        return outcomes

    def _is_held_steps(self, lease: Lease) -> Generator[Any, Any, bool]:
        if lease.kind is not EXCLUSIVE:
            return (yield from self._shared_is_held_steps(lease))
        results = yield Fanout([("GET", self.keys_for(lease.name)[0])])
        mine = lease.token.encode() + b"\n"
        held = sum(
            1
            for r in results
            if not isinstance(r, Failed) and r[0] and r[0].startswith(mine)
        )
        if held >= self.quorum:
            return True
        failed = sum(1 for r in results if isinstance(r, Failed))
        if held + failed >= self.quorum and time.monotonic() < lease.deadline:
            return True
        return False


def _asked(result: object) -> bool:
    """Whether a node's ``result`` leaves the step's outcome there unknown."""
    return isinstance(result, Failed) and result.asked


def single(step: Fanout) -> Generator[Any, Any, Any]:
    return (yield step)
