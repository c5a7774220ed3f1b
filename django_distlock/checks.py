"""System checks for ``settings.LOCKS`` (ids ``distlock.E0xx`` / ``W0xx``).

Generic keys are checked here; each backend class adds its own through
``BaseLockBackend.check(alias, params)``: its declared OPTIONS schema
(``options_schema``, read by ``backends/options.py``), then its
``check_entry`` hook for the rules a schema cannot declare.

=============  ==============================================================
id             meaning
=============  ==============================================================
distlock.E001  ``LOCKS`` is not a dict of dicts.
distlock.E002  ``LOCKS`` has no ``default`` alias.
distlock.E003  ``BACKEND`` missing or not importable.
distlock.E004  ``LOCATION`` missing or malformed for the backend.
distlock.E005  ``TTL`` is not a positive number.
distlock.E006  ``TIMEOUT`` is not None or a number >= 0.
distlock.E007  ``AUTO_RENEW`` is not a bool.
distlock.E008  ``KEY_PREFIX`` is not a string.
distlock.E009  ``OPTIONS`` is not a dict, or has an unknown/ill-typed key.
distlock.E010  ``OPTIONS["CACHE"]`` names no django-redis cache.
distlock.E011  Redlock with fewer than 3 nodes.
distlock.E012  ``OPTIONS["DATABASE"]`` names no ``DATABASES`` alias.
distlock.E013  Unknown top-level key in a ``LOCKS`` entry.
distlock.E014  ``OPTIONS["DATABASE"]`` is a database the DB backend cannot use.
distlock.E015  Redis Cluster / Sentinel settings malformed (cluster URL with a
               database, ``CLUSTER`` not a bool, ``SENTINELS`` not a list of
               ``(host, port)``, no ``SERVICE_NAME``, both forms at once).
distlock.E016  ZooKeeper ``LOCATION`` or ``OPTIONS`` malformed.
distlock.E017  A setting other than ``LOCKS`` (``LOCK``, ``DISTLOCK_LOCKS``...)
               holds django_distlock backends.
distlock.E018  django_distlock is imported but not in ``INSTALLED_APPS``
               (registered in ``handler.py``).
distlock.E019  The backend's driver (redis-py, kazoo) is not installed.
distlock.E020  A ``distributed_lock`` placeholder matches no URL kwarg of a route
               to the view (registered in ``view_checks.py``).
distlock.E021  ``DISTLOCK_LOCKED_VIEW`` cannot be imported (``view_checks.py``).
distlock.E022  A ``distributed_lock`` view's ``using=`` names no ``LOCKS`` alias
               (``view_checks.py``).
distlock.E023  A ``distributed_lock`` view's ``ttl=``, ``timeout=``,
               ``auto_renew=`` or ``max_hold=`` is invalid (``view_checks.py``).
distlock.E024  ``MAX_HOLD`` is not None or a positive number.
distlock.E025  ``OPTIONS["CACHE"]`` with connection options of the lock's own beside
               it (``backends/redis/checks.py``).
distlock.E026  A ``distributed_lock`` view has both ``shared=`` and ``limit=``,
               or a ``limit=`` that is not an int >= 1 (``view_checks.py``).
distlock.E027  A ``distributed_lock`` view asks for a kind (shared, semaphore)
               its alias's backend does not offer (``view_checks.py``).
distlock.E029  ``OPTIONS["WAIT_REPLICAS"]`` or ``WAIT_REPLICAS_TIMEOUT`` is
               invalid (``backends/redis/checks.py``).
distlock.W001  Redlock with an even number of nodes.
distlock.W002  The locmem backend with ``DEBUG = False``.
distlock.W003  The DB backend on SQLite with ``ATOMIC_REQUESTS = True``.
distlock.W004  ``AUTO_RENEW`` with a ``TTL`` under ``TINY_TTL`` seconds and no
               ``MAX_HOLD``: a stuck holder keeps the name forever.
distlock.W005  The DB backend with ``WAIT = "notify"`` behind a transaction
               pooler (``DISABLE_SERVER_SIDE_CURSORS``): waiters poll.
=============  ==============================================================
"""

from __future__ import annotations

import importlib.util
import math
from numbers import Real

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

