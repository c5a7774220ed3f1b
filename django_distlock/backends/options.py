"""The OPTIONS schema a backend declares, and the system check that reads it.

A backend lists the keys of its ``OPTIONS`` in
:attr:`~.base.BaseLockBackend.options_schema`, each with an :class:`Option`
that says what the key accepts and why (the hint of its check message)::

    options_schema = {
        "SOCKET_TIMEOUT": Seconds("Without it a paused server hangs callers."),
        "WAIT": Choice("'notify' wakes waiters at once.", choices=("poll", "notify")),
    }

:func:`check_options` reports an unknown key and a bad value of a declared
one; rules that tie several settings together stay in the backend's
:meth:`~.base.BaseLockBackend.check_entry`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from numbers import Real
from typing import Any, ClassVar

__all__ = [
    "Bool",
    "CacheAlias",
    "Choice",
    "DatabaseAlias",
    "Dict",
    "Integer",
    "Number",
    "Option",
    "Seconds",
    "Text",
    "check_options",
]

#: The default of :attr:`Option.default`: the key is checked only if set.
UNSET: Any = object()


def _is_number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class Option:
    """One key of a backend's OPTIONS: what it accepts, and why.

    ``help`` is the hint of the check message for a bad value. ``id`` is the
    check id of that message (None: the type's :attr:`check_id`, else the
    backend's :attr:`~.base.BaseLockBackend.options_check_id`). ``default``
    is checked when the key is left out: only for a default that can be
    wrong in a project (a ``DATABASES`` alias); UNSET checks the key only if
    it is set.
    """

    #: The check id of this type of option, if it has one of its own.
    check_id: ClassVar[str | None] = None

    help: str
    _: KW_ONLY
    id: str | None = None
    default: Any = UNSET

    def problem(self, value: Any) -> str | None:
        """Return what is wrong with ``value`` ("must be ..."), or None."""
        return None


@dataclass(frozen=True)
class Number(Option):
    """A finite number, positive or (``zero_ok``) non-negative; not a bool."""

    zero_ok: bool = False
    unit: str = ""

    def problem(self, value: Any) -> str | None:
        """Return what is wrong with ``value``, or None."""
        if _is_number(value) and math.isfinite(value):
            if value > 0 or (self.zero_ok and value == 0):
                return None
        sign = "non-negative" if self.zero_ok else "positive"
        unit = f" of {self.unit}" if self.unit else ""
        return f"must be a {sign} number{unit}, not {value!r}"


@dataclass(frozen=True)
class Seconds(Number):
    """A duration in seconds: a finite number > 0 (``zero_ok``: >= 0)."""

    unit: str = "seconds"


@dataclass(frozen=True)
class Integer(Option):
    """An int of at least ``minimum`` (1 unless given); not a bool."""

    minimum: int = 1

    def problem(self, value: Any) -> str | None:
        """Return what is wrong with ``value``, or None."""
        if isinstance(value, int) and not isinstance(value, bool):
            if value >= self.minimum:
                return None
        return f"must be an integer >= {self.minimum}, not {value!r}"


@dataclass(frozen=True)
class Bool(Option):
    """True or False."""

    def problem(self, value: Any) -> str | None:
        """Return what is wrong with ``value``, or None."""
        return None if isinstance(value, bool) else "must be True or False"


@dataclass(frozen=True)
class Dict(Option):
    """A dict (typically keyword arguments passed on to a driver)."""

    def problem(self, value: Any) -> str | None:
        """Return what is wrong with ``value``, or None."""
        return None if isinstance(value, dict) else "must be a dict"


@dataclass(frozen=True)
class Text(Option):
    """A non-empty string; ``what`` completes "must name ..." in the message."""

    what: str = "a non-empty string"

    def problem(self, value: Any) -> str | None:
        """Return what is wrong with ``value``, or None."""
        if isinstance(value, str) and value:
            return None
        return f"must name {self.what}, not {value!r}"


@dataclass(frozen=True)
class Choice(Option):
    """One of ``choices``."""

    choices: tuple = ()

    def problem(self, value: Any) -> str | None:
        """Return what is wrong with ``value``, or None."""
        if any(type(value) is type(c) and value == c for c in self.choices):
            return None
        names = " or ".join(repr(c) for c in self.choices)
        return f"must be {names}, not {value!r}"


@dataclass(frozen=True)
class DatabaseAlias(Option):
    """An alias of ``settings.DATABASES`` (``distlock.E012`` unless given)."""

    check_id = "distlock.E012"

    def problem(self, value: Any) -> str | None:
        """Return what is wrong with ``value``, or None."""
        from django.conf import settings

        if isinstance(value, str) and value in settings.DATABASES:
            return None
        return f"is {value!r}, which is not in settings.DATABASES"


@dataclass(frozen=True)
class CacheAlias(Option):
    """An alias of ``settings.CACHES`` whose BACKEND starts with ``backend``.

    ``distlock.E010`` unless given; ``what`` names such a cache in the message.
    """

    check_id = "distlock.E010"

    backend: str = ""
    what: str = "cache"

    def problem(self, value: Any) -> str | None:
        """Return what is wrong with ``value``, or None."""
        from django.conf import settings

        caches = getattr(settings, "CACHES", {})
        entry = caches.get(value) if isinstance(value, str) else None
        if isinstance(entry, dict) and str(entry.get("BACKEND", "")).startswith(
            self.backend
        ):
            return None
        return f"is {value!r}, which is not a {self.what} in CACHES"


def check_options(backend_cls: type, alias: str, params: Mapping[str, Any]) -> list:
    """Return the check messages of ``LOCKS[alias]['OPTIONS']`` for a backend.

    Read against ``backend_cls.options_schema``: one message for the unknown
    keys, one per declared key with a bad value. A backend that declares no
    schema (None) has its OPTIONS left unchecked.
    """
    from django.core.checks import Error

    schema: Mapping[str, Option] | None = backend_cls.options_schema
    options = params.get("OPTIONS") or {}
    if schema is None or not isinstance(options, Mapping):
        return []
    where = f"LOCKS[{alias!r}]['OPTIONS']"
    default_id = backend_cls.options_check_id
    messages = []
    unknown = sorted(set(options) - set(schema))
    if unknown:
        messages.append(
            Error(
                f"{where} has unknown keys: {unknown}.",
                hint=f"{backend_cls.__name__} accepts {sorted(schema)}.",
                obj="settings.LOCKS",
                id=default_id,
            )
        )
    for key, option in schema.items():
        value = options.get(key, option.default)
        if value is UNSET:
            continue
        problem = option.problem(value)
        if problem is not None:
            messages.append(
                Error(
                    f"{where}[{key!r}] {problem}.",
                    hint=option.help,
                    obj="settings.LOCKS",
                    id=option.id or option.check_id or default_id,
                )
            )
    return messages
