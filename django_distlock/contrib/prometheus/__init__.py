"""Prometheus metrics for the locks, fed by django_distlock's signals.

Add ``"django_distlock.contrib.prometheus"`` to ``INSTALLED_APPS`` (and
install ``prometheus_client``, the ``prometheus`` extra): the metrics are
registered on prometheus_client's default registry, the one
``prometheus_client.start_http_server()``, ``make_wsgi_app()`` and
django-prometheus's ``/metrics`` view expose. ``DISTLOCK_PROMETHEUS_REGISTRY``
(a dotted path to a ``CollectorRegistry``) picks another one. Each metric has
the labels ``backend``, the ``LOCKS`` alias, and ``kind``, what was
acquired: ``exclusive``, ``shared`` (a shared lock) or ``permit`` (a
semaphore permit):

- ``distlock_acquisitions_total{backend,outcome,kind}``: acquisitions by outcome,
  ``acquired``, ``busy`` (not acquired within the wait) or ``error`` (the
  backend could not be reached).
- ``distlock_wait_seconds{backend,kind}``: histogram of the wait of the
  acquisitions that succeeded.
- ``distlock_hold_seconds{backend,kind}``: histogram of how long a lock was held,
  from acquisition to release.
- ``distlock_lost_total{backend,kind}``: leases lost while held (expired or taken
  over before their holder released them).
- ``distlock_held{backend,kind}``: gauge of the locks this process holds now.

Without the app in ``INSTALLED_APPS`` nothing listens to the signals, and
locking pays nothing for metrics.
"""

from __future__ import annotations

import threading
from typing import Any

from ..receivers import LockSignalReceiver

__all__ = ["LockMetrics", "install"]

#: Buckets of ``distlock_wait_seconds``: an uncontended acquisition takes
#: about a millisecond, a contended one up to the wait timeout.
WAIT_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
)
#: Buckets of ``distlock_hold_seconds``: from a request to a nightly job.
HOLD_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)


class LockMetrics(LockSignalReceiver):
    """The lock metrics on one ``registry``, updated from the lock signals.

    ``LockMetrics(registry)`` creates the metrics; :meth:`connect` starts
    feeding them and :meth:`disconnect` stops. The app
    (``django_distlock.contrib.prometheus`` in ``INSTALLED_APPS``) does both
    for the default registry; use the class directly for a registry of your
    own outside the app.
    """

    def __init__(self, registry: Any = None):
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram

        registry = REGISTRY if registry is None else registry
        self.registry = registry
        self.acquisitions = Counter(
            "distlock_acquisitions",
            "Lock acquisitions by outcome: acquired, busy or error.",
            ["backend", "outcome", "kind"],
            registry=registry,
        )
        self.wait = Histogram(
            "distlock_wait_seconds",
            "Seconds waited by the lock acquisitions that succeeded.",
            ["backend", "kind"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.hold = Histogram(
            "distlock_hold_seconds",
            "Seconds a lock was held, from acquisition to release.",
            ["backend", "kind"],
            buckets=HOLD_BUCKETS,
            registry=registry,
        )
        self.lost = Counter(
            "distlock_lost",
            "Leases lost while held (expired or taken over).",
            ["backend", "kind"],
            registry=registry,
        )
        self.held = Gauge(
            "distlock_held",
            "Locks held by this process now.",
            ["backend", "kind"],
            registry=registry,
            multiprocess_mode="livesum",
        )

    # Receivers: one lease is either released or lost, never both, so the
    # gauge goes down once per acquisition.

    # ``kind`` is absent from signals sent by code older than shared locks.

    def _acquired(
        self, sender, alias: str, wait: float, kind: str = "exclusive", **kwargs
    ) -> None:
        self.acquisitions.labels(alias, "acquired", kind).inc()
        self.wait.labels(alias, kind).observe(wait)
        self.held.labels(alias, kind).inc()

    def _contended(self, sender, alias: str, kind: str = "exclusive", **kwargs):
        self.acquisitions.labels(alias, "busy", kind).inc()

    def _error(self, sender, alias: str, kind: str = "exclusive", **kwargs) -> None:
        self.acquisitions.labels(alias, "error", kind).inc()

    def _released(
        self, sender, alias: str, held: float, kind: str = "exclusive", **kwargs
    ) -> None:
        self.hold.labels(alias, kind).observe(held)
        self.held.labels(alias, kind).dec()

    def _lost(self, sender, alias: str, kind: str = "exclusive", **kwargs) -> None:
        self.lost.labels(alias, kind).inc()
        self.held.labels(alias, kind).dec()


_installed: LockMetrics | None = None
_install_lock = threading.Lock()


def install(registry: Any = None) -> LockMetrics:
    """Create and connect the metrics once per process; return them.

    Called by the app's ``ready()``; a second call returns the same metrics
    (a registry refuses the same metric names twice).
    """
    global _installed
    with _install_lock:
        if _installed is None:
            _installed = LockMetrics(registry)
            _installed.connect()
        return _installed
