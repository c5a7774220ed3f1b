"""The system checks of ``distributed_lock`` views (``manage.py check``).

The decorator records its arguments on the view (``distributed_lock_options``,
``distributed_lock_placeholders``); these checks walk the URLconf and report
what would fail at the first request: ``distlock.E020`` (a placeholder no
route provides), ``E021`` (``DISTLOCK_LOCKED_VIEW`` cannot be imported),
``E022`` (an unknown ``using=``), ``E023`` (a bad ``ttl=``, ``timeout=``,
``auto_renew=`` or ``max_hold=``), ``E026`` (bad ``shared=``/``limit=``) and
``E027`` (a kind the alias's backend does not offer). The app registers them
in ``ready()``.
"""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, Tags, register
from django.core.exceptions import ImproperlyConfigured

from .decorators import _settings_handler
from .handler import DEFAULT_LOCK_ALIAS

__all__ = ["check_locked_view_setting", "check_url_placeholders"]


@register(Tags.urls)
def check_url_placeholders(app_configs=None, **kwargs) -> list[CheckMessage]:
    """Report the ``distributed_lock`` views of the URLconf configured wrongly.

    ``<name>`` placeholders that no URL pattern of the view provides
    (distlock.E020), an unknown ``using=`` alias (E022), a bad ``ttl=``,
    ``timeout=``, ``auto_renew=`` or ``max_hold=`` (E023), bad ``shared=`` /
    ``limit=`` (E026), a kind the alias's backend does not offer (E027).
    """
    from django.urls import URLPattern, URLResolver, get_resolver

    errors: list[CheckMessage] = []

    def needs(callback) -> list[str]:
        # as_view() copies dispatch()'s attributes onto the view function.
        found = list(getattr(callback, "distributed_lock_placeholders", ()))
        view_class = getattr(callback, "view_class", None)
        if view_class is not None:
            for attr in view_class.http_method_names:
                method = getattr(view_class, attr, None)
                found += getattr(method, "distributed_lock_placeholders", ())
        return list(dict.fromkeys(found))

    def options(callback) -> list[tuple]:
        found = list(getattr(callback, "distributed_lock_options", ()))
        view_class = getattr(callback, "view_class", None)
        if view_class is not None:
            for attr in view_class.http_method_names:
                method = getattr(view_class, attr, None)
                found += getattr(method, "distributed_lock_options", ())
        return list(dict.fromkeys(found))

    reported: set[tuple[str, str]] = set()

    def check_options(entry) -> None:
        view = entry.lookup_str
        for described, using, problems, kind_problems, mode in options(entry.callback):
            messages = [
                Error(
                    f"{described} on view {view}: {text}.",
                    hint="Pass ttl as a positive number of seconds, timeout as "
                    "None or a number >= 0, auto_renew as a bool.",
                    obj=view,
                    id="distlock.E023",
                )
                for text in problems
            ]
            messages += [
                Error(
                    f"{described} on view {view}: {text}.",
                    hint="Pass shared=True for a shared lock, or limit=N (an int "
                    ">= 1) for a semaphore, not both.",
                    obj=view,
                    id="distlock.E026",
                )
                for text in kind_problems
            ]
            offered = _offered_kinds(using) if mode is not None else None
            if offered is not None and mode not in offered:
                what = "shared locks" if mode == "shared" else "semaphores"
                messages.append(
                    Error(
                        f"{described} on view {view}: LOCKS[{using!r}] does not "
                        f"offer {what} (it offers: {', '.join(sorted(offered))}).",
                        hint="Use an alias whose backend offers them (see "
                        "docs/shared-locks.md and docs/semaphores.md).",
                        obj=view,
                        id="distlock.E027",
                    )
                )
            # A missing "default" is distlock.E002's, a malformed LOCKS E001's.
            if (
                configured is not None
                and isinstance(using, str)
                and using != DEFAULT_LOCK_ALIAS
                and using not in configured
            ):
                messages.append(
                    Error(
                        f"{described} on view {view}: using={using!r} is not an "
                        "alias of settings.LOCKS.",
                        hint=f"Use one of {sorted(configured)}, or add "
                        f"LOCKS[{using!r}].",
                        obj=view,
                        id="distlock.E022",
                    )
                )
            for message in messages:
                # A view routed twice is reported once.
                if (view, message.msg) not in reported:
                    reported.add((view, message.msg))
                    errors.append(message)

    def walk(patterns, given: frozenset, route: str) -> None:
        for entry in patterns:
            names = given | set(entry.pattern.regex.groupindex)
            names |= set(getattr(entry, "default_kwargs", {}) or {})
            here = route + str(entry.pattern)
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns, frozenset(names), here)
            elif isinstance(entry, URLPattern):
                check_options(entry)
                names |= set(entry.default_args or {})
                for placeholder in needs(entry.callback):
                    if placeholder not in names:
                        errors.append(
                            Error(
                                f"distributed_lock on view "
                                f"{entry.lookup_str}: placeholder <{placeholder}> "
                                f"matches no URL kwarg of the route {here!r}.",
                                hint="Name the URL parameter like the placeholder, "
                                "or build the name with a callable.",
                                obj=entry.lookup_str,
                                id="distlock.E020",
                            )
                        )

    try:
        patterns = get_resolver().url_patterns
    except Exception:  # a broken URLconf is reported by Django's own check
        return errors
    configured = _configured_aliases()
    walk(patterns, frozenset(), "")
    return errors


@register()
def check_locked_view_setting(app_configs=None, **kwargs) -> list[CheckMessage]:
    """Report a ``DISTLOCK_LOCKED_VIEW`` that cannot be imported."""
    try:
        _settings_handler()
    except ImproperlyConfigured as e:
        return [
            Error(
                str(e),
                hint="Give the dotted path of a view taking (request, exception).",
                obj="settings.DISTLOCK_LOCKED_VIEW",
                id="distlock.E021",
            )
        ]
    return []


def _offered_kinds(using: Any) -> frozenset[str] | None:
    """Return the kinds the backend of ``using`` offers, or None if unknown."""
    from .handler import locks

    if not isinstance(using, str):
        return None
    try:
        return frozenset(locks[using].kinds)
    except Exception:  # no such alias, or it cannot load: other checks say so
        return None


def _configured_aliases() -> set[str] | None:
    """Return the ``LOCKS`` aliases, or None if ``LOCKS`` is malformed."""
    from .handler import locks

    try:
        configured = locks.settings
    except Exception:
        return None
    return set(configured) if isinstance(configured, dict) else None
