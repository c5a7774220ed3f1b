"""pytest fixtures for testing code that takes locks (needs pytest-django).

Installed as the ``pytest11`` entry point ``django_distlock``: pytest loads it
by itself, and it adds its fixtures when pytest-django is active too.

- ``distlock_locmem``: ``LOCKS`` swapped, for one test, for the in-process
  backend (every configured alias keeps its name, TTL and TIMEOUT), starting
  empty. Its value is :data:`django_distlock.locks`.
- ``distlock_held``: a factory; ``distlock_held("name", using=...)`` takes
  the lock from another owner (a thread of its own) and holds it, renewed,
  for the rest of the test, so the code under test finds it busy. It returns
  a :class:`HeldLock`, whose :meth:`~HeldLock.release` frees it earlier.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

__all__ = ["DistlockFixtures", "HeldLock"]

#: The ``LOCKS`` keys an alias keeps when swapped for the in-process backend.
KEPT_KEYS = ("TTL", "TIMEOUT", "AUTO_RENEW", "KEY_PREFIX")
LOCMEM = "django_distlock.backends.locmem.LocMemLockBackend"


def pytest_configure(config: pytest.Config) -> None:
    """Add the fixtures when pytest-django is active."""
    if config.pluginmanager.hasplugin("django"):
        config.pluginmanager.register(DistlockFixtures(), "django_distlock-fixtures")


def _clear(backend) -> None:
    for holder in list(backend.holders()):
        backend.force_release(holder.name, holder.token)


class HeldLock:
    """A lock held by another owner for a test (see ``distlock_held``).

    ``name``, ``using`` and ``fencing_token`` describe the lease.
    """

    def __init__(
        self,
        name: str,
        *,
        using: str,
        ttl: float | None,
        timeout: float | None,
    ):
        from django_distlock import lock

        self.name = name
        self.using = using
        self.fencing_token: int | None = None
        self._handle = lock(name, using=using, ttl=ttl, timeout=timeout)
        self._taken = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        # Its own thread: another owner even for a reentrant backend, whose
        # owner is the thread.
        self._thread = threading.Thread(
            target=self._hold, name=f"distlock_held:{name}", daemon=True
        )
        self._thread.start()
        self._taken.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    def _hold(self) -> None:
        try:
            with self._handle as held:
                self.fencing_token = held.fencing_token
                self._taken.set()
                self._stop.wait()
        except BaseException as exc:  # handed to the test's thread
            self._error = exc
        finally:
            self._taken.set()

    def release(self) -> None:
        """Release the lock now (else it is released when the test ends).

        Raise what releasing raised (LockLost if the lease was taken away).
        """
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def __repr__(self) -> str:
        state = "released" if self._stop.is_set() else "held"
        return f"<HeldLock {self.name!r} using={self.using!r} {state}>"


class DistlockFixtures:
    """The fixtures, registered as a plugin object when pytest-django is on."""

    @pytest.fixture
    def distlock_locmem(self) -> Iterator[Any]:
        """Swap ``LOCKS`` for the in-process backend for this test."""
        from django.test import override_settings

        from django_distlock import locks

        swapped = {}
        for alias, entry in locks.settings.items():
            swapped[alias] = {k: entry[k] for k in KEPT_KEYS if k in entry}
            swapped[alias]["BACKEND"] = LOCMEM
            swapped[alias]["LOCATION"] = f"distlock_locmem:{alias}"
        with override_settings(LOCKS=swapped):
            for alias in swapped:
                _clear(locks[alias])  # what an earlier test left held
            try:
                yield locks
            finally:
                for alias in swapped:
                    _clear(locks[alias])

    @pytest.fixture
    def distlock_held(
        self, request: pytest.FixtureRequest
    ) -> Iterator[Callable[..., HeldLock]]:
        """Return a factory holding a lock from another owner until the test ends.

        ``distlock_held(name, *, using="default", ttl=None, timeout=0)``: raise
        ``LockNotAcquired`` if ``name`` is already held after ``timeout``.
        """
        if "distlock_locmem" in request.fixturenames:
            # Set up first, so the swapped LOCKS outlive the held locks.
            request.getfixturevalue("distlock_locmem")
        held: list[HeldLock] = []

        def hold(
            name: str,
            *,
            using: str = "default",
            ttl: float | None = None,
            timeout: float | None = 0,
        ) -> HeldLock:
            lock = HeldLock(name, using=using, ttl=ttl, timeout=timeout)
            held.append(lock)
            return lock

        yield hold
        errors = []
        for lock in reversed(held):
            try:
                lock.release()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
