"""Celery tasks that run one at a time per lock name: ``locked_task``.

    from celery import shared_task
    from django_distlock.contrib.celery import locked_task

    @shared_task
    @locked_task("report:<tenant_id>", on_busy="skip")
    def build_report(tenant_id): ...

The lock is taken in the worker, around the task's body, and renewed in the
background while the body runs (however long it takes); it is released when
the body ends. A worker that dies mid-task (SIGKILL, a hard time limit, the
OOM killer) stops renewing, so the lock frees itself when its lease runs out:
no stale lock outlives its TTL.

When the lock is busy, ``on_busy`` says what the task does:

- ``"skip"`` (the default): return at once without running the body. The
  task succeeds with a result the caller can recognise (:func:`is_skipped`),
  the skip is logged (logger ``django_distlock.celery``) and sent as the
  :data:`task_skipped` signal.
- ``"retry"``: ``Task.retry()``, with a countdown of the holder's remaining
  lease; the task's ``max_retries`` applies, and exhausting it fails the task
  with :class:`~django_distlock.exceptions.LockNotAcquired`.
- ``"raise"``: fail the task with
  :class:`~django_distlock.exceptions.LockNotAcquired`.

Celery is imported only when a task is retried: this module imports without
it, and decorating needs nothing from it.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import re
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any, TypeVar

from django.dispatch import Signal

from ..exceptions import LockNotAcquired
from ..handler import DEFAULT_LOCK_ALIAS
from ..locking import lock

__all__ = ["ON_BUSY", "is_skipped", "locked_task", "task_skipped"]

logger = logging.getLogger("django_distlock.celery")

#: Sent when a task skipped its body because its lock was busy, with
#: ``sender`` the decorated function (the task's ``run``) and the keyword
#: arguments ``task`` (the Celery task's name, or None when called outside
#: Celery), ``task_id``, ``name`` (the lock name), ``holder`` (a
#: :class:`~django_distlock.backends.base.Holder`, or None if unknown),
#: ``task_args`` and ``task_kwargs``.
task_skipped = Signal()

ON_BUSY = ("skip", "retry", "raise")
PLACEHOLDER = re.compile(r"<(\w+)>")
#: The key that marks a skipped run's result.
SKIPPED = "distlock_skipped"

F = TypeVar("F", bound=Callable[..., Any])


def is_skipped(result: Any) -> bool:
    """Return True if ``result`` is the result of a run skipped as busy."""
    return isinstance(result, dict) and result.get(SKIPPED) is True


def locked_task(
    name: str | Callable[..., str],
    *,
    on_busy: str = "skip",
    using: str = DEFAULT_LOCK_ALIAS,
    ttl: float | None = None,
    timeout: float | None = 0,
) -> Callable[[F], F]:
    """Make a task function run its body only while holding the lock ``name``.

    Put it under ``@shared_task`` / ``@app.task``. ``<arg>`` placeholders in
    ``name`` are replaced by the task's arguments of that name (defaults
    included); ``name`` may also be a callable taking the task's arguments
    and returning the name. ``on_busy`` is ``"skip"``, ``"retry"`` or
    ``"raise"`` (see the module documentation); ``using`` is the ``LOCKS``
    alias, ``ttl`` the lease length (default: the alias's ``TTL``), renewed
    while the body runs, and ``timeout`` how long to wait for a busy lock
    (default 0: decide at once).

    A placeholder that names no argument of the function is a ValueError
    when the module is imported, not at the first run.
    """
    if on_busy not in ON_BUSY:
        raise ValueError(
            f"on_busy must be one of {', '.join(map(repr, ON_BUSY))}, not {on_busy!r}."
        )
    if ttl is not None and not (ttl > 0 and math.isfinite(ttl)):
        raise ValueError(f"ttl must be a positive number of seconds, not {ttl!r}.")
    if timeout is not None and not timeout >= 0:
        raise ValueError(f"timeout must be None or >= 0, not {timeout!r}.")

    def decorator(func: F) -> F:
        signature = inspect.signature(func)
        if isinstance(name, str):
            unknown = [
                p for p in PLACEHOLDER.findall(name) if p not in signature.parameters
            ]
            if unknown:
                raise ValueError(
                    f"locked_task({name!r}) on {func.__qualname__}: "
                    f"<{unknown[0]}> names no argument of the function "
                    f"(it takes: {', '.join(signature.parameters) or 'nothing'})."
                )

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            lock_name = _lock_name(name, signature, args, kwargs)
            handle = lock(lock_name, using=using, ttl=ttl, timeout=timeout)
            stack = ExitStack()
            try:
                stack.enter_context(handle)
            except LockNotAcquired as busy:
                return _busy(wrapper, handle, on_busy, busy, args, kwargs)
            with stack:
                return func(*args, **kwargs)

        # Celery checks a call's arguments against this (getfullargspec does
        # not follow __wrapped__).
        wrapper.__signature__ = signature  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorator


def _lock_name(name, signature: inspect.Signature, args, kwargs) -> str:
    if callable(name):
        return name(*args, **kwargs)
    if "<" not in name:
        return name
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    values = bound.arguments

    def value(match: re.Match) -> str:
        return str(values[match.group(1)])

    return PLACEHOLDER.sub(value, name)


def _current_task():
    """Return the Celery task being run, or None outside a Celery task."""
    try:
        from celery import current_task
    except ImportError:
        return None
    # A proxy of the task on top of Celery's stack; false when there is none.
    return current_task if current_task else None


def _busy(func, handle, on_busy: str, busy: LockNotAcquired, args, kwargs) -> Any:
    # The lock named the holder it found (one lookup) on the exception.
    name = handle.name
    holder, remaining = busy.holder, busy.expires_in
    who = "another holder" if holder is None else holder.holder
    message = f"Lock {name!r} is busy: held by {who}"
    if remaining is not None:
        message += f", lease expires in {remaining:.1f} s"
    message += "."
    task = _current_task()
    refused = LockNotAcquired(message, name=name, holder=holder, expires_in=remaining)
    if on_busy == "raise" or (on_busy == "retry" and task is None):
        raise refused from None
    if on_busy == "retry":
        countdown = remaining if remaining is not None else handle.ttl
        logger.info("Task %s retries in %.1f s: %s", task.name, countdown, message)
        raise task.retry(countdown=countdown, exc=refused)
    task_name = task.name if task is not None else None
    task_id = task.request.id if task is not None else None
    logger.info(
        "Task %s (%s) skipped: %s", task_name or func.__qualname__, task_id, message
    )
    task_skipped.send(
        sender=func,
        task=task_name,
        task_id=task_id,
        name=name,
        holder=holder,
        task_args=args,
        task_kwargs=kwargs,
    )
    return {
        SKIPPED: True,
        "lock": name,
        "holder": None if holder is None else holder.holder,
        "expires_in": remaining,
    }
