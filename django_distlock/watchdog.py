"""Renew held leases in the background: one loop per alias, for all its leases.

A lease is renewed when a third of its TTL has passed (when no more than two
thirds of it remain). A renewal that finds the lease gone marks it lost and
sends ``lock_lost``; a renewal that cannot reach the backend is retried until
the lease would have expired, and then the lease is lost too.

Leases acquired from threads are renewed by a daemon thread, leases acquired
with ``aacquire`` by a task of their event loop: one thread (one task per
loop) for each ``LOCKS`` alias with leases to renew, so that a backend that
stalls (a paused server holds each renewal for up to its socket timeout)
delays its own renewals only, never a short lease on another alias. Neither
keeps a lease alive after its :class:`~django_distlock.locks.Lock` is garbage
collected (weak references), and a forked child starts with nothing to renew:
it cannot renew its parent's leases.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
import weakref
from collections import defaultdict

from .backends.base import BaseLockBackend, Lease

__all__ = ["async_watchdog", "on_loss", "report_lost", "watchdog"]

logger = logging.getLogger("django_distlock.renew")

RETRY_AFTER_ERROR = 0.5
#: The renewal thread wakes at least this often (seconds), so registering a
#: lease due later than that needs no wake-up call.
IDLE_TICK = 1.0
#: A lease due within this fraction of its ttl is renewed with the due ones.
EARLY_FRACTION = 1 / 6


def renewal_due(lease: Lease) -> float:
    """Return the monotonic instant at which ``lease`` should be renewed."""
    return lease.deadline - lease.ttl * 2 / 3


#: Lease -> callables to run once when it is reported lost (``held.lost``,
#: ``on_lost="cancel"``). Most leases have none: nothing is stored for them.
_loss_callbacks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_loss_lock = threading.Lock()


def on_loss(lease: Lease, callback) -> None:
    """Call ``callback()`` once ``lease`` is reported lost (at once if it was)."""
    with _loss_lock:
        if not lease.lost_reported:
            _loss_callbacks.setdefault(lease, []).append(callback)
            return
    callback()


def discard_on_loss(lease: Lease, callback) -> None:
    """Forget a callback given to :func:`on_loss` (if it has not run)."""
    with _loss_lock:
        callbacks = _loss_callbacks.get(lease)
        if callbacks and callback in callbacks:
            callbacks.remove(callback)


def report_lost(backend: BaseLockBackend, lease: Lease, reason: str) -> None:
    """Mark ``lease`` lost; send ``lock_lost`` and log, once per lease."""
    lease.lost = True
    with _loss_lock:
        if lease.lost_reported:
            return
        lease.lost_reported = True
        callbacks = _loss_callbacks.pop(lease, ())
    from .signals import lock_lost

    logger.warning("Lock %r on %r was lost: %s", lease.name, backend.alias, reason)
    for callback in callbacks:
        try:
            callback()
        except Exception:
            logger.exception("A loss callback of lock %r failed", lease.name)
    lock_lost.send(
        sender=type(backend),
        alias=backend.alias,
        name=lease.name,
        lease=lease,
        held=time.time() - lease.acquired_at,
        reason=reason,
        kind=lease.kind.mode,
    )


class _Schedule:
    """The renewal bookkeeping shared by the thread and the asyncio loop."""

    def __init__(self) -> None:
        # id(lease) -> (backend, weakref to lease, due, earliest): the loop
        # wakes at the first ``due``, and then renews every lease whose
        # ``earliest`` has come, so that leases taken at about the same time
        # share one round trip instead of waking the loop one by one.
        self.entries: dict[int, tuple[BaseLockBackend, weakref.ref, float, float]] = {}
        # id(lease) -> (monotonic instant renewal stops, max_hold, whether
        # reaching it was logged), for the leases with a bound only.
        self.bounds: dict[int, tuple[float, float, bool]] = {}
        #: (backend, lease, reason) of the leases that ran out after their
        #: bound, to report (outside the lane's lock) by the lane.
        self.ended: list[tuple[BaseLockBackend, Lease, str]] = []

    def _schedule(self, backend: BaseLockBackend, lease: Lease) -> float:
        due = renewal_due(lease)
        earliest = due - lease.ttl * EARLY_FRACTION
        self.entries[id(lease)] = (backend, weakref.ref(lease), due, earliest)
        return due

    def add(
        self, backend: BaseLockBackend, lease: Lease, max_hold: float | None = None
    ) -> float:
        key = id(lease)
        if max_hold is not None:
            # From just before the acquiring request, as the deadline is.
            self.bounds[key] = (lease.deadline - lease.ttl + max_hold, max_hold, False)
        elif self.bounds:  # an id may be reused before a collected lease's goes
            self.bounds.pop(key, None)
        return self._schedule(backend, lease)

    def has(self, lease: Lease) -> bool:
        """Whether ``lease`` itself is on the schedule: a collected lease's
        entry stays until the next round, and its id may be reused."""
        entry = self.entries.get(id(lease))
        return entry is not None and entry[1]() is lease

    def __len__(self) -> int:
        """The number of leases on the schedule that are still alive."""
        return sum(1 for entry in list(self.entries.values()) if entry[1]() is not None)

    def remove(self, lease: Lease) -> None:
        self.entries.pop(id(lease), None)
        self.bounds.pop(id(lease), None)

    def next_due(self) -> float:
        return min((e[2] for e in self.entries.values()), default=math.inf)

    def take_due(self, now: float) -> dict[BaseLockBackend, list[Lease]]:
        """Return the leases to renew now, grouped by backend.

        A lease past its ``max_hold`` is not renewed: it is watched until its
        deadline, and then put on ``ended``.
        """
        due: dict[BaseLockBackend, list[Lease]] = defaultdict(list)
        for key, (backend, ref, _due, earliest) in list(self.entries.items()):
            lease = ref()
            if lease is None or lease.lost:
                del self.entries[key]
                self.bounds.pop(key, None)
            elif earliest <= now:
                bound = self.bounds.get(key)
                if bound is None or now < bound[0]:
                    due[backend].append(lease)
                else:
                    self._past_bound(backend, lease, now, bound[1])
        return due

    def _past_bound(
        self, backend: BaseLockBackend, lease: Lease, now: float, max_hold: float
    ) -> None:
        key = id(lease)
        if lease.deadline <= now:
            self.remove(lease)
            self.ended.append(
                (
                    backend,
                    lease,
                    f"held past max_hold ({max_hold:g} s): renewal stopped and "
                    "the lease expired",
                )
            )
            return
        until, _, warned = self.bounds[key]
        if not warned:
            self.bounds[key] = (until, max_hold, True)
            logger.warning(
                "Lock %r on %r has been held for its max_hold of %g s: it is no "
                "longer renewed and expires in %.1f s",
                lease.name,
                backend.alias,
                max_hold,
                lease.remaining(),
            )
        # Look again at the deadline (an explicit extend() may move it).
        self.entries[key] = (
            backend,
            weakref.ref(lease),
            lease.deadline,
            lease.deadline,
        )

    def take_ended(self) -> list[tuple[BaseLockBackend, Lease, str]]:
        ended, self.ended = self.ended, []
        return ended

    def settle(self, backend: BaseLockBackend, leases, results) -> None:
        """Record renewal results: reschedule, retry or declare lost."""
        now = time.monotonic()
        for lease, ok in zip(leases, results):
            if id(lease) not in self.entries:
                continue  # released while the renewal was in flight
            if ok:
                self._schedule(backend, lease)
            elif ok is False:
                self.remove(lease)
                report_lost(backend, lease, "renewal found the lease gone")
            elif lease.deadline <= now:
                self.remove(lease)
                report_lost(
                    backend, lease, "backend unreachable until the lease expired"
                )
            else:
                # A retry is never taken early: a dead backend is not hammered.
                retry = min(now + RETRY_AFTER_ERROR, lease.deadline)
                self.entries[id(lease)] = (backend, weakref.ref(lease), retry, retry)


def _report_ended(schedule: _Schedule) -> None:
    for backend, lease, reason in schedule.take_ended():
        report_lost(backend, lease, reason)


class _ThreadLane:
    """The renewal thread of one alias (started on first use)."""

    def __init__(self, alias: str) -> None:
        self._name = f"django_distlock-watchdog:{alias}"
        # The condition's own lock, taken directly on the acquiring path
        # (``with self._cond`` is a Python-level call more each way).
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._schedule = _Schedule()
        self._thread: threading.Thread | None = None
        # True from the thread's start until its loop ends (an unexpected
        # error): read instead of Thread.is_alive() on every registration.
        self._running = False
        self._wake_at = math.inf

    def register(
        self, backend: BaseLockBackend, lease: Lease, max_hold: float | None = None
    ) -> None:
        """Start renewing ``lease`` until :meth:`unregister` (or ``max_hold``)."""
        with self._lock:
            due = self._schedule.add(backend, lease, max_hold)
            if not self._running:
                self._thread = threading.Thread(
                    target=self._run, name=self._name, daemon=True
                )
                self._running = True
                try:
                    self._thread.start()
                except BaseException:
                    self._running = False
                    raise
            elif due < self._wake_at:
                self._cond.notify()

    def unregister(self, lease: Lease) -> None:
        """Stop renewing ``lease``."""
        with self._lock:
            self._schedule.remove(lease)

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            with self._lock:
                self._running = False

    def _loop(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                # Never sleep past the next tick: a lease registered meanwhile
                # is then only worth a notify() (a thread switch on the
                # acquiring path) if it is due before the tick.
                self._wake_at = min(self._schedule.next_due(), now + IDLE_TICK)
                if self._wake_at > now:
                    self._cond.wait(self._wake_at - now)
                    continue
                due = self._schedule.take_due(now)
            _report_ended(self._schedule)
            for backend, leases in due.items():
                try:
                    results = backend.renew(leases)
                except Exception:
                    logger.exception("Renewal on %r failed", backend.alias)
                    results = [None] * len(leases)
                with self._cond:
                    self._schedule.settle(backend, leases, results)


class _AsyncLane:
    """The renewal task of one alias on one event loop (started on first use).

    Like the renewal thread, the task wakes at least every ``IDLE_TICK``
    seconds while it has leases, so that registering a lease due later than
    its next wake-up costs no wake-up at all: an acquisition adds an entry
    and returns. It ends about a tick after its last lease went. The task
    sleeps on a plain future with a timer (no helper task, no
    ``wait_for``), so cancelling it (``asyncio.run()`` ending) always stops
    it.
    """

    def __init__(self, alias: str) -> None:
        self._name = f"django_distlock-watchdog:{alias}"
        self._schedule = _Schedule()
        self._task: asyncio.Task | None = None
        self._waiter: asyncio.Future | None = None
        # When the sleeping task wakes by itself; -inf while it is awake
        # (it looks at the schedule again before sleeping).
        self._wake_at = -math.inf

    def register(
        self, backend: BaseLockBackend, lease: Lease, max_hold: float | None = None
    ) -> None:
        """Start renewing ``lease`` until :meth:`unregister` (or ``max_hold``)."""
        due = self._schedule.add(backend, lease, max_hold)
        task = self._task
        if task is None or task.done():
            self._wake_at = -math.inf
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=self._name
            )
        elif due < self._wake_at:
            self._wake_at = -math.inf
            _wake(self._waiter)

    def unregister(self, lease: Lease) -> None:
        """Stop renewing ``lease``."""
        self._schedule.remove(lease)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        # The task ends when it finds nothing to renew twice in a row, a tick
        # apart, not as soon as the schedule is empty: a task that acquires
        # and releases in a loop empties it on every release, and would pay
        # for a new task on every acquisition.
        idle = False
        while True:
            if not self._schedule.entries:
                if idle:
                    return
                idle = True
            else:
                idle = False
            now = time.monotonic()
            wake_at = min(self._schedule.next_due(), now + IDLE_TICK)
            if wake_at > now:
                waiter = self._waiter = loop.create_future()
                timer = loop.call_later(wake_at - now, _wake, waiter)
                self._wake_at = wake_at
                try:
                    await waiter
                finally:
                    self._wake_at = -math.inf
                    self._waiter = None
                    timer.cancel()
                continue
            due = self._schedule.take_due(now)
            _report_ended(self._schedule)
            for backend, leases in due.items():
                try:
                    results = await backend.arenew(leases)
                except Exception:
                    logger.exception("Renewal on %r failed", backend.alias)
                    results = [None] * len(leases)
                self._schedule.settle(backend, leases, results)


class _Lanes:
    """One renewal lane per alias, created when the alias first has a lease
    to renew (see the module docstring)."""

    lane_class: type

    def __init__(self) -> None:
        self._lanes: dict = {}
        self._lock = threading.Lock()

    def lane(self, alias: str):
        """Return the lane renewing the leases of ``alias`` (made on first use).

        A lock handle keeps the lane of each lease it registers, so that its
        release unregisters it there directly.
        """
        lane = self._lanes.get(alias)
        if lane is None:
            with self._lock:
                lane = self._lanes.get(alias)
                if lane is None:
                    lane = self._lanes[alias] = self.lane_class(alias)
        return lane

    def register(
        self, backend: BaseLockBackend, lease: Lease, max_hold: float | None = None
    ) -> None:
        """Start renewing ``lease`` until :meth:`unregister`.

        With ``max_hold``, renewal stops that many seconds after the lease
        was acquired; when the lease then runs out, it is reported lost.
        """
        self.lane(backend.alias).register(backend, lease, max_hold)

    def unregister(self, lease: Lease) -> None:
        """Stop renewing ``lease``."""
        lane = self._lanes.get(lease.alias)
        if lane is not None:
            lane.unregister(lease)

    def renewing(self, lease: Lease) -> bool:
        """Whether ``lease`` is on this watchdog's schedule."""
        lane = self._lanes.get(lease.alias)
        return lane is not None and lane._schedule.has(lease)

    def __len__(self) -> int:
        return sum(len(lane._schedule) for lane in list(self._lanes.values()))


class ThreadWatchdog(_Lanes):
    """The renewal threads of this process, one per alias."""

    lane_class = _ThreadLane


class AsyncWatchdog(_Lanes):
    """The renewal tasks of one event loop, one per alias."""

    lane_class = _AsyncLane


def _wake(waiter: asyncio.Future | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


watchdog = ThreadWatchdog()
_async_watchdogs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def async_watchdog() -> AsyncWatchdog:
    """Return the watchdog of the running event loop."""
    loop = asyncio.get_running_loop()
    dog = _async_watchdogs.get(loop)
    if dog is None:
        dog = _async_watchdogs[loop] = AsyncWatchdog()
    return dog


def _after_fork_in_child() -> None:
    global watchdog, _async_watchdogs
    watchdog = ThreadWatchdog()
    _async_watchdogs = weakref.WeakKeyDictionary()


os.register_at_fork(after_in_child=_after_fork_in_child)


def get_watchdog() -> ThreadWatchdog:
    """Return this process's renewal threads (fork-aware)."""
    return watchdog
