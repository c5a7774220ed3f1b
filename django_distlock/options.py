"""Validate the options of a lock, for ``lock()`` and ``distributed_lock``.

Each check returns ``(error class, text)`` where ``text`` names the argument;
the caller adds the lock (or the view), so that every refusal is one sentence
naming both: ``lock()`` raises it at once, the view decorator reports it
through ``manage.py check``.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any

__all__ = ["ON_LOST_CHOICES", "option_problems", "seconds_problem", "timeout_problem"]

#: What ``on_lost=`` accepts: report the loss when the block ends, or cancel
#: the asyncio task running the block as soon as the loss is known.
ON_LOST_CHOICES = ("raise", "cancel")

Problem = tuple[type[Exception], str]


def _is_number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def seconds_problem(what: str, value: Any) -> Problem | None:
    """Return (error class, text) if ``value`` is not a positive, finite number."""
    if type(value) is float or type(value) is int:  # the common case, fast
        if value > 0 and value != math.inf:
            return None
    elif not _is_number(value):
        return TypeError, (
            f"{what} must be a number of seconds, not {value!r} "
            f"({type(value).__name__})"
        )
    if not (value > 0 and math.isfinite(value)):
        return ValueError, f"{what} must be a positive number of seconds, not {value!r}"
    return None


def timeout_problem(value: Any, *, forever: tuple = (None,)) -> Problem | None:
    """Return (error class, text) if ``value`` is not a valid wait timeout."""
    if value in forever and (value is None or _is_number(value)):
        return None
    allowed = "None, -1 or a number >= 0" if -1 in forever else "None or a number >= 0"
    if not _is_number(value):
        return TypeError, (
            f"timeout must be {allowed} (seconds), not {value!r} "
            f"({type(value).__name__})"
        )
    if not (value >= 0 and math.isfinite(value)):
        return ValueError, f"timeout must be {allowed} (seconds), not {value!r}"
    return None


def option_problems(
    *,
    using: Any,
    ttl: Any,
    timeout: Any,
    auto_renew: Any,
    on_lost: Any = "raise",
    max_hold: Any = None,
) -> list[Problem]:
    """Return what is wrong with the options of a lock, as (class, text).

    An empty list means they are valid. ``timeout`` is the one to check
    (None: wait forever); ``ttl`` and ``auto_renew`` None mean the alias's.
    ``max_hold`` is checked if given: None means no bound.
    """
    problems = []
    if not isinstance(using, str):
        problems.append(
            (TypeError, f"using must be a LOCKS alias (str), not {using!r}")
        )
    if ttl is not None:
        problem = seconds_problem("ttl", ttl)
        if problem:
            problems.append(problem)
    problem = timeout_problem(timeout)
    if problem:
        problems.append(problem)
    if auto_renew is not None and not isinstance(auto_renew, bool):
        problems.append(
            (TypeError, f"auto_renew must be True, False or None, not {auto_renew!r}")
        )
    if max_hold is not None:
        problem = seconds_problem("max_hold", max_hold)
        if problem:
            error, text = problem
            problems.append((error, text + " (or None: no bound)"))
    if on_lost not in ON_LOST_CHOICES or not isinstance(on_lost, str):
        problems.append(
            (ValueError, f"on_lost must be 'raise' or 'cancel', not {on_lost!r}")
        )
    return problems