__all__ = ["check_locks_setting", "check_misnamed_setting"]

KNOWN_KEYS = {
    "BACKEND",
    "LOCATION",
    "TTL",
    "TIMEOUT",
    "AUTO_RENEW",
    "KEY_PREFIX",
    "OPTIONS",
    "MAX_HOLD",
}
OBJ = "settings.LOCKS"
#: A TTL below this many seconds, renewed with no MAX_HOLD, draws distlock.W004.
TINY_TTL = 1.0


def _error(id_: str, msg: str, hint: str) -> Error:
    return Error(msg, hint=hint, obj=OBJ, id=id_)


def _is_number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


@register(Tags.caches, "distlock")
def check_locks_setting(app_configs=None, **kwargs):
    """Check every ``LOCKS`` entry; return the list of problems found."""
    from .handler import DEFAULT_LOCK_ALIAS, DEFAULT_LOCKS

    value = getattr(settings, "LOCKS", None)
    if value is None:
        value = DEFAULT_LOCKS
    if not isinstance(value, dict) or not all(
        isinstance(v, dict) for v in value.values()
    ):
        return [
            _error(
                "distlock.E001",
                "LOCKS must be a dict of dicts, like CACHES.",
                'Write LOCKS = {"default": {"BACKEND": "..."}}.',
            )
        ]
    errors = []
    if DEFAULT_LOCK_ALIAS not in value:
        errors.append(
            _error(
                "distlock.E002",
                "LOCKS has no 'default' alias.",
                "lock() uses LOCKS['default'] unless given using=...; "
                "add a 'default' entry.",
            )
        )
    for alias, params in value.items():
        errors.extend(_check_entry(alias, params))
    return errors


@register(Tags.caches, "distlock")
def check_misnamed_setting(app_configs=None, **kwargs):
    """Report a setting that looks like ``LOCKS`` under another name (``LOCK``).

    django_distlock reads ``LOCKS`` only: without it every lock silently
    uses the default database backend.
    """
    errors = []
    for name in dir(settings):
        # Only names that mention locks: reading every setting would also
        # read deprecated ones (EMAIL_BACKEND on Django 6.1), which warns.
        if name == "LOCKS" or not name.isupper() or "LOCK" not in name:
            continue
        try:
            value = getattr(settings, name, None)
        except ImproperlyConfigured:  # e.g. an empty SECRET_KEY: not ours
            continue
        if not isinstance(value, dict):
            continue
        # A LOCKS-like dict of entries, or a single entry written bare.
        entries = [value, *value.values()]
        if any(
            isinstance(entry, dict)
            and isinstance(entry.get("BACKEND"), str)
            and entry["BACKEND"].startswith("django_distlock.")
            for entry in entries
        ):
            errors.append(
                Error(
                    f"settings.{name} looks like a LOCKS setting, but "
                    "django_distlock reads LOCKS only"
                    + (
                        ""
                        if hasattr(settings, "LOCKS")
                        else ": without it, every lock uses the default "
                        "database backend"
                    )
                    + ".",
                    hint=f"Rename {name} to LOCKS.",
                    obj=f"settings.{name}",
                    id="distlock.E017",
                )
            )
    return errors


