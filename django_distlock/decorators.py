"""The view decorator: run a view while holding a distributed lock.

Modelled on :mod:`django.views.decorators.cache`: one decorator, a sync and
an async branch, :func:`functools.wraps`.

When the lock stays busy for the wait timeout the view is not run and the
answer is ``423 Locked``; when the backend cannot be reached it is ``503
Service Unavailable``. Both carry ``Retry-After``. Override them per view with
``on_locked=`` or project-wide with the ``DISTLOCK_LOCKED_VIEW`` setting, a
dotted path to a view ``(request, exception)`` in the manner of Django's
``CSRF_FAILURE_VIEW``; the exception is a
:class:`~django_distlock.exceptions.LockNotAcquired` or a
:class:`~django_distlock.exceptions.LockBackendError`.

System checks (:mod:`django_distlock.view_checks`): ``distlock.E020`` when a
name template's ``<placeholder>`` matches no URL kwarg of a route to the view
(the request would fail with ImproperlyConfigured), ``distlock.E021`` when
``DISTLOCK_LOCKED_VIEW`` cannot be imported, ``distlock.E022`` when ``using=``
names no ``LOCKS`` alias and ``distlock.E023`` when ``ttl=``, ``timeout=``,
``auto_renew=`` or ``max_hold=`` is invalid (those two also fail the request,
should it come), ``distlock.E026`` when ``shared=`` and ``limit=`` are both
given or ``limit=`` is not an int >= 1, and ``distlock.E027`` when the alias's
backend does not offer shared locks or semaphores (both fail the request too).

``shared=True`` runs the view under a shared lease; ``limit=N`` under one of
``N`` permits of a semaphore, and a full semaphore answers ``429 Too Many
Requests`` (with ``Retry-After``) instead of ``423 Locked``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Callable
from functools import wraps
from inspect import iscoroutinefunction
from typing import Any

from asgiref.sync import iscoroutinefunction as asgiref_iscoroutinefunction
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS
from django.http import HttpRequest, HttpResponse
from django.utils.module_loading import import_string

from .exceptions import LockBackendError, LockLost, LockNotAcquired
from .handler import DEFAULT_LOCK_ALIAS
from .instances import RELEASE_ON_COMMIT, RELEASE_ON_EXIT, OnCommitLock
from .locking import DEFAULT, Lock
from .options import option_problems
from .semaphores import Semaphore

__all__ = [
    "RETRY_AFTER_LOCKED",
    "RETRY_AFTER_UNAVAILABLE",
    "distributed_lock",
    "locked_view",
    "retry_after",
]

release_log = logging.getLogger("django_distlock.release")

#: ``Retry-After`` (seconds) of the default 423 answer.
RETRY_AFTER_LOCKED = 1
#: ``Retry-After`` (seconds) of the default 503 answer.
RETRY_AFTER_UNAVAILABLE = 5

#: A placeholder: ``<name>`` where name is a Python identifier (like URL kwargs).
PLACEHOLDER = re.compile(r"<([A-Za-z_][A-Za-z0-9_]*)>")

LockedHandler = Callable[[HttpRequest, Exception], HttpResponse]


def locked_view(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Answer a request whose lock could not be taken: 423, or 503 if down.

    A semaphore whose permits were all held answers 429 Too Many Requests.

    This is the default of the ``DISTLOCK_LOCKED_VIEW`` setting.
    """
    if isinstance(exception, LockBackendError):
        response = HttpResponse(
            "The lock service is unavailable; try again later.\n",
            status=503,
            content_type="text/plain; charset=utf-8",
        )
        response["Retry-After"] = str(RETRY_AFTER_UNAVAILABLE)
    elif getattr(getattr(exception, "kind", None), "mode", None) == "permit":
        response = HttpResponse(
            "Too many requests are using this resource; try again shortly.\n",
            status=429,
            content_type="text/plain; charset=utf-8",
        )
        response["Retry-After"] = str(retry_after(exception))
    else:
        response = HttpResponse(
            "This resource is locked by another request; try again shortly.\n",
            status=423,
            content_type="text/plain; charset=utf-8",
        )
        response["Retry-After"] = str(retry_after(exception))
    return response


