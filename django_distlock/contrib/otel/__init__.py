"""OpenTelemetry spans for the locks, fed by django_distlock's signals.

Add ``"django_distlock.contrib.otel"`` to ``INSTALLED_APPS`` (and install
``opentelemetry-api``, the ``otel`` extra): every acquisition and every hold
of a lock becomes a span of the tracer provider you configured (the global
one), a child of the span that was current when the lock was taken or
released (the request, the Celery task):

- ``distlock.acquire``: from the start of the wait to its end. Attribute
  ``distlock.outcome`` is ``acquired``, ``busy`` (not acquired within the
  wait) or ``error`` (the backend could not be reached: the span's status is
  ERROR and the exception is recorded).
- ``distlock.hold``: from the acquisition to the release, made when the lock
  is released; or, when the lease is lost while held, up to the moment the
  loss was noticed, with status ERROR.

Both carry ``distlock.backend`` (the ``LOCKS`` alias), ``distlock.name``
(the lock name) and ``distlock.kind`` (``exclusive``, ``shared`` or
``permit``), and the acquisition's ``distlock.fencing_token`` and
``distlock.ttl``; a semaphore permit's also ``distlock.limit``. Lock names
may hold ids or personal data:
``DISTLOCK_OTEL_LOCK_NAME = False`` leaves the name out.

The spans are made after the fact, from the lock signals, with their real
start times: nothing is added to the locking path itself, and without the
app nothing listens to the signals.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ..receivers import LockSignalReceiver

__all__ = ["LockTracing", "install"]

TRACER_NAME = "django_distlock"


def _ns_ago(seconds: float) -> int:
    return time.time_ns() - int(seconds * 1e9)


class LockTracing(LockSignalReceiver):
    """Turn the lock signals into spans of ``tracer_provider``.

    ``tracer_provider`` defaults to OpenTelemetry's global one (looked up at
    each span, so one set later is used). ``record_name=False`` leaves the
    lock name out of the attributes. :meth:`connect` starts, and
    :meth:`disconnect` stops.
    """

    def __init__(self, tracer_provider: Any = None, *, record_name: bool = True):
        from opentelemetry import trace

        self.tracer = trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)
        self.record_name = record_name

    def _attributes(
        self, alias: str, name: str, lease=None, kind: str = "exclusive", **more
    ) -> dict:
        attributes = {"distlock.backend": alias, "distlock.kind": kind, **more}
        if self.record_name:
            attributes["distlock.name"] = name
        if lease is not None:
            attributes["distlock.fencing_token"] = lease.fencing_token
            attributes["distlock.ttl"] = lease.ttl
            limit = getattr(lease.kind, "limit", None)
            if limit is not None:
                attributes["distlock.limit"] = limit
        return attributes

    def _span(self, name: str, start: int, attributes: dict, error=None) -> None:
        from opentelemetry.trace import Status, StatusCode

        span = self.tracer.start_span(name, attributes=attributes, start_time=start)
        if error is not None:
            if isinstance(error, BaseException):
                span.record_exception(error)
                error = str(error)
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    # ``kind`` is absent from signals sent by code older than shared locks.

    def _acquired(self, sender, alias, name, lease, wait, **kwargs) -> None:
        attributes = self._attributes(
            alias,
            name,
            lease,
            kwargs.get("kind", "exclusive"),
            **{"distlock.outcome": "acquired"},
        )
        self._span("distlock.acquire", _ns_ago(wait), attributes)

    def _contended(self, sender, alias, name, wait, **kwargs) -> None:
        attributes = self._attributes(
            alias,
            name,
            kind=kwargs.get("kind", "exclusive"),
            **{"distlock.outcome": "busy"},
        )
        self._span("distlock.acquire", _ns_ago(wait), attributes)

    def _error(self, sender, alias, name, wait, error, **kwargs) -> None:
        attributes = self._attributes(
            alias,
            name,
            kind=kwargs.get("kind", "exclusive"),
            **{"distlock.outcome": "error"},
        )
        self._span("distlock.acquire", _ns_ago(wait), attributes, error)

    def _released(self, sender, alias, name, lease, held, **kwargs) -> None:
        attributes = self._attributes(
            alias, name, lease, kwargs.get("kind", "exclusive")
        )
        self._span("distlock.hold", _ns_ago(held), attributes)

    def _lost(self, sender, alias, name, lease, held, reason, **kwargs) -> None:
        attributes = self._attributes(
            alias, name, lease, kwargs.get("kind", "exclusive")
        )
        self._span("distlock.hold", _ns_ago(held), attributes, f"lease lost: {reason}")


_installed: LockTracing | None = None
_install_lock = threading.Lock()


def install(tracer_provider: Any = None, *, record_name: bool = True) -> LockTracing:
    """Create and connect the tracing once per process; return it.

    Called by the app's ``ready()``; a second call returns the same one.
    """
    global _installed
    with _install_lock:
        if _installed is None:
            _installed = LockTracing(tracer_provider, record_name=record_name)
            _installed.connect()
        return _installed