def _check_entry(alias, params):
    where = f"LOCKS[{alias!r}]"
    errors = []
    unknown = sorted(set(params) - KNOWN_KEYS)
    if unknown:
        errors.append(
            _error(
                "distlock.E013",
                f"{where} has unknown keys: {unknown}.",
                f"Valid keys are {sorted(KNOWN_KEYS)}; backend-specific "
                "settings go in OPTIONS.",
            )
        )
    backend = params.get("BACKEND")
    backend_cls = None
    if not backend or not isinstance(backend, str):
        errors.append(
            _error(
                "distlock.E003",
                f"{where} has no BACKEND.",
                "Set BACKEND to a dotted path such as "
                "'django_distlock.backends.redis.RedisLockBackend'.",
            )
        )
    else:
        try:
            backend_cls = import_string(backend)
        except ImportError as e:
            missing = (getattr(e, "name", None) or "").partition(".")[0]
            if missing in DRIVER_EXTRAS:
                errors.append(_missing_driver(where, backend, missing))
                return errors
            errors.append(
                _error(
                    "distlock.E003",
                    f"{where}['BACKEND'] {backend!r} cannot be imported: {e}",
                    "Check the dotted path and that its driver is installed.",
                )
            )
        else:
            from .backends.base import BaseLockBackend

            if not (
                isinstance(backend_cls, type)
                and issubclass(backend_cls, BaseLockBackend)
            ):
                errors.append(
                    _error(
                        "distlock.E003",
                        f"{where}['BACKEND'] {backend!r} is not a lock backend.",
                        "BACKEND must name a subclass of "
                        "django_distlock.backends.base.BaseLockBackend.",
                    )
                )
                backend_cls = None
    ttl = params.get("TTL", 30)
    if not _is_number(ttl) or not (ttl > 0 and math.isfinite(ttl)):
        errors.append(
            _error(
                "distlock.E005",
                f"{where}['TTL'] must be a positive number of seconds, not {ttl!r}.",
                "For example 'TTL': 30.",
            )
        )
    timeout = params.get("TIMEOUT", 10)
    if timeout is not None and (not _is_number(timeout) or timeout < 0):
        errors.append(
            _error(
                "distlock.E006",
                f"{where}['TIMEOUT'] must be None or a number >= 0, not {timeout!r}.",
                "None waits forever, 0 tries once.",
            )
        )
    if not isinstance(params.get("AUTO_RENEW", True), bool):
        errors.append(
            _error(
                "distlock.E007",
                f"{where}['AUTO_RENEW'] must be True or False.",
                "Leave it out to renew held leases automatically.",
            )
        )
    max_hold = params.get("MAX_HOLD")
    if max_hold is not None and (
        not _is_number(max_hold) or not (max_hold > 0 and math.isfinite(max_hold))
    ):
        errors.append(
            _error(
                "distlock.E024",
                f"{where}['MAX_HOLD'] must be None or a positive number of "
                f"seconds, not {max_hold!r}.",
                "For example 'MAX_HOLD': 600, to stop renewing a lease after "
                "10 minutes; None (the default) never stops.",
            )
        )
    elif (
        max_hold is None
        and params.get("AUTO_RENEW", True) is True
        and _is_number(ttl)
        and 0 < ttl < TINY_TTL
    ):
        errors.append(
            Warning(
                f"{where} renews a TTL of {ttl!r} s with no MAX_HOLD: a holder "
                "stuck in its block keeps the name for as long as its process "
                "lives.",
                hint="Set MAX_HOLD (the longest a lock may be held, in seconds), "
                "or a TTL of at least 1 s if the short TTL was meant as the bound.",
                obj=OBJ,
                id="distlock.W004",
            )
        )
    if not isinstance(params.get("KEY_PREFIX", ""), str):
        errors.append(
            _error(
                "distlock.E008",
                f"{where}['KEY_PREFIX'] must be a string.",
                "For example 'KEY_PREFIX': 'myproject'.",
            )
        )
    options = params.get("OPTIONS", {})
    if not isinstance(options, dict):
        errors.append(
            _error(
                "distlock.E009",
                f"{where}['OPTIONS'] must be a dict.",
                "Leave OPTIONS out or write OPTIONS = {...}.",
            )
        )
    elif backend_cls is not None:
        missing = [
            (module, extra)
            for module, extra in backend_cls.drivers
            if not _importable(module)
        ]
        errors.extend(_missing_driver(where, backend, m, e) for m, e in missing)
        if not missing:
            errors.extend(backend_cls.check(alias, params))
    return errors


#: Driver modules the bundled backends import, and the extra that installs each.
DRIVER_EXTRAS = {
    "redis": "redis",
    "async_timeout": "redis",  # redis-py's own dependency on Python < 3.11.3
    "hiredis": "redis",
    "kazoo": "zookeeper",
    "django_redis": "django-redis",
}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package fails, or a stub
        return False


def _missing_driver(where, backend, module, extra=None):
    extra = extra or DRIVER_EXTRAS[module]
    return _error(
        "distlock.E019",
        f"{where} uses {backend!r}, which needs the {module!r} package, "
        f"and it is not installed.",
        f'pip install "django-distlock[{extra}]"',
    )