def retry_after(exception: Exception) -> int:
    """Return the ``Retry-After`` seconds for a lock that was busy.

    The holder's remaining lease when the backend named the holder (rounded
    up, at least 1 s), else :data:`RETRY_AFTER_LOCKED`.
    """
    expires_in = getattr(exception, "expires_in", None)
    if expires_in is None:
        return RETRY_AFTER_LOCKED
    return max(1, math.ceil(expires_in))


def _settings_handler() -> LockedHandler:
    path = getattr(settings, "DISTLOCK_LOCKED_VIEW", None)
    if not path:
        return locked_view
    if callable(path):
        return path
    try:
        return import_string(path)
    except ImportError as e:
        raise ImproperlyConfigured(
            f"DISTLOCK_LOCKED_VIEW {path!r} cannot be imported: {e}"
        ) from e


def _namer(
    template_or_callable: str | Callable[..., str], view: Callable
) -> Callable[..., str]:
    """Return ``f(request, args, kwargs) -> lock name`` for the decorator."""
    if callable(template_or_callable):
        make = template_or_callable

        def from_callable(request, args, kwargs):
            name = make(request, *args, **kwargs)
            if not isinstance(name, str):
                raise TypeError(
                    f"The lock name callable of view {_view_name(view)} returned "
                    f"{type(name).__name__}, not str."
                )
            return name

        return from_callable
    if not isinstance(template_or_callable, str):
        raise TypeError(
            "distributed_lock() takes a name template (str) or a callable, not "
            f"{type(template_or_callable).__name__}."
        )
    template = template_or_callable
    placeholders = PLACEHOLDER.findall(template)
    if not placeholders:
        return lambda request, args, kwargs: template

    def from_template(request, args, kwargs):
        missing = [p for p in placeholders if p not in kwargs]
        if missing:
            raise ImproperlyConfigured(
                f"distributed_lock({template!r}) on view {_view_name(view)}: "
                f"placeholder <{missing[0]}> matches no URL kwarg "
                f"(the URL gave {sorted(kwargs) or 'none'})."
            )
        # One pass: a value containing "<x>" is data, never substituted again.
        return PLACEHOLDER.sub(lambda m: str(kwargs[m.group(1)]), template)

    return from_template


def _describe(template_or_callable: Any) -> str:
    """Return ``distributed_lock(<template>)`` for messages."""
    if isinstance(template_or_callable, str):
        return f"distributed_lock({template_or_callable!r})"
    return f"distributed_lock({getattr(template_or_callable, '__qualname__', '...')})"


def _view_name(view: Callable) -> str:
    # method_decorator() hands the decorator a partial of the bound method:
    # name the view's class, not the base class defining the method.
    bound = getattr(view, "func", None)
    owner = getattr(bound, "__self__", None)
    if owner is not None:
        cls = type(owner)
        return f"{cls.__module__}.{cls.__qualname__}.{bound.__name__}"
    module = getattr(view, "__module__", "?")
    return f"{module}.{getattr(view, '__qualname__', repr(view))}"


