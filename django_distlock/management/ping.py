"""``manage.py locks ping``: is every lock backend reachable, and how fast?

One round trip per backend, through the backend contract: looking up the
holder of one name (:meth:`~django_distlock.backends.base.BaseLockBackend.holder_of`),
which reads and never writes. Suitable for a deploy check or a readiness
probe: the exit status is 1 when any backend failed.
"""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ..handler import locks
from . import selected_aliases

__all__ = ["PING_NAME", "add_ping_parser", "handle_ping", "ping"]

#: The name whose holder a ping looks up (nobody is expected to hold it).
PING_NAME = "django_distlock:ping"


def ping(alias: str) -> float:
    """Make one round trip to the backend of ``alias``; return its seconds.

    Raise whatever the backend raised (normally
    :class:`~django_distlock.exceptions.LockBackendError`).
    """
    backend = locks[alias]
    started = time.perf_counter()
    backend.holder_of(PING_NAME)
    return time.perf_counter() - started


def add_ping_parser(subparsers) -> None:
    """Add the ``ping`` subcommand to ``manage.py locks``."""
    parser = subparsers.add_parser(
        "ping",
        help="One round trip per backend: its latency or its error (exit 1 if "
        "any failed).",
    )
    parser.add_argument("--using", help="Only this LOCKS alias (default: every alias).")


def handle_ping(cmd: BaseCommand, *, using: str | None = None, **options: Any) -> None:
    """Carry out ``manage.py locks ping`` for the ``locks`` command ``cmd``."""
    aliases = selected_aliases(using)
    failed = []
    for alias in aliases:
        try:
            seconds = ping(alias)
        except Exception as exc:  # any failure is the answer, not a crash
            failed.append(alias)
            kind = type(exc).__name__
            cmd.stderr.write(cmd.style.ERROR(f"{alias}: unreachable ({kind}: {exc})"))
        else:
            cmd.stdout.write(
                cmd.style.SUCCESS(f"{alias}: ok in {seconds * 1000:.1f} ms")
            )
    if failed:
        raise CommandError(
            f"{len(failed)} of {len(aliases)} backend(s) unreachable: "
            f"{', '.join(map(repr, failed))}."
        )
