"""Signals sent around the life of a lock, for metrics and logging.

Every signal is sent with ``sender`` the backend class and these keyword
arguments: ``alias`` (the LOCKS alias), ``name`` (the lock name) and
``lease`` (the :class:`~django_distlock.backends.base.Lease`, or None where
there is none) and ``kind``, what was asked for: ``"exclusive"``,
``"shared"`` (a shared lock) or ``"permit"`` (a semaphore permit; the
lease's ``kind.limit`` says of how many). Receivers should accept
``**kwargs``, as Django asks: signals may gain arguments. Some add timings:

- ``lock_acquired``: ``wait`` (seconds spent waiting).
- ``lock_released``: ``held`` (seconds the lease was held).
- ``lock_lost``: ``held`` (seconds from acquisition to detection), ``reason``
  (a lease that ran out after its ``max_hold`` is a loss too; its reason
  names ``max_hold``).
- ``lock_contended``: ``wait`` (seconds waited before giving up), ``timeout``.
- ``lock_error``: an acquisition failed because the backend could not be
  reached: ``wait`` (seconds until it failed), ``error`` (the
  :class:`~django_distlock.exceptions.LockBackendError`).
"""

from django.dispatch import Signal

lock_acquired = Signal()
lock_released = Signal()
lock_lost = Signal()
lock_contended = Signal()
lock_error = Signal()
