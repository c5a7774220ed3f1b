"""Management commands under a lock: ``flock(1)`` for ``manage.py``.

``manage.py locks run NAME -- COMMAND [ARGS ...]`` runs a management command
in-process while holding ``NAME`` (renewed in the background), so that a job
cron starts on several hosts at once runs on one of them. The same behaviour
is available for a command class of your own through :class:`LockedCommand`,
and for any callable through :func:`run_locked`.

Exit statuses follow ``sysexits.h``: the lock busy is ``EX_TEMPFAIL`` (75),
the backend unreachable is ``EX_UNAVAILABLE`` (69). Both reach the shell as
the ``returncode`` of a :class:`~django.core.management.CommandError`, which
``manage.py`` turns into its exit status.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO, TypeVar

from django.core.management import call_command, get_commands
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ..backends.base import Holder
from ..exceptions import LockBackendError, LockError, LockLost
from ..handler import DEFAULT_LOCK_ALIAS, locks
from ..locking import lock

__all__ = [
    "EX_LOST",
    "EX_TEMPFAIL",
    "EX_UNAVAILABLE",
    "LockedCommand",
    "describe_holder",
    "run_locked",
]

#: Exit status when the lock is busy (sysexits.h: "try again later").
EX_TEMPFAIL = 75
#: Exit status when the lock backend cannot be reached.
EX_UNAVAILABLE = 69
#: Exit status when the lease was lost while the command ran.
EX_LOST = 1

T = TypeVar("T")

release_log = logging.getLogger("django_distlock.release")


def describe_holder(using: str, name: str) -> str:
    """Return a phrase naming who holds ``name`` on ``using``, for messages.

    Ask the backend once (its ``holder_of()``); an unknown holder, or a
    backend that cannot tell, gives a phrase saying so.
    """
    try:
        holder: Holder | None = locks[using].holder_of(name)
    except (LockError, NotImplementedError, OSError):
        holder = None
    if holder is None:
        return "by another holder (unknown)"
    phrase = f"by {holder.holder}"
    expires = holder.expires_ts
    if expires is not None:
        phrase += f", lease expires in {max(expires - time.time(), 0):.1f} s"
    if holder.fencing_token is not None:
        phrase += f" (fencing token {holder.fencing_token})"
    return phrase


def run_locked(
    name: str,
    func: Callable[[], T],
    *,
    using: str = DEFAULT_LOCK_ALIAS,
    ttl: float | None = None,
    timeout: float | None = 0,
    skip_if_locked: bool = False,
    stderr: TextIO | None = None,
) -> T | None:
    """Call ``func()`` while holding ``name``, renewing the lease meanwhile.

    Return what ``func`` returns, or None when the lock was busy and
    ``skip_if_locked`` is set (a note goes to ``stderr``). Otherwise raise
    :class:`~django.core.management.CommandError` with ``returncode``
    :data:`EX_TEMPFAIL` (75) when the lock stayed busy for ``timeout``
    seconds, naming the holder; :data:`EX_UNAVAILABLE` (69) when the backend
    cannot be reached; :data:`EX_LOST` (1) when the lease was lost while
    ``func`` ran and ``func`` itself returned normally. An exception from
    ``func`` (``SystemExit`` and ``CommandError`` included) propagates
    unchanged after the lock is released.
    """
    if stderr is None:
        stderr = sys.stderr
    handle = lock(name, using=using, ttl=ttl, timeout=timeout, auto_renew=True)
    try:
        acquired = handle.acquire()
    except LockBackendError as exc:
        raise CommandError(
            f"Lock backend {using!r} is unreachable, {name!r} was not taken: {exc}",
            returncode=EX_UNAVAILABLE,
        ) from exc
    if not acquired:
        busy = f"Lock {name!r} is busy: held {describe_holder(using, name)}."
        if skip_if_locked:
            stderr.write(f"{busy} Skipped.\n")
            return None
        raise CommandError(busy, returncode=EX_TEMPFAIL)
    try:
        result = func()
    except BaseException:
        _release_after_error(handle)
        raise
    try:
        handle.release()
    except LockLost as exc:
        raise CommandError(
            f"Lock {name!r} was lost while the command ran (another holder may "
            f"have run it too): {exc}",
            returncode=EX_LOST,
        ) from exc
    except LockError as exc:
        # The work is done; the lease runs out by itself within its ttl.
        stderr.write(f"Releasing lock {name!r} failed ({exc}); it expires by itself.\n")
    return result


def _release_after_error(handle) -> None:
    """Release after ``func`` raised: the error is the news, not the release."""
    try:
        handle.release()
    except LockLost:
        pass  # sent as lock_lost and logged by the watchdog
    except LockError:
        release_log.exception("Releasing lock %r failed", handle.name)


class LockedCommand(BaseCommand):
    """A management command whose every run holds a distributed lock.

    Subclass it instead of :class:`~django.core.management.BaseCommand` and
    write ``handle()`` as usual; ``execute()`` (what ``manage.py`` and
    ``call_command()`` call) takes the lock first, renews it while
    ``handle()`` runs and releases it afterwards. Busy, the command raises
    :class:`~django.core.management.CommandError` with ``returncode`` 75
    naming the holder (or, with ``lock_skip_if_locked``, returns without
    running); the backend unreachable gives ``returncode`` 69. The class
    attributes mirror the options of ``manage.py locks run``:

        class Command(LockedCommand):
            lock_name = "nightly-report"   # default: "manage.py:<command name>"
            lock_ttl = 60

            def handle(self, *args, **options): ...

    Override :meth:`get_lock_name` to derive the name from the options.
    """

    #: The lock name; None means ``"manage.py:<module name of the command>"``.
    lock_name: str | None = None
    #: The ``LOCKS`` alias.
    lock_using: str = DEFAULT_LOCK_ALIAS
    #: The lease length in seconds (None: the alias's TTL).
    lock_ttl: float | None = None
    #: How long to wait for a busy lock, in seconds (None: forever).
    lock_timeout: float | None = 0
    #: Return without running (exit 0) when the lock is busy.
    lock_skip_if_locked: bool = False

    def get_lock_name(self, *args: Any, **options: Any) -> str:
        """Return the name of the lock this run takes."""
        if self.lock_name is not None:
            return self.lock_name
        return "manage.py:" + type(self).__module__.rsplit(".", 1)[-1]

    def execute(self, *args: Any, **options: Any) -> Any:
        """Run the command (checks, ``handle()``) while holding the lock."""
        return run_locked(
            self.get_lock_name(*args, **options),
            lambda: super(LockedCommand, self).execute(*args, **options),
            using=self.lock_using,
            ttl=self.lock_ttl,
            timeout=self.lock_timeout,
            skip_if_locked=self.lock_skip_if_locked,
            stderr=options.get("stderr") or sys.stderr,
        )


# -- ``manage.py locks run`` --------------------------------------------------

RUN_USAGE = (
    "manage.py locks run NAME [--using ALIAS] [--ttl S] [--timeout S] "
    "[--skip-if-locked] -- COMMAND [ARGS ...]"
)


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):
        raise ValueError(text)
    return value


def _positive_seconds(text: str) -> float:
    value = _seconds(text)
    if value == 0:
        raise ValueError(text)
    return value


def _add_run_options(parser, default) -> None:
    parser.add_argument(
        "--using",
        default=default(DEFAULT_LOCK_ALIAS),
        help="The LOCKS alias (default: 'default').",
    )
    parser.add_argument(
        "--ttl",
        type=_positive_seconds,
        default=default(None),
        help="Lease length in seconds (default: the alias's TTL); renewed while "
        "the command runs.",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=default(0.0),
        help="Seconds to wait for a busy lock (default: 0, try once).",
    )
    parser.add_argument(
        "--skip-if-locked",
        action="store_true",
        default=default(False),
        help="Exit 0 without running when the lock is busy (default: exit 75).",
    )


def add_run_parser(subparsers) -> None:
    """Add the ``run`` subcommand to ``manage.py locks``."""
    parser = subparsers.add_parser(
        "run",
        usage=RUN_USAGE,
        help="Run a management command while holding a lock (exit 75 if busy).",
        description="Run COMMAND in this process while holding NAME, renewing "
        "it. The exit status is COMMAND's; 75 when the lock is busy (0 with "
        "--skip-if-locked), 69 when the backend is unreachable.",
    )
    _add_run_options(parser, lambda value: value)
    # Everything after the subcommand: NAME, options, "--", COMMAND, ARGS.
    # argparse cannot tell options placed after NAME from COMMAND's own, so
    # they are split at "--" by handle_run().
    parser.add_argument("argv", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def _split_run_argv(argv: list[str], options: dict[str, Any]) -> tuple[str, list]:
    """Return (NAME, [COMMAND, ARGS...]); update ``options`` with late options."""
    if "--" in argv:
        cut = argv.index("--")
        own, command = argv[:cut], argv[cut + 1 :]
    elif len(argv) > 1 and argv[1].startswith("-"):
        raise CommandError(
            f"Put '--' between the options of 'locks run' and COMMAND: {RUN_USAGE}"
        )
    else:
        own, command = argv[:1], argv[1:]
    parser = CommandParser(prog="manage.py locks run", usage=RUN_USAGE)
    parser.add_argument("name", metavar="NAME")
    _add_run_options(parser, lambda value: argparse.SUPPRESS)
    try:
        parsed = parser.parse_args(own)
    except SystemExit:  # only from --help, which the subparser answers first
        raise CommandError(f"usage: {RUN_USAGE}") from None
    late = vars(parsed)
    name = late.pop("name")
    options.update(late)
    if not command:
        raise CommandError(f"No COMMAND to run. usage: {RUN_USAGE}")
    return name, command


def handle_run(cmd: BaseCommand, **options: Any) -> None:
    """Carry out ``manage.py locks run`` for the ``locks`` command ``cmd``."""
    name, argv = _split_run_argv(list(options["argv"]), options)
    command, args = argv[0], argv[1:]
    if command not in get_commands():
        raise CommandError(f"Unknown command: {command!r}. usage: {RUN_USAGE}")
    using = options["using"]
    if using not in locks.settings:
        raise CommandError(
            f"Unknown LOCKS alias {using!r}; configured: {', '.join(locks.settings)}."
        )
    streams = {key: options[key] for key in ("stdout", "stderr") if options.get(key)}
    run_locked(
        name,
        lambda: call_command(command, *args, **streams),
        using=using,
        ttl=options["ttl"],
        timeout=options["timeout"],
        skip_if_locked=options["skip_if_locked"],
        stderr=streams.get("stderr") or sys.stderr,
    )