def distributed_lock(
    template_or_callable: str | Callable[..., str],
    *,
    using: str = DEFAULT_LOCK_ALIAS,
    ttl: float | None = None,
    timeout: float | None = 0,
    auto_renew: bool | None = None,
    max_hold: float | None = DEFAULT,
    on_locked: LockedHandler | None = None,
    release: str = RELEASE_ON_COMMIT,
    database: str = DEFAULT_DB_ALIAS,
    shared: bool = False,
    limit: int | None = None,
) -> Callable[[Callable], Callable]:
    """Decorate a view so that it runs while holding a lock.

    ``template_or_callable`` is either a name template whose ``<kwarg>``
    placeholders are filled from the view's URL kwargs
    (``"inventory:<sku>"``), or a callable ``(request, *args, **kwargs) ->
    str``. URL values are plain data: any string makes a valid lock name and
    the backend keeps its keys bounded whatever its length. A placeholder
    with no matching URL kwarg raises ImproperlyConfigured naming the
    placeholder and the view.

    ``using``, ``ttl``, ``timeout``, ``auto_renew`` and ``max_hold`` are those of
    :func:`~django_distlock.lock`, except that ``timeout`` defaults to 0, not
    to the alias's ``TIMEOUT``: a busy resource answers at once instead of
    tying up a worker; an explicit ``timeout`` waits as ``lock()`` does. If
    the lock is still busy after ``timeout`` or the backend is unreachable,
    the view is not run and
    ``on_locked(request, exception)`` answers (default: the
    ``DISTLOCK_LOCKED_VIEW`` setting, itself defaulting to
    :func:`locked_view`: 423 or 503 with ``Retry-After``).

    ``release="on_commit"`` (the default) matters only when the view runs
    inside ``transaction.atomic()`` on ``database``, as with
    ``ATOMIC_REQUESTS``: the lock is then held until that transaction
    commits (or rolls back), so the next request reads the committed row
    (see :class:`~django_distlock.instances.OnCommitLock`). Elsewhere, and for
    async views (Django runs them outside request transactions), the lock is
    released when the view returns, as with ``release="on_exit"``.

    A lease lost while the view ran (it expired during a long pause, or an
    operator force-released it) does not turn the view's answer into a 500:
    the view's side effects happened, so its response is sent, and the loss
    is reported by the ``lock_lost`` signal and a warning on the
    ``django_distlock.release`` logger naming the view and the request. The
    same goes for a release the backend could not confirm. To make the
    database refuse writes from a holder whose lease was lost, use fencing
    (``save(fence=...)``).

    Works on function views, async views, and class-based views through
    ``method_decorator(distributed_lock(...), name="dispatch")`` (sync or
    async ones: Django runs sync views off the event loop, so a wrapped
    callable found on the loop is an async view's ``dispatch`` and the lock
    is held around the coroutine it returns). The lock
    is released when the view returns: a streaming response's body is
    produced after that.

    ``shared=True`` holds a shared lease of the name while the view runs
    (views that only read side by side, excluding an exclusive writer);
    ``limit=N`` holds one of ``N`` permits of the semaphore of that name
    (at most N requests in the view at once; when all are taken the answer
    is ``429 Too Many Requests`` with ``Retry-After`` from the permit that
    expires first). The two are mutually exclusive. A permit is released
    when the view returns, whatever ``release`` says.
    """

    if release not in (RELEASE_ON_COMMIT, RELEASE_ON_EXIT):
        raise ValueError(
            f"release must be {RELEASE_ON_EXIT!r} or {RELEASE_ON_COMMIT!r}, "
            f"not {release!r}."
        )

    # Checked here, reported by manage.py check (distlock.E022, E023) and,
    # should the view be reached anyway, by the request: like a model
    # field's arguments, not by an import-time traceback.
    problems = [
        text
        for _, text in option_problems(
            using=using,
            ttl=ttl,
            timeout=timeout,
            auto_renew=auto_renew,
            max_hold=None if max_hold is DEFAULT else max_hold,
        )
    ]
    kind_problems = _kind_problems(shared, limit)
    mode = "permit" if limit is not None else "shared" if shared is True else None
    described = _describe(template_or_callable)

    def decorator(view_func: Callable) -> Callable:
        name_of = _namer(template_or_callable, view_func)

        def make_lock(request, args, kwargs, asynchronous: bool = False) -> Lock:
            if problems or kind_problems:
                raise ImproperlyConfigured(
                    f"{described} on view {_view_name(view_func)}: "
                    f"{(problems or kind_problems)[0]}."
                )
            name = name_of(request, args, kwargs)
            options = {
                "using": using,
                "ttl": ttl,
                "timeout": timeout,
                "auto_renew": auto_renew,
                "max_hold": max_hold,
            }
            if mode == "permit":
                return Semaphore(name, limit, **options)
            if mode == "shared":
                options["shared"] = True
            if release == RELEASE_ON_COMMIT and not asynchronous:
                return OnCommitLock(name, database=database, **options)
            return Lock(name, **options)

        def refuse(request, exc) -> HttpResponse:
            handler = on_locked or _settings_handler()
            return handler(request, exc)

        async def _async_view(request, *args, **kwargs):
            held = make_lock(request, args, kwargs, asynchronous=True)
            try:
                await held.__aenter__()
            except (LockNotAcquired, LockBackendError) as exc:
                response = refuse(request, exc)
                if hasattr(response, "__await__"):  # an async handler
                    response = await response
                return response
            response = None
            try:
                async with _Entered(held):
                    response = view_func(request, *args, **kwargs)
                    if hasattr(response, "__await__"):
                        response = await response
            except (LockLost, LockBackendError) as exc:
                if response is None:  # the view raised it
                    raise
                _answered_anyway(request, view_func, held, response, exc)
            return response

        if iscoroutinefunction(view_func) or asgiref_iscoroutinefunction(view_func):

            async def _view_wrapper(request, *args, **kwargs):
                return await _async_view(request, *args, **kwargs)

        else:

            def _view_wrapper(request, *args, **kwargs):
                if _in_event_loop():
                    # A sync callable run on the event loop returns a
                    # coroutine: an async class-based view's dispatch().
                    # Hold the lock around that coroutine, not around
                    # its creation.
                    return _async_view(request, *args, **kwargs)
                held = make_lock(request, args, kwargs)
                try:
                    held.__enter__()
                except (LockNotAcquired, LockBackendError) as exc:
                    return refuse(request, exc)
                response = None
                try:
                    with _Entered(held):
                        response = view_func(request, *args, **kwargs)
                except (LockLost, LockBackendError) as exc:
                    if response is None:  # the view raised it
                        raise
                    _answered_anyway(request, view_func, held, response, exc)
                return response

        wrapper = wraps(view_func)(_view_wrapper)
        # For the URL checks (distlock.E020, E022, E023, E026, E027). wraps() copied
        # those of a decorator below this one; keep them too.
        wrapper.distributed_lock_placeholders = tuple(
            dict.fromkeys(
                getattr(wrapper, "distributed_lock_placeholders", ())
                + (
                    tuple(PLACEHOLDER.findall(template_or_callable))
                    if isinstance(template_or_callable, str)
                    else ()
                )
            )
        )
        wrapper.distributed_lock_options = getattr(
            wrapper, "distributed_lock_options", ()
        ) + (
            (
                described,
                using if isinstance(using, str) else None,
                tuple(problems),
                tuple(kind_problems),
                mode,
            ),
        )
        return wrapper

    return decorator


def _kind_problems(shared: Any, limit: Any) -> list[str]:
    """Return what is wrong with ``shared=`` and ``limit=`` (distlock.E026)."""
    if shared is not True and shared is not False:
        return [f"shared must be a bool, not {shared!r}"]
    if limit is None:
        return []
    if shared:
        return ["shared=True and limit= are mutually exclusive"]
    if type(limit) is not int or limit < 1:
        return [f"limit must be an int >= 1, not {limit!r}"]
    return []


def _answered_anyway(
    request: HttpRequest,
    view: Callable,
    held: Lock,
    response: HttpResponse,
    exc: Exception,
) -> None:
    """Log a lease lost (or not released) after the view ran; keep its answer.

    The view's side effects happened and its response is true: a 500 would
    only hide them. A lost lease was already signalled (``lock_lost``) and
    logged by ``django_distlock.renew``; a release the backend refused
    leaves the lease to expire after its ttl.
    """
    what = "was lost" if isinstance(exc, LockLost) else "could not be released"
    release_log.warning(
        "Lock %r %s while view %s answered %s %s; its response (%s) was sent "
        "anyway: %s",
        held.name,
        what,
        _view_name(view),
        request.method,
        request.get_full_path(),
        getattr(response, "status_code", "?"),
        exc,
    )


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class _Entered:
    """Leave an already entered Lock (its ``__exit__`` semantics, unchanged)."""

    __slots__ = ("held",)

    def __init__(self, held: Lock):
        self.held = held

    def __enter__(self) -> Lock:
        return self.held

    def __exit__(self, *exc_info: Any) -> None:
        return self.held.__exit__(*exc_info)

    async def __aenter__(self) -> Lock:
        return self.held

    async def __aexit__(self, *exc_info: Any) -> None:
        return await self.held.__aexit__(*exc_info)
